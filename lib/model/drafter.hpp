// The DSpark drafter of SPEC §4, written once against a Backend (where tensors live and ops run) and a
// Communicator (what crosses ranks). Holds the slots' KV rings; every rank of a tp group runs the same calls.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "comm/communicator.hpp"
#include "lib/api/draft_types.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/numeric.hpp"
#include "lib/model/backend.hpp"
#include "lib/model/draft_engine.hpp"
#include "lib/model/insert_pack.hpp"
#include "lib/model/markov_cache.hpp"
#include "lib/model/shard_plan.hpp"
#include "lib/model/weights.hpp"

namespace dspark {

struct DrafterOptions {
  int64_t slots = 8;
  int64_t max_batch = 16;           // draft requests per call
  int64_t max_insert_rows = 256;    // rows per internal insert chunk (bigger inserts are chunked)
  int64_t max_model_len = 1 << 20;  // positions are clamped to max_model_len - 1
  // Replay the recordings capture_graphs() makes, when the backend can record (the cpu backend cannot).
  bool use_graphs = false;
  // Draft steps capture_graphs() records: these batch sizes (each <= max_batch), every k' from 1 to k. Other
  // batch sizes run eagerly. (The worker passes graphs.batch_sizes.)
  std::vector<int64_t> graph_batch_sizes;
  // Context-insert buckets (each <= max_insert_rows): on a backend with graphs, a chunk of m rows runs as the
  // smallest bucket >= m, the extra rows written nowhere, recorded or not (so both give the same bits).
  std::vector<int64_t> insert_row_buckets;
  // A step's inserts and draft recorded as one (insert bucket, batch size) pair, for every k' from 1 to k:
  // each bucket one of insert_row_buckets, each batch size one of graph_batch_sizes.
  std::vector<std::pair<int64_t, int64_t>> step_graph_pairs;
  bool check_replicated = false;  // compare hashes of replicated activations across ranks every half (eager)
  // The Markov bias cache (SPEC §4): room for markov_cache_rows previous tokens' bias rows over this rank's
  // vocabulary shard (V_r x 4 bytes each), read instead of markov_head; markov_cache_tokens (distinct ids in
  // [0, V), at most markov_cache_rows of them; with rows 0, as many rows as tokens) fill it at construction
  // and set_markov_cache() refills it. No rows: no cache.
  int64_t markov_cache_rows = 0;
  std::vector<int32_t> markov_cache_tokens;
  // Draft requests per batch that may ask for their whole draft distribution (SPEC §4): each takes k x V x 4
  // bytes of workspace for it, and the distribution pass after the step.
  int64_t max_distributions = 1;
};

// What capture_graphs() recorded, and how the calls since ran.
struct GraphCounts {
  int64_t draft_graphs = 0, insert_graphs = 0;   // recordings held
  int64_t draft_replays = 0, draft_eager = 0;    // draft steps since construction
  int64_t insert_replays = 0, insert_eager = 0;  // insert chunks since construction
  int64_t step_graphs = 0, step_replays = 0;     // inserts + draft as one recording: held, replayed
};

// Called with named intermediates (e.g. "stage0.after_attn") during a draft when set: for parity checks.
using TraceFn = std::function<void(const std::string& name, const Tensor& t)>;

class Drafter final : public DraftEngine {
 public:
  Drafter(const ModelConfig& cfg, DrafterWeights weights, const ShardPlan& plan, Backend& backend,
          Communicator& comm, const DrafterOptions& options);

  const ModelConfig& config() const { return cfg_; }
  const DrafterOptions& options() const { return opt_; }
  const DrafterWeights& weights() const { return w_; }
  int64_t row_dim() const override { return cfg_.row_dim(); }

  // The rows that survive the blocks (insert_pack.hpp) go through as few chunks as max_insert_rows allows,
  // rows of several slots in one chunk.
  void insert_blocks(std::span<const ContextBlock> blocks, const bf16_t* rows) override;
  void validate_inserts(std::span<const ContextBlock> blocks) const override;
  // One replay for both where a step_graph_pairs recording fits (the surviving rows in one chunk).
  DraftResult insert_and_draft(std::span<const ContextBlock> blocks, const bf16_t* rows,
                               std::span<const DraftRequest> requests, bool with_margin) override;
  // One batch of requests. Throws dspark::Error on an invalid request (nothing changes: drafting is
  // read-only).
  DraftResult draft(std::span<const DraftRequest> requests, bool with_margin = true) override;
  void reset(int64_t slot) override;
  // The checks draft() starts with, on their own (the step loop agrees on them across ranks before any
  // collective runs).
  void validate(std::span<const DraftRequest> requests) const override;
  // Positions clamp to n - 1 from now on (n <= the max_model_len the drafter was built with: the workspace
  // does not depend on it, but the host's view of the limit must only shrink or return).
  void set_max_model_len(int64_t n) override;

  void set_trace(TraceFn fn) { trace_ = std::move(fn); }

