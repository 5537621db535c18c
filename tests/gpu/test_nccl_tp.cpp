// Tensor parallelism on the CUDA backend under mpirun -np N, rank r on GPU local_rank: NcclCommunicator's
// collectives on hand values (and replayed from a CUDA graph), then the Drafter at tp = N (CUDA + NCCL)
// against the CPU at tp = 1 (rule in draft_compare.hpp) with replicated activations bit-identical across
// ranks. Every rank skips when the host has fewer GPUs than ranks.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <random>

#include "comm/nccl_communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/synthetic.hpp"
#include "lib/core/top2.hpp"
#include "lib/model/load_weights.hpp"
#include "lib/model/replica_check.hpp"
#include "tests/gpu/draft_compare.hpp"
#include "tests/support/tp_setup.hpp"

namespace dspark {
namespace {

namespace fs = std::filesystem;
constexpr float kInf = std::numeric_limits<float>::infinity();

int local_rank() {
  MPI_Comm local;
  int rank = 0, lr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &lr);
  MPI_Comm_free(&local);
  return lr;
}

// Collective, the same answer on every rank: does every rank have its GPU?
bool every_rank_has_a_gpu() {
  static const bool ok = [] {
    const int lacking = local_rank() >= cuda::device_count() ? 1 : 0;
    int any = 0;
    MPI_Allreduce(&lacking, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    return any == 0;
  }();
  return ok;
}

// One backend and one NCCL communicator per process (NCCL's init is the slow part), torn down before
// MPI_Finalize by the environment below.
struct Gpu {
  std::unique_ptr<CudaBackend> be;
  std::unique_ptr<NcclCommunicator> comm;
};
Gpu& gpu_state() {
  static Gpu g;
  return g;
}
Gpu& gpu() {
  Gpu& g = gpu_state();
  if (!g.be) {
    g.be = std::make_unique<CudaBackend>(local_rank());
    g.comm = std::make_unique<NcclCommunicator>(MPI_COMM_WORLD, g.be->stream());
  }
  return g;
}

class GpuTeardown : public ::testing::Environment {
 public:
  void TearDown() override {
    Gpu& g = gpu_state();
    g.comm.reset();
    g.be.reset();
  }
};
[[maybe_unused]] ::testing::Environment* const kTeardown =
    ::testing::AddGlobalTestEnvironment(new GpuTeardown);

class NcclTp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!every_rank_has_a_gpu()) GTEST_SKIP() << "fewer GPUs than ranks on this host";
    be_ = gpu().be.get();
    comm_ = gpu().comm.get();
    N_ = comm_->size();
    r_ = comm_->rank();
  }
  // Host records -> device tensor -> argmax_exchange -> host records.
  std::vector<Top2> exchange(const std::vector<Top2>& mine) {
    Tensor t = be_->alloc(DType::i32, {static_cast<int64_t>(mine.size()), 4});
    be_->upload(t, mine.data());
    comm_->argmax_exchange(t);
    std::vector<Top2> out(mine.size());
    be_->download(out.data(), t);
    return out;
  }
  std::vector<Top2> hand_records() const {
    const float r = static_cast<float>(r_);
    return {{1.0f, 0.5f, 100 + r_, 0},   // equal best everywhere: the lowest id (rank 0's) wins
            {r, r - 0.5f, 10 * r_, 0},   // the last rank wins; second = its own
            {5.0f, 1.0f, 1000 - r_, 0},  // equal best, ids falling with rank: the LAST rank's id wins
            {-kInf, -kInf, 0, 0},        // a request past its k' on every rank
            {r_ == 0 ? 2.0f : 1.95f, r_ == 0 ? 1.9f : 0.0f, r_ == 0 ? 7 : 3, 0}};  // second from another rank
  }
  // all_reduce_sum(t) then argmax_exchange(c), after `before` (nodes of the test's own), recorded under the
  // strictest capture mode; exec stays null when recording failed on this rank.
  struct Recording {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    Recording() = default;
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;
    ~Recording() {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
  };
  std::unique_ptr<Recording> record_collectives(const Tensor& t, const Tensor& c,
                                                const std::function<void(cudaStream_t)>& before) {
    auto r = std::make_unique<Recording>();
    cudaStream_t s = be_->stream();
    cudaError_t rc = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (rc == cudaSuccess) {
      before(s);
      comm_->all_reduce_sum(t);
      comm_->argmax_exchange(c);
      rc = cudaStreamEndCapture(s, &r->graph);
    }
    if (rc == cudaSuccess) rc = cudaGraphInstantiate(&r->exec, r->graph, 0);
    EXPECT_EQ(rc, cudaSuccess) << cudaGetErrorString(rc);
    if (rc != cudaSuccess && r->exec != nullptr) {
      cudaGraphExecDestroy(r->exec);
      r->exec = nullptr;
    }
    return r;
  }
  // Fresh inputs into t and c, then one replay of the recording, waited for.
  void replay_with(const Recording& rec, const Tensor& t, const void* t_in, const Tensor& c,
                   const void* c_in) {
    be_->upload(t, t_in);
    be_->upload(c, c_in);
    EXPECT_EQ(cudaGraphLaunch(rec.exec, be_->stream()), cudaSuccess);
    be_->synchronize();
  }
  CudaBackend* be_ = nullptr;
  NcclCommunicator* comm_ = nullptr;
  int N_ = 1, r_ = 0;
};

