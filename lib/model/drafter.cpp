#include "lib/model/drafter.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <span>

#include <spdlog/spdlog.h>

#include "lib/api/step_plan.hpp"
#include "lib/core/error.hpp"
#include "lib/model/replica_check.hpp"

namespace dspark {
namespace {

// Index of a 4-byte view's first element inside the 4-byte buffer it was carved from.
int64_t element_offset(const Tensor& buffer, const Tensor& view) {
  return (static_cast<const char*>(view.data) - static_cast<const char*>(buffer.data)) / 4;
}

// Where an insert's rows start in its [positions, slots, row sources, rows] buffer of N rows (4-byte words:
// N, N, 2N (the i64 addresses, 8-byte aligned), then the rows 16-byte aligned).
int64_t ins_rows_word(int64_t N) {
  return 4 * N;
}

// The activation block of the first of `readers` that quantises its input (fp8 block and fp4 weights, SPEC
// §3), 0 when none does: the block of the codes their input's producer writes.
int64_t quantised_input_block(std::span<const LinearWeight* const> readers) {
  for (const LinearWeight* w : readers) {
    switch (w->format) {
      case WeightFormat::fp8_block:
      case WeightFormat::fp8_mma_tiles:
      case WeightFormat::fp4:
      case WeightFormat::fp4_mma_tiles:
        return w->block;
      default:
        break;
    }
  }
  return 0;
}

// Issues `ops` on a side branch of the backend (Backend::begin_side): they may run beside the main sequence
// issued after them until its next join_side().
template <class Ops>
void on_side(Backend& backend, Ops&& ops, Backend::SideLane lane = Backend::SideLane::step) {
  backend.begin_side(lane);
  try {
    ops();
  } catch (...) {
    try {
      backend.end_side();
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  backend.end_side();
}

// The largest insert chunk that a step's recording runs beside its draft: beside it, steps of B = 1..4 with 4
// rows a sequence ran faster; at B = 8 (32 rows; in fp8 main_proj's bf16 copy) the insert slowed the draft's
// kernels by more than it saved.
constexpr int64_t kInsertBesideDraftMaxRows = 16;

// Whether a request of the batch is sampled: the step then runs the Markov loop's draw arithmetic.
bool any_draws(std::span<const DraftRequest> requests) {
  return std::any_of(requests.begin(), requests.end(),
                     [](const DraftRequest& r) { return r.temperature != 0.0f; });
}

}  // namespace

Drafter::Drafter(const ModelConfig& cfg, DrafterWeights weights, const ShardPlan& plan, Backend& backend,
                 Communicator& comm, const DrafterOptions& options)
    : cfg_(cfg), w_(std::move(weights)), plan_(plan), backend_(backend), comm_(comm), opt_(options) {
  if (opt_.slots < 1 || opt_.max_batch < 1 || opt_.max_insert_rows < 1 || opt_.max_model_len < 1)
    fail("drafter options: slots, max_batch, max_insert_rows and max_model_len must be positive");
  backend_.prepare_weights(w_);
  const int64_t H = cfg.dim, hc = cfg.hc_mult, d = cfg.head_dim, W = cfg.window_size, k = cfg.block_size;
  const int64_t heads = plan.heads.size(), B = opt_.max_batch, T = B * k, N = opt_.max_insert_rows;
  for (int64_t i = 0; i < cfg.n_mtp_layers; ++i) {
    ring_kv_.push_back(alloc(DType::bf16, {opt_.slots, W, d}));
    ring_pos_.push_back(alloc(DType::i32, {opt_.slots, W}));
    backend_.fill_i32(ring_pos_.back(), -1);
  }
  for (const int64_t b : opt_.graph_batch_sizes)
    if (b < 1 || b > B) fail("drafter options: graph batch size {} outside [1, max_batch = {}]", b, B);
  for (const int64_t n : opt_.insert_row_buckets)
    if (n < 1 || n > N) fail("drafter options: insert bucket {} outside [1, max_insert_rows = {}]", n, N);
  std::sort(opt_.insert_row_buckets.begin(), opt_.insert_row_buckets.end());
  for (const auto& [rows, b] : opt_.step_graph_pairs) {
    const auto& buckets = opt_.insert_row_buckets;
    const auto& sizes = opt_.graph_batch_sizes;
    if (std::find(buckets.begin(), buckets.end(), rows) == buckets.end() ||
        std::find(sizes.begin(), sizes.end(), b) == sizes.end())
      fail("drafter options: step pair ({} rows, batch {}) needs an insert bucket and a graph batch size",
           rows, b);
  }
  Work& w = work_;
  const size_t i32 = sizeof(int32_t);
  const int64_t n_in = 2 * T + (kReqFields + kSampleFields + 2) * B, n_out = 5 * T;
  w.step_io = alloc(DType::i32, {n_in + n_out + 1});
  w.host_io = backend_.alloc_host(DType::i32, {n_in + n_out + 1});
  w.host_answer = backend_.alloc_host(DType::i32, {n_out + 1});
  w.step_in = w.step_io.view(0, DType::i32, {n_in});
  w.ids = w.step_in.view(0, DType::i32, {T});
  w.pos = w.step_in.view(T * i32, DType::i32, {T});
  w.requests = w.step_in.view(2 * T * i32, DType::i32, {B, kReqFields});
  w.sampling = w.step_in.view((2 * T + kReqFields * B) * i32, DType::i32, {B, kSampleFields});
  w.anchor = w.step_in.view((2 * T + (kReqFields + kSampleFields) * B) * i32, DType::i32, {B});
  w.prev = w.step_in.view((2 * T + (kReqFields + kSampleFields + 1) * B) * i32, DType::i32, {B});
  w.step_out = w.step_io.view(n_in * i32, DType::i32, {5, B, k});
  w.out_ids = w.step_out.view(0, DType::i32, {B, k});
  w.margin = w.step_out.view(T * i32, DType::f32, {B, k});
  w.conf = w.step_out.view(2 * T * i32, DType::f32, {B, k});
  w.conf_logit = w.step_out.view(3 * T * i32, DType::f32, {B, k});
  w.q_tok = w.step_out.view(4 * T * i32, DType::f32, {B, k});
  w.step_answer = w.step_io.view(n_in * i32, DType::i32, {n_out + 1});
  w.host_out = w.host_answer.view(0, DType::i32, {5, B, k});
  w.norm = alloc(DType::f32, {B, k, 2});
  w.host_ticket = w.host_answer.view(n_out * i32, DType::i32, {1});
  w.x = alloc(DType::bf16, {T, H});
  w.X = alloc(DType::bf16, {T, hc, H});
  w.collapsed = alloc(DType::bf16, {T, H});
  w.normed = alloc(DType::bf16, {T, H});
  w.y = alloc(DType::bf16, {T, H});
  w.pre0 = alloc(DType::f32, {T, hc});
  std::vector<float> pre0(static_cast<size_t>(T * hc), 0.0f);
  for (int64_t t = 0; t < T; ++t) pre0[static_cast<size_t>(t * hc)] = 1.0f;
  backend_.upload(w.pre0, pre0.data());
  for (Mix* m : {&w.attn, &w.ffn}) {
    m->pre = alloc(DType::f32, {T, hc});
    m->post = alloc(DType::f32, {T, hc});
    m->comb = alloc(DType::f32, {T, hc, hc});
  }
  w.qa = alloc(DType::bf16, {T, cfg.q_lora_rank});
  w.qa_n = alloc(DType::bf16, {T, cfg.q_lora_rank});
  w.q = alloc(DType::bf16, {T, heads, d});
  w.kv = alloc(DType::bf16, {T, d});
  w.kv_n = alloc(DType::bf16, {T, d});
  w.o = alloc(DType::bf16, {T, heads, d});
  w.oa = alloc(DType::bf16, {T, plan.groups.size() * cfg.o_lora_rank});
  w.attn_sum = comm_.make_exchange(alloc(DType::f32, {T, H}));
  w.ffn_sum = comm_.make_exchange(alloc(DType::f32, {T, H}));
  w.route_ids = alloc(DType::i32, {T, cfg.n_activated_experts});
  w.route_w = alloc(DType::f32, {T, cfg.n_activated_experts});
  w.y_routed = alloc(DType::f32, {T, cfg.n_activated_experts, H});
  w.y_shared = alloc(DType::f32, {T, H});
  w.h = alloc(DType::bf16, {T, H});
  w.h_n = alloc(DType::bf16, {T, H});
  w.logits = alloc(DType::f32, {T, plan.vocab.size()});
  for (Exchange& c : w.cand) c = comm_.make_exchange(alloc(DType::i32, {B, kMarkovRecordWords}));
  if (opt_.max_distributions < 0 || opt_.max_distributions > B)
    fail("drafter options: max_distributions {} outside [0, max_batch = {}]", opt_.max_distributions, B);
  if (const int64_t n = opt_.max_distributions * k; n > 0) {
    w.dist_meta = alloc(DType::i32, {2 * n});
    w.dist_rows = w.dist_meta.view(0, DType::i32, {n});
    w.dist_tokens = w.dist_meta.view(n * i32, DType::i32, {n});
    w.dist_bias = alloc(DType::f32, {n, plan.vocab.size()});
    w.dist_q = alloc(DType::f32, {n, cfg.vocab_size});
    if (comm_.rank() == 0) w.dist_host = backend_.alloc_host(DType::f32, {n, cfg.vocab_size});
  }
  // An insert's inputs in one buffer, ins_io = [positions, slots, row sources, rows], and its host image: a
  // chunk's positions, slots and the host addresses of its rows are one recorded copy, then one gather reads
  // the rows from those addresses (the caller's memory where the backend reads it in place, else host_rows).
  // The rows start 16-byte aligned (the few-row kernels' vector loads).
  const int64_t io_words = ins_rows_word(N) + (N * cfg.row_dim() + 1) / 2;
  w.ins_io = alloc(DType::i32, {io_words});
  w.host_ins = backend_.alloc_host(DType::i32, {io_words});
  w.rows = w.ins_io.view(ins_rows_word(N) * i32, DType::bf16, {N, cfg.row_dim()});
  w.host_rows = w.host_ins.view(ins_rows_word(N) * i32, DType::bf16, {N, cfg.row_dim()});
  w.host_meta = w.host_ins.view(0, DType::i32, {ins_rows_word(N)});
  w.main = alloc(DType::bf16, {N, H});
  w.main_x = alloc(DType::bf16, {N, H});
  for (int64_t i = 0; i < cfg.n_mtp_layers; ++i) {  // a stage's own: the stages may run together
    w.ins_kv.push_back(alloc(DType::bf16, {N, d}));
    w.ins_kv_n.push_back(alloc(DType::bf16, {N, d}));
  }
  alloc_act_codes(T, N);
  w.ins_meta = w.ins_io.view(0, DType::i32, {ins_rows_word(N)});
  w.ins_pos = w.ins_meta.view(0, DType::i32, {N});
  w.ins_slot = w.ins_meta.view(N * i32, DType::i32, {N});
  w.ins_src = w.ins_meta.view(2 * N * i32, DType::i64, {N});
  clear_staged_meta();  // no slot, no source: an insert before any staging reads and writes nothing
  markov_tokens_ = MarkovTokenBook(cfg.vocab_size, {});
  const int64_t room = opt_.markov_cache_rows > 0 ? opt_.markov_cache_rows
                                                  : static_cast<int64_t>(opt_.markov_cache_tokens.size());
  if (room > 0) {
    markov_cache_.rows = alloc(DType::f32, {room, plan.vocab.size()});
    markov_cache_.slot = alloc(DType::i32, {cfg.vocab_size});
  }
  set_markov_cache(opt_.markov_cache_tokens);
}

void Drafter::set_markov_cache(const std::vector<int32_t>& tokens) {
  const int64_t V = cfg_.vocab_size, n = static_cast<int64_t>(tokens.size());
  const int64_t room = markov_cache_.empty() ? 0 : markov_cache_.rows.dim(0);
  if (n > room) fail("Markov cache: {} tokens, room for {} (markov_cache.rows)", n, room);
  std::vector<int32_t> slot(static_cast<size_t>(V), -1);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tokens[static_cast<size_t>(i)];
    if (t < 0 || t >= V) fail("Markov cache: token {} outside [0, {})", t, V);
    if (slot[static_cast<size_t>(t)] >= 0) fail("Markov cache: token {} listed twice", t);
    slot[static_cast<size_t>(t)] = static_cast<int32_t>(i);
  }
  if (room > 0) {
    // No row is looked up while the rows are rewritten: a refill that fails leaves an empty cache, never a
    // table pointing at rows of other tokens.
    const std::vector<int32_t> none(static_cast<size_t>(V), -1);
    backend_.upload(markov_cache_.slot, none.data());
    markov_tokens_.set_cached({});
    if (n > 0) {
      const Tensor ids = alloc(DType::i32, {n});
      backend_.upload(ids, tokens.data());
      backend_.markov_bias_rows(w_.markov_head, w_.markov_head_tiles, w_.markov_embed, ids,
                                markov_cache_.rows.rows(0, n));
      backend_.synchronize();  // `ids` is released on return
    }
    backend_.upload(markov_cache_.slot, slot.data());
  }
  markov_tokens_.set_cached(tokens);
}

void Drafter::count_markov_tokens(int64_t B, DraftResult& r) {
  const int64_t k = cfg_.block_size;
  const int32_t* in = work_.host_io.as<const int32_t>();
  const int32_t* anchor = in + element_offset(work_.step_in, work_.anchor);
  const int32_t* reqs = in + element_offset(work_.step_in, work_.requests);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t outputs = reqs[b * kReqFields + kReqOutputs];
    for (int64_t j = 0; j < outputs && j < k; ++j) {
      const int32_t prev = j == 0 ? anchor[b] : r.ids[static_cast<size_t>(b * k + j - 1)];
      ++r.markov_lookups;
      if (markov_tokens_.cached(prev)) ++r.markov_hits;
      markov_tokens_.count(prev);
    }
  }
}

void Drafter::trace(const std::string& name, const Tensor& t) const {
  if (trace_) trace_(name, t);
}

void Drafter::check_replicated(const std::string& name, const Tensor& t) {
  if (opt_.check_replicated) verify_replicated(comm_, backend_, name, t);
}

void Drafter::reset(int64_t slot) {
  if (slot < 0 || slot >= opt_.slots) fail("reset: slot {} out of range [0, {})", slot, opt_.slots);
  for (const Tensor& pos : ring_pos_) backend_.ring_clear(pos, slot);
}

void Drafter::set_max_model_len(int64_t n) {
  if (n < 1) fail("max_model_len {} must be positive", n);
  opt_.max_model_len = n;
}

void Drafter::validate_inserts(std::span<const ContextBlock> blocks) const {
  validate_context_blocks(blocks, opt_.slots, opt_.max_model_len);
}

void Drafter::clear_staged_meta() {
  const int64_t N = opt_.max_insert_rows;
  int32_t* meta = work_.host_meta.as<int32_t>();
  std::fill_n(meta, 2 * N, -1);
  std::fill_n(reinterpret_cast<int64_t*>(meta + 2 * N), N, int64_t{0});
}

void Drafter::stage_insert(const bf16_t* rows, int64_t from, int64_t m) {
  // The staging is read by the insert's first ops: the one queued last must have run.
  if (staged_insert_pending_) backend_.synchronize();
  staged_insert_pending_ = false;
  const int64_t N = opt_.max_insert_rows, D = cfg_.row_dim();
  int32_t* meta = work_.host_meta.as<int32_t>();
  int64_t* sources = reinterpret_cast<int64_t*>(meta + 2 * N);
  // The insert's gather reads the rows where they lie when the backend can (page-locked row memory: no host
  // copy at all), else from host_rows.
  const bool in_place = backend_.reads_in_place(rows);
  bf16_t* staged = work_.host_rows.as<bf16_t>();
  for (int64_t i = 0; i < m; ++i) {
    const InsertRow& r = pack_[static_cast<size_t>(from + i)];
    meta[i] = r.pos;
    meta[N + i] = r.slot;
    const bf16_t* row = rows + r.src * D;
    if (!in_place) {
      std::memcpy(staged + i * D, row, static_cast<size_t>(D) * sizeof(bf16_t));
      row = staged + i * D;
    }
    sources[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(row));
  }
  std::fill(meta + m, meta + N, -1);  // positions past the chunk
  std::fill(meta + N + m, meta + 2 * N, -1);
  std::fill(sources + m, sources + N, int64_t{0});
  reads_caller_rows_ = reads_caller_rows_ || (in_place && m > 0);
}

void Drafter::insert_blocks(std::span<const ContextBlock> blocks, const bf16_t* rows) {
  validate_inserts(blocks);
  pack_insert_rows(blocks, cfg_.window_size, pack_, pack_seen_);
  insert_packed(rows);
  release_caller_rows();
}

void Drafter::release_caller_rows() {
  // The caller may free or reuse its rows on return: the inserts that read them must have run.
  if (reads_caller_rows_) backend_.synchronize();
  reads_caller_rows_ = false;
}

void Drafter::insert_packed(const bf16_t* rows) {
  const int64_t n = static_cast<int64_t>(pack_.size()), N = opt_.max_insert_rows;
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min(N, n - done);
    stage_insert(rows, done, m);
    const int64_t padded = insert_rows_for(m);
    const auto it = insert_graphs_.find(padded);
    if (graphs_usable() && it != insert_graphs_.end()) {
      last_insert_graph_ = it->second;
      backend_.replay(it->second);
      ++counts_.insert_replays;
    } else {
      last_insert_graph_ = nullptr;
      run_insert(padded);
      ++counts_.insert_eager;
    }
    staged_insert_pending_ = true;
    done += m;
  }
}

