// The load-time option that re-quantises the dense head to fp8 block (SPEC §3, weights.head: fp8): scale
// bytes and codes of hand-made blocks, the cut rule, each rank's part of the tiny checkpoint's head equal to
// the whole head's blocks, the refusal of a vocabulary cut off the blocks, and drafts on the CPU backend
// running the head as an fp8 linear: finite, and the tokens of the dense head where its margins are clear.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "lib/model/requantize.hpp"
#include "tests/support/tensor_host.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<uint8_t> bytes_of(Backend& be, const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  be.download(b.data(), t);
  return b;
}

TEST(RequantizeFp8Block, ScaleBytesAndCodesOfHandMadeBlocks) {
  // A [64, 64] bf16 weight in 32 x 32 blocks:
  //   (0, 0) 0.25 except w[0][0] = 1 and w[1][1] = 0.5: amax 1, 1/448 = 2^-8.8 -> scale 2^-8, byte 119;
  //          codes 1 * 2^8 = 2^8 -> 0x78, 0.5 -> 2^7 -> 0x70, 0.25 -> 2^6 -> 0x68.
  //   (0, 1) 3 except w[0][32] = 448 and w[1][33] = bf16(3.3) = 3.296875: amax 448 -> 2^0, byte 127;
  //          448 -> 0x7e, 3 = 1.5 * 2 -> 0x44, 3.296875 rounds to 3.25 = 1.625 * 2 -> 0x45.
  //   (1, 0) -0.75: 0.75/448 = 2^-9.2 -> 2^-9, byte 118; -0.75 * 2^9 = -384 = -1.5 * 2^8 -> 0xfc.
  //   (1, 1) zeros: amax 0 -> the smallest scale, byte 0; codes 0.
  std::vector<float> v(64 * 64);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) v[r * 64 + c] = r < 32 ? (c < 32 ? 0.25f : 3.0f) : (c < 32 ? -0.75f : 0.0f);
  v[0 * 64 + 0] = 1.0f;
  v[1 * 64 + 1] = 0.5f;
  v[0 * 64 + 32] = 448.0f;
  v[1 * 64 + 33] = 3.3f;
  CpuBackend be;
  const LinearWeight dense = dense_linear("test.weight", test::make_tensor(be, DType::bf16, {64, 64}, v));
  const LinearWeight q = requantize_fp8_block(dense, 32, 0, 64, be);
  EXPECT_EQ(q.format, WeightFormat::fp8_block);
  EXPECT_EQ(q.block, 32);
  EXPECT_EQ(q.out, 64);
  EXPECT_EQ(q.in, 64);
  EXPECT_EQ(q.weight.dtype, DType::f8_e4m3);
  EXPECT_EQ(q.scale.dtype, DType::f8_e8m0);
  EXPECT_EQ(q.scale.shape, (Shape{2, 2}));
  EXPECT_EQ(bytes_of(be, q.scale), (std::vector<uint8_t>{119, 127, 118, 0}));
  const std::vector<uint8_t> codes = bytes_of(be, q.weight);
  EXPECT_EQ(codes[0 * 64 + 0], 0x78);
  EXPECT_EQ(codes[1 * 64 + 1], 0x70);
  EXPECT_EQ(codes[5 * 64 + 7], 0x68);
  EXPECT_EQ(codes[0 * 64 + 32], 0x7e);
  EXPECT_EQ(codes[2 * 64 + 40], 0x44);
  EXPECT_EQ(codes[1 * 64 + 33], 0x45);
  EXPECT_EQ(codes[40 * 64 + 3], 0xfc);
  EXPECT_EQ(codes[63 * 64 + 63], 0x00);
}

