// The mixture of experts: routing (moe_route.cu), the grouped experts and their combine (moe_experts.cu);
// their CudaBackend ops are in moe_ops.cpp. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch_common.hpp"
#include "kernels/cuda/quant_act.hpp"

namespace dspark::cuda {

cudaError_t launch_moe_route(const void* x, Elt x_t, const void* gate, Elt gate_t, const float* bias,
                             int64_t T, int64_t E, int64_t H, int64_t top_k, float route_scale,
                             float gate_temp, bool normalize, float* score_scratch /* [T, E] */, int32_t* ids,
                             float* weights, cudaStream_t s);

// Device pointers of every expert's matrices, passed by value as a kernel parameter (no device-side table
// to build or keep in sync; graph capture records the values).
constexpr int kMaxExperts = 256;
constexpr int kMaxTopK = 16;
// How a set's matrices are stored: bf16 (row-major or in mma tiles, see `tiles`), or quantised in their mma
// tiles (quant_tile.cuh) with scales: their products read the input quantised per block (SPEC §3).
enum class ExpertKind : int32_t { bf16 = 0, fp8 = 1, fp4 = 2 };
struct ExpertSet {
  const void* w1[kMaxExperts];
  const void* w3[kMaxExperts];
  const void* w2[kMaxExperts];
  const void* shared_w1;
  const void* shared_w3;
  const void* shared_w2;
  Elt w1_t, w3_t, w2_t, shared_w1_t, shared_w3_t, shared_w2_t;
  int64_t E;          // routed experts
  int64_t I;          // routed intermediate channels (this rank's)
  int64_t I_shared;   // shared intermediate channels (this rank's)
  bool tiles;         // the routed matrices are in bf16 mma tiles (mma_tile.cuh), not row-major
  bool shared_tiles;  // the shared expert's are
  // Quantised sets: the scales of each matrix (fp8: its B x B blocks; fp4: tiled per row and chunk), the fp8
  // block B, and the activation block (SPEC §3: B for fp8 and fp4 alike).
  ExpertKind kind, shared_kind;
  const void* w1_scale[kMaxExperts];
  const void* w3_scale[kMaxExperts];
  const void* w2_scale[kMaxExperts];
  const void *shared_w1_scale, *shared_w3_scale, *shared_w2_scale;
  int64_t block, shared_block;  // fp8 weight block (0 for fp4)
  int64_t act_block, shared_act_block;
};
// Units of a routed launch: the distinct routed experts the rows select (at most min(E, T top_k)).
inline int64_t moe_max_units(int64_t T, int64_t top_k, int64_t E) {
  return T * top_k < E ? T * top_k : E;
}
// Scratch of launch_moe_routed (the units, their (row, choice) pairs and h [T top_k, I]; quantised: x and h
// quantised too) and of launch_moe_shared (h [T, I_shared], and the same).
size_t moe_routed_scratch_bytes(int64_t T, int64_t top_k, int64_t E, int64_t I, int64_t H, bool quantised);
size_t moe_shared_scratch_bytes(int64_t T, int64_t I_shared, int64_t H, bool quantised);
// y [T, top_k, H] f32: each row's choices' expert outputs; each selected expert's w1, w3 and w2 are read
// once per call (grouped by expert). Choices outside [0, E) are not written. w1 and w3 share an element type.
// x_codes (both): quantised experts read x's codes there instead of quantising x (nullptr: they quantise it).
cudaError_t launch_moe_routed(const void* x, Elt x_t, const QuantAct* x_codes, const int32_t* ids,
                              const float* weights, int64_t T, int64_t H, int64_t top_k,
                              const ExpertSet& experts, float swiglu_limit, void* scratch, float* y,
                              cudaStream_t s);
// out [T, H] f32: the shared expert's output of every row.
cudaError_t launch_moe_shared(const void* x, Elt x_t, const QuantAct* x_codes, int64_t T, int64_t H,
                              const ExpertSet& experts, float swiglu_limit, void* scratch, float* out,
                              cudaStream_t s);
// out [T, H] = each row's y in ascending expert id (ids outside [0, E) skipped), then shared, in fp32.
cudaError_t launch_moe_combine(const int32_t* ids, int64_t T, int64_t H, int64_t top_k, int64_t E,
                               const float* y, const float* shared, float* out, cudaStream_t s);

}  // namespace dspark::cuda