DraftResult Drafter::insert_and_draft(std::span<const ContextBlock> blocks, const bf16_t* rows,
                                      std::span<const DraftRequest> requests, bool with_margin) {
  validate_inserts(blocks);
  validate(requests);
  pack_insert_rows(blocks, cfg_.window_size, pack_, pack_seen_);
  const int64_t m = static_cast<int64_t>(pack_.size()), B = static_cast<int64_t>(requests.size());
  if (m > 0 && m <= opt_.max_insert_rows && graphs_usable() && !step_graphs_.empty()) {
    const int64_t padded = insert_rows_for(m);
    int64_t max_outputs = 0;
    for (const DraftRequest& r : requests)
      max_outputs = std::max<int64_t>(max_outputs, r.outputs == 0 ? cfg_.block_size : r.outputs);
    const auto it = step_graphs_.find({padded, B, max_outputs, any_draws(requests)});
    if (it != step_graphs_.end()) {
      stage_insert(rows, 0, m);
      stage_draft(requests);
      last_draft_graph_ = nullptr;  // the recording holds the insert too: replay_last_draft has none
      last_insert_graph_ = nullptr;
      backend_.replay(it->second);
      ++counts_.step_replays;
      ShapeCount& c = shapes_[{B, max_outputs}];
      ++c.steps;
      ++c.replayed;
      DraftResult r = finish_draft(requests, with_margin);
      reads_caller_rows_ = false;  // read before the answer the draft waited for
      return r;
    }
  }
  insert_packed(rows);
  DraftResult r = draft_checked(requests, with_margin);
  reads_caller_rows_ = false;
  return r;
}