TEST(RequantizeFp8Block, APartMustStartOnABlock) {
  CpuBackend be;
  const LinearWeight part = dense_linear("head.weight", be.alloc(DType::bf16, {40, 64}));
  be.zero(part.weight);
  // Rows [16, 56) of 128: starts inside a block.
  EXPECT_THAT([&] { requantize_fp8_block(part, 32, 16, 128, be); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("'head.weight'"), HasSubstr("[16, 56) of 128"),
                                                    HasSubstr("32-row blocks"))));
  // Rows [32, 72) of 128: 40 rows end inside a block that the next part would share.
  EXPECT_THROW(requantize_fp8_block(part, 32, 32, 128, be), Error);
  // Rows [32, 72) of 72: the last part may end on a partial block.
  EXPECT_EQ(requantize_fp8_block(part, 32, 32, 72, be).scale.shape, (Shape{2, 2}));
}

struct Loaded {
  CpuBackend be;
  ModelConfig cfg;
  ShardPlan plan;
  DrafterWeights w;
};

std::unique_ptr<Loaded> load(int rank, int ranks, bool head_fp8) {
  auto l = std::make_unique<Loaded>();
  const Checkpoint ckpt(test::tiny_checkpoint());
  l->cfg = load_model_config(ckpt.config_path());
  l->plan = make_shard_plan(l->cfg, rank, ranks);
  LoadOptions opt;
  opt.head_fp8 = head_fp8;
  l->w = load_drafter_weights(ckpt, l->cfg, l->plan, l->be, opt);
  return l;
}

TEST(HeadFp8, TheHeadIsFp8BlockAndEachRankHoldsTheWholeHeadsBlocks) {
  const auto dense = load(0, 1, false), whole = load(0, 1, true), half = load(1, 2, true);
  EXPECT_EQ(dense->w.head.format, WeightFormat::dense);
  const LinearWeight& h = whole->w.head;
  EXPECT_EQ(h.format, WeightFormat::fp8_block);
  EXPECT_EQ(h.block, 32);
  EXPECT_EQ(h.weight.shape, (Shape{1024, 256}));
  EXPECT_EQ(h.scale.shape, (Shape{32, 8}));  // 1024 / 32 x 256 / 32
  // [1024, 256] bf16 (524288 bytes) becomes 262144 code bytes and 256 scale bytes.
  EXPECT_EQ(whole->w.bytes, dense->w.bytes - 524288 + 262144 + 256);
  // Rank 1 of 2 holds vocabulary rows [512, 1024): scale rows 16..31 and code rows 512.. of the whole head.
  const LinearWeight& p = half->w.head;
  EXPECT_EQ(p.weight.shape, (Shape{512, 256}));
  EXPECT_EQ(p.scale.shape, (Shape{16, 8}));
  const std::vector<uint8_t> ws = bytes_of(whole->be, h.scale), wc = bytes_of(whole->be, h.weight);
  EXPECT_EQ(bytes_of(half->be, p.scale), std::vector<uint8_t>(ws.begin() + 16 * 8, ws.end()));
  EXPECT_EQ(bytes_of(half->be, p.weight), std::vector<uint8_t>(wc.begin() + 512 * 256, wc.end()));
  // The other linears are as stored.
  EXPECT_EQ(whole->w.stages[0].wq_b.format, WeightFormat::dense);
}

TEST(HeadFp8, WithoutTheOptionTheHeadIsTheCheckpointsBytes) {
  const auto l = load(0, 1, false);
  const Checkpoint ckpt(test::tiny_checkpoint());
  std::vector<uint8_t> stored(ckpt.get("head.weight").nbytes);
  ckpt.read("head.weight", stored.data());
  EXPECT_EQ(l->w.head.format, WeightFormat::dense);
  EXPECT_EQ(l->w.head.weight.dtype, DType::bf16);
  EXPECT_TRUE(l->w.head.scale.empty());
  EXPECT_EQ(bytes_of(l->be, l->w.head.weight), stored);
}