TEST_F(NcclTp, AllReduceSumOfHandValues) {
  // Rank r contributes r + 1 + i / 2 at element i (odd length): every sum is exact in fp32.
  const int64_t n = 1003;
  std::vector<float> mine(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = float(r_ + 1) + 0.5f * float(i);
  Tensor t = be_->alloc(DType::f32, {n});
  be_->upload(t, mine.data());
  comm_->all_reduce_sum(t);
  std::vector<float> got(static_cast<size_t>(n));
  be_->download(got.data(), t);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(got[static_cast<size_t>(i)], float(N_ * (N_ + 1) / 2) + 0.5f * float(N_) * float(i)) << i;
}

TEST_F(NcclTp, AllReduceSumIsBitIdenticalOnEveryRankAndNearTheRankOrderSum) {
  std::mt19937 g(100 + static_cast<unsigned>(r_));
  std::normal_distribution<float> d;
  const int64_t n = 15 * 256;  // the drafter's partial: T x H
  std::vector<float> mine(static_cast<size_t>(n));
  for (float& v : mine) v = d(g);
  std::vector<float> all(mine.size() * static_cast<size_t>(N_));
  comm_->all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
  Tensor t = be_->alloc(DType::f32, {15, 256});
  be_->upload(t, mine.data());
  comm_->all_reduce_sum(t);
  const uint64_t h = tensor_hash(*be_, t);
  std::vector<uint64_t> hashes(static_cast<size_t>(N_));
  comm_->all_gather(&h, hashes.data(), sizeof(h));
  for (uint64_t x : hashes) EXPECT_EQ(x, hashes[0]);
  std::vector<float> got(mine.size());
  be_->download(got.data(), t);
  for (size_t i = 0; i < got.size(); ++i) {
    float sum = 0, mag = 0;
    for (int r = 0; r < N_; ++r)
      sum += all[static_cast<size_t>(r) * mine.size() + i],
          mag += std::fabs(all[static_cast<size_t>(r) * mine.size() + i]);
    ASSERT_NEAR(got[i], sum, 1e-6f * mag) << i;
  }
}

TEST_F(NcclTp, ArgmaxExchangeTiesGoToTheLowerIdAndSecondIsTheRestsBest) {
  const std::vector<Top2> mine = hand_records(), got = exchange(mine);
  const float n = static_cast<float>(N_);
  const bool many = N_ > 1;
  const std::vector<Top2> want = {{1.0f, many ? 1.0f : 0.5f, 100, 0},
                                  {n - 1, n - 1.5f, 10 * (N_ - 1), 0},
                                  {5.0f, many ? 5.0f : 1.0f, 1000 - (N_ - 1), 0},
                                  {-kInf, -kInf, 0, 0},
                                  {2.0f, many ? 1.95f : 1.9f, 7, 0}};
  // The host rule (MpiCommunicator's fold of merge_top2 in rank order) gives the same.
  std::vector<Top2> all(mine.size() * static_cast<size_t>(N_));
  comm_->all_gather(mine.data(), all.data(), mine.size() * sizeof(Top2));
  for (size_t b = 0; b < want.size(); ++b) {
    Top2 fold = all[b];
    for (int r = 1; r < N_; ++r) fold = merge_top2(fold, all[static_cast<size_t>(r) * mine.size() + b]);
    for (const Top2& w : {want[b], fold}) {
      EXPECT_EQ(got[b].best, w.best) << "request " << b;
      EXPECT_EQ(got[b].second, w.second) << "request " << b;
      EXPECT_EQ(got[b].index, w.index) << "request " << b;
    }
  }
}

TEST_F(NcclTp, MergeKernelFoldsLikeMergeTop2) {
  // The device fold on its own (at one rank argmax_exchange never launches it): 4 "ranks" of 500 records
  // drawn from few values and ids, so that ties of value, of id and of both are frequent.
  const int ranks = 4;
  const int64_t B = 500;
  std::mt19937 g(7);
  const float values[] = {-kInf, 0.0f, 1.0f, 2.0f};
  std::vector<Top2> recs(static_cast<size_t>(ranks * B));
  for (Top2& t : recs) {
    t.best = values[g() % 4];
    t.second = std::min(t.best, values[g() % 4]);
    t.index = static_cast<int32_t>(g() % 6);
    t.pad = 0;
  }
  Tensor in = be_->alloc(DType::i32, {ranks * B, 4}), out = be_->alloc(DType::i32, {B, 4});
  be_->upload(in, recs.data());
  detail::launch_merge_top2(static_cast<const Top2*>(in.data), static_cast<Top2*>(out.data), B, ranks,
                            be_->stream());
  std::vector<Top2> got(static_cast<size_t>(B));
  be_->download(got.data(), out);
  for (int64_t b = 0; b < B; ++b) {
    Top2 want = recs[static_cast<size_t>(b)];
    for (int r = 1; r < ranks; ++r) want = merge_top2(want, recs[static_cast<size_t>(r * B + b)]);
    const Top2& x = got[static_cast<size_t>(b)];
    EXPECT_TRUE(x.best == want.best && x.second == want.second && x.index == want.index)
        << "record " << b << ": got {" << x.best << ", " << x.second << ", " << x.index << "}, want {"
        << want.best << ", " << want.second << ", " << want.index << "}";
  }
}

TEST_F(NcclTp, CollectivesReplayFromACapturedGraph) {
  const std::vector<Top2> records = hand_records();
  std::vector<float> mine(4096, float(r_ + 1));
  Tensor t = be_->alloc(DType::f32, {4096}),
         c = be_->alloc(DType::i32, {static_cast<int64_t>(records.size()), 4});
  Tensor marker = be_->alloc(DType::i32, {1});  // one node of our own: at one rank the collectives add none
  be_->upload(t, mine.data());
  be_->upload(c, records.data());
  comm_->all_reduce_sum(t);  // eager once (NCCL sets up lazily), then captured under the strictest mode
  comm_->argmax_exchange(c);
  be_->synchronize();
  const auto rec = record_collectives(
      t, c, [&](cudaStream_t s) { cudaMemsetAsync(marker.data, 0x11, sizeof(int32_t), s); });
  // A rank that cannot replay must not leave the others waiting inside a captured collective.
  if (!comm_->any(rec->exec == nullptr)) {
    for (int rep = 0; rep < 2; ++rep) {
      replay_with(*rec, t, mine.data(), c, records.data());
      std::vector<float> sum(mine.size());
      be_->download(sum.data(), t);
      EXPECT_EQ(std::count(sum.begin(), sum.end(), float(N_ * (N_ + 1) / 2)), 4096) << "replay " << rep;
      std::vector<Top2> got(records.size());
      be_->download(got.data(), c);
      EXPECT_EQ(got[0].index, 100);
      EXPECT_EQ(got[2].index, 1000 - (N_ - 1));
      EXPECT_EQ(got[4].second, N_ > 1 ? 1.95f : 1.9f);
    }
  }
}

TEST_F(NcclTp, PeerSumExpandsTheAllReducedSumBitForBitEagerlyAndFromAGraph) {
  // Two PeerBuffers used in turn, as the Drafter's halves use them: each call's y and X hold the bits of
  // all_reduce_sum then convert_hc_expand on the same inputs (a + b == b + a at two ranks). The third call
  // reuses the first pair of buffers (the handshake re-armed); then the two calls replayed from a graph.
  const int64_t T = 5, hc = 4, H = 320;  // rows of 320 span two 256-thread blocks
  PeerBuffer a = comm_->alloc_peer_buffer(DType::f32, {T, H});
  PeerBuffer b = comm_->alloc_peer_buffer(DType::f32, {T, H});
  if (N_ != 2) {
    EXPECT_TRUE(a.empty());
    GTEST_SKIP() << "peer sums only at two ranks";
  }
  if (comm_->any(a.empty() || b.empty())) GTEST_SKIP() << "no peer sums here (no IPC between the two GPUs)";
  std::mt19937 g(7);  // the same replicated inputs on both ranks
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> X0(static_cast<size_t>(T * hc * H));
  for (uint16_t& v : X0) v = float_to_bf16(d(g));
  std::vector<float> post(static_cast<size_t>(T * hc)), comb(static_cast<size_t>(T * hc * hc));
  for (float& v : post) v = d(g);
  for (float& v : comb) v = d(g);
  std::mt19937 mine_g(100 + static_cast<unsigned>(r_));  // partials differ by rank
  const auto partial = [&] {
    std::vector<float> p(static_cast<size_t>(T * H));
    for (float& v : p) v = d(mine_g);
    return p;
  };
  Tensor Xd = be_->alloc(DType::bf16, {T, hc, H}), yd = be_->alloc(DType::bf16, {T, H});
  Tensor pd = be_->alloc(DType::f32, {T, hc}), cd = be_->alloc(DType::f32, {T, hc, hc});
  Tensor sum = be_->alloc(DType::f32, {T, H});
  be_->upload(pd, post.data());
  be_->upload(cd, comb.data());
  using Out = std::pair<std::vector<uint16_t>, std::vector<uint16_t>>;  // y, X
  const auto fetch_out = [&] {
    Out o{std::vector<uint16_t>(static_cast<size_t>(T * H)), std::vector<uint16_t>(X0.size())};
    be_->download(o.first.data(), yd);
    be_->download(o.second.data(), Xd);
    return o;
  };
  const auto reference = [&](const std::vector<float>& p) {
    be_->upload(sum, p.data());
    be_->upload(Xd, X0.data());
    comm_->all_reduce_sum(sum);
    be_->convert_hc_expand(sum, yd, Xd, pd, cd);
    return fetch_out();
  };
  const auto peer = [&](const PeerBuffer& s, const std::vector<float>& p) {
    be_->upload(s.mine, p.data());
    be_->upload(Xd, X0.data());
    be_->peer_sum_hc_expand(s, T, yd, Xd, pd, cd);
    return fetch_out();
  };
  for (int call = 0; call < 3; ++call) {
    const std::vector<float> p = partial();
    const Out want = reference(p);
    EXPECT_EQ(peer(call % 2 == 0 ? a : b, p), want) << "eager call " << call;
  }

  // Recorded: the sums of a then b (each with its own X upload before the replay).
  Tensor Xb = be_->alloc(DType::bf16, {T, hc, H}), yb = be_->alloc(DType::bf16, {T, H});
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStream_t st = be_->stream();
  cudaError_t rc = cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
  if (rc == cudaSuccess) {
    be_->peer_sum_hc_expand(a, T, yd, Xd, pd, cd);
    be_->peer_sum_hc_expand(b, T, yb, Xb, pd, cd);
    rc = cudaStreamEndCapture(st, &graph);
  }
  if (rc == cudaSuccess) rc = cudaGraphInstantiate(&exec, graph, 0);
  EXPECT_EQ(rc, cudaSuccess) << cudaGetErrorString(rc);
  if (!comm_->any(rc != cudaSuccess)) {
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<float> pa = partial(), pb = partial();
      const Out want_a = reference(pa), want_b = reference(pb);
      be_->upload(a.mine, pa.data());
      be_->upload(b.mine, pb.data());
      be_->upload(Xd, X0.data());
      be_->upload(Xb, X0.data());
      EXPECT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
      be_->synchronize();
      EXPECT_EQ(fetch_out(), want_a) << "replay " << rep << ", first sum";
      Out got_b{std::vector<uint16_t>(static_cast<size_t>(T * H)), std::vector<uint16_t>(X0.size())};
      be_->download(got_b.first.data(), yb);
      be_->download(got_b.second.data(), Xb);
      EXPECT_EQ(got_b, want_b) << "replay " << rep << ", second sum";
    }
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
}

TEST_F(NcclTp, PeerCommitEqualsTheExchangeThenTheCommit) {
  // The hand records (ties, a request past its k' on every rank, the second from another rank) committed at
  // positions 0, 1, 2 through two PeerBuffers used in turn: ids, margins and prev equal argmax_exchange then
  // markov_commit's. Request 3 asks for no output (k' = 0): neither path writes its position.
  const std::vector<Top2> records = hand_records();
  const auto B = static_cast<int64_t>(records.size());
  const int64_t k = 5;
  PeerBuffer a = comm_->alloc_peer_buffer(DType::i32, {B, 4});
  PeerBuffer b = comm_->alloc_peer_buffer(DType::i32, {B, 4});
  if (N_ != 2) {
    EXPECT_TRUE(a.empty());
    GTEST_SKIP() << "peer buffers only at two ranks";
  }
  if (comm_->any(a.empty() || b.empty()))
    GTEST_SKIP() << "no peer buffers here (no IPC between the two GPUs)";
  std::vector<int32_t> req(static_cast<size_t>(B * kReqFields), 0);
  for (int64_t r = 0; r < B; ++r)
    req[static_cast<size_t>(r * kReqFields + 3)] = r == 3 ? 0 : static_cast<int32_t>(k);
  Tensor reqs = be_->alloc(DType::i32, {B, kReqFields}), cand = be_->alloc(DType::i32, {B, 4});
  be_->upload(reqs, req.data());
  struct Out {
    std::vector<int32_t> ids, prev;
    std::vector<float> margin;
    bool operator==(const Out&) const = default;
  };
  const auto run = [&](const PeerBuffer* peer) {
    Tensor ids = be_->alloc(DType::i32, {B, k}), prev = be_->alloc(DType::i32, {B});
    Tensor margin = be_->alloc(DType::f32, {B, k});
    for (int64_t j = 0; j < 3; ++j) {
      if (peer == nullptr) {
        be_->upload(cand, records.data());
        comm_->argmax_exchange(cand);
        be_->markov_commit(cand, reqs, j, prev, ids, margin);
      } else {
        const PeerBuffer& p = peer[j % 2];
        be_->upload(p.mine, records.data());
        be_->markov_peer_commit(p, reqs, j, prev, ids, margin);
      }
    }
    Out o{std::vector<int32_t>(static_cast<size_t>(B * k)), std::vector<int32_t>(static_cast<size_t>(B)),
          std::vector<float>(static_cast<size_t>(B * k))};
    be_->download(o.ids.data(), ids);
    be_->download(o.prev.data(), prev);
    be_->download(o.margin.data(), margin);
    return o;
  };
  const Out want = run(nullptr);
  EXPECT_EQ(want.ids[0], 100);  // the exchange itself, by hand: the lowest id of the tie
  EXPECT_EQ(want.ids[3 * static_cast<size_t>(k)], 0);  // k' = 0: never written
  const PeerBuffer pair[2] = {a, b};
  EXPECT_EQ(run(pair), want);
}

// ---- the drafter at tp = N

// Written by rank 0 into a folder every rank sees (same host), removed when the process ends.
const fs::path& shared_checkpoint() {
  struct Dir {
    fs::path path;
    bool owner = false;
    ~Dir() {
      std::error_code ec;
      if (owner) fs::remove_all(path, ec);
    }
  };
  static const Dir dir = [] {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    unsigned long id = rank == 0 ? static_cast<unsigned long>(::getpid()) : 0;
    MPI_Bcast(&id, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
    Dir d{fs::temp_directory_path() / ("dspark-nccl-test-" + std::to_string(id)), rank == 0};
    if (rank == 0) {
      SyntheticOptions opt;
      opt.seed = 3;
      opt.force = true;
      write_synthetic_checkpoint(test::tp_test_config(), d.path, opt);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return d;
  }();
  return dir.path;
}

TEST_F(NcclTp, PeerSumOffGivesNoPeerBuffers) {
  // Tuning::peer_sum off: empty peer buffers on every rank, so the Drafter goes through the collectives.
  NcclCommunicator off(MPI_COMM_WORLD, be_->stream(), Tuning{.peer_sum = false});
  EXPECT_TRUE(off.alloc_peer_buffer(DType::f32, {5, 320}).empty());
  EXPECT_TRUE(off.alloc_peer_buffer(DType::i32, {5, 4}).empty());
}

class NcclTpDrafter : public NcclTp {
 protected:
  void SetUp() override {
    NcclTp::SetUp();
    if (IsSkipped()) return;
    const Checkpoint ckpt(shared_checkpoint());
    cfg_ = load_model_config(ckpt.config_path());
    DrafterOptions opt;
    opt.slots = 4;
    opt.max_batch = 4;
    plan_ = make_shard_plan(cfg_, r_, N_);
    const ShardPlan whole = make_shard_plan(cfg_, 0, 1);
    tp_ = std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, plan_, *be_), plan_, *be_, *comm_,
                                    opt);
    one_ = std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, whole, cpu_), whole, cpu_, local_,
                                     opt);
    batch_ = test::insert_tp_context({tp_.get(), one_.get()}, cfg_.row_dim(), true);
  }

  CpuBackend cpu_;
  LocalCommunicator local_;
  ModelConfig cfg_;
  ShardPlan plan_;
  std::unique_ptr<Drafter> tp_, one_;
  std::vector<DraftRequest> batch_;
};

