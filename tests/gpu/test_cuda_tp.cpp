// Tensor parallelism on the CUDA backend under mpirun -np N, rank r on GPU local_rank mod the GPUs: on N GPUs
// the communicator is NCCL's (with peer memory for the exchanges on one host), on fewer the ranks share GPUs
// and IpcCommunicator carries every exchange (SPEC §5's emulation; tests/scripts/shared_gpu.sh runs it
// time-sliced, or under MPS on request). The communicator's collectives on hand values (and replayed from a
// CUDA graph), the exchange points' fused ops against the rank-order sum and merge, an exchange that gives up
// on a late rank and starts over, then the Drafter at tp = N against the CPU at the same tp and at tp = 1
// (rule in draft_compare.hpp), with replicated activations bit-identical across ranks, graphs equal to eager
// steps, and a step that a late rank fails answered INTERNAL everywhere before the drafter serves on. Every
// rank skips without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <thread>

#include "comm/device_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/nccl_communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/synthetic.hpp"
#include "lib/core/markov_record.hpp"
#include "lib/model/forwarding_engine.hpp"
#include "lib/model/load_weights.hpp"
#include "lib/model/replica_check.hpp"
#include "lib/runtime/step_loop.hpp"
#include "tests/gpu/draft_compare.hpp"
#include "tests/support/golden_case.hpp"
#include "tests/support/golden_exl3_rule.hpp"
#include "tests/support/golden_fp8_rule.hpp"
#include "tests/support/golden_run.hpp"
#include "tests/support/shared_checkpoint.hpp"
#include "tests/support/tensor_host.hpp"
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