int64_t Drafter::insert_rows_for(int64_t m) const {
  if (!backend_.supports_graphs()) return m;
  for (const int64_t b : opt_.insert_row_buckets)
    if (b >= m) return b;
  return m;
}

void Drafter::run_insert(int64_t m) {
  Work& w = work_;
  const float eps = static_cast<float>(cfg_.norm_eps);
  const Tensor x = w.rows.rows(0, m), main = w.main.rows(0, m), main_x = w.main_x.rows(0, m);
  const Tensor pos = w.ins_pos.rows(0, m), slots = w.ins_slot.rows(0, m);
  backend_.copy(w.host_meta, w.ins_meta);
  backend_.gather_host_rows(w.ins_src.rows(0, m), x);
  backend_.linear(x, w_.main_proj, main);
  backend_.rms_norm_coded(main, w_.main_norm, eps, main_x, w.main_x_codes);
  std::vector<InsertKvStage>& stages = insert_stages_;
  stages.resize(static_cast<size_t>(cfg_.n_mtp_layers));
  for (size_t i = 0; i < stages.size(); ++i)
    stages[i] = {&w_.stages[i].wkv, w_.stages[i].kv_norm,   ring_kv_[i],
                 ring_pos_[i],      w.ins_kv[i].rows(0, m), w.ins_kv_n[i].rows(0, m)};
  backend_.insert_kv_rows(main_x, w.main_x_codes, stages, pos, slots,
                          {eps, cfg_.rope_head_dim, cfg_.rope_theta, cfg_.weight_block_size});
}

