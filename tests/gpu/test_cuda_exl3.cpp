// CudaBackend's EXL3 products (SPEC §9) against the CPU reference: the linear for every codebook and K = 1..8
// at row counts from one to more than one pass, the golden decoder's whole linears (their x' exact, y within
// fp32 rounding), the experts with EXL3 routed and shared weights (experts of a few pairs, and of more than
// one pass), and the device's trellis generator against the checkpoint writer's bits.
#include <cuda_runtime.h>

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "kernels/cuda/exl3.hpp"
#include "kernels/cuda/fill_random.hpp"
#include "lib/checkpoint/synthetic.hpp"
#include "lib/checkpoint/synthetic_exl3.hpp"
#include "lib/checkpoint/synthetic_random.hpp"
#include "lib/core/exl3.hpp"
#include "tests/gpu/cuda_op_harness.hpp"

namespace dspark {
namespace {

using test::fetch;
using test::Outs;
using test::put;
using CudaOps = test::CudaOps;
using test::normal_bf16;
using test::prepared;
using test::put_raw;

// A host EXL3 matrix W_dec [in, out]: random trellis bits, suh = +-a m and svh = +-m (m in [0.7, 1.4], a = 1
// / sqrt(in)), which keep the output near the input's scale.
struct Exl3Matrix {
  int64_t in, out;
  int K;
  Exl3Codebook codebook;
  std::vector<int16_t> trellis;
  std::vector<f16_t> suh, svh;
};
Exl3Matrix exl3_matrix(std::mt19937& g, int64_t in, int64_t out, int K, Exl3Codebook cb) {
  Exl3Matrix m{in, out, K, cb, std::vector<int16_t>(static_cast<size_t>(in * out * K / 16)), {}, {}};
  for (int16_t& v : m.trellis) v = static_cast<int16_t>(g() & 0xffffu);
  std::uniform_real_distribution<float> mag(0.7f, 1.4f);
  const float a = 1.0f / std::sqrt(static_cast<float>(in));
  for (int64_t i = 0; i < in; ++i) m.suh.push_back(float_to_f16((g() & 1 ? -a : a) * mag(g)));
  for (int64_t o = 0; o < out; ++o) m.svh.push_back(float_to_f16((g() & 1 ? -1.0f : 1.0f) * mag(g)));
  return m;
}

LinearWeight upload(Backend& be, const Exl3Matrix& m, const char* name) {
  LinearWeight l;
  l.name = name;
  l.format = WeightFormat::exl3;
  l.out = m.out;
  l.in = m.in;
  l.bits = m.K;
  l.codebook = m.codebook;
  l.weight = put_raw(be, DType::i16, {m.in / 16, m.out / 16, 16 * m.K}, m.trellis);
  l.suh = put_raw(be, DType::f16, {m.in}, m.suh);
  l.svh = put_raw(be, DType::f16, {m.out}, m.svh);
  return l;
}

TEST_F(CudaOps, Exl3LinearMatchesTheCpuForEveryCodebookAndK) {
  std::mt19937 g(41);
  struct Case {
    Exl3Codebook cb;
    int K;
    int64_t in, out;
  };
  std::vector<Case> cases;
  for (int K = 1; K <= 8; ++K) cases.push_back({Exl3Codebook::mul1, K, 512, 256});
  cases.push_back({Exl3Codebook::mcg, 3, 256, 384});
  cases.push_back({Exl3Codebook::inst3, 4, 384, 128});
  cases.push_back({Exl3Codebook::mul1, 2, 4096, 128});  // k split over several blocks
  for (const Case& c : cases) {
    const Exl3Matrix m = exl3_matrix(g, c.in, c.out, c.K, c.cb);
    // One row, the draft step's 5, two and five groups of 8, a pass boundary and more than one pass.
    for (const int64_t T : {1, 5, 12, 40, 45}) {
      SCOPED_TRACE(testing::Message() << "codebook " << static_cast<int>(c.cb) << " K " << c.K << " ["
                                      << c.out << ", " << c.in << "] T " << T);
      const std::vector<float> x = normal_bf16(g, static_cast<size_t>(T * c.in), 1.0f);
      auto [cpu, gpu] = run([&](Backend& be) {
        // The CPU decodes W_dec; the GPU reads the trellis as it is.
        const LinearWeight w = prepared(be, upload(be, m, "exl3"));
        const Tensor xt = put(be, DType::bf16, {T, c.in}, x);
        Tensor yb = be.alloc(DType::bf16, {T, c.out}), yf = be.alloc(DType::f32, {T, c.out});
        be.linear(xt, w, yb);
        be.linear(xt, w, yf);
        return Outs{fetch(be, "bf16 out", yb), fetch(be, "f32 out", yf)};
      });
      test::expect_near_scale(cpu[0], gpu[0], test::kOneRounding);
      test::expect_near_scale(cpu[1], gpu[1], test::kF32);
    }
  }
}

// The golden decoder's whole linears (shared/golden/tiny-v41-exl3/exl3_vectors.json): the device's x' has
// their bits, its y lies within fp32 rounding of theirs.
TEST_F(CudaOps, Exl3GoldenLinearsGiveTheirTransformedInputExactlyAndTheirOutput) {
  std::ifstream f(DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/exl3_vectors.json");
  if (!f.good()) GTEST_SKIP() << "no exl3_vectors.json";
  const nlohmann::json v = nlohmann::json::parse(f);
  ASSERT_EQ(v["linears"].size(), 3u);
  for (const nlohmann::json& l : v["linears"]) {
    SCOPED_TRACE(l["codebook"].get<std::string>());
    Exl3Matrix m;
    m.in = l["in"].get<int64_t>();
    m.out = l["out"].get<int64_t>();
    m.K = l["K"].get<int>();
    m.codebook = exl3_codebook_named(l["codebook"].get<std::string>());
    m.trellis = l["trellis_i16"].get<std::vector<int16_t>>();
    m.suh = l["suh_f16_bits"].get<std::vector<f16_t>>();
    m.svh = l["svh_f16_bits"].get<std::vector<f16_t>>();
    const std::vector<std::vector<int>> xs = l["x_bf16_bits"], had = l["x_had_f16_bits"];
    const std::vector<std::vector<double>> ys = l["y_f32"];
    const auto T = static_cast<int64_t>(xs.size());
    std::vector<float> x;
    for (const auto& row : xs)
      for (int b : row) x.push_back(bf16_to_float(static_cast<bf16_t>(b)));
    const LinearWeight w = upload(*gpu_, m, "golden");
    const Tensor xt = put(*gpu_, DType::bf16, {T, m.in}, x);
    Tensor y = gpu_->alloc(DType::f32, {T, m.out});
    gpu_->linear(xt, w, y);
    const std::vector<float> got = fetch(*gpu_, "y", y).values();
    // x' straight from the transform kernel.
    cuda::Exl3Table table{};
    table.suh[0][0] = w.suh.data;
    Tensor xh = gpu_->alloc(DType::f16, {T, m.in});
    ASSERT_EQ(cuda::launch_exl3_transform_rows(xt.data, m.in, T, 1, nullptr, 0, m.in, 0, 1, table,
                                               xh.as<uint16_t>(), gpu_->stream()),
              cudaSuccess);
    std::vector<uint16_t> xh_host(static_cast<size_t>(T * m.in));
    gpu_->download(xh_host.data(), xh);
    for (int64_t t = 0; t < T; ++t) {
      double scale = 0;
      for (double e : ys[static_cast<size_t>(t)]) scale = std::max(scale, std::abs(e));
      for (int64_t i = 0; i < m.in; ++i)
        ASSERT_EQ(xh_host[static_cast<size_t>(t * m.in + i)],
                  had[static_cast<size_t>(t)][static_cast<size_t>(i)])
            << "row " << t << " x' " << i;
      for (int64_t o = 0; o < m.out; ++o)
        EXPECT_NEAR(got[static_cast<size_t>(t * m.out + o)],
                    ys[static_cast<size_t>(t)][static_cast<size_t>(o)], 1e-5 * std::max(1.0, scale))
            << "row " << t << " out " << o;
    }
  }
}

TEST_F(CudaOps, MoeExpertsWithExl3RoutedAndSharedWeights) {
  std::mt19937 g(43);
  const int64_t H = cfg_.dim, E = cfg_.n_routed_experts;
  ASSERT_EQ(cfg_.n_activated_experts, 2) << "moe_inputs draws two experts per row";
  const test::MoeInputs spread = test::moe_inputs(g, T_, H, E);
  // Every row choosing expert 0 and one of 1, 2: units of 15 pairs, which a routed product takes in two
  // passes of 8.
  test::MoeInputs hot = spread;
  for (int64_t t = 0; t < T_; ++t) {
    hot.ids[static_cast<size_t>(2 * t)] = 0;
    hot.ids[static_cast<size_t>(2 * t + 1)] = static_cast<int32_t>(1 + t % 2);
  }
  // I = 512 (the tiny config) and a tp shard's 384; routed K 2 (the seed's), shared K 4.
  struct Case {
    int64_t I;
    const test::MoeInputs* in;
  };
  for (const Case& c :
       {Case{cfg_.moe_inter_dim, &spread}, Case{cfg_.moe_inter_dim, &hot}, Case{384, &spread}}) {
    const int64_t I = c.I;
    const test::MoeInputs& in = *c.in;
    SCOPED_TRACE(testing::Message() << "I = " << I << (c.in == &hot ? ", hot experts" : ""));
    std::vector<Exl3Matrix> routed;
    for (int64_t e = 0; e < E; ++e) {
      routed.push_back(exl3_matrix(g, H, I, 2, Exl3Codebook::mul1));
      routed.push_back(exl3_matrix(g, H, I, 2, Exl3Codebook::mul1));
      routed.push_back(exl3_matrix(g, I, H, 2, Exl3Codebook::mul1));
    }
    const Exl3Matrix s1 = exl3_matrix(g, H, I, 4, Exl3Codebook::mul1),
                     s3 = exl3_matrix(g, H, I, 4, Exl3Codebook::mul1),
                     s2 = exl3_matrix(g, I, H, 4, Exl3Codebook::mul1);
    auto [cpu, gpu] = run([&](Backend& be) {
      DrafterWeights d;
      d.stages.emplace_back();
      StageWeights& st = d.stages[0];
      for (int64_t e = 0; e < E; ++e) {
        const size_t m = static_cast<size_t>(3 * e);
        st.experts.push_back(
            {upload(be, routed[m], "w1"), upload(be, routed[m + 1], "w3"), upload(be, routed[m + 2], "w2")});
      }
      st.shared = {upload(be, s1, "shared w1"), upload(be, s3, "shared w3"), upload(be, s2, "shared w2")};
      be.prepare_weights(d);
      return test::run_moe_experts(be, st, in, T_, H, static_cast<float>(cfg_.swiglu_limit));
    });
    for (size_t i = 0; i < cpu.size(); ++i) test::expect_near_scale(cpu[i], gpu[i], test::kChained);
  }
}

TEST_F(CudaOps, TrellisGeneratorHasTheCheckpointWritersBits) {
  const ModelConfig cfg = synthetic_model_config(cfg_, SyntheticFormat::exl3, ConfigLayout::inference);
  for (const DrafterTensor& t : drafter_tensors(cfg)) {
    if (t.name != "mtp.0.ffn.experts.1.w2" && t.name != "mtp.0.attn.wq_b") continue;
    SCOPED_TRACE(t.name);
    const int64_t out = t.shape[0], in = t.shape[1], K = synthetic_exl3_bits(t, cfg), per_tile = 16 * K;
    std::vector<int16_t> whole(static_cast<size_t>(in * out * K / 16));
    synthetic_trellis_rows(t, cfg, 7, 0, in / 16, whole.data());
    // A shard of tile rows [1, 3) and tile columns [2, 6).
    cuda::TrellisFill f{
        synthetic::tensor_key(7, synthetic_exl3_base(t) + ".trellis"), 2, 4, per_tile, out / 16, 1, 2};
    Tensor dst = gpu_->alloc(DType::i16, {2, 4, per_tile});
    ASSERT_EQ(cuda::launch_fill_trellis(dst.as<int16_t>(), f, gpu_->stream()), cudaSuccess);
    std::vector<int16_t> got(static_cast<size_t>(dst.numel()));
    gpu_->download(got.data(), dst);
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 4; ++b)
        for (int64_t j = 0; j < per_tile; ++j)
          ASSERT_EQ(got[static_cast<size_t>((a * 4 + b) * per_tile + j)],
                    whole[static_cast<size_t>(((1 + a) * (out / 16) + 2 + b) * per_tile + j)])
              << a << " " << b << " " << j;
  }
}

}  // namespace
}  // namespace dspark
