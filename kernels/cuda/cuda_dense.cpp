// Embedding, linear layers (cuBLAS for bf16, a warp-per-output kernel otherwise), RMSNorm, RoPE and KV QDQ.
#include <climits>
#include <cmath>

#include "kernels/cuda/blas.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/rope_host.hpp"

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

void CudaBackend::embed(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const char* op = "embed";
  cuda::expect_rank(table, 2, op, "table");
  cuda::expect_dtype(ids, DType::i32, op, "ids");
  const int64_t V = table.dim(0), H = table.dim(1), T = ids.numel();
  cuda::expect_numel(out, T * H, op, "out");
  check(cuda::launch_embed(table.data, elt(table, op, "table"), V, H, ids.as<const int32_t>(), T, out.data,
                           elt(out, op, "out"), cur_),
        op);
}

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
  const char* op = "linear";
  check_dense(w, op);
  if (x.shape.empty() || w.in <= 0 || x.shape.back() != w.in || out.numel() != x.numel() / w.in * w.out)
    fail("cuda linear '{}': x {} and out {} do not fit [{}, {}]", w.name, shape_str(x.shape),
         shape_str(out.shape), w.out, w.in);
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
  check_dense(w, op);
  if (groups < 1 || w.out % groups != 0 || w.in <= 0 || x.numel() % (groups * w.in) != 0)
    fail("cuda grouped_linear '{}': x {} does not split into {} groups of [{}, {}]", w.name,
         shape_str(x.shape), groups, groups > 0 ? w.out / groups : 0, w.in);
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

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  const char* op = "rms_norm";
  const int64_t n = w.numel();
  if (n == 0 || x.numel() % n != 0) fail("cuda rms_norm: x {} is not rows of {}", shape_str(x.shape), n);
  cuda::expect_numel(out, x.numel(), op, "out");
  check(cuda::launch_rms_norm(x.data, elt(x, op, "x"), w.data, elt(w, op, "weight"), eps, out.data,
                              elt(out, op, "out"), x.numel() / n, n, cur_),
        op);
}

void CudaBackend::rope(const Tensor& x, const Tensor& pos, int64_t rope_dim, double theta, bool inverse) {
  const char* op = "rope";
  if (x.shape.size() < 2) fail("cuda rope: x {} must be [T, ..., d]", shape_str(x.shape));
  cuda::expect_dtype(pos, DType::i32, op, "pos");
  const int64_t T = x.dim(0), d = x.shape.back();
  if (T == 0 || d == 0) return;
  const int64_t heads = x.numel() / (T * d);
  if (pos.numel() < T) fail("cuda rope: {} positions for {} rows", pos.numel(), T);
  cuda::check_rope_dim(rope_dim, d, op);
  check(cuda::launch_rope(x.data, elt(x, op, "x"), pos.as<const int32_t>(), T, heads, d, rope_dim,
                          cuda::rope_freqs(rope_dim, theta), inverse, cur_),
        op);
}

void CudaBackend::kv_qdq(const Tensor& x, int64_t block) {
  const char* op = "kv_qdq";
  if (block < 1) fail("cuda kv_qdq: block {} must be positive", block);
  check(cuda::launch_kv_qdq(x.data, elt(x, op, "x"), x.numel(), block, cur_), op);
}

void CudaBackend::kv_norm_rope_qdq(const Tensor& kv, const Tensor& w, float eps, const Tensor& pos,
                                   int64_t rope_dim, double theta, int64_t block, const Tensor& out) {
  const char* op = "kv_norm_rope_qdq";
  cuda::expect_rank(kv, 2, op, "kv");
  cuda::expect_dtype(pos, DType::i32, op, "pos");
  const int64_t N = kv.dim(0), d = kv.dim(1);
  cuda::expect_numel(w, d, op, "weight");
  cuda::expect_numel(out, N * d, op, "out");
  if (pos.numel() < N) fail("cuda {}: {} positions for {} rows", op, pos.numel(), N);
  if (block < 1) fail("cuda {}: block {} must be positive", op, block);
  cuda::check_rope_dim(rope_dim, d, op);
  if (d % block != 0 || cuda::kv_norm_rope_qdq_smem_bytes(d) > 48 * 1024) {
    Backend::kv_norm_rope_qdq(kv, w, eps, pos, rope_dim, theta, block, out);  // the three kernels
    return;
  }
  check(cuda::launch_kv_norm_rope_qdq(
            kv.data, elt(kv, op, "kv"), w.data, elt(w, op, "weight"), eps, pos.as<const int32_t>(), N, d,
            rope_dim, cuda::rope_freqs(rope_dim, theta), block, out.data, elt(out, op, "out"), cur_),
        op);
}

}  // namespace dspark