  // Records the draft steps of options().graph_batch_sizes and the insert buckets (each shape runs once
  // eagerly first, so lazy allocations happen outside the recording). A collective call: every rank of the
  // group makes it at the same point. Does nothing without use_graphs, on a backend without graphs, or with
  // check_replicated (which reads back mid-step). Start-up work: the worker calls it before serving.
  void capture_graphs();
  GraphCounts graph_counts() const { return counts_; }
  // Draft steps run since construction per shape (B, k'), and how many of them replayed a recording: the
  // shapes an engine actually sends, to choose graphs.batch_sizes by.
  struct ShapeCount {
    int64_t steps = 0, replayed = 0;
  };
  const std::map<std::pair<int64_t, int64_t>, ShapeCount>& draft_shapes() const { return shapes_; }
  // Replays the recording the last draft() replayed, on its requests still in place (no planning, no wait
  // for the answer): the device time of a replay alone, which the benchmark reports beside the whole call. A
  // collective call. False when the last draft ran eagerly (or there was none).
  bool replay_last_draft();
  // The same for the last insert chunk's recording, on its staged rows still in place (re-inserting them
  // leaves the rings as the chunk did): the insert's device time without the host's staging. False when the
  // last chunk ran eagerly (or there was none).
  bool replay_last_insert();
  // Whether the step's exchanges read the ranks' buffers in peer memory (the sums inside the expand, the
  // argmax exchanges inside the commit) rather than run the communicator's collectives.
  bool peer_exchange() const { return work_.attn_sum.peers() != nullptr; }
  // Rows an insert chunk of m rows runs as (m, or its bucket on a backend with graphs).
  int64_t insert_rows_for(int64_t m) const;
  // The previous tokens the drafts' Markov positions saw, and the cache's hits among them.
  const MarkovTokenBook& markov_tokens() const { return markov_tokens_; }
  // Refills the Markov bias cache with these tokens' rows (distinct ids in [0, V), at most the room the
  // options gave; empty: no token cached). The recordings read the cache's fixed buffers, so they stay
  // valid. A collective call: every rank with the same tokens, between steps.
  void set_markov_cache(const std::vector<int32_t>& tokens);

 private:
  struct Mix {
    Tensor pre, post, comb;
  };
  void attention_half(const StageWeights& s, int64_t stage, int64_t T, const Tensor& pre);
  void ffn_half(const StageWeights& s, int64_t stage, int64_t T);
  // insert_blocks and draft after their checks: the rows of pack_ staged and written, the batch run.
  void insert_packed(const bf16_t* rows);
  DraftResult draft_checked(std::span<const DraftRequest> requests, bool with_margin);
  void trace(const std::string& name, const Tensor& t) const;
  void check_replicated(const std::string& name, const Tensor& t);
  // Everything of a draft from the copy of its request data (host_io) to the copy of its answer
  // (host_answer): the part a graph records. Reads only fixed buffers, so one recording serves every batch of
  // the same shape.
  // draws: a request of the batch is sampled (else the Markov loop passes no sampling fields).
  void run_draft(int64_t B, int64_t max_outputs, bool draws);

  // The device part of an insert chunk of `rows` rows: the staged positions, slots and row addresses
  // (host_meta; slot -1 = skip, address 0 = no row) copied in, the rows gathered from those addresses, then
  // the KV rows written. Recordable.
  void run_insert(int64_t rows);
  // Writes the positions, slots and host addresses of rows pack_[from, from + m) into host_meta (after the
  // last insert has read them): the caller's rows where the backend reads them in place, else their copies
  // in host_rows.
  void stage_insert(const bf16_t* rows, int64_t from, int64_t m);
  // host_meta with no slot and no source in any entry.
  void clear_staged_meta();
  // Waits for the inserts that read the caller's rows, before a call that took them returns.
  void release_caller_rows();
  // Writes the batch into host_io with a fresh ticket; returns the largest k' asked.
  int64_t stage_draft(std::span<const DraftRequest> requests);
  // Waits for the staged draft's answer and returns it.
  DraftResult finish_draft(std::span<const DraftRequest> requests, bool with_margin);
  // Counts the previous tokens of the answered batch's Markov positions (markov_tokens_, and r's counts).
  void count_markov_tokens(int64_t B, DraftResult& r);
  // The whole draft distribution of the answered batch's requests that asked for it, into r (rank 0): every
  // asked position's bias row (markov_bias_rows, the step's bits), its q over this rank's columns
  // (draft_distribution), summed over the ranks (the other columns are 0: the sum is exact). A collective
  // call, made by every rank after the same batch; eager, after the step's recording.
  void add_distributions(std::span<const DraftRequest> requests, DraftResult& r);
  // The recording for a draft of (B, k'), or null (then logged once per shape while graphs are on).
  std::shared_ptr<void> draft_graph(int64_t B, int64_t max_outputs, bool draws);
  bool graphs_usable() const;
  Tensor alloc(DType t, Shape s) { return backend_.alloc(t, std::move(s)); }
  // Work's activation codes for steps of up to T rows and inserts of up to N.
  void alloc_act_codes(int64_t T, int64_t N);

  ModelConfig cfg_;
  DrafterWeights w_;
  ShardPlan plan_;
  Backend& backend_;
  Communicator& comm_;
  DrafterOptions opt_;
  TraceFn trace_;