TEST_F(NcclTpDrafter, DraftsAgreeWithTheCpuAtOneRankOutsideNearTies) {
  test::Trace t1, tn;
  one_->set_trace(test::record_into(cpu_, t1));
  tp_->set_trace(test::record_into(*be_, tn));
  const DraftResult a = one_->draft(batch_), b = tp_->draft(batch_);
  test::expect_draft_agrees(cfg_, a, t1, b, tn);
}

TEST_F(NcclTpDrafter, ReplicatedActivationsAreBitIdenticalAcrossRanks) {
  std::vector<std::pair<std::string, uint64_t>> hashes;
  tp_->set_trace([&](const std::string& n, const Tensor& t) {
    if (n.find("after_") != std::string::npos || n.find("route_") != std::string::npos ||
        n == "head_hidden" || n.ends_with("attn_out") || n.ends_with("moe_out"))
      hashes.emplace_back(n, tensor_hash(*be_, t));
  });
  const DraftResult mine = tp_->draft(batch_);
  ASSERT_FALSE(hashes.empty());
  for (const auto& [name, h] : hashes) {
    std::vector<uint64_t> all(static_cast<size_t>(N_));
    comm_->all_gather(&h, all.data(), sizeof(h));
    for (uint64_t x : all) EXPECT_EQ(x, all[0]) << name;
  }
  // The answer too: every rank holds the same ids and confidences.
  std::vector<int32_t> ids(mine.ids.size() * static_cast<size_t>(N_));
  comm_->all_gather(mine.ids.data(), ids.data(), mine.ids.size() * sizeof(int32_t));
  for (int r = 1; r < N_; ++r)
    EXPECT_TRUE(std::equal(mine.ids.begin(), mine.ids.end(),
                           ids.begin() + r * static_cast<int64_t>(mine.ids.size())));
  // The built-in run-time check passes as well.
  tp_->set_trace(nullptr);
  DrafterOptions opt = tp_->options();
  opt.check_replicated = true;
  const Checkpoint ckpt(shared_checkpoint());
  Drafter checked(cfg_, load_drafter_weights(ckpt, cfg_, plan_, *be_), plan_, *be_, *comm_, opt);
  EXPECT_NO_THROW(checked.draft(batch_));
}

