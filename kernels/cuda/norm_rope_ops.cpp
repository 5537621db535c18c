// The RMSNorm, RoPE and KV QDQ ops of CudaBackend, and their fusion for the KV row (kernels: norm_rope.cu):
// shape / dtype checks, then launches.
#include "kernels/cuda/act_codes.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/norm_rope.hpp"
#include "kernels/cuda/rope_host.hpp"

namespace dspark {

using cuda::check;
using cuda::elt;

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  rms_norm_coded(x, w, eps, out, {});
}

void CudaBackend::rms_norm_coded(const Tensor& x, const Tensor& w, float eps, const Tensor& out,
                                 const ActCodes& codes) {
  const char* op = "rms_norm";
  const int64_t n = w.numel();
  if (n == 0 || x.numel() % n != 0) fail("cuda rms_norm: x {} is not rows of {}", shape_str(x.shape), n);
  cuda::expect_numel(out, x.numel(), op, "out");
  if (!codes.empty()) cuda::expect_dtype(out, DType::bf16, op, "out (with activation codes)");
  const int64_t rows = x.numel() / n;
  check(cuda::launch_rms_norm(x.data, elt(x, op, "x"), w.data, elt(w, op, "weight"), eps, out.data,
                              elt(out, op, "out"), rows, n, cur_, cuda::codes_out(codes, rows, n, op)),
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