void Drafter::alloc_act_codes(int64_t T, int64_t N) {
  Work& w = work_;
  // One block per activation, its first quantised reader's (a reader of another block quantises its input
  // itself).
  std::vector<const LinearWeight*> normed_readers, qa_n_readers, main_x_readers, h_n_readers{&w_.head};
  for (const StageWeights& s : w_.stages) {
    normed_readers.insert(normed_readers.end(), {&s.wq_a, &s.wkv, &s.shared.w1});
    if (!s.experts.empty()) normed_readers.push_back(&s.experts.front().w1);
    qa_n_readers.push_back(&s.wq_b);
    main_x_readers.push_back(&s.wkv);
  }
  const auto codes = [&](int64_t rows, int64_t cols, const std::vector<const LinearWeight*>& readers) {
    const int64_t block = quantised_input_block(readers);
    return block > 0 ? backend_.alloc_act_codes(rows, cols, block) : ActCodes{};
  };
  w.normed_codes = codes(T, cfg_.dim, normed_readers);
  w.qa_n_codes = codes(T, cfg_.q_lora_rank, qa_n_readers);
  w.h_n_codes = codes(T, cfg_.dim, h_n_readers);
  w.main_x_codes = codes(N, cfg_.dim, main_x_readers);
}

bool Drafter::graphs_usable() const {
  return opt_.use_graphs && backend_.supports_graphs() && !trace_ && !opt_.check_replicated;
}