TEST_F(NcclTpDrafter, PeerSumOffDraftsTheSameBits) {
  // One drafter on the communicator with peer sums (at tp 2 on one host its halves sum through peer
  // buffers), one on a communicator with Tuning::peer_sum off (NCCL's all-reduce and exchange): fed the same
  // context, they answer with the same bits.
  const Checkpoint ckpt(shared_checkpoint());
  NcclCommunicator nccl_only(MPI_COMM_WORLD, be_->stream(), Tuning{.peer_sum = false});
  const DrafterOptions opt = tp_->options();
  Drafter peer(cfg_, load_drafter_weights(ckpt, cfg_, plan_, *be_), plan_, *be_, *comm_, opt);
  Drafter plain(cfg_, load_drafter_weights(ckpt, cfg_, plan_, *be_), plan_, *be_, nccl_only, opt);
  EXPECT_FALSE(plain.peer_exchange());
  const std::vector<DraftRequest> batch = test::insert_tp_context({&peer, &plain}, cfg_.row_dim(), true);
  const DraftResult a = peer.draft(batch), b = plain.draft(batch);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.conf, b.conf);
  EXPECT_EQ(a.margin, b.margin);
}

TEST_F(NcclTpDrafter, GraphReplaysWithCollectivesInsideEqualEagerSteps) {
  // Two tp drafters with the same buckets, one replaying recordings (its all-reduces and argmax exchanges
  // recorded with the step), one eager; fed the same context, they answer with the same bits on every rank.
  const Checkpoint ckpt(shared_checkpoint());
  DrafterOptions opt = tp_->options();
  opt.max_insert_rows = 32;
  opt.graph_batch_sizes = {static_cast<int64_t>(batch_.size())};
  opt.insert_row_buckets = {32};
  std::unique_ptr<Drafter> eager, graphed;
  for (bool g : {false, true}) {
    opt.use_graphs = g;
    (g ? graphed : eager) = std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, plan_, *be_),
                                                      plan_, *be_, *comm_, opt);
    (g ? graphed : eager)->capture_graphs();
  }
  EXPECT_EQ(graphed->graph_counts().draft_graphs, cfg_.block_size);
  const std::vector<DraftRequest> batch =
      test::insert_tp_context({eager.get(), graphed.get()}, cfg_.row_dim(), true);
  EXPECT_GT(graphed->graph_counts().insert_replays, 0);
  EXPECT_EQ(graphed->graph_counts().insert_eager, 0);
  const DraftResult e = eager->draft(batch);
  for (int round = 0; round < 2; ++round) {
    const DraftResult g = graphed->draft(batch);
    EXPECT_EQ(g.ids, e.ids) << "round " << round;
    EXPECT_EQ(g.conf, e.conf) << "round " << round;
    EXPECT_EQ(g.margin, e.margin) << "round " << round;
  }
  EXPECT_EQ(graphed->graph_counts().draft_replays, 2);
}

}  // namespace
}  // namespace dspark