// Collective, the same answer on every rank: does every rank see a GPU?
bool every_rank_has_a_gpu() {
  static const bool ok = [] {
    const int lacking = cuda::device_count() < 1 ? 1 : 0;
    int any = 0;
    MPI_Allreduce(&lacking, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    return any == 0;
  }();
  return ok;
}

int my_gpu() {
  return local_rank() % cuda::device_count();
}

// One backend and one communicator per process (NCCL's init is the slow part), torn down before
// MPI_Finalize by the environment below.
struct Gpu {
  std::unique_ptr<CudaBackend> be;
  std::unique_ptr<Communicator> comm;
  bool shared = false;  // ranks share GPUs: IpcCommunicator
};
Gpu& gpu_state() {
  static Gpu g;
  return g;
}
Gpu& gpu() {
  Gpu& g = gpu_state();
  if (!g.be) {
    g.be = std::make_unique<CudaBackend>(my_gpu());
    g.shared = ranks_share_a_gpu(MPI_COMM_WORLD, g.be->device());
    g.comm = make_device_communicator(MPI_COMM_WORLD, g.be->device(), g.be->stream(), Tuning{},
                                      kDefaultExchangeTimeout);
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

class CudaTp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!every_rank_has_a_gpu()) GTEST_SKIP() << "no GPU on this host";
    be_ = gpu().be.get();
    comm_ = gpu().comm.get();
    shared_ = gpu().shared;
    N_ = comm_->size();
    r_ = comm_->rank();
  }
  // Host records -> device tensor -> argmax_exchange -> host records.
  std::vector<MarkovRecord> exchange(const std::vector<MarkovRecord>& mine) {
    Tensor t = be_->alloc(DType::i32, {static_cast<int64_t>(mine.size()), kMarkovRecordWords});
    be_->upload(t, mine.data());
    comm_->argmax_exchange(t);
    std::vector<MarkovRecord> out(mine.size());
    be_->download(out.data(), t);
    return out;
  }
  std::vector<MarkovRecord> hand_records() const {
    const float r = static_cast<float>(r_);
    const auto greedy = [](float best, float second, int32_t index) {
      return MarkovRecord{best, second, index, -1, -kInf, 0.0f, 0.0f, 0.0f};
    };
    return {
        greedy(1.0f, 0.5f, 100 + r_),   // equal best everywhere: the lowest id (rank 0's) wins
        greedy(r, r - 0.5f, 10 * r_),   // the last rank wins; second = its own
        greedy(5.0f, 1.0f, 1000 - r_),  // equal best, ids falling with rank: the LAST rank's id wins
        markov_empty(),                 // a request past its k' on every rank
        greedy(r_ == 0 ? 2.0f : 1.95f, r_ == 0 ? 1.9f : 0.0f, r_ == 0 ? 7 : 3),  // second elsewhere
        // Draws: the last rank's score wins, its z comes with it; the normalisers fold to the largest max.
        {1.0f, 0.0f, 500 + r_, 200 + r_, 1.0f + 0.5f * r, 0.5f - 0.25f * r, 0.25f * r, 1.0f + r},
        // Equal scores, ids falling with rank: the last rank's (lowest) id draws.
        {1.0f, 0.0f, 600 + r_, 300 - r_, 2.0f, r, 0.0f, 2.0f}};
  }
  // The draws' merged normaliser sum over N ranks of hand_records' record 5, in double.
  double hand_z_sum(int N) const {
    double sum = 0.0;
    for (int r = 0; r < N; ++r) sum += (1.0 + r) * std::exp(0.25 * r - 0.25 * (N - 1));
    return sum;
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
  Communicator* comm_ = nullptr;
  bool shared_ = false;
  int N_ = 1, r_ = 0;
};

TEST_F(CudaTp, AllReduceSumOfHandValues) {
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

TEST_F(CudaTp, AllReduceSumIsBitIdenticalOnEveryRankAndNearTheRankOrderSum) {
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

TEST_F(CudaTp, ArgmaxExchangeTiesGoToTheLowerIdAndSecondIsTheRestsBest) {
  const std::vector<MarkovRecord> mine = hand_records(), got = exchange(mine);
  const float n = static_cast<float>(N_);
  const bool many = N_ > 1;
  const auto greedy = [](float best, float second, int32_t index) {
    return MarkovRecord{best, second, index, -1, -kInf, 0.0f, 0.0f, 0.0f};
  };
  const int last = N_ - 1;
  const std::vector<MarkovRecord> want = {
      greedy(1.0f, many ? 1.0f : 0.5f, 100),
      greedy(n - 1, n - 1.5f, 10 * last),
      greedy(5.0f, many ? 5.0f : 1.0f, 1000 - last),
      markov_empty(),
      greedy(2.0f, many ? 1.95f : 1.9f, 7),
      {1.0f, many ? 1.0f : 0.0f, 500, 200 + last, 1.0f + 0.5f * last, 0.5f - 0.25f * last, 0.25f * last,
       static_cast<float>(hand_z_sum(N_))},
      {1.0f, many ? 1.0f : 0.0f, 600, 300 - last, 2.0f, static_cast<float>(last), 0.0f, 2.0f * N_}};
  // The host rule (MpiCommunicator's fold of merge_markov in rank order) gives the same.
  std::vector<MarkovRecord> all(mine.size() * static_cast<size_t>(N_));
  comm_->all_gather(mine.data(), all.data(), mine.size() * sizeof(MarkovRecord));
  for (size_t b = 0; b < want.size(); ++b) {
    MarkovRecord fold = all[b];
    for (int r = 1; r < N_; ++r) fold = merge_markov(fold, all[static_cast<size_t>(r) * mine.size() + b]);
    for (const MarkovRecord& w : {want[b], fold}) {
      EXPECT_EQ(got[b].best, w.best) << "request " << b;
      EXPECT_EQ(got[b].second, w.second) << "request " << b;
      EXPECT_EQ(got[b].index, w.index) << "request " << b;
      EXPECT_EQ(got[b].sample_index, w.sample_index) << "request " << b;
      if (w.sample_index < 0) continue;
      EXPECT_EQ(got[b].score, w.score) << "request " << b;
      EXPECT_EQ(got[b].z, w.z) << "request " << b;
      EXPECT_EQ(got[b].z_max, w.z_max) << "request " << b;
      // The device's expf and the host's may differ in the last bit.
      EXPECT_NEAR(got[b].z_sum, w.z_sum, 1e-6f * w.z_sum) << "request " << b;
    }
  }
}

TEST_F(CudaTp, MergeKernelFoldsLikeMergeMarkov) {
  // The device fold on its own (at one rank argmax_exchange never launches it): 4 "ranks" of 500 records
  // drawn from few values and ids, so that ties of value, of id and of both are frequent.
  const int ranks = 4;
  const int64_t B = 500;
  std::mt19937 g(7);
  const float values[] = {-kInf, 0.0f, 1.0f, 2.0f};
  std::vector<MarkovRecord> recs(static_cast<size_t>(ranks * B));
  for (MarkovRecord& t : recs) {
    t = markov_empty();
    t.best = values[g() % 4];
    t.second = std::min(t.best, values[g() % 4]);
    t.index = static_cast<int32_t>(g() % 6);
    if (g() % 3 != 0) {  // a draw (the others have none): scores and ids tie often too
      t.sample_index = static_cast<int32_t>(g() % 6);
      t.score = values[1 + g() % 3];
      t.z = values[1 + g() % 3];
      t.z_max = 0.5f * static_cast<float>(g() % 4);
      t.z_sum = 1.0f + static_cast<float>(g() % 5);
    }
  }
  Tensor in = be_->alloc(DType::i32, {ranks * B, kMarkovRecordWords}),
         out = be_->alloc(DType::i32, {B, kMarkovRecordWords});
  be_->upload(in, recs.data());
  detail::launch_merge_records(static_cast<const MarkovRecord*>(in.data),
                               static_cast<MarkovRecord*>(out.data), B, ranks, be_->stream());
  std::vector<MarkovRecord> got(static_cast<size_t>(B));
  be_->download(got.data(), out);
  for (int64_t b = 0; b < B; ++b) {
    MarkovRecord want = recs[static_cast<size_t>(b)];
    for (int r = 1; r < ranks; ++r) want = merge_markov(want, recs[static_cast<size_t>(r * B + b)]);
    const MarkovRecord& x = got[static_cast<size_t>(b)];
    EXPECT_TRUE(x.best == want.best && x.second == want.second && x.index == want.index)
        << "record " << b << ": got {" << x.best << ", " << x.second << ", " << x.index << "}, want {"
        << want.best << ", " << want.second << ", " << want.index << "}";
    EXPECT_TRUE(x.sample_index == want.sample_index && x.score == want.score && x.z == want.z &&
                x.z_max == want.z_max)
        << "record " << b << ": drew " << x.sample_index << ", want " << want.sample_index;
    EXPECT_NEAR(x.z_sum, want.z_sum, 1e-6f * want.z_sum) << "record " << b;
  }
}

TEST_F(CudaTp, CollectivesReplayFromACapturedGraph) {
  const std::vector<MarkovRecord> records = hand_records();
  std::vector<float> mine(4096, float(r_ + 1));
  Tensor t = be_->alloc(DType::f32, {4096}),
         c = be_->alloc(DType::i32, {static_cast<int64_t>(records.size()), kMarkovRecordWords});
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
      std::vector<MarkovRecord> got(records.size());
      be_->download(got.data(), c);
      EXPECT_EQ(got[0].index, 100);
      EXPECT_EQ(got[2].index, 1000 - (N_ - 1));
      EXPECT_EQ(got[4].second, N_ > 1 ? 1.95f : 1.9f);
    }
  }
}

// The expand's inputs of the exchange tests: replicated X, post and comb, partials that differ by rank, and
// the expected y and X of an exchange computed apart from it (the rank-order sum of the gathered partials on
// the host, then convert_hc_expand; or the communicator's all-reduce where the exchange has no peer memory).
class ExpandCase {
 public:
  ExpandCase(CudaBackend& be, Communicator& comm, int rank, int64_t T)
      : be_(be), comm_(comm), T_(T), mine_g_(100 + static_cast<unsigned>(rank)) {
    std::mt19937 g(7);  // the same replicated inputs on every rank
    std::normal_distribution<float> d(0.0f, 1.0f);
    X0_.resize(static_cast<size_t>(T * kHc * kH));
    for (uint16_t& v : X0_) v = float_to_bf16(d(g));
    std::vector<float> post(static_cast<size_t>(T * kHc)), comb(static_cast<size_t>(T * kHc * kHc));
    for (float& v : post) v = d(g);
    for (float& v : comb) v = d(g);
    X_ = be.alloc(DType::bf16, {T, kHc, kH});
    y_ = be.alloc(DType::bf16, {T, kH});
    post_ = be.alloc(DType::f32, {T, kHc});
    comb_ = be.alloc(DType::f32, {T, kHc, kHc});
    sum_ = be.alloc(DType::f32, {T, kH});
    be.upload(post_, post.data());
    be.upload(comb_, comb.data());
  }
  static constexpr int64_t kHc = 4, kH = 320;  // rows of 320 span two 256-thread blocks
  using Out = std::pair<std::vector<uint16_t>, std::vector<uint16_t>>;  // y, X

  std::vector<float> partial() {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> p(static_cast<size_t>(T_ * kH));
    for (float& v : p) v = d(mine_g_);
    return p;
  }
  Out reference(const std::vector<float>& p, bool rank_order) {
    if (rank_order) {
      std::vector<float> all(p.size() * static_cast<size_t>(comm_.size()));
      comm_.all_gather(p.data(), all.data(), p.size() * sizeof(float));
      std::vector<float> sum(p.size());
      for (size_t i = 0; i < p.size(); ++i) {
        float acc = 0.0f;
        for (int r = 0; r < comm_.size(); ++r) acc += all[static_cast<size_t>(r) * p.size() + i];
        sum[i] = acc;
      }
      be_.upload(sum_, sum.data());
    } else {
      be_.upload(sum_, p.data());
      comm_.all_reduce_sum(sum_);
    }
    be_.upload(X_, X0_.data());
    be_.convert_hc_expand(sum_, y_, X_, post_, comb_);
    return fetch();
  }
  // This rank's partial into the exchange, then the fused op (its result fetched unless `defer`).
  Out fused(const Exchange& ex, const std::vector<float>& p) {
    stage(ex, p);
    be_.sum_and_expand(ex, y_, X_, post_, comb_);
    return fetch();
  }
  void stage(const Exchange& ex, const std::vector<float>& p) {
    be_.upload(ex.buffer().rows(0, T_), p.data());
    be_.upload(X_, X0_.data());
  }
  Out fetch() {
    Out o{std::vector<uint16_t>(static_cast<size_t>(T_ * kH)), std::vector<uint16_t>(X0_.size())};
    be_.download(o.first.data(), y_);
    be_.download(o.second.data(), X_);
    return o;
  }
  const Tensor& X() const { return X_; }
  const Tensor& y() const { return y_; }
  const Tensor& post() const { return post_; }
  const Tensor& comb() const { return comb_; }
  const std::vector<uint16_t>& X0() const { return X0_; }

 private:
  CudaBackend& be_;
  Communicator& comm_;
  int64_t T_;
  std::mt19937 mine_g_;
  std::vector<uint16_t> X0_;
  Tensor X_, y_, post_, comb_, sum_;
};

TEST_F(CudaTp, SumAndExpandEqualsTheSumThenTheExpandEagerlyAndFromAGraph) {
  // Two exchange points used in turn, as the Drafter's halves use them: each call's y and X hold the bits of
  // convert_hc_expand on the ranks' sum (in rank order where the points are in peer memory). The third call
  // reuses the first point; then the two calls replayed from a graph, twice.
  const int64_t T = 5;
  ExpandCase c(*be_, *comm_, r_, T);
  const Exchange a = comm_->make_exchange(be_->alloc(DType::f32, {T, ExpandCase::kH}));
  const Exchange b = comm_->make_exchange(be_->alloc(DType::f32, {T, ExpandCase::kH}));
  if (shared_ && N_ > 1) {  // ranks sharing a GPU have no other path
    EXPECT_NE(a.peers(), nullptr);
  }
  const bool peer = a.peers() != nullptr;
  EXPECT_EQ(b.peers() != nullptr, peer);
  for (int call = 0; call < 3; ++call) {
    const std::vector<float> p = c.partial();
    const ExpandCase::Out want = c.reference(p, peer);
    EXPECT_EQ(c.fused(call % 2 == 0 ? a : b, p), want) << "eager call " << call;
  }

  // Recorded: the sums of a then b, into two outputs.
  Tensor Xb = be_->alloc(DType::bf16, c.X().shape), yb = be_->alloc(DType::bf16, c.y().shape);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStream_t st = be_->stream();
  cudaError_t rc = cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
  if (rc == cudaSuccess) {
    be_->sum_and_expand(a, c.y(), c.X(), c.post(), c.comb());
    be_->sum_and_expand(b, yb, Xb, c.post(), c.comb());
    rc = cudaStreamEndCapture(st, &graph);
  }
  if (rc == cudaSuccess) rc = cudaGraphInstantiate(&exec, graph, 0);
  EXPECT_EQ(rc, cudaSuccess) << cudaGetErrorString(rc);
  if (!comm_->any(rc != cudaSuccess)) {
    for (int rep = 0; rep < 2; ++rep) {
      const std::vector<float> pa = c.partial(), pb = c.partial();
      const ExpandCase::Out want_a = c.reference(pa, peer), want_b = c.reference(pb, peer);
      be_->upload(b.buffer(), pb.data());
      be_->upload(Xb, c.X0().data());
      c.stage(a, pa);
      EXPECT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
      be_->synchronize();
      EXPECT_EQ(c.fetch(), want_a) << "replay " << rep << ", first sum";
      ExpandCase::Out got_b{std::vector<uint16_t>(static_cast<size_t>(yb.numel())),
                            std::vector<uint16_t>(c.X0().size())};
      be_->download(got_b.first.data(), yb);
      be_->download(got_b.second.data(), Xb);
      EXPECT_EQ(got_b, want_b) << "replay " << rep << ", second sum";
    }
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_NO_THROW(comm_->check_exchanges());
}

TEST_F(CudaTp, CommitMarkovEqualsTheExchangeThenTheCommit) {
  // The hand records (ties, a request past its k' on every rank, the second from another rank) committed at
  // positions 0, 1, 2 through two exchange points used in turn: ids, margins and prev equal argmax_exchange
  // then markov_commit's. Request 3 asks for no output (k' = 0): neither path writes its position.
  const std::vector<MarkovRecord> records = hand_records();
  const auto B = static_cast<int64_t>(records.size());
  const int64_t k = 5;
  const Exchange pair[2] = {comm_->make_exchange(be_->alloc(DType::i32, {B, kMarkovRecordWords})),
                            comm_->make_exchange(be_->alloc(DType::i32, {B, kMarkovRecordWords}))};
  if (shared_ && N_ > 1) {  // ranks sharing a GPU have no other path
    EXPECT_NE(pair[0].peers(), nullptr);
  }
  std::vector<int32_t> req(static_cast<size_t>(B * kReqFields), 0);
  for (int64_t r = 0; r < B; ++r)
    req[static_cast<size_t>(r * kReqFields + 3)] = r == 3 ? 0 : static_cast<int32_t>(k);
  Tensor reqs = be_->alloc(DType::i32, {B, kReqFields}),
         cand = be_->alloc(DType::i32, {B, kMarkovRecordWords});
  be_->upload(reqs, req.data());
  struct Out {
    std::vector<int32_t> ids, prev;
    std::vector<float> margin, q, norm;
  };
  const auto run = [&](bool fused) {
    const MarkovOutputs out{be_->alloc(DType::i32, {B, k}), be_->alloc(DType::f32, {B, k}),
                            be_->alloc(DType::f32, {B, k}), be_->alloc(DType::f32, {B, k, 2})};
    Tensor prev = be_->alloc(DType::i32, {B});
    for (const Tensor* t : {&out.ids, &out.margin, &out.q, &out.norm, static_cast<const Tensor*>(&prev)})
      be_->zero(*t);  // unwritten: 0
    for (int64_t j = 0; j < 3; ++j) {
      if (!fused) {
        be_->upload(cand, records.data());
        comm_->argmax_exchange(cand);
        be_->markov_commit(cand, reqs, j, prev, out);
      } else {
        const Exchange& p = pair[j % 2];
        be_->upload(p.buffer(), records.data());
        be_->commit_markov(p, reqs, j, prev, out);
      }
    }
    const auto n = static_cast<size_t>(B * k);
    Out o{std::vector<int32_t>(n), std::vector<int32_t>(static_cast<size_t>(B)), std::vector<float>(n),
          std::vector<float>(n), std::vector<float>(2 * n)};
    be_->download(o.ids.data(), out.ids);
    be_->download(o.prev.data(), prev);
    be_->download(o.margin.data(), out.margin);
    be_->download(o.q.data(), out.q);
    be_->download(o.norm.data(), out.norm);
    return o;
  };
  const Out want = run(false);
  EXPECT_EQ(want.ids[0], 100);  // the exchange itself, by hand: the lowest id of the tie
  EXPECT_EQ(want.ids[3 * static_cast<size_t>(k)], 0);  // k' = 0: never written
  EXPECT_EQ(want.ids[2 * static_cast<size_t>(k)], 1000 - (N_ - 1));
  EXPECT_EQ(want.ids[5 * static_cast<size_t>(k)], 200 + (N_ - 1));  // a draw: its token, not the argmax
  EXPECT_EQ(want.q[0], 1.0f);                                       // greedy
  const float z_last = 0.5f - 0.25f * static_cast<float>(N_ - 1), z_max = 0.25f * static_cast<float>(N_ - 1);
  EXPECT_NEAR(want.q[5 * static_cast<size_t>(k)], std::exp(z_last - z_max) / hand_z_sum(N_), 1e-6);
  const Out fused = run(true);
  EXPECT_EQ(fused.ids, want.ids) << "rank " << r_;
  EXPECT_EQ(fused.prev, want.prev) << "rank " << r_;
  EXPECT_EQ(fused.margin, want.margin) << "rank " << r_;
  EXPECT_EQ(fused.q, want.q) << "rank " << r_;
  EXPECT_EQ(fused.norm, want.norm) << "rank " << r_;
}

TEST_F(CudaTp, AnExchangeGivesUpOnALateRankNamesItAndStartsOver) {
  // A communicator whose kernels wait 300 ms: the last rank arrives 1.5 s late at two exchanges in a row.
  // The others give up on it within the timeout once (the second exchange of the failed step does not wait
  // again) and name it; the late rank finds every other rank's buffer long published and passes. Agreed on
  // and reset, the next exchanges sum every rank's partial again.
  if (N_ < 2) GTEST_SKIP() << "needs two ranks";
  const auto timeout = std::chrono::milliseconds(300);
  const std::unique_ptr<Communicator> comm =
      make_device_communicator(MPI_COMM_WORLD, be_->device(), be_->stream(), Tuning{}, timeout);
  const int64_t T = 3;
  ExpandCase c(*be_, *comm, r_, T);
  const Exchange a = comm->make_exchange(be_->alloc(DType::f32, {T, ExpandCase::kH}));
  const Exchange b = comm->make_exchange(be_->alloc(DType::f32, {T, ExpandCase::kH}));
  if (comm->any(a.peers() == nullptr || b.peers() == nullptr))
    GTEST_SKIP() << "no peer memory between these ranks (NCCL's collectives do not time out)";
  const int late = N_ - 1;
  const std::vector<float> p = c.partial();
  comm->barrier();
  if (r_ == late) std::this_thread::sleep_for(5 * timeout);
  const auto t0 = std::chrono::steady_clock::now();
  c.fused(a, p);
  c.fused(b, p);
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  std::string error;
  try {
    comm->check_exchanges();
  } catch (const ExchangeTimeout& e) {
    error = e.what();
  }
  if (r_ == late) {
    EXPECT_TRUE(error.empty()) << error;
  } else {
    EXPECT_NE(error.find("rank(s) " + std::to_string(late) + " did not reach"), std::string::npos) << error;
    EXPECT_GE(waited.count(), timeout.count() * 9 / 10);
    EXPECT_LT(waited.count(), timeout.count() + 1000) << "the second exchange waited again";
  }
  ASSERT_TRUE(comm->any(!error.empty()));
  comm->reset_exchanges();
  EXPECT_NO_THROW(comm->check_exchanges());
  for (int call = 0; call < 3; ++call) {
    const std::vector<float> q = c.partial();
    const ExpandCase::Out want = c.reference(q, true);
    EXPECT_EQ(c.fused(call % 2 == 0 ? a : b, q), want) << "call " << call << " after the reset";
  }
  EXPECT_NO_THROW(comm->check_exchanges());
}

// ---- the drafter at tp = N

// tp_test_config for this job's ranks (6 groups do not split over 4 or 8).
ModelConfig tp_config() {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  return test::tp_test_config(ranks);
}

// The drafter tests' checkpoint, shared by the job's ranks.
const fs::path& shared_checkpoint() {
  return test::shared_checkpoint_dir(MPI_COMM_WORLD, "cuda-tp-test", tp_config());
}

TEST_F(CudaTp, PeerSumOffKeepsNcclsCollectives) {
  // Tuning::peer_sum off: no exchange point in peer memory on any rank, so the ops run NCCL's collectives.
  if (shared_) GTEST_SKIP() << "NCCL refuses ranks that share a GPU";
  NcclCommunicator off(MPI_COMM_WORLD, be_->stream(), Tuning{.peer_sum = false});
  const Tensor local = be_->alloc(DType::f32, {5, 320});
  const Exchange ex = off.make_exchange(local);
  EXPECT_EQ(ex.peers(), nullptr);
  EXPECT_EQ(ex.buffer().data, local.data);
  EXPECT_EQ(off.make_exchange(be_->alloc(DType::i32, {5, 4})).peers(), nullptr);
}

class CudaTpDrafter : public CudaTp {
 protected:
  void SetUp() override {
    CudaTp::SetUp();
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
    cpu_tp_ = std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, plan_, cpu_), plan_, cpu_,
                                        mpi_, opt);
    batch_ = test::insert_tp_context({tp_.get(), one_.get(), cpu_tp_.get()}, cfg_.row_dim(), true);
  }

  CpuBackend cpu_;
  LocalCommunicator local_;
  MpiCommunicator mpi_{MPI_COMM_WORLD};  // the CPU reference at the same tp
  ModelConfig cfg_;
  ShardPlan plan_;
  std::unique_ptr<Drafter> tp_, one_, cpu_tp_;
  std::vector<DraftRequest> batch_;
};