void Drafter::capture_graphs() {
  if (!opt_.use_graphs || !backend_.supports_graphs() || opt_.check_replicated) return;
  const auto record = [&](auto&& body) {
    body();  // eagerly first: scratch and library workspaces grow outside the recording
    backend_.begin_capture();
    try {
      body();
    } catch (...) {
      backend_.end_capture();
      throw;
    }
    std::shared_ptr<void> g = backend_.end_capture();
    if (!g) fail("graph capture failed");
    return g;
  };
  // The eager warm-ups read whatever the input buffers hold; no slot is written and no row read (every
  // staged insert slot is -1, every source 0; the last insert has run).
  backend_.synchronize();
  clear_staged_meta();
  staged_insert_pending_ = false;
  // Every shape twice: greedy batches, and batches with a sampled request.
  for (const bool draws : {false, true})
    for (const int64_t B : opt_.graph_batch_sizes)
      for (int64_t kp = 1; kp <= cfg_.block_size; ++kp)
        if (!draft_graphs_.contains({B, kp, draws}))
          draft_graphs_[{B, kp, draws}] = record([&] { run_draft(B, kp, draws); });
  for (const int64_t n : opt_.insert_row_buckets)
    if (!insert_graphs_.contains(n)) insert_graphs_[n] = record([&] { run_insert(n); });
  for (const bool draws : {false, true})
    for (const auto& [n, B] : opt_.step_graph_pairs)
      for (int64_t kp = 1; kp <= cfg_.block_size; ++kp)
        if (!step_graphs_.contains({n, B, kp, draws}))
          step_graphs_[{n, B, kp, draws}] = record([&] {
            // A latency-bound insert runs beside the draft's first kernels: the draft needs its rows only
            // in stage 0's attention, whose join_side() joins the insert too. A larger chunk streams its
            // weights at the bandwidth those kernels need, so it runs first.
            const auto insert = [&] { run_insert(n); };
            if (n <= kInsertBesideDraftMaxRows)
              on_side(backend_, insert, Backend::SideLane::insert);
            else
              insert();
            run_draft(B, kp, draws);
          });
  backend_.synchronize();
  counts_.draft_graphs = static_cast<int64_t>(draft_graphs_.size());
  counts_.insert_graphs = static_cast<int64_t>(insert_graphs_.size());
  counts_.step_graphs = static_cast<int64_t>(step_graphs_.size());
}

bool Drafter::replay_last_insert() {
  if (!last_insert_graph_) return false;
  backend_.replay(last_insert_graph_);
  return true;
}

bool Drafter::replay_last_draft() {
  if (!last_draft_graph_) return false;
  backend_.replay(last_draft_graph_);
  return true;
}

void Drafter::validate(std::span<const DraftRequest> requests) const {
  validate_draft_batch(requests, {opt_.max_batch, opt_.slots, cfg_.vocab_size, opt_.max_model_len,
                                  cfg_.block_size, opt_.max_distributions});
}

