// The step loop across ranks: plans arrive intact on every rank, a step failing on one rank fails on all (its
// slots reset everywhere, INTERNAL answered), repeated failures end the loop unhealthy, shutdown ends it
// cleanly, a peer exchange that gave up on a late rank fails the step on every rank and the exchanges start
// over.
#include <gtest/gtest.h>
#include <mpi.h>

#include <deque>
#include <random>

#include "comm/mpi_communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/forwarding_engine.hpp"
#include "lib/model/load_weights.hpp"
#include "lib/runtime/plan_broadcast.hpp"
#include "lib/runtime/step_loop.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

LoopOptions unhealthy_after(int64_t failed_steps) {
  LoopOptions o;
  o.max_failed_steps = failed_steps;
  return o;
}

TEST(BroadcastPlan, EveryRankReceivesTheSamePlan) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t row_dim = 3;
  StepPlan p;
  if (comm.rank() == 0) {
    p.id = 42;
    p.max_model_len = 77;
    p.margin = false;
    p.resets = {3, 1};
    p.contexts = {{2, 10, 2}};
    p.rows = {1, 2, 3, 4, 5, 6};
    p.drafts = {{2, 9, 12, 5, 3}};
  }
  broadcast_plan(comm, p, row_dim);
  EXPECT_EQ(p.id, 42u);
  EXPECT_EQ(p.max_model_len, 77);
  EXPECT_FALSE(p.margin);
  EXPECT_FALSE(p.shutdown);
  EXPECT_EQ(p.resets, (std::vector<int32_t>{3, 1}));
  ASSERT_EQ(p.contexts.size(), 1u);
  EXPECT_EQ(p.contexts[0].first_pos, 10);
  EXPECT_EQ(p.rows, (RowVector{1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(p.drafts.size(), 1u);
  EXPECT_EQ(p.drafts[0].window_low, 5);
  EXPECT_EQ(p.drafts[0].outputs, 3);
}

class StepLoopTest : public ::testing::Test {
 protected:
  // Rank 1's drafter has a smaller max_model_len: an insert valid on rank 0 fails there only.
  void SetUp() override {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    unsigned long id = static_cast<unsigned long>(::getpid());
    MPI_Bcast(&id, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
    dir_ = std::filesystem::temp_directory_path() / ("dspark-steploop-" + std::to_string(id));
    if (rank == 0) {
      SyntheticOptions o;
      o.force = true;
      write_synthetic_checkpoint(tiny_model_config(), dir_, o);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const Checkpoint ckpt(dir_);
    cfg_ = load_model_config(ckpt.config_path());
    const ShardPlan plan = make_shard_plan(cfg_, comm_.rank(), comm_.size());
    DrafterOptions opt;
    opt.slots = 4;
    opt.max_batch = 2;
    opt.max_model_len = comm_.rank() == 1 ? 50 : 100;
    drafter_ =
        std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, plan, be_), plan, be_, comm_, opt);
    limits_ = {4, 2, 64, 100, 100, cfg_.vocab_size, cfg_.block_size, cfg_.row_dim()};
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (comm_.rank() == 0) std::filesystem::remove_all(dir_);
  }

  StepPlan insert_plan(int32_t slot, int32_t first, int32_t n) const {
    StepPlan p;
    p.contexts = {{slot, first, n}};
    std::mt19937 rng(static_cast<unsigned>(first));
    std::normal_distribution<float> normal;
    p.rows.resize(static_cast<size_t>(n * cfg_.row_dim()));
    for (auto& v : p.rows) v = float_to_bf16(normal(rng));
    p.drafts = {{slot, 5, first + n, -1, 0}};
    return p;
  }

  std::filesystem::path dir_;
  MpiCommunicator comm_{MPI_COMM_WORLD};
  CpuBackend be_;
  ModelConfig cfg_;
  StepLimits limits_;
  std::unique_ptr<Drafter> drafter_;
};

TEST_F(StepLoopTest, AStepFailingOnOneRankFailsOnAllAndResetsItsSlots) {
  if (comm_.size() < 2) GTEST_SKIP() << "needs two ranks";
  const StepResult ok = execute_step(*drafter_, comm_, insert_plan(0, 0, 20));
  EXPECT_TRUE(ok.status.ok()) << ok.status.message;
  const DraftResult before = ok.draft;
  // Positions 55..59 are valid on rank 0 only.
  const StepResult bad = execute_step(*drafter_, comm_, insert_plan(0, 55, 5));
  EXPECT_EQ(bad.status.status, Status::internal);
  EXPECT_FALSE(bad.status.message.empty());
  // Slot 0 was reset on every rank: drafting it now equals drafting an empty slot.
  StepPlan probe;
  probe.drafts = {{0, 5, 20, -1, 0}, {3, 5, 20, -1, 0}};
  const StepResult after = execute_step(*drafter_, comm_, probe);
  ASSERT_TRUE(after.status.ok());
  const int64_t k = cfg_.block_size;
  for (int64_t j = 0; j < k; ++j) EXPECT_EQ(after.draft.conf[j], after.draft.conf[k + j]) << j;
  EXPECT_NE(after.draft.conf[0], before.conf[0]);
}

TEST_F(StepLoopTest, ANonFiniteDraftIsAnErrorAndResetsItsSlot) {
  // A context row with a NaN (which check_plan refuses from a host) poisons the slot's drafts: the step is
  // INTERNAL with no answer, on every rank, and the slot starts clean again.
  StepPlan poisoned = insert_plan(1, 0, 8);
  poisoned.rows[static_cast<size_t>(3 * cfg_.row_dim() + 7)] = 0x7fc1;  // row 3, element 7: a NaN
  const StepResult bad = execute_step(*drafter_, comm_, poisoned);
  EXPECT_EQ(bad.status.status, Status::internal);
  EXPECT_NE(bad.status.message.find("the draft is not finite"), std::string::npos) << bad.status.message;
  EXPECT_TRUE(bad.draft.conf.empty());
  StepPlan probe;
  probe.drafts = {{1, 5, 8, -1, 0}, {3, 5, 8, -1, 0}};  // slot 1 again and a never-used slot
  const StepResult after = execute_step(*drafter_, comm_, probe);
  ASSERT_TRUE(after.status.ok()) << after.status.message;
  const int64_t k = cfg_.block_size;
  for (int64_t j = 0; j < k; ++j) EXPECT_EQ(after.draft.conf[j], after.draft.conf[k + j]) << j;
}

// Feeds rank 0's loop a fixed list of plans and records the answers.
class ListSource : public PlanSource {
 public:
  explicit ListSource(std::deque<StepPlan> plans) : plans_(std::move(plans)) {}
  std::optional<StepPlan> next() override {
    if (plans_.empty()) return std::nullopt;
    StepPlan p = std::move(plans_.front());
    plans_.pop_front();
    return p;
  }
  void complete(const StepPlan&, const StepResult& r) override { answers.push_back(r.status.status); }
  std::vector<Status> answers;

 private:
  std::deque<StepPlan> plans_;
};

TEST_F(StepLoopTest, RejectedPlansNeverReachTheOtherRanksAndShutdownIsClean) {
  StepPlan bad_token = insert_plan(1, 0, 8);
  bad_token.drafts[0].anchor_token = static_cast<int32_t>(cfg_.vocab_size);
  ListSource source({insert_plan(1, 0, 8), bad_token, insert_plan(2, 0, 30)});
  const int rc =
      run_step_loop(*drafter_, comm_, comm_.rank() == 0 ? &source : nullptr, limits_, unhealthy_after(3));
  EXPECT_EQ(rc, 0);
  if (comm_.rank() == 0) {
    EXPECT_EQ(source.answers, (std::vector<Status>{Status::ok, Status::invalid_argument, Status::ok}));
  }
}

TEST_F(StepLoopTest, RepeatedFailuresMakeTheWorkerUnhealthy) {
  if (comm_.size() < 2) GTEST_SKIP() << "needs two ranks";
  ListSource source({insert_plan(0, 60, 4), insert_plan(1, 60, 4), insert_plan(2, 0, 8),
                     insert_plan(0, 60, 4), insert_plan(1, 60, 4), insert_plan(2, 60, 4),
                     insert_plan(3, 0, 8)});
  const int rc =
      run_step_loop(*drafter_, comm_, comm_.rank() == 0 ? &source : nullptr, limits_, unhealthy_after(3));
  EXPECT_EQ(rc, 1);
  if (comm_.rank() == 0) {  // two failures, a success (the count restarts), then three in a row: stop
    EXPECT_EQ(source.answers, (std::vector<Status>{Status::internal, Status::internal, Status::ok,
                                                   Status::internal, Status::internal, Status::internal}));
  }
}

// The drafter, except that on rank `late_on` every insert_and_draft ends as a peer exchange that gave up on a
// late rank does: the kernels ran (the answer is there), then ExchangeTimeout.
class TimesOut : public ForwardingEngine {
 public:
  TimesOut(Drafter& d, int rank, int late_on) : ForwardingEngine(d), times_out_(rank == late_on) {}
  DraftResult insert_and_draft(std::span<const ContextBlock> b, const bf16_t* rows,
                               std::span<const DraftRequest> r, bool m) override {
    DraftResult out = ForwardingEngine::insert_and_draft(b, rows, r, m);
    if (times_out_) throw ExchangeTimeout("rank(s) 9 did not reach an exchange within 5 ms");
    return out;
  }

 private:
  bool times_out_;
};

// MpiCommunicator, counting reset_exchanges.
class CountsResets : public Communicator {
 public:
  explicit CountsResets(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  void all_reduce_sum(const Tensor& t) override { c_.all_reduce_sum(t); }
  void argmax_exchange(const Tensor& t) override { c_.argmax_exchange(t); }
  void broadcast(void* d, size_t n, int root) override { c_.broadcast(d, n, root); }
  void all_gather(const void* m, void* a, size_t n) override { c_.all_gather(m, a, n); }
  bool any(bool f) override { return c_.any(f); }
  bool exchanges_may_time_out() const override { return true; }  // as a peer-memory communicator
  void barrier() override { c_.barrier(); }
  void reset_exchanges() override {
    ++resets;
    c_.barrier();  // collective, as the peer-memory communicators' is
  }
  int resets = 0;

 private:
  Communicator& c_;
};

TEST_F(StepLoopTest, AnExchangeThatGaveUpOnALateRankFailsTheStepEverywhereAndTheWorkerServesOn) {
  if (comm_.size() < 2) GTEST_SKIP() << "needs two ranks";
  CountsResets comm(comm_);
  TimesOut engine(*drafter_, comm_.rank(), /*late_on=*/1);
  std::vector<Status> early;
  const auto answer_now = [&](const StepResult& r) { early.push_back(r.status.status); };
  const StepResult failed = execute_step(engine, comm, insert_plan(0, 0, 20), answer_now);
  EXPECT_EQ(failed.status.status, Status::internal);
  EXPECT_TRUE(failed.draft.conf.empty());
  EXPECT_EQ(comm.resets, 1);
  if (comm_.rank() == 1) {  // the rank that saw the timeout answers at once, with its reason
    EXPECT_EQ(early, (std::vector<Status>{Status::internal}));
    EXPECT_NE(failed.status.message.find("did not reach an exchange"), std::string::npos);
  } else {  // the others learn of it from the agreement
    EXPECT_TRUE(early.empty());
    EXPECT_EQ(failed.status.message, "the step failed on another rank");
  }
  // Slot 0 was reset on every rank (the late rank's answer is not trusted): it drafts as an empty slot.
  StepPlan probe;
  probe.drafts = {{0, 5, 20, -1, 0}, {3, 5, 20, -1, 0}};
  const StepResult after = execute_step(*drafter_, comm, probe);
  ASSERT_TRUE(after.status.ok()) << after.status.message;
  const int64_t k = cfg_.block_size;
  for (int64_t j = 0; j < k; ++j) EXPECT_EQ(after.draft.conf[j], after.draft.conf[k + j]) << j;
  EXPECT_EQ(comm.resets, 1);  // a good step resets nothing
}

TEST_F(StepLoopTest, ExchangeTimeoutsInARowMakeTheWorkerUnhealthyAndEachStepIsAnsweredOnce) {
  if (comm_.size() < 2) GTEST_SKIP() << "needs two ranks";
  CountsResets comm(comm_);
  TimesOut engine(*drafter_, comm_.rank(), /*late_on=*/0);  // rank 0 answers its hosts early
  ListSource source({insert_plan(0, 0, 8), insert_plan(1, 0, 8), insert_plan(2, 0, 8), insert_plan(3, 0, 8)});
  const int rc =
      run_step_loop(engine, comm, comm_.rank() == 0 ? &source : nullptr, limits_, unhealthy_after(3));
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(comm.resets, 3);
  if (comm_.rank() == 0) {
    EXPECT_EQ(source.answers, (std::vector<Status>{Status::internal, Status::internal, Status::internal}));
  }
}

}  // namespace
}  // namespace dspark
