// The attention ops of CudaBackend (kernels: attention.cu, attention_mma.cu, attention_whole.cu): shape /
// dtype checks, the key splits and their scratch, then the launch.
#include <cmath>
#include <limits>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/blas.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_ops_common.hpp"
#include "kernels/cuda/rope_host.hpp"

namespace dspark {

using cuda::check;
using cuda::elt;
using cuda::expect_dtype;
using cuda::expect_numel;
using cuda::expect_rank;
using cuda::kMaxGridYZ;
using cuda::request_rows_check;

namespace {

// The checked kernel arguments of an attention op (no RoPE).
cuda::AttentionArgs attention_args(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                                   const Tensor& ring_pos, const Tensor& requests, const Tensor& sink,
                                   int64_t k, const Tensor& out, const char* op) {
  expect_rank(q, 3, op, "q");
  expect_rank(ring_kv, 3, op, "ring_kv");
  expect_rank(ring_pos, 2, op, "ring_pos");
  expect_dtype(ring_pos, DType::i32, op, "ring_pos");
  expect_dtype(sink, DType::f32, op, "sink");
  const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2);
  if (k < 1 || T % k != 0) fail("cuda attention: {} rows are not requests of k = {}", T, k);
  const int64_t B = T / k, S = ring_kv.dim(0), W = ring_kv.dim(1);
  if (ring_kv.dim(2) != d || ring_pos.dim(0) != S || ring_pos.dim(1) != W)
    fail("cuda attention: ring_kv {} / ring_pos {} do not fit heads of {}", shape_str(ring_kv.shape),
         shape_str(ring_pos.shape), d);
  expect_numel(block_kv, T * d, op, "block_kv");
  expect_numel(sink, heads, op, "sink");
  expect_numel(out, T * heads * d, op, "out");
  request_rows_check(requests, B, op);
  if (B > kMaxGridYZ) fail("cuda attention: {} requests (at most {})", B, kMaxGridYZ);
  if (W + k > std::numeric_limits<int32_t>::max() / 2) fail("cuda attention: window {} too large", W);
  if (cuda::attention_smem_bytes(d, W, k) > 200 * 1024)
    fail("cuda attention: head dim {} and window {} need too much shared memory", d, W);
  cuda::AttentionArgs a{};
  a.q = q.data;
  a.q_t = elt(q, op, "q");
  a.block_kv = block_kv.data;
  a.block_kv_t = elt(block_kv, op, "block_kv");
  a.ring_kv = ring_kv.data;
  a.ring_kv_t = elt(ring_kv, op, "ring_kv");
  a.ring_pos = ring_pos.as<const int32_t>();
  a.requests = requests.as<const int32_t>();
  a.sink = sink.as<const float>();
  a.out = out.data;
  a.out_t = elt(out, op, "out");
  a.B = B;
  a.k = k;
  a.heads = heads;
  a.d = d;
  a.slots = S;
  a.W = W;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  return a;
}

}  // namespace

void CudaBackend::split_attention(cuda::AttentionArgs& a, const char* op) {
  a.splits = cuda::attention_splits(a);
  if (a.splits <= 1) return;
  // Stream-ordered scratch like the other multi-pass ops (refused inside a capture if it would have to grow;
  // at V4.1's B = 1, 32 heads and 3 splits the partials take 1 MB of the 64 MiB).
  a.split_partials = static_cast<float*>(scratch(cuda::attention_split_scratch_bytes(a, a.splits), op));
  a.split_counters = current_scratch().counters;
}

void CudaBackend::attention(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                            const Tensor& ring_pos, const Tensor& requests, const Tensor& sink, int64_t k,
                            const Tensor& out) {
  const char* op = "attention";
  cuda::AttentionArgs a = attention_args(q, block_kv, ring_kv, ring_pos, requests, sink, k, out, op);
  split_attention(a, op);
  check(cuda::launch_attention(a, cur_), op);
}

void CudaBackend::attention_inverse_rope(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                                         const Tensor& ring_pos, const Tensor& requests, const Tensor& sink,
                                         int64_t k, const Tensor& pos, int64_t rope_dim, double theta,
                                         const Tensor& out) {
  const char* op = "attention_inverse_rope";
  cuda::AttentionArgs a = attention_args(q, block_kv, ring_kv, ring_pos, requests, sink, k, out, op);
  expect_dtype(pos, DType::i32, op, "pos");
  if (pos.numel() < q.dim(0)) fail("cuda {}: {} positions for {} rows", op, pos.numel(), q.dim(0));
  cuda::check_rope_dim(rope_dim, a.d, op);
  a.rope_pos = pos.as<const int32_t>();
  a.rope_dim = rope_dim;
  a.freqs = cuda::rope_freqs(rope_dim, theta);
  split_attention(a, op);
  check(cuda::launch_attention(a, cur_), op);
}

}  // namespace dspark