void Drafter::attention_half(const StageWeights& s, int64_t stage, int64_t T, const Tensor& pre) {
  Work& w = work_;
  const float eps = static_cast<float>(cfg_.norm_eps);
  const MixParams mp{eps, static_cast<float>(cfg_.hc_eps), cfg_.hc_sinkhorn_iters};
  const Tensor X = w.X.rows(0, T), normed = w.normed.rows(0, T), pos = w.pos.rows(0, T);
  const Mix m{w.attn.pre.rows(0, T), w.attn.post.rows(0, T), w.attn.comb.rows(0, T)};
  // Side branch: this half's mixes, needed from the expand on (the collapse uses the delayed `pre`), joined
  // with the KV row's before the attention.
  on_side(backend_, [&] { backend_.hc_mixes(X, s.hc_attn, mp, m.pre, m.post, m.comb); });
  backend_.hc_collapse_norm_coded(X, pre, s.attn_norm, eps, w.collapsed.rows(0, T), normed, w.normed_codes);

  // Side branch (after the mixes): the KV row, beside the query path; both only read `normed`.
  const Tensor kv = w.kv.rows(0, T), kv_n = w.kv_n.rows(0, T);
  on_side(backend_, [&] {
    backend_.linear_coded(normed, w.normed_codes, s.wkv, kv);
    backend_.kv_norm_rope_qdq(kv, s.kv_norm, eps, pos, cfg_.rope_head_dim, cfg_.rope_theta,
                              cfg_.weight_block_size, kv_n);
  });

  const Tensor qa = w.qa.rows(0, T), qa_n = w.qa_n.rows(0, T), q = w.q.rows(0, T);
  backend_.linear_coded(normed, w.normed_codes, s.wq_a, qa);
  backend_.rms_norm_coded(qa, s.q_norm, eps, qa_n, w.qa_n_codes);
  backend_.linear_coded(qa_n, w.qa_n_codes, s.wq_b, q);
  backend_.rope(q, pos, cfg_.rope_head_dim, cfg_.rope_theta, false);
  backend_.join_side();  // the mixes and the KV row (and, in stage 0, an insert issued beside the draft)
  trace(fmt::format("stage{}.block_kv", stage), kv_n);

  const Tensor o = w.o.rows(0, T);
  backend_.attention_inverse_rope(q, kv_n, ring_kv_[static_cast<size_t>(stage)],
                                  ring_pos_[static_cast<size_t>(stage)],
                                  w.requests.rows(0, T / cfg_.block_size), s.attn_sink, cfg_.block_size, pos,
                                  cfg_.rope_head_dim, cfg_.rope_theta, o);
  const Tensor oa = w.oa.rows(0, T);
  backend_.grouped_linear(o.reshaped({T, o.numel() / T}), s.wo_a, plan_.groups.size(), oa);
  const Tensor partial = w.attn_sum.buffer().rows(0, T), y = w.y.rows(0, T);
  backend_.linear(oa, s.wo_b, partial);
  backend_.sum_and_expand(w.attn_sum, y, X, m.post, m.comb);
  trace(fmt::format("stage{}.attn_out", stage), y);
  trace(fmt::format("stage{}.after_attn", stage), X);
  check_replicated(fmt::format("stage {} after attention", stage), X);
}

void Drafter::ffn_half(const StageWeights& s, int64_t stage, int64_t T) {
  Work& w = work_;
  const float eps = static_cast<float>(cfg_.norm_eps);
  const MixParams mp{eps, static_cast<float>(cfg_.hc_eps), cfg_.hc_sinkhorn_iters};
  const Tensor X = w.X.rows(0, T), normed = w.normed.rows(0, T);
  const Mix m{w.ffn.pre.rows(0, T), w.ffn.post.rows(0, T), w.ffn.comb.rows(0, T)};
  // V4.1's delayed pre-mix: the attention half's pre.
  backend_.hc_collapse_norm_coded(X, w.attn.pre.rows(0, T), s.ffn_norm, eps, w.collapsed.rows(0, T), normed,
                                  w.normed_codes);
  // Side branch: the shared expert, which needs no routing, beside the (latency-bound) routing; then this
  // half's mixes, needed from the expand on.
  const float limit = static_cast<float>(cfg_.swiglu_limit);
  const Tensor y_shared = w.y_shared.rows(0, T), y_routed = w.y_routed.rows(0, T);
  on_side(backend_, [&] {
    backend_.moe_shared_expert(normed, w.normed_codes, s, limit, y_shared);
    backend_.hc_mixes(X, s.hc_ffn, mp, m.pre, m.post, m.comb);
  });

  const RouteParams rp{cfg_.n_activated_experts, static_cast<float>(cfg_.route_scale),
                       static_cast<float>(cfg_.gate_temp), cfg_.norm_topk_prob};
  const Tensor ids = w.route_ids.rows(0, T), rw = w.route_w.rows(0, T);
  backend_.moe_route(normed, s.gate, s.gate_bias, rp, ids, rw);
  trace(fmt::format("stage{}.route_ids", stage), ids);
  check_replicated(fmt::format("stage {} routing", stage), ids);
  trace(fmt::format("stage{}.route_w", stage), rw);
  const Tensor partial = w.ffn_sum.buffer().rows(0, T), y = w.y.rows(0, T);
  backend_.moe_routed_experts(normed, w.normed_codes, ids, rw, s, limit, y_routed);
  backend_.join_side();  // the mixes and the shared expert
  backend_.moe_combine(ids, y_routed, y_shared, static_cast<int64_t>(s.experts.size()), partial);
  backend_.sum_and_expand(w.ffn_sum, y, X, m.post, m.comb);
  trace(fmt::format("stage{}.moe_out", stage), y);
  trace(fmt::format("stage{}.after_ffn", stage), X);
  check_replicated(fmt::format("stage {} after the FFN", stage), X);
}

DraftResult Drafter::draft(std::span<const DraftRequest> requests, bool with_margin) {
  validate(requests);
  return draft_checked(requests, with_margin);
}

