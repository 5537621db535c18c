// CudaBackend's activation codes (ActCodes): the norms write their output's SPEC §3 quantisation beside it,
// bit for bit lib/core/block_quant's quantize_activation_row of that output, and the fp8 and fp4 products
// read the codes they are given instead of their input (so codes of another activation give that activation's
// product), or quantise their input themselves where the codes are of another block.
#include <cuda_runtime.h>

#include <random>

#include "kernels/cuda/quant_act.hpp"
#include "lib/core/block_quant.hpp"
#include "lib/core/error.hpp"
#include "tests/gpu/cuda_op_harness.hpp"

namespace dspark {
namespace {

using test::fetch;
using test::normal_bf16;
using test::put;
using CudaOps = test::CudaOps;

// The values codes hold for rows [0, T) of K: each code times its chunk's scale.
std::vector<float> code_values(const ActCodes& codes, int64_t T, int64_t K) {
  std::vector<uint8_t> bytes(cuda::quant_act_bytes(codes.rows, K));
  EXPECT_EQ(cudaMemcpy(bytes.data(), codes.data.data, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  const cuda::QuantAct at = cuda::quant_act_at(bytes.data(), codes.rows, K);
  std::vector<float> v(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i)
      v[static_cast<size_t>(t * K + i)] =
          e4m3_to_float(at.codes[t * K + i]) * at.scales[t * (K / 32) + i / 32];
  return v;
}

// quantize_activation_row of each row of a downloaded bf16 activation.
std::vector<float> reference_codes(const test::Out& activation, int64_t T, int64_t K, int64_t block) {
  const std::vector<float> x = activation.values();
  std::vector<float> want(x.size());
  for (int64_t t = 0; t < T; ++t) quantize_activation_row(x.data() + t * K, K, block, want.data() + t * K);
  return want;
}

void expect_equal_values(const std::vector<float>& want, const std::vector<float>& got, const char* what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << what << " element " << i;
}

// Rows with a zero block (the amax floor), a tiny one and one past e4m3's range after the norm.
std::vector<float> varied_rows(std::mt19937& g, int64_t T, int64_t K) {
  std::vector<float> x = normal_bf16(g, static_cast<size_t>(T * K), 1.0f);
  for (int64_t i = 0; i < 32; ++i) {
    x[static_cast<size_t>(i)] = 0.0f;
    x[static_cast<size_t>(32 + i)] = round_bf16(x[static_cast<size_t>(32 + i)] * 1e-6f);
    x[static_cast<size_t>(K + i)] = round_bf16(x[static_cast<size_t>(K + i)] * 3000.0f);
  }
  return x;
}

TEST_F(CudaOps, NormsWriteTheReferenceCodesOfTheirOutput) {
  std::mt19937 g(41);
  const int64_t T = 7;
  // K 544: the last block of threads holds 32 elements (a partial block of 256); K 512 for block 256.
  for (const auto& [K, block] : {std::pair<int64_t, int64_t>{544, 32}, {512, 128}, {512, 256}}) {
    SCOPED_TRACE(testing::Message() << "K " << K << ", block " << block);
    const std::vector<float> x = varied_rows(g, T, K), w = normal_bf16(g, static_cast<size_t>(K), 0.5f, 1.0f);
    const ActCodes codes = gpu_->alloc_act_codes(T + 2, K, block);
    ASSERT_FALSE(codes.empty());
    const Tensor xt = put(*gpu_, DType::bf16, {T, K}, x), wt = put(*gpu_, DType::bf16, {K}, w);
    const Tensor out = gpu_->alloc(DType::bf16, {T, K}), plain = gpu_->alloc(DType::bf16, {T, K});
    gpu_->rms_norm_coded(xt, wt, 1e-6f, out, codes);
    gpu_->rms_norm(xt, wt, 1e-6f, plain);
    const test::Out normed = fetch(*gpu_, "rms_norm", out);
    test::expect_same_bits(fetch(*gpu_, "rms_norm without codes", plain), normed);
    expect_equal_values(reference_codes(normed, T, K, block), code_values(codes, T, K), "rms_norm codes");

    // hc_collapse_norm: V4.1's 4 copies (the fused kernel) and 2 (collapse, then rms_norm).
    for (const int64_t hc : {4, 2}) {
      SCOPED_TRACE(testing::Message() << "hc " << hc);
      const std::vector<float> X = normal_bf16(g, static_cast<size_t>(T * hc * K), 1.0f);
      std::vector<float> pre(static_cast<size_t>(T * hc));
      for (float& p : pre) p = std::uniform_real_distribution<float>(0.1f, 1.0f)(g);
      const Tensor Xt = put(*gpu_, DType::bf16, {T, hc, K}, X), pt = put(*gpu_, DType::f32, {T, hc}, pre);
      const Tensor collapsed = gpu_->alloc(DType::bf16, {T, K});
      gpu_->hc_collapse_norm_coded(Xt, pt, wt, 1e-6f, collapsed, out, codes);
      gpu_->hc_collapse_norm(Xt, pt, wt, 1e-6f, collapsed, plain);
      const test::Out hc_normed = fetch(*gpu_, "hc_collapse_norm", out);
      test::expect_same_bits(fetch(*gpu_, "hc_collapse_norm without codes", plain), hc_normed);
      expect_equal_values(reference_codes(hc_normed, T, K, block), code_values(codes, T, K),
                          "hc_collapse_norm codes");
    }
  }
}

TEST_F(CudaOps, ActivationCodesOnlyForShapesTheNormsWrite) {
  EXPECT_FALSE(gpu_->alloc_act_codes(5, 512, 32).empty());
  EXPECT_TRUE(gpu_->alloc_act_codes(5, 512, 512).empty()) << "a block wider than a norm's thread block";
  EXPECT_TRUE(gpu_->alloc_act_codes(5, 512, 48).empty()) << "not a multiple of 32";
  EXPECT_TRUE(gpu_->alloc_act_codes(5, 480, 128).empty()) << "the row is not whole blocks";
  EXPECT_TRUE(gpu_->alloc_act_codes(0, 512, 32).empty());
  EXPECT_TRUE(cpu_.alloc_act_codes(5, 512, 32).empty()) << "the CPU quantises in each product";
  // Codes for fewer rows than a norm writes are refused, naming the op.
  const ActCodes codes = gpu_->alloc_act_codes(2, 64, 32);
  const Tensor x = gpu_->alloc(DType::bf16, {3, 64}), w = gpu_->alloc(DType::bf16, {64});
  const Tensor out = gpu_->alloc(DType::bf16, {3, 64});
  try {
    gpu_->rms_norm_coded(x, w, 1e-6f, out, codes);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm"), std::string::npos) << e.what();
  }
}

// An fp8 block weight [N, K] of block B, as a checkpoint holds it.
LinearWeight fp8_weight(Backend& be, std::mt19937& g, int64_t N, int64_t K, int64_t B) {
  const std::vector<float> w = normal_bf16(g, static_cast<size_t>(N * K), 0.05f);
  std::vector<uint8_t> codes(static_cast<size_t>(N * K)), scales(static_cast<size_t>((N / B) * (K / B)));
  quantize_fp8_block(w.data(), N, K, B, codes.data(), scales.data());
  LinearWeight l;
  l.name = "fp8";
  l.format = WeightFormat::fp8_block;
  l.out = N;
  l.in = K;
  l.block = B;
  l.weight = test::put_raw(be, DType::f8_e4m3, {N, K}, codes);
  l.scale = test::put_raw(be, DType::f8_e8m0, {N / B, K / B}, scales);
  return l;
}

// An fp4 weight [N, K] (activation block 32), as a checkpoint holds it.
LinearWeight fp4_weight(Backend& be, std::mt19937& g, int64_t N, int64_t K) {
  const std::vector<float> w = normal_bf16(g, static_cast<size_t>(N * K), 0.05f);
  std::vector<uint8_t> packed(static_cast<size_t>(N * K / 2)), scales(static_cast<size_t>(N * K / kFp4Block));
  quantize_fp4(w.data(), N, K, packed.data(), scales.data());
  LinearWeight l;
  l.name = "fp4";
  l.format = WeightFormat::fp4;
  l.out = N;
  l.in = K;
  l.block = 32;
  l.weight = test::put_raw(be, DType::u8, {N, K / 2}, packed);
  l.scale = test::put_raw(be, DType::f8_e8m0, {N, K / kFp4Block}, scales);
  return l;
}

TEST_F(CudaOps, QuantisedProductsReadTheCodesTheyAreGiven) {
  std::mt19937 g(42);
  const int64_t T = 5, N = 256, K = 512, B = 32;
  const LinearWeight w = test::prepared(*gpu_, fp8_weight(*gpu_, g, N, K, B));
  const Tensor norm_w = put(*gpu_, DType::bf16, {K}, normal_bf16(g, static_cast<size_t>(K), 0.5f, 1.0f));
  const Tensor a = put(*gpu_, DType::bf16, {T, K}, normal_bf16(g, static_cast<size_t>(T * K), 1.0f));
  const Tensor b = put(*gpu_, DType::bf16, {T, K}, normal_bf16(g, static_cast<size_t>(T * K), 3.0f));
  const Tensor a_n = gpu_->alloc(DType::bf16, {T, K}), b_n = gpu_->alloc(DType::bf16, {T, K});
  const ActCodes codes = gpu_->alloc_act_codes(T, K, B), other_block = gpu_->alloc_act_codes(T, K, 128);
  gpu_->rms_norm(a, norm_w, 1e-6f, a_n);
  gpu_->rms_norm_coded(b, norm_w, 1e-6f, b_n, codes);  // codes: b_n's
  gpu_->rms_norm_coded(b, norm_w, 1e-6f, b_n, other_block);
  const auto product = [&](const Tensor& x, const ActCodes& c, const char* name) {
    const Tensor y = gpu_->alloc(DType::bf16, {T, N});
    gpu_->linear_coded(x, c, w, y);
    return fetch(*gpu_, name, y);
  };
  const test::Out of_b = product(b_n, {}, "b_n's product");
  test::expect_same_bits(of_b, product(b_n, codes, "b_n's product from its codes"));
  test::expect_same_bits(of_b, product(a_n, codes, "a_n's product given b_n's codes"));
  test::expect_same_bits(product(a_n, {}, "a_n's product"),
                         product(a_n, other_block, "a_n's product given codes of block 128"));

  // The experts: fp4 routed and fp8 shared, given b_n's codes for a_n.
  const int64_t H = K, I = 256, E = 4;
  DrafterWeights d;
  d.stages.emplace_back();
  StageWeights& st = d.stages[0];
  for (int64_t e = 0; e < E; ++e)
    st.experts.push_back(
        {fp4_weight(*gpu_, g, I, H), fp4_weight(*gpu_, g, I, H), fp4_weight(*gpu_, g, H, I)});
  st.shared = {fp8_weight(*gpu_, g, I, H, B), fp8_weight(*gpu_, g, I, H, B), fp8_weight(*gpu_, g, H, I, B)};
  gpu_->prepare_weights(d);
  const Tensor ids = test::put_i32(*gpu_, {T, 2}, {0, 1, 2, 3, 1, 2, 3, 0, 2, 1});
  const Tensor rw = put(*gpu_, DType::f32, {T, 2}, std::vector<float>(static_cast<size_t>(2 * T), 0.5f));
  const auto experts = [&](const Tensor& x, const ActCodes& c, const char* name) {
    const Tensor shared = gpu_->alloc(DType::f32, {T, H}), routed = gpu_->alloc(DType::f32, {T, 2, H});
    gpu_->moe_shared_expert(x, c, st, 10.0f, shared);
    gpu_->moe_routed_experts(x, c, ids, rw, st, 10.0f, routed);
    return test::Outs{fetch(*gpu_, std::string(name) + " shared", shared),
                      fetch(*gpu_, std::string(name) + " routed", routed)};
  };
  const test::Outs want = experts(b_n, {}, "b_n's experts"), got = experts(a_n, codes, "given b_n's codes");
  for (size_t i = 0; i < want.size(); ++i) test::expect_same_bits(want[i], got[i]);
}

}  // namespace
}  // namespace dspark
