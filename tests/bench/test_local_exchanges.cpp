// The communicator that replaces a step's exchanges by local copies of what they gave (dspark_bench
// --exchange-cost): each call gets back the result of its own place in the step, nothing crosses ranks once
// learned, and a drafter on it drafts what a drafter on the plain communicator drafts.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/bench/local_exchanges.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/error.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark::bench {
namespace {

// Two ranks whose other rank holds a known partial: a sum adds 100 to every element, an argmax exchange
// adds 7 to every word. Counts what reaches it.
class FakeTwoRanks final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce_sum(const Tensor& t) override {
    ++sums;
    for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] += 100.0f;
  }
  void argmax_exchange(const Tensor& t) override {
    ++argmaxes;
    for (int64_t i = 0; i < t.numel(); ++i) t.as<int32_t>()[i] += 7;
  }
  void broadcast(void*, size_t, int) override { ++host_calls; }
  void all_gather(const void*, void*, size_t) override { ++host_calls; }
  bool any(bool flag) override {
    ++host_calls;
    return flag;
  }
  void barrier() override { ++host_calls; }
  int sums = 0, argmaxes = 0, host_calls = 0;
};

std::vector<float> floats(const Tensor& t) {
  return {t.as<float>(), t.as<float>() + t.numel()};
}
std::vector<int32_t> words(const Tensor& t) {
  return {t.as<int32_t>(), t.as<int32_t>() + t.numel()};
}
void fill(const Tensor& t, float first) {
  std::iota(t.as<float>(), t.as<float>() + t.numel(), first);
}
void fill_words(const Tensor& t, int32_t first) {
  std::iota(t.as<int32_t>(), t.as<int32_t>() + t.numel(), first);
}

class LocalExchangesTest : public ::testing::Test {
 protected:
  CpuBackend be_;
  FakeTwoRanks inner_;
  LocalExchangeCommunicator lx_{inner_, be_};
};

TEST_F(LocalExchangesTest, EachExchangeOfAStepGetsBackTheResultOfItsOwnPlace) {
  // One step: two sums (the halves of a stage), then three argmax exchanges (the positions), into the same
  // buffers each time as the drafter's exchange points are reused.
  const Tensor sum = be_.alloc(DType::f32, {2, 3}), cand = be_.alloc(DType::i32, {1, 8});
  fill(sum, 0.0f);
  lx_.all_reduce_sum(sum);  // 100, 101, ... 105
  fill(sum, 10.0f);
  lx_.all_reduce_sum(sum);  // 110 ... 115
  for (int32_t j = 0; j < 3; ++j) {
    fill_words(cand, 1000 * j);
    lx_.argmax_exchange(cand);  // 1000 j + 7 ...
  }
  EXPECT_EQ(inner_.sums, 2);
  EXPECT_EQ(inner_.argmaxes, 3);
  EXPECT_EQ(lx_.learned(), 5);

  lx_.set_mode(LocalExchangeCommunicator::Mode::local);
  fill(sum, -50.0f);  // whatever the step computed: the kept result replaces it
  lx_.all_reduce_sum(sum);
  EXPECT_EQ(floats(sum), (std::vector<float>{100, 101, 102, 103, 104, 105}));
  lx_.all_reduce_sum(sum);
  EXPECT_EQ(floats(sum), (std::vector<float>{110, 111, 112, 113, 114, 115}));
  for (int32_t j = 0; j < 3; ++j) {
    fill_words(cand, -1);
    lx_.argmax_exchange(cand);
    std::vector<int32_t> want(8);
    std::iota(want.begin(), want.end(), 1000 * j + 7);
    EXPECT_EQ(words(cand), want) << "position " << j;
  }
  // The next step starts again at sum 0.
  lx_.all_reduce_sum(sum);
  EXPECT_EQ(floats(sum)[0], 100.0f);
  EXPECT_EQ(inner_.sums, 2);  // nothing crossed ranks after learning
  EXPECT_EQ(inner_.argmaxes, 3);
  EXPECT_EQ(lx_.copied(), 6);
}

