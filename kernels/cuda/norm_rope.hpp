// RMSNorm, RoPE and the fp8 QDQ of KV rows, separately and fused (norm_rope.cu); their CudaBackend ops are in
// norm_rope_ops.cpp, the host side of RoPE in rope_host.hpp. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch_common.hpp"
#include "kernels/cuda/quant_act.hpp"

namespace dspark::cuda {

// codes: where to write out's activation quantisation too (out bf16, quant_act_out_fits(n, codes.block)).
cudaError_t launch_rms_norm(const void* x, Elt x_t, const void* w, Elt w_t, float eps, void* out, Elt out_t,
                            int64_t rows, int64_t n, cudaStream_t s, const QuantActOut& codes = {});
// The RoPE frequencies, computed on the host with the CPU reference's expression (bit-identical); passed
// by value so that a captured graph carries them.
constexpr int kMaxRopeHalf = 256;
struct RopeFreqs {
  float f[kMaxRopeHalf];
};
cudaError_t launch_rope(void* x, Elt x_t, const int32_t* pos, int64_t T, int64_t heads, int64_t d,
                        int64_t rope_dim, const RopeFreqs& freqs, bool inverse, cudaStream_t s);
cudaError_t launch_kv_qdq(void* x, Elt x_t, int64_t n, int64_t block, cudaStream_t s);
// rms_norm, forward rope and kv_qdq of N rows of d (one head) in one kernel, the same bits as the three in
// turn; needs d % block == 0 and kv_norm_rope_qdq_smem_bytes(d) <= 48 KiB (cudaErrorInvalidValue otherwise).
size_t kv_norm_rope_qdq_smem_bytes(int64_t d);
cudaError_t launch_kv_norm_rope_qdq(const void* x, Elt x_t, const void* w, Elt w_t, float eps,
                                    const int32_t* pos, int64_t N, int64_t d, int64_t rope_dim,
                                    const RopeFreqs& freqs, int64_t block, void* out, Elt out_t,
                                    cudaStream_t s);
// launch_kv_norm_rope_qdq's rows of up to kMaxKvRingStages stages (an insert's), each written into its
// stage's ring as ring_write does (row n to slot row_slot[n], entry pos[n] mod W; a later row for the same
// entry wins; invalid slots and negative positions go nowhere) instead of to an output: the same bits in the
// rings. The kv rows [N, d] of x_t, the norm weights of w_t; the rings bf16 [slots, W, d] and i32 [slots, W].
constexpr int kMaxKvRingStages = 8;
struct KvRingStages {
  const void* kv[kMaxKvRingStages];
  const void* norm[kMaxKvRingStages];
  uint16_t* ring_kv[kMaxKvRingStages];
  int32_t* ring_pos[kMaxKvRingStages];
};
cudaError_t launch_kv_rows_to_rings(const KvRingStages& stages, int n_stages, Elt x_t, Elt w_t, float eps,
                                    const int32_t* pos, const int32_t* row_slot, int64_t N, int64_t slots,
                                    int64_t W, int64_t d, int64_t rope_dim, const RopeFreqs& freqs,
                                    int64_t block, cudaStream_t s);

}  // namespace dspark::cuda