  std::vector<Tensor> ring_kv_, ring_pos_;  // per stage: [slots, W, d] bf16, [slots, W] i32
  // (B, max k', a request draws) -> recording
  std::map<std::tuple<int64_t, int64_t, bool>, std::shared_ptr<void>> draft_graphs_;
  std::shared_ptr<void> last_draft_graph_;  // the recording the last draft() replayed; empty: it ran eagerly
  std::map<int64_t, std::shared_ptr<void>> insert_graphs_;  // rows -> recording
  std::shared_ptr<void> last_insert_graph_;  // the recording the last insert chunk replayed; empty: eager
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, std::shared_ptr<void>>
      step_graphs_;                                          // (rows, B, k', draws)
  std::set<std::pair<int64_t, int64_t>> unrecorded_logged_;  // draft shapes logged as running eagerly
  std::map<std::pair<int64_t, int64_t>, ShapeCount> shapes_;
  std::vector<InsertRow> pack_;               // the surviving rows of the current insert
  std::vector<InsertKvStage> insert_stages_;  // run_insert's, kept for its capacity
  std::unordered_set<uint64_t> pack_seen_;
  bool staged_insert_pending_ = false;  // an insert queued since the host last waited for the device
  bool reads_caller_rows_ = false;      // an insert reading the caller's rows queued since then
  GraphCounts counts_;
  MarkovCache markov_cache_;
  MarkovTokenBook markov_tokens_;
  uint32_t tickets_ = 0;       // draft steps started (Work::step_io's ticket)
  int32_t staged_ticket_ = 0;  // the ticket stage_draft wrote last

  // Workspace for the largest step; a call uses the leading rows.
  struct Work {
    // A draft's inputs and answer live in one buffer, step_io = [step_in, step_out, ticket]; the tensors
    // below view it. The step copies host_io into step_io first (the requests, zeros for the answer, the
    // ticket) and step_answer = [step_out, ticket] into host_answer last (Backend::copy, inside a recording
    // too): the host writes host_io before the step and reads host_out once host_ticket shows the step's
    // ticket (Backend::wait_for_word), with no transfer or stream sync of its own.
    Tensor step_io, step_in, step_out, step_answer;  // i32 [n_in + 5 T + 1], [n_in = 2 T + 10 B], [5, B, k]
    Tensor host_io, host_answer, host_out, host_ticket;  // alloc_host: step_io's image; [5 T + 1] and views
    Tensor ids, pos, requests, sampling, anchor, prev;   // i32: [T], [T], [B, 4], [B, 4], [B], [B] (step_in)
    Tensor x, X, collapsed, normed, y;                   // [T, H], [T, hc, H], [T, H] x3
    Tensor pre0;                                         // [T, hc] f32: [1, 0, 0, 0] (stage 0's pre-mix)
    Mix attn, ffn;
    Tensor qa, qa_n, q, kv, kv_n, o, oa;  // attention
    // The exchange points (Communicator::make_exchange): the [T, H] f32 partials of the two halves, summed
    // over the ranks by Backend::sum_and_expand, and the [B] Markov records, two used in turn by position
    // (Backend::commit_markov). No point serves two exchanges in a row, as peer memory requires: the halves
    // alternate, so do the positions, and a step's last position and the next step's first are apart by
    // the sums.
    Exchange attn_sum, ffn_sum;
    Exchange cand[2];
    Tensor route_ids, route_w;                        // [T, top_k]
    Tensor y_routed, y_shared;                        // f32 [T, top_k, H], [T, H]: the experts' outputs
    Tensor h, h_n, logits;                            // [T, H], [T, H], [T, V_r] f32
    Tensor out_ids, margin, conf, conf_logit, q_tok;  // in step_out
    Tensor norm;                                      // f32 [B, k, 2]: the draws' normalisers (MarkovOutputs)
    // The distribution pass (add_distributions), n = max_distributions k rows: the asked positions' block
    // rows and previous tokens (i32 [n] each, in dist_meta = [rows, tokens]), bias f32 [n, V_r], q f32 [n,
    // V].
    Tensor dist_meta, dist_rows, dist_tokens, dist_bias, dist_q;
    Tensor
        dist_host;  // rank 0: q's image in alloc_host memory (a pageable download runs at a fraction of it)
    Tensor rows, main, main_x;                    // context insert
    std::vector<Tensor> ins_kv, ins_kv_n;         // per stage
    Tensor ins_meta, ins_pos, ins_slot, ins_src;  // i32 [4 N]: positions, slots, then i64 row addresses
    Tensor ins_io, host_ins;                      // [ins_meta, rows] and its alloc_host staging
    Tensor host_rows, host_meta;                  // host_ins' views
    // The activation codes (Backend::alloc_act_codes) that the norms write beside normed, qa_n, h_n and
    // main_x for the quantised products reading them; empty where none reads them or the backend keeps none.
    ActCodes normed_codes, qa_n_codes, h_n_codes, main_x_codes;
  } work_;
};

}  // namespace dspark
