// The KV ring ops of CudaBackend (kernels: ring.cu; ring_clear fills with memory.cu's fill): shape / dtype
// checks, then launches.
#include <limits>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/memory.hpp"
#include "kernels/cuda/ring.hpp"

namespace dspark {

using cuda::check;
using cuda::expect_dtype;
using cuda::expect_numel;
using cuda::expect_rank;

void CudaBackend::ring_write(const Tensor& ring_kv, const Tensor& ring_pos, const Tensor& kv,
                             const Tensor& slots, const Tensor& pos) {
  const char* op = "ring_write";
  expect_rank(ring_kv, 3, op, "ring_kv");
  expect_rank(ring_pos, 2, op, "ring_pos");
  expect_rank(kv, 2, op, "kv");
  expect_dtype(ring_pos, DType::i32, op, "ring_pos");
  expect_dtype(slots, DType::i32, op, "slots");
  expect_dtype(pos, DType::i32, op, "pos");
  if (dtype_size(ring_kv.dtype) != 2)
    fail("cuda ring_write: ring_kv must be 16-bit, got {}", dtype_name(ring_kv.dtype));
  expect_dtype(kv, ring_kv.dtype, op, "kv");
  const int64_t S = ring_kv.dim(0), W = ring_kv.dim(1), d = ring_kv.dim(2), N = kv.dim(0);
  if (ring_pos.dim(0) != S || ring_pos.dim(1) != W || kv.dim(1) != d || W < 1)
    fail("cuda ring_write: ring_kv {}, ring_pos {} and kv {} disagree", shape_str(ring_kv.shape),
         shape_str(ring_pos.shape), shape_str(kv.shape));
  expect_numel(slots, N, op, "slots");
  expect_numel(pos, N, op, "pos");
  if (N > std::numeric_limits<int32_t>::max()) fail("cuda ring_write: {} rows", N);
  check(cuda::launch_ring_write(ring_kv.as<uint16_t>(), ring_pos.as<int32_t>(), S, W, d,
                                kv.as<const uint16_t>(), slots.as<const int32_t>(), pos.as<const int32_t>(),
                                N, cur_),
        op);
}

void CudaBackend::ring_clear(const Tensor& ring_pos, int64_t slot) {
  const char* op = "ring_clear";
  expect_rank(ring_pos, 2, op, "ring_pos");
  expect_dtype(ring_pos, DType::i32, op, "ring_pos");
  if (slot < 0 || slot >= ring_pos.dim(0))
    fail("cuda ring_clear: slot {} out of range [0, {})", slot, ring_pos.dim(0));
  const int64_t W = ring_pos.dim(1);
  check(cuda::launch_fill_i32(ring_pos.as<int32_t>() + slot * W, W, -1, cur_), op);
}

}  // namespace dspark