TEST_F(CudaTpDrafter, DraftsAgreeWithTheCpuAtTheSameTpOutsideNearTies) {
  // The same shards and the same exchange rule on both sides (the sums in rank order, where the GPU's
  // exchanges are in peer memory): only the kernels' own accumulation order differs.
  if (N_ == 1) {
    EXPECT_FALSE(tp_->peer_exchange());
  }
  if (shared_ && N_ > 1) {  // ranks sharing a GPU have no other path
    EXPECT_TRUE(tp_->peer_exchange());
  }
  test::expect_drafters_agree(cfg_, *cpu_tp_, cpu_, *tp_, *be_, batch_);
}

TEST_F(CudaTpDrafter, DraftsAgreeWithTheCpuAtOneRankOutsideNearTies) {
  test::expect_drafters_agree(cfg_, *one_, cpu_, *tp_, *be_, batch_);
}

// d's replicated activations (every stage's residual stream, routing, attention and MoE outputs, the head's
// input) and its ids hash alike on every rank.
void expect_replicated_bits(Drafter& d, CudaBackend& be, Communicator& comm,
                            const std::vector<DraftRequest>& batch) {
  std::vector<std::pair<std::string, uint64_t>> hashes;
  d.set_trace([&](const std::string& n, const Tensor& t) {
    if (n.find("after_") != std::string::npos || n.find("route_") != std::string::npos ||
        n == "head_hidden" || n.ends_with("attn_out") || n.ends_with("moe_out"))
      hashes.emplace_back(n, tensor_hash(be, t));
  });
  const DraftResult mine = d.draft(batch);
  d.set_trace(nullptr);
  ASSERT_FALSE(hashes.empty());
  const int N = comm.size();
  for (const auto& [name, h] : hashes) {
    std::vector<uint64_t> all(static_cast<size_t>(N));
    comm.all_gather(&h, all.data(), sizeof(h));
    for (uint64_t x : all) EXPECT_EQ(x, all[0]) << name;
  }
  std::vector<int32_t> ids(mine.ids.size() * static_cast<size_t>(N));
  comm.all_gather(mine.ids.data(), ids.data(), mine.ids.size() * sizeof(int32_t));
  for (int r = 1; r < N; ++r)
    EXPECT_TRUE(std::equal(mine.ids.begin(), mine.ids.end(),
                           ids.begin() + r * static_cast<int64_t>(mine.ids.size())));
}