TEST_F(LocalExchangesTest, StepsOfOtherShapesKeepResultsOfTheirOwn) {
  // A step of B = 1 and one of B = 2, each a sum and an argmax exchange; served back in the other order.
  const Tensor s1 = be_.alloc(DType::f32, {5, 2}), s2 = be_.alloc(DType::f32, {10, 2});
  const Tensor c1 = be_.alloc(DType::i32, {1, 8}), c2 = be_.alloc(DType::i32, {2, 8});
  for (const auto& [s, c] : {std::pair{s1, c1}, std::pair{s2, c2}}) {
    fill(s, 0.0f);
    lx_.all_reduce_sum(s);
    fill_words(c, 0);
    lx_.argmax_exchange(c);
  }
  lx_.set_mode(LocalExchangeCommunicator::Mode::local);
  for (const auto& [s, c] : {std::pair{s2, c2}, std::pair{s1, c1}}) {
    fill(s, -1.0f);
    lx_.all_reduce_sum(s);
    EXPECT_EQ(floats(s).back(), 100.0f + static_cast<float>(s.numel() - 1));
    fill_words(c, -1);
    lx_.argmax_exchange(c);
    EXPECT_EQ(words(c).back(), 7 + c.numel() - 1);
  }
}

TEST_F(LocalExchangesTest, AnExchangeNeverLearnedIsRefusedByPlaceAndShape) {
  const Tensor sum = be_.alloc(DType::f32, {2, 3});
  lx_.all_reduce_sum(sum);
  lx_.set_mode(LocalExchangeCommunicator::Mode::local);
  lx_.all_reduce_sum(sum);
  try {
    lx_.all_reduce_sum(sum);  // a second sum in the step: only one was learned
    FAIL() << "a sum never learned was served";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum 1 of a step on f32 [2, 3] was never learned"),
              std::string::npos)
        << e.what();
  }
  const Tensor cand = be_.alloc(DType::i32, {2, 8});
  EXPECT_THROW(lx_.argmax_exchange(cand), Error);
}

TEST_F(LocalExchangesTest, HostCallsGoToTheWrappedCommunicator) {
  lx_.set_mode(LocalExchangeCommunicator::Mode::local);
  int x = 0;
  lx_.broadcast(&x, sizeof x, 0);
  lx_.barrier();
  EXPECT_TRUE(lx_.any(true));
  EXPECT_EQ(inner_.host_calls, 3);
  EXPECT_EQ(lx_.size(), 2);
  EXPECT_FALSE(lx_.make_exchange(be_.alloc(DType::f32, {1})).peers());
}

// The drafter's own sequence of exchanges: with every sum and argmax exchange of its steps served from the
// copies (the plain drafter's LocalCommunicator computes the same values in place), a drafter on the local
// exchanges drafts what the plain drafter drafts, at two batch sizes and after another batch's step; a copy
// of another stage's or position's result would change the drafts.
TEST(LocalExchangesDrafter, DraftsWhatThePlainDrafterDrafts) {
  const Checkpoint ckpt(test::tiny_checkpoint());
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const ShardPlan plan = make_shard_plan(cfg, 0, 1);
  CpuBackend be;
  LocalCommunicator plain_comm;
  LocalExchangeCommunicator lx(plain_comm, be);
  DrafterOptions opt;
  opt.slots = 3;
  opt.max_batch = 3;
  Drafter plain(cfg, load_drafter_weights(ckpt, cfg, plan, be), plan, be, plain_comm, opt);
  Drafter local(cfg, load_drafter_weights(ckpt, cfg, plan, be), plan, be, lx, opt);
  std::vector<bf16_t> rows(static_cast<size_t>(24 * cfg.row_dim()));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = float_to_bf16(std::sin(0.37f * static_cast<float>(i)));
  for (int32_t s = 0; s < 3; ++s) {
    plain.insert(s, 0, rows.data() + s * 8 * cfg.row_dim(), 8);
    local.insert(s, 0, rows.data() + s * 8 * cfg.row_dim(), 8);
  }
  const std::vector<DraftRequest> one{{0, 5, 8, -1, 0}};
  const std::vector<DraftRequest> three{{0, 5, 8, -1, 0}, {1, 9, 8, -1, 0}, {2, 3, 8, -1, 0}};
  (void)local.draft(one);  // learned
  (void)local.draft(three);
  lx.set_mode(LocalExchangeCommunicator::Mode::local);
  const int64_t exchanges = 2 * cfg.n_mtp_layers + cfg.block_size;
  EXPECT_EQ(lx.learned(), 2 * exchanges);
  for (const auto* reqs : {&three, &one, &three}) {
    const DraftResult want = plain.draft(*reqs), got = local.draft(*reqs);
    EXPECT_EQ(got.ids, want.ids) << reqs->size() << " requests";
    EXPECT_EQ(got.margin, want.margin) << reqs->size() << " requests";
    EXPECT_EQ(got.conf_logit, want.conf_logit) << reqs->size() << " requests";
  }
  EXPECT_EQ(lx.learned(), 2 * exchanges);
  EXPECT_EQ(lx.copied(), 3 * exchanges);
}

}  // namespace
}  // namespace dspark::bench
