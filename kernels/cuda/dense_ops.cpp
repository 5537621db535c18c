// The linear ops of CudaBackend (linear, grouped_linear): cuBLAS for bf16, the few-row kernel from a copy in
// mma tiles (linear_tiles.cu), the warp-per-output kernel otherwise (dense.cu); fp8 block weights go to
// quant_ops.cpp, EXL3 ones to exl3_ops.cpp.
#include <climits>

#include "kernels/cuda/blas.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/dense.hpp"
#include "kernels/cuda/linear_tiles.hpp"
#include "kernels/cuda/weight_tiles.hpp"

namespace dspark {

using cuda::check;
using cuda::Elt;
using cuda::elt;

namespace {

void check_dense(const LinearWeight& w, const char* op) {
  if (w.format != WeightFormat::dense)
    fail("cuda {}: weight '{}' is {}, only dense weights are supported", op, w.name,
         weight_format_name(w.format));
  cuda::expect_data(w.weight, op, "weight");
}

bool is_fp8(const LinearWeight& w) {
  return w.format == WeightFormat::fp8_block || w.format == WeightFormat::fp8_mma_tiles;
}

// Whether a linear layer takes launch_linear_tiles: a copy in mma tiles, bf16 x (16-byte aligned), bf16 or
// f32 out, few rows, whole tiles per group.
bool few_rows_from_tiles(const Tensor& x, const LinearWeight& w, int64_t groups, int64_t rows, Elt out_t) {
  return !w.tiles.empty() && x.dtype == DType::bf16 && cuda::aligned16(x.data) && out_t != Elt::f16 &&
         rows <= cuda::kLinearTilesMaxRows && (w.out / groups) % cuda::kMmaTileRows == 0 &&
         w.in % cuda::kMmaTileCols == 0;
}

int cublas_int(int64_t v, const char* op) {
  if (v < 0 || v > INT_MAX) fail("cuda {}: dimension {} does not fit cuBLAS's int", op, v);
  return static_cast<int>(v);
}

}  // namespace

void CudaBackend::gemm_bf16(const char* op, const Tensor& x, const LinearWeight& w, int64_t groups,
                            int64_t rows, const Tensor& out) {
  // Row-major y[T, G out_g] = x[T, G in_g] W^T is, column-major, y^T = W x^T per group: A = W stored
  // [out_g, in_g] row-major = an in_g x out_g column-major matrix, used transposed (lda = in_g); B = x^T, an
  // in_g x T column-major matrix with ldb = G in_g; C = y^T with ldc = G out_g. Groups are batches striding
  // through W by out_g in_g, through x by in_g and through y by out_g.
  const int64_t out_g = w.out / groups, in_g = w.in;
  const int m = cublas_int(out_g, op), n = cublas_int(rows, op), k = cublas_int(in_g, op);
  const int lda = cublas_int(in_g, op), ldb = cublas_int(groups * in_g, op), ldc = cublas_int(w.out, op);
  const cudaDataType_t ctype = out.dtype == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  const float alpha = 1.0f, beta = 0.0f;
  if (groups == 1) {
    check(cublasGemmEx(blas().handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w.weight.data, CUDA_R_16BF,
                       lda, x.data, CUDA_R_16BF, ldb, &beta, out.data, ctype, ldc, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT),
          op);
  } else {
    check(cublasGemmStridedBatchedEx(blas().handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w.weight.data,
                                     CUDA_R_16BF, lda, out_g * in_g, x.data, CUDA_R_16BF, ldb, in_g, &beta,
                                     out.data, ctype, ldc, out_g, cublas_int(groups, op), CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT),
          op);
  }
}

void CudaBackend::linear(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  linear_coded(x, {}, w, out);
}

void CudaBackend::linear_coded(const Tensor& x, const ActCodes& codes, const LinearWeight& w,
                               const Tensor& out) {
  const char* op = "linear";
  if (x.shape.empty() || w.in <= 0 || x.shape.back() != w.in || out.numel() != x.numel() / w.in * w.out)
    fail("cuda linear '{}': x {} and out {} do not fit [{}, {}]", w.name, shape_str(x.shape),
         shape_str(out.shape), w.out, w.in);
  if (is_fp8(w)) {
    if (x.numel() > 0 && w.out > 0) fp8_linear(op, x, w, x.numel() / w.in, out, &codes);
    return;
  }
  if (w.format == WeightFormat::exl3) {
    if (x.numel() > 0) exl3_linear(op, x, w, x.numel() / w.in, out);
    return;
  }
  check_dense(w, op);
  cuda::expect_numel(w.weight, w.out * w.in, op, "weight");
  const int64_t rows = x.numel() / w.in;
  if (rows == 0 || w.out == 0) return;
  const Elt xt = elt(x, op, "x"), wt = elt(w.weight, op, "weight"), ot = elt(out, op, "out");
  if (few_rows_from_tiles(x, w, 1, rows, ot)) {
    check(cuda::launch_linear_tiles(x.data, rows, 1, w.tiles.data, w.out, w.in, out.data, ot, cur_), op);
    return;
  }
  if (xt == Elt::bf16 && wt == Elt::bf16 && ot != Elt::f16) {
    gemm_bf16(op, x, w, 1, rows, out);
    return;
  }
  check(cuda::launch_dense_gemv(x.data, xt, w.in, w.weight.data, wt, out.data, ot, w.out, rows, w.out, w.in,
                                w.out, cur_),
        op);
}

void CudaBackend::grouped_linear(const Tensor& x, const LinearWeight& w, int64_t groups, const Tensor& out) {
  const char* op = "grouped_linear";
  if (groups < 1 || w.out % groups != 0 || w.in <= 0 || x.numel() % (groups * w.in) != 0)
    fail("cuda grouped_linear '{}': x {} does not split into {} groups of [{}, {}]", w.name,
         shape_str(x.shape), groups, groups > 0 ? w.out / groups : 0, w.in);
  if (is_fp8(w)) {
    const int64_t rows = x.numel() / (groups * w.in);
    cuda::expect_numel(out, rows * w.out, op, "out");
    if (rows > 0 && w.out > 0) fp8_grouped(op, x, w, groups, rows, out);
    return;
  }
  check_dense(w, op);
  cuda::expect_numel(w.weight, w.out * w.in, op, "weight");
  const int64_t rows = x.numel() / (groups * w.in);
  cuda::expect_numel(out, rows * w.out, op, "out");
  if (rows == 0 || w.out == 0) return;
  const Elt xt = elt(x, op, "x"), wt = elt(w.weight, op, "weight"), ot = elt(out, op, "out");
  if (few_rows_from_tiles(x, w, groups, rows, ot)) {
    check(cuda::launch_linear_tiles(x.data, rows, groups, w.tiles.data, w.out / groups, w.in, out.data, ot,
                                    cur_),
          op);
    return;
  }
  if (xt == Elt::bf16 && wt == Elt::bf16 && ot != Elt::f16) {
    gemm_bf16(op, x, w, groups, rows, out);
    return;
  }
  check(cuda::launch_dense_gemv(x.data, xt, groups * w.in, w.weight.data, wt, out.data, ot, w.out, rows,
                                w.out, w.in, w.out / groups, cur_),
        op);
}

}  // namespace dspark