TEST_F(CudaTpDrafter, ReplicatedActivationsAreBitIdenticalAcrossRanks) {
  expect_replicated_bits(*tp_, *be_, *comm_, batch_);
  // The built-in run-time check passes as well.
  tp_->set_trace(nullptr);
  DrafterOptions opt = tp_->options();
  opt.check_replicated = true;
  const Checkpoint ckpt(shared_checkpoint());
  Drafter checked(cfg_, load_drafter_weights(ckpt, cfg_, plan_, *be_), plan_, *be_, *comm_, opt);
  EXPECT_NO_THROW(checked.draft(batch_));
}

TEST_F(CudaTpDrafter, PeerSumOffDraftsTheSameBits) {
  // One drafter on the communicator with peer memory (on one host its exchanges read the peers' buffers),
  // one on a communicator with Tuning::peer_sum off (NCCL's all-reduce and exchange): fed the same context,
  // they answer with the same bits (at tp 2; NCCL's ring sums 4 or more ranks in another order).
  if (shared_) GTEST_SKIP() << "NCCL refuses ranks that share a GPU";
  if (N_ > 2) GTEST_SKIP() << "NCCL's all-reduce order equals the rank order at two ranks only";
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

TEST_F(CudaTpDrafter, GraphReplaysWithCollectivesInsideEqualEagerSteps) {
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
  EXPECT_EQ(graphed->graph_counts().draft_graphs, 2 * cfg_.block_size);  // greedy and sampled
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

// The drafter, except that its step's inserts and draft start `stall` late.
class Stalls : public ForwardingEngine {
 public:
  Stalls(Drafter& d, std::chrono::milliseconds stall) : ForwardingEngine(d), stall_(stall) {}
  DraftResult insert_and_draft(std::span<const ContextBlock> b, const bf16_t* rows,
                               std::span<const DraftRequest> r, bool m) override {
    std::this_thread::sleep_for(stall_);
    return ForwardingEngine::insert_and_draft(b, rows, r, m);
  }

 private:
  std::chrono::milliseconds stall_;
};

TEST_F(CudaTpDrafter, ALateRankFailsTheStepWithInternalEverywhereAndTheDrafterServesOn) {
  // A drafter whose exchanges wait 300 ms; the last rank stalls 1.5 s inside the step's collective phase
  // (after the plan and the checks, before its draft is queued), as a stuck process or device would. The
  // others answer INTERNAL within the timeout (answer_now, before the late rank is back), then every rank
  // agrees, resets the step's slots and the exchanges; re-inserted, the same batch drafts the bits of the
  // drafter on the default communicator.
  if (N_ < 2) GTEST_SKIP() << "needs two ranks";
  const auto timeout = std::chrono::milliseconds(300);
  const std::unique_ptr<Communicator> comm =
      make_device_communicator(MPI_COMM_WORLD, be_->device(), be_->stream(), Tuning{}, timeout);
  const Checkpoint ckpt(shared_checkpoint());
  Drafter d(cfg_, load_drafter_weights(ckpt, cfg_, plan_, *be_), plan_, *be_, *comm, tp_->options());
  if (comm->any(!d.peer_exchange())) GTEST_SKIP() << "no peer memory between these ranks";
  test::insert_tp_context({&d}, cfg_.row_dim(), true);
  StepPlan plan;
  plan.drafts = batch_;
  const int late = N_ - 1;
  Stalls stalled(d, r_ == late ? 5 * timeout : std::chrono::milliseconds(0));
  comm->barrier();
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<std::chrono::milliseconds> answered_after;
  const StepResult failed = execute_step(stalled, *comm, plan, [&](const StepResult& r) {
    EXPECT_EQ(r.status.status, Status::internal);
    answered_after =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  });
  EXPECT_EQ(failed.status.status, Status::internal) << failed.status.message;
  if (r_ == late) {
    EXPECT_FALSE(answered_after.has_value());
  } else {
    EXPECT_TRUE(answered_after.has_value());
    EXPECT_LT(answered_after.value_or(std::chrono::milliseconds(1 << 30)).count(), timeout.count() + 1000);
    EXPECT_NE(failed.status.message.find("did not reach an exchange"), std::string::npos)
        << failed.status.message;
  }
  // The slots were reset: the host sends their context again, and the batch drafts as it should.
  test::insert_tp_context({&d}, cfg_.row_dim(), true);
  const StepResult again = execute_step(d, *comm, plan);
  ASSERT_TRUE(again.status.ok()) << again.status.message;
  const DraftResult want = tp_->draft(batch_);
  EXPECT_EQ(again.draft.ids, want.ids);
  EXPECT_EQ(again.draft.conf, want.conf);
  EXPECT_EQ(again.draft.margin, want.margin);
}

// ---- the quantised formats on the tp tests' model at tp = N (no golden case splits over 8 ranks)

// The released fp8 / fp4 format and the seed's EXL3 mix (hidden width 384: trellis matrices are multiples of
// 128 each way) at tp = N: the GPU against the CPU at the same tp (the same shards, the sums in rank order on
// both sides) and replicated activations bit-identical across ranks.
class CudaTpQuantDrafter : public CudaTp, public ::testing::WithParamInterface<SyntheticFormat> {
 protected:
  void SetUp() override {
    CudaTp::SetUp();
    if (IsSkipped()) return;
    ModelConfig base = tp_config();
    if (GetParam() == SyntheticFormat::exl3) base.dim = 384;
    const std::string name = GetParam() == SyntheticFormat::fp8 ? "cuda-tp-test-fp8" : "cuda-tp-test-exl3";
    const Checkpoint ckpt(test::shared_checkpoint_dir(
        MPI_COMM_WORLD, name, synthetic_model_config(base, GetParam(), ConfigLayout::inference)));
    cfg_ = load_model_config(ckpt.config_path());
    DrafterOptions opt;
    opt.slots = 4;
    opt.max_batch = 4;
    const ShardPlan plan = make_shard_plan(cfg_, r_, N_);
    gpu_d_ = std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, plan, *be_), plan, *be_, *comm_,
                                       opt);
    cpu_d_ =
        std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, plan, cpu_), plan, cpu_, mpi_, opt);
    batch_ = test::insert_tp_context({gpu_d_.get(), cpu_d_.get()}, cfg_.row_dim(), true);
  }

  CpuBackend cpu_;
  MpiCommunicator mpi_{MPI_COMM_WORLD};
  ModelConfig cfg_;
  std::unique_ptr<Drafter> gpu_d_, cpu_d_;
  std::vector<DraftRequest> batch_;
};

