// The CPU backend's EXL3 linear (SPEC §9) on the golden decoder vectors (exl3_vectors.json, whole linears of
// each codebook): prepare_weights decodes the trellis once, and linear() gives the vectors' fp32 outputs
// within fp32 rounding (its sums run in cpu::dot's order, the vectors' in ascending input order) and, rounded
// to bf16, within one bf16 step of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/core/exl3.hpp"
#include "tests/support/golden.hpp"

namespace dspark {
namespace {

Exl3Codebook codebook_named(const std::string& name) {
  if (name == "3inst") return Exl3Codebook::inst3;
  if (name == "mcg") return Exl3Codebook::mcg;
  return Exl3Codebook::mul1;
}

template <typename T>
Tensor host_tensor(CpuBackend& be, DType dt, const Shape& shape, const std::vector<T>& v) {
  Tensor t = be.alloc(dt, shape);
  be.upload(t, v.data());
  return t;
}

TEST(CpuExl3Linear, GoldenLinearsGiveTheirOutputs) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  std::ifstream f(DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/exl3_vectors.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json v = nlohmann::json::parse(f);
  ASSERT_EQ(v["linears"].size(), 3u);
  for (const nlohmann::json& l : v["linears"]) {
    CpuBackend be;
    const int64_t in = l["in"], out = l["out"];
    const std::vector<int16_t> trellis = l["trellis_i16"];
    const std::vector<int64_t> tshape = l["trellis_shape"];
    DrafterWeights w;
    LinearWeight& lin = w.head;
    lin.name = "golden";
    lin.format = WeightFormat::exl3;
    lin.out = out;
    lin.in = in;
    lin.bits = l["K"];
    lin.codebook = codebook_named(l["codebook"]);
    lin.weight = host_tensor(be, DType::i16, Shape(tshape.begin(), tshape.end()), trellis);
    lin.suh = host_tensor(be, DType::f16, {in}, l["suh_f16_bits"].get<std::vector<f16_t>>());
    lin.svh = host_tensor(be, DType::f16, {out}, l["svh_f16_bits"].get<std::vector<f16_t>>());
    be.prepare_weights(w);
    ASSERT_EQ(lin.dequantised.shape, (Shape{out, in}));

    const std::vector<std::vector<uint16_t>> xs = l["x_bf16_bits"];
    const std::vector<std::vector<double>> ys = l["y_f32"];
    const auto rows = static_cast<int64_t>(xs.size());
    std::vector<uint16_t> x;
    for (const auto& r : xs) x.insert(x.end(), r.begin(), r.end());
    const Tensor xt = host_tensor(be, DType::bf16, {rows, in}, x);
    const Tensor y32 = be.alloc(DType::f32, {rows, out}), y16 = be.alloc(DType::bf16, {rows, out});
    be.linear(xt, lin, y32);
    be.linear(xt, lin, y16);
    for (int64_t r = 0; r < rows; ++r) {
      double scale = 0;
      for (double t : ys[static_cast<size_t>(r)]) scale = std::max(scale, std::abs(t));
      for (int64_t o = 0; o < out; ++o) {
        const double want = ys[static_cast<size_t>(r)][static_cast<size_t>(o)];
        EXPECT_NEAR(y32.as<const float>()[r * out + o], want, 1e-5 * std::max(1.0, scale))
            << l["codebook"] << " row " << r << " out " << o;
        const float b = bf16_to_float(y16.as<const bf16_t>()[r * out + o]);
        EXPECT_LE(std::abs(b - want), std::abs(want) / 256 + 1e-5 * scale) << l["codebook"] << " bf16 " << o;
      }
    }
  }
}

TEST(CpuExl3Linear, AWeightWithoutItsDecodedCopyIsRefusedNamingIt) {
  CpuBackend be;
  LinearWeight lin;
  lin.name = "mtp.0.attn.wq_a";
  lin.format = WeightFormat::exl3;
  lin.out = 128;
  lin.in = 128;
  lin.suh = be.alloc(DType::f16, {128});
  lin.svh = be.alloc(DType::f16, {128});
  be.zero(lin.suh);
  be.zero(lin.svh);
  const Tensor x = be.alloc(DType::bf16, {1, 128}), y = be.alloc(DType::bf16, {1, 128});
  be.zero(x);
  try {
    be.linear(x, lin, y);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("'mtp.0.attn.wq_a' has no decoded copy"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dspark