DraftResult Drafter::draft_checked(std::span<const DraftRequest> requests, bool with_margin) {
  const int64_t B = static_cast<int64_t>(requests.size());
  const int64_t max_outputs = stage_draft(requests);
  const bool draws = any_draws(requests);
  last_draft_graph_ = draft_graph(B, max_outputs, draws);
  ShapeCount& shape = shapes_[{B, max_outputs}];
  ++shape.steps;
  shape.replayed += last_draft_graph_ ? 1 : 0;
  if (last_draft_graph_) {
    backend_.replay(last_draft_graph_);
    ++counts_.draft_replays;
  } else {
    run_draft(B, max_outputs, draws);
    ++counts_.draft_eager;
  }
  return finish_draft(requests, with_margin);
}

std::shared_ptr<void> Drafter::draft_graph(int64_t B, int64_t max_outputs, bool draws) {
  if (!graphs_usable()) return nullptr;
  const auto it = draft_graphs_.find({B, max_outputs, draws});
  if (it != draft_graphs_.end()) return it->second;
  if (unrecorded_logged_.insert({B, max_outputs}).second)
    spdlog::warn(
        "a draft step of batch {}, k' {} has no recording (graphs.batch_sizes): it runs eagerly, with more "
        "launch overhead; logged once per shape",
        B, max_outputs);
  return nullptr;
}

int64_t Drafter::stage_draft(std::span<const DraftRequest> requests) {
  const int64_t B = static_cast<int64_t>(requests.size()), k = cfg_.block_size;
  Work& w = work_;
  // The host image of step_io, written in place: step_in's parts where their views (made in the constructor)
  // lie, and step_out's zeros (positions past a request's outputs keep them). The previous step has finished
  // with it (its answer was waited for).
  int32_t* in = w.host_io.as<int32_t>();
  std::fill_n(in, w.host_io.numel(), 0);
  int32_t* ids = in + element_offset(w.step_in, w.ids);
  int32_t* pos = in + element_offset(w.step_in, w.pos);
  int32_t* req = in + element_offset(w.step_in, w.requests);
  int32_t* sampling = in + element_offset(w.step_in, w.sampling);
  int32_t* anchor = in + element_offset(w.step_in, w.anchor);
  int32_t* prev = in + element_offset(w.step_in, w.prev);
  int64_t max_outputs = 0;
  // The block: tokens [a, noise, ...], positions clamped to max_model_len - 1.
  for (int64_t b = 0; b < B; ++b) {
    const DraftRequest& r = requests[static_cast<size_t>(b)];
    for (int64_t j = 0; j < k; ++j) {
      ids[b * k + j] = j == 0 ? r.anchor_token : static_cast<int32_t>(cfg_.noise_token_id);
      pos[b * k + j] = static_cast<int32_t>(std::min<int64_t>(r.anchor_pos + j, opt_.max_model_len - 1));
    }
    const int64_t default_low = std::max<int64_t>(0, r.anchor_pos - cfg_.window_size);
    int32_t* f = req + b * kReqFields;
    f[kReqSlot] = r.slot;
    f[kReqLow] = static_cast<int32_t>(std::max<int64_t>(default_low, r.window_low));
    f[kReqAnchorPos] = r.anchor_pos;
    f[kReqOutputs] = r.outputs == 0 ? static_cast<int32_t>(k) : r.outputs;
    max_outputs = std::max<int64_t>(max_outputs, f[kReqOutputs]);
    int32_t* g = sampling + b * kSampleFields;
    g[kSampleTemperature] = std::bit_cast<int32_t>(r.temperature == 0.0f ? 0.0f : r.temperature);  // no -0
    g[kSampleSeedLow] = static_cast<int32_t>(static_cast<uint32_t>(r.seed));
    g[kSampleSeedHigh] = static_cast<int32_t>(static_cast<uint32_t>(r.seed >> 32));
    g[kSampleFlags] = r.distribution ? kSampleWantsDistribution : 0;
    anchor[b] = r.anchor_token;
    prev[b] = r.anchor_token;  // the Markov loop's previous token starts at the anchor
  }
  // The step's ticket, last in step_io: the answer's copy brings it back last (Backend::copy), so it
  // appearing in host_answer means the answer is there. Never 0 (host_answer's first contents).
  staged_ticket_ = static_cast<int32_t>(tickets_++ % 0x7fffffffu) + 1;
  in[w.host_io.numel() - 1] = staged_ticket_;
  return max_outputs;
}

DraftResult Drafter::finish_draft(std::span<const DraftRequest> requests, bool with_margin) {
  const int64_t B = static_cast<int64_t>(requests.size()), k = cfg_.block_size, T = B * k;
  Work& w = work_;
  backend_.wait_for_word(w.host_ticket, staged_ticket_);
  staged_insert_pending_ = false;  // the step, its insert included, has run
  comm_.check_exchanges();         // a peer that never arrived fails the step (ExchangeTimeout)
  // host_out holds ids, margins, confidences and their logits; each answer is the first T elements of its
  // view.
  const int32_t* out = w.host_out.as<int32_t>();
  const auto take = [&](const Tensor& view, auto& dst) {
    dst.resize(static_cast<size_t>(T));
    std::memcpy(dst.data(), out + element_offset(w.step_out, view), static_cast<size_t>(T) * 4);
  };
  DraftResult r;
  r.batch = B;
  r.k = k;
  take(w.out_ids, r.ids);
  take(w.conf, r.conf);
  take(w.conf_logit, r.conf_logit);
  take(w.q_tok, r.q);
  r.margin.assign(static_cast<size_t>(T), 0.0f);
  if (with_margin) take(w.margin, r.margin);
  count_markov_tokens(B, r);
  if (distributions_asked(requests) > 0) add_distributions(requests, r);
  return r;
}