TEST_P(CudaTpQuantDrafter, DraftsAgreeWithTheCpuAtTheSameTpOutsideNearTies) {
  // A product's last bit may differ between the kernels and the CPU; where it moves a re-quantised
  // activation (fp8) or an fp16 rounding point (EXL3) across a step, the later stages carry it (kQuantRule).
  test::expect_drafters_agree(cfg_, *cpu_d_, cpu_, *gpu_d_, *be_, batch_, test::kQuantRule);
}

TEST_P(CudaTpQuantDrafter, ReplicatedActivationsAreBitIdenticalAcrossRanks) {
  expect_replicated_bits(*gpu_d_, *be_, *comm_, batch_);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaTpQuantDrafter,
                         ::testing::Values(SyntheticFormat::fp8, SyntheticFormat::exl3),
                         [](const ::testing::TestParamInfo<SyntheticFormat>& i) {
                           return std::string(i.param == SyntheticFormat::fp8 ? "fp8" : "exl3");
                         });

// ---- the golden cases of the quantised formats at tp = N

// A golden case on the CUDA backend at tp = N (its exchanges in peer memory on one host): each rank's shard
// of every weight, the requests drafted once (the routing traced), and whether every rank answers the same
// bits.
class CudaTpGoldenCase : public CudaTp {
 protected:
  explicit CudaTpGoldenCase(const char* name) : dir_(test::golden_case_dir(name)) {}

