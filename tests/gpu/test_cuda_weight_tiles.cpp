// CudaBackend::prepare_weights: the expert matrices rearranged into bf16 mma tiles
// (kernels/cuda/mma_tile.cuh) land exactly where the layout says, the originals stay untouched, untileable
// shapes stay row-major, and the experts read from tiles give the same bits as from row-major rows.
#include <cstring>
#include <random>

#include "lib/core/error.hpp"
#include "tests/gpu/cuda_op_harness.hpp"

namespace dspark {
namespace {

using test::fetch;
using test::Outs;
using test::put;
using test::put_i32;
using CudaOps = test::CudaOps;

// A bf16 [rows, cols] tensor holding raw bits `bits` (copied, not converted).
LinearWeight raw_weight(Backend& be, const char* name, int64_t rows, int64_t cols,
                        const std::vector<uint16_t>& bits) {
  Tensor t = be.alloc(DType::bf16, {rows, cols});
  be.upload(t, bits.data());
  return dense_linear(name, t);
}

std::vector<uint16_t> raw_bits(Backend& be, const Tensor& t) {
  std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

// Element ids: element (r, c) holds r * cols + c (as raw bits; only the copy is tested).
std::vector<uint16_t> ids(int64_t rows, int64_t cols) {
  std::vector<uint16_t> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

TEST_F(CudaOps, PrepareWeightsPutsExpertMatricesInMmaTiles) {
  CudaBackend& be = *gpu_;
  const int64_t I = 32, H = 64;  // w1 / w3 [32, 64]: 2 tiles of 2 chunks; w2 [64, 32]: 4 tiles of 1 chunk
  DrafterWeights w;
  w.stages.resize(1);
  StageWeights& st = w.stages[0];
  st.experts.push_back({raw_weight(be, "w1", I, H, ids(I, H)), raw_weight(be, "w3", I, H, ids(I, H)),
                        raw_weight(be, "w2", H, I, ids(H, I))});
  // A shared expert with 24 channels (not a multiple of 16 rows): it stays row-major.
  st.shared = {raw_weight(be, "s1", 24, H, ids(24, H)), raw_weight(be, "s3", 24, H, ids(24, H)),
               raw_weight(be, "s2", H, 24, ids(H, 24))};
  const Tensor old_w1 = st.experts[0].w1.weight, old_shared = st.shared.w1.weight;

  be.prepare_weights(w);

  for (const LinearWeight* m : {&st.experts[0].w1, &st.experts[0].w3, &st.experts[0].w2}) {
    SCOPED_TRACE(m->name);
    EXPECT_EQ(m->format, WeightFormat::bf16_mma_tiles);
    const std::vector<uint16_t> got = raw_bits(be, m->weight);
    // The layout written out as nested loops in storage order: tiles of 16 rows, chunks of 32 columns, the
    // lanes' pieces of rows g then g + 8 (g = lane / 4), each 8 columns from 8 (lane % 4).
    std::vector<uint16_t> want;
    for (int64_t t = 0; t < m->out / 16; ++t)
      for (int64_t c = 0; c < m->in / 32; ++c)
        for (int64_t half = 0; half < 2; ++half)
          for (int64_t lane = 0; lane < 32; ++lane)
            for (int64_t e = 0; e < 8; ++e)
              want.push_back(
                  static_cast<uint16_t>((t * 16 + half * 8 + lane / 4) * m->in + c * 32 + lane % 4 * 8 + e));
    EXPECT_EQ(got, want);
  }
  // By hand, w1 [32, 64]: lane 1's piece is row 0 from column 8; lane 4's row 1; the second half row 8; the
  // next chunk starts at row 0, column 32; the second tile at row 16.
  const std::vector<uint16_t> w1 = raw_bits(be, st.experts[0].w1.weight);
  EXPECT_EQ(w1[0], 0);
  EXPECT_EQ(w1[8], 8);
  EXPECT_EQ(w1[32], 64);
  EXPECT_EQ(w1[256], 8 * 64);
  EXPECT_EQ(w1[263], 8 * 64 + 7);
  EXPECT_EQ(w1[512], 32);
  EXPECT_EQ(w1[16 * 64], 16 * 64);

  EXPECT_NE(st.experts[0].w1.weight.data, old_w1.data);
  EXPECT_EQ(raw_bits(be, old_w1), ids(I, H)) << "the row-major original is left as it was";
  EXPECT_EQ(st.shared.w1.format, WeightFormat::dense);
  EXPECT_EQ(st.shared.w1.weight.data, old_shared.data);
  EXPECT_EQ(raw_bits(be, st.shared.w1.weight), ids(24, H));
}

TEST_F(CudaOps, ExpertsInMmaTilesGiveTheRowMajorBits) {
  CudaBackend& be = *gpu_;
  std::mt19937 g(31);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const auto normal = [&](size_t n, float s) {
    std::vector<float> v(n);
    for (float& x : v) x = round_bf16(s * d(g));
    return v;
  };
  const int64_t H = cfg_.dim, E = cfg_.n_routed_experts, top = cfg_.n_activated_experts;
  // 24 rows, all choosing expert 1 first: its unit has 24 pairs (three passes of 8), the shared expert too.
  const int64_t T = 24;
  std::vector<int32_t> ids_v;
  std::vector<float> w_v;
  for (int64_t t = 0; t < T; ++t) {
    ids_v.push_back(1);
    for (int64_t c = 1; c < top; ++c) ids_v.push_back(static_cast<int32_t>((t + 2 * c) % E));
    for (int64_t c = 0; c < top; ++c) w_v.push_back(0.25f + 0.05f * static_cast<float>((t + c) % 7));
  }
  const std::vector<float> x = normal(static_cast<size_t>(T * H), 3.0f);  // some g / u clamped at 10
  for (const int64_t I : {cfg_.moe_inter_dim, int64_t{384}}) {
    SCOPED_TRACE(testing::Message() << "I = " << I);
    DrafterWeights w;
    w.stages.resize(1);
    StageWeights& st = w.stages[0];
    for (int64_t e = 0; e <= E; ++e) {
      const auto m = [&](const char* name, int64_t out, int64_t in, float s) {
        return dense_linear(name, put(be, DType::bf16, {out, in}, normal(static_cast<size_t>(out * in), s)));
      };
      ExpertWeights ew{m("w1", I, H, 1.0f / 16), m("w3", I, H, 1.0f / 16), m("w2", H, I, 1.0f / 16)};
      if (e < E)
        st.experts.push_back(std::move(ew));
      else
        st.shared = std::move(ew);
    }
    const Tensor xt = put(be, DType::bf16, {T, H}, x), it = put_i32(be, {T, top}, ids_v);
    const Tensor wt = put(be, DType::f32, {T, top}, w_v);
    const float L = static_cast<float>(cfg_.swiglu_limit);
    const auto experts = [&] {
      Tensor shared = be.alloc(DType::f32, {T, H}), routed = be.alloc(DType::f32, {T, top, H});
      be.moe_shared_expert(xt, {}, st, L, shared);
      be.moe_routed_experts(xt, {}, it, wt, st, L, routed);
      return Outs{fetch(be, "moe_shared_expert", shared), fetch(be, "moe_routed_experts", routed)};
    };
    const Outs rows = experts();
    be.prepare_weights(w);
    ASSERT_EQ(st.experts[0].w2.format, WeightFormat::bf16_mma_tiles);
    ASSERT_EQ(st.shared.w1.format, WeightFormat::bf16_mma_tiles);
    const Outs tiles = experts();
    for (size_t i = 0; i < rows.size(); ++i) test::expect_same_bits(rows[i], tiles[i]);
  }
}

TEST_F(CudaOps, ExpertsInMmaTilesRefuseAnF32Input) {
  CudaBackend& be = *gpu_;
  const int64_t H = 64, I = 32, T = 2;
  DrafterWeights w;
  w.stages.resize(1);
  StageWeights& st = w.stages[0];
  const std::vector<float> zeros(static_cast<size_t>(I * H), 0.0f);
  const auto m = [&](const char* name, int64_t out, int64_t in) {
    return dense_linear(name, put(be, DType::bf16, {out, in}, zeros));
  };
  st.shared = {m("w1", I, H), m("w3", I, H), m("w2", H, I)};
  be.prepare_weights(w);
  const Tensor x = be.alloc(DType::f32, {T, H}), out = be.alloc(DType::f32, {T, H});
  try {
    be.moe_shared_expert(x, {}, st, 10.0f, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mma tiles"), std::string::npos) << e.what();
  }
}

// w as the Drafter hands it to the backend, as an attention layer (wo_a) or as the head: prepare_weights adds
// a copy in tiles on the CUDA backend (none on the CPU reference).
enum class Slot { wo_a, head };
LinearWeight prepared(Backend& be, LinearWeight w, Slot slot = Slot::wo_a) {
  DrafterWeights dw;
  dw.stages.resize(1);
  LinearWeight& target = slot == Slot::head ? dw.head : dw.stages[0].wo_a;
  target = std::move(w);
  be.prepare_weights(dw);
  return target;
}

std::vector<float> normal_bf16(std::mt19937& g, size_t n, float stddev) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(d(g));
  return v;
}

TEST_F(CudaOps, FewRowLinearLayersFromTiles) {
  struct Case {
    int64_t T, groups, out_g, in;
    DType dt;
  };
  // 1-16 rows (one or two passes of 8; 17 goes to cuBLAS), bf16 and f32 out, grouped like wo_a, and layers
  // with too few tiles for the GPU, split over clusters of 2 (48 x 512) and 8 blocks (32 x 2048).
  const Case cases[] = {
      {1, 1, 64, 256, DType::bf16}, {5, 1, 64, 256, DType::bf16}, {8, 1, 64, 256, DType::f32},
      {9, 1, 64, 256, DType::bf16}, {16, 1, 64, 256, DType::f32}, {17, 1, 64, 256, DType::bf16},
      {5, 1, 48, 512, DType::bf16}, {5, 1, 32, 2048, DType::f32}, {15, 1, 32, 2048, DType::bf16},
      {5, 4, 32, 256, DType::bf16}, {16, 4, 32, 256, DType::f32}};
  std::mt19937 g(32);
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "T " << c.T << ", " << c.groups << " x [" << c.out_g << ", " << c.in
                                    << "], out " << dtype_name(c.dt));
    const int64_t out = c.groups * c.out_g;
    const std::vector<float> x = normal_bf16(g, static_cast<size_t>(c.T * c.groups * c.in), 1.0f);
    const std::vector<float> w =
        normal_bf16(g, static_cast<size_t>(out * c.in), 1.0f / std::sqrt(float(c.in)));
    auto [cpu, gpu] = run([&](Backend& be) {
      const LinearWeight lw = prepared(be, dense_linear("wo_a", put(be, DType::bf16, {out, c.in}, w)));
      EXPECT_EQ(lw.tiles.empty(), &be == &cpu_) << "a copy in tiles on the GPU only";
      const Tensor xt = put(be, DType::bf16, {c.T, c.groups * c.in}, x);
      Tensor o = be.alloc(c.dt, {c.T, out});
      if (c.groups == 1)
        be.linear(xt, lw, o);
      else
        be.grouped_linear(xt, lw, c.groups, o);
      return Outs{fetch(be, "out", o)};
    });
    test::expect_near_scale(cpu[0], gpu[0], c.dt == DType::f32 ? test::kF32 : test::kOneRounding);
  }
}

// The head (f32 logits) gets a copy in tiles too: a draft step's 5-15 rows then read it through the few-row
// kernel; 17 rows and more go to cuBLAS on the row-major matrix.
TEST_F(CudaOps, HeadFromTilesForFewRows) {
  const int64_t out = 96, in = 512;
  std::mt19937 g(33);
  const std::vector<float> w = normal_bf16(g, static_cast<size_t>(out * in), 1.0f / std::sqrt(float(in)));
  for (const int64_t T : {5, 15, 20}) {
    SCOPED_TRACE(testing::Message() << "T " << T);
    const std::vector<float> x = normal_bf16(g, static_cast<size_t>(T * in), 1.0f);
    auto [cpu, gpu] = run([&](Backend& be) {
      const LinearWeight head =
          prepared(be, dense_linear("head", put(be, DType::bf16, {out, in}, w)), Slot::head);
      EXPECT_EQ(head.tiles.empty(), &be == &cpu_) << "a copy in tiles on the GPU only";
      Tensor o = be.alloc(DType::f32, {T, out});
      be.linear(put(be, DType::bf16, {T, in}, x), head, o);
      return Outs{fetch(be, "logits", o)};
    });
    test::expect_near_scale(cpu[0], gpu[0], test::kF32);
  }
}

}  // namespace
}  // namespace dspark