void Drafter::add_distributions(std::span<const DraftRequest> requests, DraftResult& r) {
  const int64_t k = cfg_.block_size, V = cfg_.vocab_size, N = work_.dist_rows.numel();
  Work& w = work_;
  std::vector<int32_t> meta(static_cast<size_t>(2 * N), 0);  // [rows, tokens]
  int64_t n = 0;
  for (size_t b = 0; b < requests.size(); ++b) {
    const DraftRequest& q = requests[b];
    if (!q.distribution) continue;
    const int64_t outputs = q.outputs == 0 ? k : q.outputs;
    for (int64_t j = 0; j < outputs; ++j, ++n) {
      if (n >= N) fail("draft: more distribution rows than max_distributions {} x k", opt_.max_distributions);
      meta[static_cast<size_t>(n)] = static_cast<int32_t>(static_cast<int64_t>(b) * k + j);
      meta[static_cast<size_t>(N + n)] =
          j == 0 ? q.anchor_token : r.ids[static_cast<size_t>(static_cast<int64_t>(b) * k + j - 1)];
    }
  }
  if (n == 0) return;
  const int64_t B = static_cast<int64_t>(requests.size());
  backend_.upload(w.dist_meta, meta.data());
  const Tensor rows = w.dist_rows.rows(0, n), q = w.dist_q.rows(0, n), bias = w.dist_bias.rows(0, n);
  backend_.markov_bias_rows(w_.markov_head, w_.markov_head_tiles, w_.markov_embed, w.dist_tokens.rows(0, n),
                            bias);
  backend_.draft_distribution(w.logits.rows(0, B * k), bias, rows, w.sampling.rows(0, B), w.norm.rows(0, B),
                              k, plan_.vocab.begin, q);
  comm_.all_reduce_sum(q);  // every other rank's columns are 0 here: the sum is each rank's q, exactly
  if (comm_.rank() != 0) {
    backend_.synchronize();
    return;
  }
  const Tensor host = w.dist_host.rows(0, n);
  backend_.copy(q, host);
  backend_.synchronize();
  const float* image = host.as<const float>();
  r.distribution.assign(image, image + n * V);
  r.distribution_rows.assign(meta.begin(), meta.begin() + n);
}

void Drafter::run_draft(int64_t B, int64_t max_outputs, bool draws) {
  Work& w = work_;
  const int64_t k = cfg_.block_size, T = B * k;
  backend_.copy(w.host_io, w.step_io);  // the requests, and the answer's zeros
  backend_.embed(w_.embed, w.ids.rows(0, T), w.x.rows(0, T));
  backend_.hc_replicate(w.x.rows(0, T), w.X.rows(0, T));
  Tensor pre = w.pre0.rows(0, T);
  for (int64_t i = 0; i < cfg_.n_mtp_layers; ++i) {
    const StageWeights& s = w_.stages[static_cast<size_t>(i)];
    attention_half(s, i, T, pre);
    ffn_half(s, i, T);
    pre = w.ffn.pre.rows(0, T);
  }

  // Head on the collapsed, normed stream; the hidden h stays pre-norm for the confidence head.
  const Tensor h = w.h.rows(0, T), logits = w.logits.rows(0, T);
  backend_.hc_collapse_norm_coded(w.X.rows(0, T), pre, w_.final_norm, static_cast<float>(cfg_.norm_eps), h,
                                  w.h_n.rows(0, T), w.h_n_codes);
  trace("head_hidden", h);
  backend_.linear_coded(w.h_n.rows(0, T), w.h_n_codes, w_.head, logits);
  trace("base_logits", logits);

  const Tensor out_ids = w.out_ids.rows(0, B);
  const MarkovOutputs outputs{out_ids, w.margin.rows(0, B), w.q_tok.rows(0, B), w.norm.rows(0, B)};
  const Tensor reqs = w.requests.rows(0, B), prev = w.prev.rows(0, B);
  const auto confidence = [&] {
    backend_.confidence(h, w_.markov_embed, w_.confidence_proj, w.anchor.rows(0, B), out_ids, reqs, k,
                        w.conf.rows(0, B), w.conf_logit.rows(0, B));
  };
  for (int64_t j = 0; j < max_outputs; ++j) {
    // The confidence of position j reads the token before it (the anchor, or output j - 1): before the last
    // position every one it reads is committed, so it runs beside that position instead of after it.
    if (j == max_outputs - 1) on_side(backend_, confidence);
    const Exchange& records = w.cand[j % 2];
    // A greedy batch passes no sampling fields: the backend may then leave out the draw's arithmetic.
    backend_.markov_top2(logits, w_.markov_head, w_.markov_head_tiles, w_.markov_embed, prev, reqs,
                         draws ? w.sampling.rows(0, B) : Tensor{}, j, k, plan_.vocab.begin, markov_cache_,
                         records.buffer().rows(0, B));
    backend_.commit_markov(records, reqs, j, prev, outputs);
  }
  if (max_outputs < 1) confidence();
  backend_.join_side();  // the confidence
  trace("conf_logit", w.conf_logit.rows(0, B));
  backend_.copy(w.step_answer, w.host_answer);  // the ticket last
}

}  // namespace dspark