  void SetUp() override {
    CudaTp::SetUp();
    if (IsSkipped()) return;
    if (!test::have_golden(dir_)) GTEST_SKIP() << "no golden case at " << dir_;
    const Checkpoint ckpt(dir_ / "ckpt");
    cfg_ = load_model_config(ckpt.config_path());
    // The golden model (the tiny config) splits up to tp 4: the same answer on every rank.
    if (cfg_.o_groups % N_ != 0)
      GTEST_SKIP() << "the golden model's " << cfg_.o_groups << " groups do not split over " << N_
                   << " ranks";
    const ShardPlan plan = make_shard_plan(cfg_, r_, N_);
    DrafterOptions opt;
    opt.slots = 2;
    opt.max_batch = 4;
    Drafter d(cfg_, load_drafter_weights(ckpt, cfg_, plan, *be_), plan, *be_, *comm_, opt);
    test::insert_golden_rows(d, 2, dir_);
    d.set_trace([this](const std::string& name, const Tensor& t) {
      if (name.find("route_ids") != std::string::npos) trace_[name] = test::to_floats(*be_, t);
    });
    result_ = d.draft(test::golden_requests(dir_));
    expected_ = test::golden_expected(dir_);
  }

  const std::filesystem::path dir_;
  ModelConfig cfg_;
  test::Trace trace_;
  DraftResult result_;
  nlohmann::json expected_;
};

