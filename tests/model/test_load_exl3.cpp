// EXL3 weights as each rank loads them (SPEC §9): an output split holds trellis tiles of dim 1 and its part
// of svh, an input split tiles of dim 0 and its part of suh, byte for byte the stored slices; a legacy
// checkpoint's sign vectors load as +-1 scales; an EXL3 wo_a (a grouped product) is refused at load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/exl3.hpp"
#include "lib/model/load_weights.hpp"
#include "lib/model/shard_report.hpp"
#include "tests/support/edited_checkpoint.hpp"
#include "tests/support/golden.hpp"

namespace dspark {
namespace {

const char* const kGolden = DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/ckpt";

template <typename T>
std::vector<T> stored(const Checkpoint& ckpt, const std::string& name) {
  std::vector<T> v(ckpt.get(name).nbytes / sizeof(T));
  ckpt.read(name, v.data());
  return v;
}

template <typename T>
std::vector<T> held(const Tensor& t) {
  return std::vector<T>(t.as<const T>(), t.as<const T>() + t.numel());
}

class LoadExl3 : public ::testing::TestWithParam<int> {};

TEST_P(LoadExl3, EachRankHoldsTheStoredSlicesOfEveryPart) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  const int N = GetParam();
  const Checkpoint ckpt(kGolden);
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const ShardReport report = make_shard_report(cfg, N, &ckpt);
  for (int r = 0; r < N; ++r) {
    CpuBackend be;
    DrafterWeights w = load_drafter_weights(ckpt, cfg, make_shard_plan(cfg, r, N), be);
    // wq_b [1024, 128], an output split: trellis [8, 64, 64] keeps 64 / N tile columns of each tile row.
    const LinearWeight& q = w.stages[1].wq_b;
    ASSERT_EQ(q.out, 1024 / N);
    ASSERT_EQ(q.in, 128);
    ASSERT_EQ(q.weight.shape, (Shape{8, 64 / N, 64}));
    const std::vector<int16_t> tq = stored<int16_t>(ckpt, "mtp.1.attn.wq_b.trellis");
    std::vector<int16_t> want;
    for (int64_t ti = 0; ti < 8; ++ti)
      want.insert(want.end(), tq.begin() + (ti * 64 + r * 64 / N) * 64,
                  tq.begin() + (ti * 64 + (r + 1) * 64 / N) * 64);
    EXPECT_EQ(held<int16_t>(q.weight), want) << "rank " << r;
    const std::vector<f16_t> svh = stored<f16_t>(ckpt, "mtp.1.attn.wq_b.svh");
    EXPECT_EQ(held<f16_t>(q.svh),
              std::vector<f16_t>(svh.begin() + r * 1024 / N, svh.begin() + (r + 1) * 1024 / N));
    EXPECT_EQ(held<f16_t>(q.suh), stored<f16_t>(ckpt, "mtp.1.attn.wq_b.suh"));
    // A routed expert's w2 [256, 512], an input split: trellis [32, 16, 32] keeps 32 / N tile rows.
    const LinearWeight& d = w.stages[2].experts[5].w2;
    ASSERT_EQ(d.in, 512 / N);
    const std::vector<int16_t> td = stored<int16_t>(ckpt, "mtp.2.ffn.experts.5.w2.trellis");
    const int64_t row = 16 * 32;  // int16 per tile row
    EXPECT_EQ(held<int16_t>(d.weight),
              std::vector<int16_t>(td.begin() + r * (32 / N) * row, td.begin() + (r + 1) * (32 / N) * row));
    const std::vector<f16_t> suh = stored<f16_t>(ckpt, "mtp.2.ffn.experts.5.w2.suh");
    EXPECT_EQ(held<f16_t>(d.suh),
              std::vector<f16_t>(suh.begin() + r * 512 / N, suh.begin() + (r + 1) * 512 / N));
    EXPECT_EQ(held<f16_t>(d.svh), stored<f16_t>(ckpt, "mtp.2.ffn.experts.5.w2.svh"));
    // The head [1024, 256] splits by vocabulary rows: its output tiles.
    EXPECT_EQ(w.head.format, WeightFormat::exl3);
    EXPECT_EQ(w.head.out, 1024 / N);
    EXPECT_EQ(w.head.weight.shape, (Shape{16, 64 / N, 96}));
    // dspark_inspect's report counts what this rank loaded.
    uint64_t loaded = 0;
    for_each_linear(w, [&](LinearWeight& l) {
      if (l.format == WeightFormat::exl3) loaded += linear_bytes(l);
    });
    const PartBytes reported = report.bytes[static_cast<size_t>(r)].formats.at(WeightFormat::exl3);
    EXPECT_EQ(reported.weight + reported.scale, loaded) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, LoadExl3, ::testing::Values(1, 2, 4));

TEST(LoadExl3Legacy, SignVectorsLoadAsPlusOrMinusOneScales) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  // mtp.0.attn.wq_a [128, 256] with .su (I16 [16]) and .sv (I16 [8]) for its .suh and .svh: word 0 0x0005
  // makes inputs 0 and 2 negative, word 15 0x8000 input 255; sv word 1 0x0001 output 16.
  std::vector<uint8_t> su(32, 0), sv(16, 0);
  su[0] = 0x05;
  su[31] = 0x80;
  sv[2] = 0x01;
  const auto dir = test::edited_checkpoint(
      kGolden, "exl3-legacy",
      [](TensorSpec& s, std::vector<uint8_t>&) {
        return s.name != "mtp.0.attn.wq_a.suh" && s.name != "mtp.0.attn.wq_a.svh";
      },
      {{{"mtp.0.attn.wq_a.su", DType::i16, {16}}, su}, {{"mtp.0.attn.wq_a.sv", DType::i16, {8}}, sv}});
  const Checkpoint ckpt(dir);
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  CpuBackend be;
  const DrafterWeights w = load_drafter_weights(ckpt, cfg, make_shard_plan(cfg, 0, 1), be);
  constexpr f16_t kPlus = 0x3c00, kMinus = 0xbc00;
  std::vector<f16_t> suh(256, kPlus), svh(128, kPlus);
  suh[0] = suh[2] = suh[255] = kMinus;
  svh[16] = kMinus;
  EXPECT_EQ(held<f16_t>(w.stages[0].wq_a.suh), suh);
  EXPECT_EQ(held<f16_t>(w.stages[0].wq_a.svh), svh);
}

TEST(LoadExl3Refusals, AnExl3WoAIsRefusedAtLoadNamingIt) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  // mtp.0.attn.wo_a [512, 256] as EXL3 parts (K 2) instead of its fp8 block weight and scale.
  const uint32_t marker = 0x83DCD12Du;
  std::vector<uint8_t> mul1(4);
  std::memcpy(mul1.data(), &marker, 4);
  const auto dir = test::edited_checkpoint(
      kGolden, "exl3-wo-a",
      [](TensorSpec& s, std::vector<uint8_t>&) { return !s.name.starts_with("mtp.0.attn.wo_a."); },
      {{{"mtp.0.attn.wo_a.trellis", DType::i16, {16, 32, 32}}, std::vector<uint8_t>(16 * 32 * 32 * 2, 0)},
       {{"mtp.0.attn.wo_a.suh", DType::f16, {256}}, std::vector<uint8_t>(256 * 2, 0)},
       {{"mtp.0.attn.wo_a.svh", DType::f16, {512}}, std::vector<uint8_t>(512 * 2, 0)},
       {{"mtp.0.attn.wo_a.mul1", DType::i32, {}}, mul1}});
  EXPECT_THAT(test::load_error(dir), ::testing::HasSubstr("tensor 'mtp.0.attn.wo_a.trellis' in "));
  EXPECT_THAT(test::load_error(dir), ::testing::HasSubstr("wo_a is a grouped product"));
}

}  // namespace
}  // namespace dspark
