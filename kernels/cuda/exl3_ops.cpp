// The EXL3 ops of CudaBackend (kernels: exl3_linear.cu, moe_exl3.cu): each matrix's trellis, suh and svh
// checked against its shape and K, then the launches; the experts' matrices gathered into an Exl3Table.
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/exl3.hpp"

namespace dspark {

using cuda::check;

namespace {

cuda::Exl3Cb codebook_of(Exl3Codebook c) {
  switch (c) {
    case Exl3Codebook::inst3:
      return cuda::Exl3Cb::inst3;
    case Exl3Codebook::mcg:
      return cuda::Exl3Cb::mcg;
    case Exl3Codebook::mul1:
      return cuda::Exl3Cb::mul1;
  }
  fail("cuda: unknown EXL3 codebook");
}

// w's parts as the EXL3 kernels read them: trellis i16 [in/16, out/16, 16K], suh f16 [in], svh f16 [out].
cuda::Exl3Shape exl3_shape(const LinearWeight& w, const char* op) {
  if (w.format != WeightFormat::exl3)
    fail("cuda {}: weight '{}' is {}, not EXL3", op, w.name, weight_format_name(w.format));
  cuda::expect_data(w.weight, op, "trellis");
  cuda::expect_data(w.suh, op, "suh");
  cuda::expect_data(w.svh, op, "svh");
  if (w.in % 128 != 0 || w.out % 128 != 0 || w.bits < 1 || w.bits > 8 || w.weight.dtype != DType::i16 ||
      w.weight.shape != Shape{w.in / 16, w.out / 16, 16 * w.bits} || w.suh.dtype != DType::f16 ||
      w.suh.numel() != w.in || w.svh.dtype != DType::f16 || w.svh.numel() != w.out ||
      !cuda::aligned16(w.weight.data))
    fail(
        "cuda {}: EXL3 weight '{}' [{}, {}] K {} (trellis {} {}, suh {}, svh {}) is not a shape its kernels "
        "take",
        op, w.name, w.out, w.in, w.bits, dtype_name(w.weight.dtype), shape_str(w.weight.shape),
        shape_str(w.suh.shape), shape_str(w.svh.shape));
  return {w.in, w.out, static_cast<int>(w.bits), codebook_of(w.codebook)};
}

bool same_code(const cuda::Exl3Shape& a, const cuda::Exl3Shape& b) {
  return a.in == b.in && a.out == b.out && a.K == b.K && a.codebook == b.codebook;
}

// Row m of the table at expert e (-1: the shared expert).
void put(cuda::Exl3Table& t, int m, int64_t e, const LinearWeight& w) {
  t.trellis[m][e + 1] = w.weight.data;
  t.suh[m][e + 1] = w.suh.data;
  t.svh[m][e + 1] = w.svh.data;
}

// The shapes of one expert's matrices (w1 and w3 one code, as one launch reads them).
void expert_shapes(const ExpertWeights& e, const char* op, cuda::Exl3Shape* w13, cuda::Exl3Shape* w2) {
  *w13 = exl3_shape(e.w1, op);
  if (!same_code(*w13, exl3_shape(e.w3, op)))
    fail("cuda {}: EXL3 '{}' and '{}' differ in shape, K or codebook; one launch reads both", op, e.w1.name,
         e.w3.name);
  *w2 = exl3_shape(e.w2, op);
}

void expect_rows(const Tensor& x, const char* op) {
  if (x.dtype != DType::bf16 || !cuda::aligned16(x.data))
    fail("cuda {}: an EXL3 product needs x bf16 and 16-byte aligned (x is {})", op, dtype_name(x.dtype));
}

}  // namespace

void CudaBackend::exl3_linear(const char* op, const Tensor& x, const LinearWeight& w, int64_t rows,
                              const Tensor& out) {
  const cuda::Exl3Shape sh = exl3_shape(w, op);
  expect_rows(x, op);
  const cuda::Elt ot = cuda::elt(out, op, "out");
  void* buf = scratch(cuda::exl3_linear_scratch_bytes(rows, w.in, w.out), op);
  check(cuda::launch_exl3_linear(x.data, rows, w.in, w.weight.data, w.suh.data, w.svh.data, sh, out.data, ot,
                                 buf, cur_),
        op);
}

void CudaBackend::exl3_routed(const char* op, const Tensor& x, const Tensor& ids, const Tensor& weights,
                              const StageWeights& stage, float swiglu_limit, const Tensor& y) {
  const int64_t H = x.shape.back(), T = x.numel() / H, top_k = ids.numel() / T;
  const int64_t E = static_cast<int64_t>(stage.experts.size());
  if (E > cuda::kMaxExperts) fail("cuda {}: {} experts (at most {})", op, E, cuda::kMaxExperts);
  expect_rows(x, op);
  cuda::Exl3Shape w13{}, w2{};
  cuda::Exl3Table table{};
  for (int64_t e = 0; e < E; ++e) {
    const ExpertWeights& ew = stage.experts[static_cast<size_t>(e)];
    cuda::Exl3Shape a{}, b{};
    expert_shapes(ew, op, &a, &b);
    if (e == 0) w13 = a, w2 = b;  // one launch reads every expert in expert 0's shape and code
    if (!same_code(a, w13) || !same_code(b, w2))
      fail("cuda {}: EXL3 expert '{}' differs from '{}' in shape, K or codebook; one launch reads them all",
           op, ew.w1.name, stage.experts[0].w1.name);
    put(table, 0, e, ew.w1);
    put(table, 1, e, ew.w3);
    put(table, 2, e, ew.w2);
  }
  if (w13.in != H || w2.out != H) fail("cuda {}: EXL3 experts of width {} for x of {}", op, w13.in, H);
  void* buf = scratch(cuda::moe_exl3_routed_scratch_bytes(T, top_k, E, w13.out, H), op);
  check(cuda::launch_moe_routed_exl3(x.data, ids.as<const int32_t>(), weights.as<const float>(), T, H, top_k,
                                     E, w13.out, w13, w2, table, swiglu_limit, buf, y.as<float>(), cur_),
        op);
}

void CudaBackend::exl3_shared(const char* op, const Tensor& x, const StageWeights& stage, float swiglu_limit,
                              const Tensor& out) {
  const int64_t H = x.shape.back(), T = x.numel() / H;
  expect_rows(x, op);
  cuda::Exl3Shape w13{}, w2{};
  expert_shapes(stage.shared, op, &w13, &w2);
  if (w13.in != H || w2.out != H) fail("cuda {}: EXL3 shared expert of width {} for x of {}", op, w13.in, H);
  cuda::Exl3Table table{};
  put(table, 0, -1, stage.shared.w1);
  put(table, 1, -1, stage.shared.w3);
  put(table, 2, -1, stage.shared.w2);
  void* buf = scratch(cuda::moe_exl3_shared_scratch_bytes(T, w13.out, H), op);
  check(cuda::launch_moe_shared_exl3(x.data, T, H, w13.out, w13, w2, table, swiglu_limit, buf,
                                     out.as<float>(), cur_),
        op);
}

}  // namespace dspark