// The released format (fp8 block linears, fp4 routed experts): the drafts meet the golden rule as the CPU's
// at tp = N do (tests/mpi/test_golden_fp8_tp.cpp).
class CudaTpGoldenFp8 : public CudaTpGoldenCase {
 protected:
  CudaTpGoldenFp8() : CudaTpGoldenCase("tiny-v41-fp8") {}
};

TEST_F(CudaTpGoldenFp8, DraftsMeetTheGoldenRuleAndEveryRankAnswersTheSame) {
  const test::Fp8Routing routing = test::expect_fp8_routing(trace_, cfg_.n_mtp_layers, dir_, 2);
  test::expect_fp8_ids(result_, expected_, dir_);
  test::expect_fp8_conf(result_, expected_, routing, dir_, test::Fp8ConfRule::logit);
  test::expect_every_rank_answers_alike(*comm_, result_);
}

// The seed's EXL3 mix (the seed's own deployment is EXL3 at tp = 2): 128-aligned trellis shards, the drafts
// meeting the README's rule.
class CudaTpGoldenExl3 : public CudaTpGoldenCase {
 protected:
  CudaTpGoldenExl3() : CudaTpGoldenCase("tiny-v41-exl3") {}
};

TEST_F(CudaTpGoldenExl3, DraftsMeetTheGoldenRuleAndEveryRankAnswersTheSame) {
  test::expect_exl3_golden_rule(result_, expected_);
  test::expect_every_rank_answers_alike(*comm_, result_);
}

}  // namespace
}  // namespace dspark