TEST(HeadFp8, AVocabularyCutOffTheBlocksIsRefused) {
  // With 512-row blocks, tp = 4 gives rank 1 vocabulary rows [256, 512): not on a block.
  const Checkpoint ckpt(test::tiny_checkpoint());
  ModelConfig cfg = load_model_config(ckpt.config_path());
  cfg.weight_block_size = 512;
  CpuBackend be;
  LoadOptions opt;
  opt.head_fp8 = true;
  try {
    load_drafter_weights(ckpt, cfg, make_shard_plan(cfg, 1, 4), be, opt);
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("weights.head fp8"), HasSubstr("'head.weight'"),
                                HasSubstr("model.safetensors"), HasSubstr("[256, 512) at tp = 4"),
                                HasSubstr("512-row fp8 blocks")));
  }
  // Rank 0's rows [0, 256) start on a block but end inside it.
  EXPECT_THROW(load_drafter_weights(ckpt, cfg, make_shard_plan(cfg, 0, 4), be, opt), Error);
  // At tp = 2 the cut at 512 is on a block.
  EXPECT_EQ(load_drafter_weights(ckpt, cfg, make_shard_plan(cfg, 1, 2), be, opt).head.scale.shape,
            (Shape{1, 1}));
}

TEST(HeadFp8, DraftsAreFiniteAndTheDenseHeadsTokensWhereItsMarginsAreClear) {
  const auto dense = load(0, 1, false), fp8 = load(0, 1, true);
  LocalCommunicator comm;
  DrafterOptions opt;
  opt.slots = 4;
  opt.max_batch = 4;
  Drafter a(dense->cfg, dense->w, dense->plan, dense->be, comm, opt);
  Drafter b(fp8->cfg, fp8->w, fp8->plan, fp8->be, comm, opt);
  std::mt19937 rng(21);
  std::normal_distribution<float> normal;
  std::vector<DraftRequest> reqs;
  for (int s = 0; s < 4; ++s) {
    const int64_t n = 6 + 7 * s;
    std::vector<bf16_t> rows(static_cast<size_t>(n * dense->cfg.row_dim()));
    for (auto& v : rows) v = float_to_bf16(normal(rng));
    a.insert(s, 0, rows.data(), n);
    b.insert(s, 0, rows.data(), n);
    reqs.push_back({s, static_cast<int32_t>(rng() % 1000), static_cast<int32_t>(n), -1, 0});
  }
  std::vector<float> la, lb;
  a.set_trace([&](const std::string& name, const Tensor& t) {
    if (name == "base_logits") la = test::to_floats(dense->be, t);
  });
  b.set_trace([&](const std::string& name, const Tensor& t) {
    if (name == "base_logits") lb = test::to_floats(fp8->be, t);
  });
  const DraftResult ra = a.draft(reqs), rb = b.draft(reqs);
  double max_diff = 0, max_logit = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(la[i]) - lb[i]));
    max_logit = std::max(max_logit, std::fabs(double(la[i])));
  }
  // e4m3 keeps 3 mantissa bits of the weights and of the per-block input: each product within about 2^-3
  // relative, so the logits move by a few percent of their largest value.
  EXPECT_LT(max_diff, 0.05 * max_logit) << max_diff << " of " << max_logit;
  const int64_t k = ra.k;
  size_t same = 0, decided = 0;  // positions whose earlier tokens agree (one flip changes every later bias)
  for (size_t r = 0; r < reqs.size(); ++r) {
    bool chain = true;  // every earlier token of the request equal: the same Markov bias
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = r * k + j;
      EXPECT_TRUE(std::isfinite(rb.conf[i]) && rb.conf[i] > 0 && rb.conf[i] < 1) << rb.conf[i];
      EXPECT_TRUE(std::isfinite(rb.margin[i]) && rb.margin[i] >= 0) << rb.margin[i];
      // A margin above twice the largest logit change cannot flip.
      if (chain && ra.margin[i] > 2 * max_diff) {
        EXPECT_EQ(ra.ids[i], rb.ids[i]) << "request " << r << " position " << j;
      }
      if (chain) {
        ++decided;
        same += ra.ids[i] == rb.ids[i];
      }
      chain = chain && ra.ids[i] == rb.ids[i];
    }
  }
  // Mostly the same tokens where the prefixes agree (measured: 15 of 16, the one flip request 3's first token
  // at a dense margin of 0.003; the logits within 0.16 of the dense head's, 4 % of the largest).
  EXPECT_GE(same * 5, decided * 4) << same << " of " << decided;
}

}  // namespace
}  // namespace dspark
