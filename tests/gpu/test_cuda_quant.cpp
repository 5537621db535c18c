// CudaBackend's quantised products (SPEC §3) against the CPU reference: fp8 block linears (bf16 and f32
// out, T from 1 to more rows than one launch takes, B 32 and 128), the grouped wo_a product (fp8 weight,
// bf16 input unquantised), and the MoE experts with fp4 routed and fp8 block shared weights. Also the
// device's activation and weight quantisers, bit for bit against lib/core/block_quant, and the exact bf16
// copies of main_proj and wkv (Tuning::bf16_copies).
#include <cuda_runtime.h>

#include <random>

#include "kernels/cuda/quant_linear.hpp"
#include "lib/core/block_quant.hpp"
#include "lib/core/tuning.hpp"
#include "tests/gpu/cuda_op_harness.hpp"

namespace dspark {
namespace {

using test::fetch;
using test::Outs;
using test::put;
using test::put_i32;
using CudaOps = test::CudaOps;
using test::normal_bf16;
using test::prepared;

// Host-side quantised matrices (block_quant's rules), uploaded per backend.
struct Fp8Matrix {
  int64_t out, in, block;
  std::vector<uint8_t> codes, scales;
};
Fp8Matrix fp8_matrix(const std::vector<float>& w, int64_t out, int64_t in, int64_t block) {
  Fp8Matrix m{
      out, in, block, std::vector<uint8_t>(static_cast<size_t>(out * in)),
      std::vector<uint8_t>(static_cast<size_t>(((out + block - 1) / block) * ((in + block - 1) / block)))};
  quantize_fp8_block(w.data(), out, in, block, m.codes.data(), m.scales.data());
  return m;
}
LinearWeight upload(Backend& be, const Fp8Matrix& m, const char* name) {
  LinearWeight l;
  l.name = name;
  l.format = WeightFormat::fp8_block;
  l.out = m.out;
  l.in = m.in;
  l.block = m.block;
  l.weight = test::put_raw(be, DType::f8_e4m3, {m.out, m.in}, m.codes);
  l.scale = test::put_raw(be, DType::f8_e8m0,
                          {(m.out + m.block - 1) / m.block, (m.in + m.block - 1) / m.block}, m.scales);
  return l;
}
struct Fp4Matrix {
  int64_t out, in;
  std::vector<uint8_t> packed, scales;
};
Fp4Matrix fp4_matrix(const std::vector<float>& w, int64_t out, int64_t in) {
  Fp4Matrix m{out, in, std::vector<uint8_t>(static_cast<size_t>(out * in / 2)),
              std::vector<uint8_t>(static_cast<size_t>(out * in / kFp4Block))};
  quantize_fp4(w.data(), out, in, m.packed.data(), m.scales.data());
  return m;
}
LinearWeight upload(Backend& be, const Fp4Matrix& m, const char* name, int64_t act_block) {
  LinearWeight l;
  l.name = name;
  l.format = WeightFormat::fp4;
  l.out = m.out;
  l.in = m.in;
  l.block = act_block;
  l.weight = test::put_raw(be, DType::u8, {m.out, m.in / 2}, m.packed);
  l.scale = test::put_raw(be, DType::f8_e8m0, {m.out, m.in / kFp4Block}, m.scales);
  return l;
}

TEST_F(CudaOps, Fp8LinearMatchesTheCpuAtEveryRowCount) {
  std::mt19937 g(31);
  // N = 272: 17 tiles (an odd count, split over clusters); K = 512. Rows: one pass, the draft step's 15, a
  // pass boundary, one launch's most, and more than one launch.
  for (const int64_t B : {int64_t{32}, int64_t{128}}) {
    const int64_t N = B == 32 ? 272 : 256, K = 512;
    const Fp8Matrix m = fp8_matrix(normal_bf16(g, static_cast<size_t>(N * K), 0.05f), N, K, B);
    for (const int64_t T : {1, 5, 15, 17, 80, 130}) {
      SCOPED_TRACE(testing::Message() << "B " << B << ", T " << T);
      std::vector<float> x = normal_bf16(g, static_cast<size_t>(T * K), 1.0f);
      for (int64_t i = 0; i < K; ++i)
        x[static_cast<size_t>(i)] = round_bf16(x[static_cast<size_t>(i)] * 40.0f);
      auto [cpu, gpu] = run([&](Backend& be) {
        const LinearWeight w = prepared(be, upload(be, m, "fp8"));
        const Tensor xt = put(be, DType::bf16, {T, K}, x);
        Tensor yb = be.alloc(DType::bf16, {T, N}), yf = be.alloc(DType::f32, {T, N});
        be.linear(xt, w, yb);
        be.linear(xt, w, yf);
        return Outs{fetch(be, "bf16 out", yb), fetch(be, "f32 out", yf)};
      });
      test::expect_near_scale(cpu[0], gpu[0], test::kOneRounding);
      test::expect_near_scale(cpu[1], gpu[1], test::kF32);
    }
  }
}

TEST_F(CudaOps, Fp8InsertProductsHaveExactBf16CopiesForManyRows) {
  std::mt19937 g(37);
  const int64_t N = 96, K = 160, B = 32;
  Fp8Matrix m = fp8_matrix(normal_bf16(g, static_cast<size_t>(N * K), 0.05f), N, K, B);
  // main_proj and wkv get the copy, the draft step's other products not.
  const auto main_proj = [&](CudaBackend& be, const Fp8Matrix& mat) {
    DrafterWeights d;
    d.main_proj = upload(be, mat, "main_proj");
    d.head = upload(be, mat, "head");
    d.stages.resize(1);
    d.stages[0].wkv = upload(be, mat, "wkv");
    d.stages[0].wq_a = upload(be, mat, "wq_a");
    be.prepare_weights(d);
    EXPECT_TRUE(d.head.dequantised.empty()) << "head";
    EXPECT_TRUE(d.stages[0].wq_a.dequantised.empty()) << "wq_a";
    EXPECT_EQ(d.stages[0].wkv.dequantised.empty(), d.main_proj.dequantised.empty()) << "wkv";
    return std::move(d.main_proj);
  };
  const LinearWeight w = main_proj(*gpu_, m);
  ASSERT_FALSE(w.dequantised.empty());
  EXPECT_EQ(w.format, WeightFormat::fp8_mma_tiles);
  std::vector<uint16_t> copy(static_cast<size_t>(N * K));
  ASSERT_EQ(cudaMemcpy(copy.data(), w.dequantised.data, copy.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < K; ++c) {
      // code x 2^(e - 127), from the format tables.
      const float want =
          e4m3_to_float(m.codes[static_cast<size_t>(r * K + c)]) *
          std::ldexp(1.0f, m.scales[static_cast<size_t>(r / B * ((K + B - 1) / B) + c / B)] - 127);
      ASSERT_EQ(bf16_to_float(copy[static_cast<size_t>(r * K + c)]), want) << "row " << r << " column " << c;
    }
  CudaBackend off(0, Tuning{.bf16_copies = false});
  EXPECT_TRUE(main_proj(off, m).dequantised.empty()) << "bf16_copies off";
  m.scales[3] = 9;  // 2^-118: its smallest code times it, 2^-127, is not a normal bf16
  EXPECT_TRUE(main_proj(*gpu_, m).dequantised.empty()) << "a scale outside the exact range";
}

TEST_F(CudaOps, Fp8ProductsOfSeveralMatricesOnOneInputGiveEachMatrixItsOwnBits) {
  // Three wkv of the tiny shapes (H 256 -> d 128, blocks of 32), distinct weights. launch_fp8_linear_multi on
  // one set of codes against launch_fp8_linear of each matrix (1, 9 and 80 rows: one to ten passes); then
  // insert_kv_rows with them (one launch up to 16 rows; from 17 one quantisation for every bf16 copy)
  // against the stage-by-stage ops: the same kv rows and rings, bit for bit.
  const int64_t H = cfg_.dim, d = cfg_.head_dim, Bq = cfg_.weight_block_size, S = 3, W = 16, slots = 4;
  std::mt19937 g(41);
  DrafterWeights dw;
  dw.stages.resize(static_cast<size_t>(S));
  std::vector<Tensor> norms;
  for (int64_t i = 0; i < S; ++i) {
    dw.stages[static_cast<size_t>(i)].wkv =
        upload(*gpu_, fp8_matrix(normal_bf16(g, static_cast<size_t>(d * H), 0.06f), d, H, Bq), "wkv");
    norms.push_back(put(*gpu_, DType::bf16, {d}, normal_bf16(g, static_cast<size_t>(d), 0.2f, 1.0f)));
  }
  gpu_->prepare_weights(dw);
  const auto wkv = [&](int64_t i) -> const LinearWeight& { return dw.stages[static_cast<size_t>(i)].wkv; };
  ASSERT_EQ(wkv(0).format, WeightFormat::fp8_mma_tiles);
  ASSERT_FALSE(wkv(0).dequantised.empty());
  const auto bytes_of = [&](const Tensor& t) { return fetch(*gpu_, "out", t); };

  for (const int64_t T : {int64_t{1}, int64_t{9}, int64_t{80}}) {
    SCOPED_TRACE(testing::Message() << "kernel, T " << T);
    const Tensor x = put(*gpu_, DType::bf16, {T, H}, normal_bf16(g, static_cast<size_t>(T * H), 1.0f));
    const Tensor q = gpu_->alloc(DType::u8, {static_cast<int64_t>(cuda::quant_act_bytes(T, H))});
    const cuda::QuantAct codes = cuda::quant_act_at(q.data, T, H);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the launches below run on the default stream
    ASSERT_EQ(cuda::launch_quantize_act(x.data, T, H, H, Bq, codes, nullptr), cudaSuccess);
    std::vector<Tensor> one, many;
    const void* w[3];
    const uint8_t* sc[3];
    void* out[3];
    for (int64_t i = 0; i < S; ++i) {
      one.push_back(gpu_->alloc(DType::bf16, {T, d}));
      many.push_back(gpu_->alloc(DType::bf16, {T, d}));
      w[i] = wkv(i).weight.data;
      sc[i] = wkv(i).scale.as<const uint8_t>();
      out[i] = many.back().data;
      ASSERT_EQ(
          cuda::launch_fp8_linear(codes, T, w[i], sc[i], d, H, Bq, one.back().data, cuda::Elt::bf16, nullptr),
          cudaSuccess);
    }
    ASSERT_EQ(cuda::launch_fp8_linear_multi(codes, T, w, sc, 3, d, H, Bq, out, cuda::Elt::bf16, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int64_t i = 0; i < S; ++i)
      test::expect_same_bits(bytes_of(one[static_cast<size_t>(i)]), bytes_of(many[static_cast<size_t>(i)]));
    // Each output is its own matrix's product (not another's): the matrices differ.
    EXPECT_NE(bytes_of(one[0]).bytes, bytes_of(one[1]).bytes);
  }

  for (const int64_t rows : {int64_t{1}, int64_t{16}, int64_t{20}}) {
    SCOPED_TRACE(testing::Message() << "insert, rows " << rows);
    const Tensor x = put(*gpu_, DType::bf16, {rows, H}, normal_bf16(g, static_cast<size_t>(rows * H), 1.0f));
    std::vector<int32_t> pos(static_cast<size_t>(rows)), slot(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      pos[static_cast<size_t>(r)] = static_cast<int32_t>(3 + 5 * r);
      slot[static_cast<size_t>(r)] = static_cast<int32_t>(r % slots);
    }
    const Tensor p = put_i32(*gpu_, {rows}, pos), sl = put_i32(*gpu_, {rows}, slot);
    std::vector<const LinearWeight*> wkvs;
    for (int64_t i = 0; i < S; ++i) wkvs.push_back(&wkv(i));
    const std::vector<InsertKvStage> stages[2] = {
        test::empty_insert_stages(*gpu_, wkvs, norms, slots, W, d, rows),
        test::empty_insert_stages(*gpu_, wkvs, norms, slots, W, d, rows)};
    const KvRowParams kp{static_cast<float>(cfg_.norm_eps), cfg_.rope_head_dim, cfg_.rope_theta, Bq};
    gpu_->insert_kv_rows(x, {}, stages[0], p, sl, kp);
    gpu_->Backend::insert_kv_rows(x, {}, stages[1], p, sl, kp);
    for (size_t i = 0; i < static_cast<size_t>(S); ++i) {
      test::expect_same_bits(bytes_of(stages[1][i].kv), bytes_of(stages[0][i].kv));
      test::expect_same_bits(bytes_of(stages[1][i].ring_kv), bytes_of(stages[0][i].ring_kv));
      test::expect_same_bits(bytes_of(stages[1][i].ring_pos), bytes_of(stages[0][i].ring_pos));
    }
  }
}

TEST_F(CudaOps, Fp8GroupedLinearUsesTheUnquantisedInput) {
  std::mt19937 g(32);
  // wo_a's shape at the tiny config: 4 groups of 128 outputs over 256 inputs each.
  const int64_t G = 4, out_g = 128, K = 256;
  const Fp8Matrix m = fp8_matrix(normal_bf16(g, static_cast<size_t>(G * out_g * K), 0.05f), G * out_g, K, 32);
  for (const int64_t T : {5, 80, 100}) {
    SCOPED_TRACE(testing::Message() << "T " << T);
    const std::vector<float> x = normal_bf16(g, static_cast<size_t>(T * G * K), 1.0f);
    auto [cpu, gpu] = run([&](Backend& be) {
      const LinearWeight w = prepared(be, upload(be, m, "wo_a"));
      const Tensor xt = put(be, DType::bf16, {T, G * K}, x);
      Tensor yb = be.alloc(DType::bf16, {T, G * out_g}), yf = be.alloc(DType::f32, {T, G * out_g});
      be.grouped_linear(xt, w, G, yb);
      be.grouped_linear(xt, w, G, yf);
      return Outs{fetch(be, "bf16 out", yb), fetch(be, "f32 out", yf)};
    });
    test::expect_near_scale(cpu[0], gpu[0], test::kOneRounding);
    test::expect_near_scale(cpu[1], gpu[1], test::kF32);
  }
}

TEST_F(CudaOps, MoeExpertsWithFp4RoutedAndFp8SharedWeights) {
  std::mt19937 g(33);
  const int64_t H = cfg_.dim, E = cfg_.n_routed_experts;
  ASSERT_EQ(cfg_.n_activated_experts, 2) << "moe_inputs draws two experts per row";
  const test::MoeInputs in = test::moe_inputs(g, T_, H, E);
  // I = 512 (the tiny config) and a tp shard's 384.
  for (const int64_t I : {cfg_.moe_inter_dim, int64_t{384}}) {
    SCOPED_TRACE(testing::Message() << "I = " << I);
    std::vector<Fp4Matrix> routed;
    for (int64_t e = 0; e < E; ++e) {
      routed.push_back(fp4_matrix(normal_bf16(g, static_cast<size_t>(I * H), 1.0f / 16.0f), I, H));
      routed.push_back(fp4_matrix(normal_bf16(g, static_cast<size_t>(I * H), 1.0f / 16.0f), I, H));
      routed.push_back(
          fp4_matrix(normal_bf16(g, static_cast<size_t>(H * I), 1.0f / std::sqrt(float(I))), H, I));
    }
    const Fp8Matrix s1 = fp8_matrix(normal_bf16(g, static_cast<size_t>(I * H), 1.0f / 16.0f), I, H, 32);
    const Fp8Matrix s3 = fp8_matrix(normal_bf16(g, static_cast<size_t>(I * H), 1.0f / 16.0f), I, H, 32);
    const Fp8Matrix s2 =
        fp8_matrix(normal_bf16(g, static_cast<size_t>(H * I), 1.0f / std::sqrt(float(I))), H, I, 32);
    auto [cpu, gpu] = run([&](Backend& be) {
      DrafterWeights d;
      d.stages.emplace_back();
      StageWeights& st = d.stages[0];
      for (int64_t e = 0; e < E; ++e) {
        const size_t m = static_cast<size_t>(3 * e);
        st.experts.push_back({upload(be, routed[m], "w1", 32), upload(be, routed[m + 1], "w3", 32),
                              upload(be, routed[m + 2], "w2", 32)});
      }
      st.shared = {upload(be, s1, "shared w1"), upload(be, s3, "shared w3"), upload(be, s2, "shared w2")};
      be.prepare_weights(d);
      return test::run_moe_experts(be, st, in, T_, H, static_cast<float>(cfg_.swiglu_limit));
    });
    for (size_t i = 0; i < cpu.size(); ++i) test::expect_near_scale(cpu[i], gpu[i], test::kChained);
  }
}

// Raw device buffers for the quantiser kernels.
struct DeviceBytes {
  explicit DeviceBytes(size_t n) { EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess); }
  ~DeviceBytes() { cudaFree(p); }
  void* p = nullptr;
};

TEST_F(CudaOps, ActivationQuantisationHasTheReferenceBits) {
  std::mt19937 g(34);
  const int64_t T = 7, K = 512;
  std::vector<float> x = normal_bf16(g, static_cast<size_t>(T * K), 1.0f);
  // A zero block (amax floor 1e-4), a tiny one, one with a huge value, one past e4m3's range.
  for (int64_t i = 0; i < 32; ++i) {
    x[static_cast<size_t>(i)] = 0.0f;
    x[static_cast<size_t>(32 + i)] = round_bf16(x[static_cast<size_t>(32 + i)] * 1e-6f);
    x[static_cast<size_t>(K + i)] = round_bf16(x[static_cast<size_t>(K + i)] * 3000.0f);
  }
  for (const int64_t B : {int64_t{32}, int64_t{128}}) {
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = float_to_bf16(x[i]);
    DeviceBytes dx(xb.size() * 2), dq(cuda::quant_act_bytes(T, K));
    ASSERT_EQ(cudaMemcpy(dx.p, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    const cuda::QuantAct q = cuda::quant_act_at(dq.p, T, K);
    ASSERT_EQ(cuda::launch_quantize_act(dx.p, T, K, K, B, q, nullptr), cudaSuccess);
    std::vector<uint8_t> codes(static_cast<size_t>(T * K));
    std::vector<float> scales(static_cast<size_t>(T * K / 32));
    ASSERT_EQ(cudaMemcpy(codes.data(), q.codes, codes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(scales.data(), q.scales, scales.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> want(static_cast<size_t>(K));
      quantize_activation_row(x.data() + t * K, K, B, want.data());
      for (int64_t i = 0; i < K; ++i) {
        const float got = e4m3_to_float(codes[static_cast<size_t>(t * K + i)]) *
                          scales[static_cast<size_t>(t * K / 32 + i / 32)];
        ASSERT_EQ(got, want[static_cast<size_t>(i)]) << "B " << B << " row " << t << " element " << i;
      }
    }
  }
}

TEST_F(CudaOps, WeightQuantisersHaveTheReferenceBits) {
  std::mt19937 g(35);
  const int64_t rows = 96, cols = 160;  // fp8 blocks of 32 and a partial 128 block at the edges
  std::vector<float> w = normal_bf16(g, static_cast<size_t>(rows * cols), 0.05f);
  w[5] = 0.0f;
  std::vector<uint16_t> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = float_to_bf16(w[i]);
  DeviceBytes dw(wb.size() * 2), dc(w.size()), ds(w.size());
  ASSERT_EQ(cudaMemcpy(dw.p, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  const auto download = [](const void* p, size_t n) {
    std::vector<uint8_t> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  };
  for (const int64_t B : {int64_t{32}, int64_t{128}}) {
    const Fp8Matrix want = fp8_matrix(w, rows, cols, B);
    ASSERT_EQ(cuda::launch_quantize_fp8_block(dw.p, rows, cols, B, dc.p, ds.p, nullptr), cudaSuccess);
    EXPECT_EQ(download(dc.p, want.codes.size()), want.codes) << "fp8 codes, B " << B;
    EXPECT_EQ(download(ds.p, want.scales.size()), want.scales) << "fp8 scales, B " << B;
  }
  const Fp4Matrix want = fp4_matrix(w, rows, cols);
  ASSERT_EQ(cuda::launch_quantize_fp4(dw.p, rows, cols, dc.p, ds.p, nullptr), cudaSuccess);
  EXPECT_EQ(download(dc.p, want.packed.size()), want.packed) << "fp4 codes";
  EXPECT_EQ(download(ds.p, want.scales.size()), want.scales) << "fp4 scales";
}

}  // namespace
}  // namespace dspark
