// The grouped experts with EXL3 weights (SPEC §9): each pair's x through its expert's w1 and w3 input
// transforms, gate_up as the EXL3 product over the units of the selected experts (both matrices in one
// launch), then per 128 channels the splits' sums, both output transforms, h = SwiGLU rounded to bf16 and
// w2's input transform in one warp; down the same way. Each selected expert's trellis is read once per pass
// of up to 40 of its pairs; a pair's result never depends on which other pairs share its unit.
#include <cuda_fp16.h>

#include "kernels/cuda/exl3_decode.cuh"
#include "kernels/cuda/moe_units.cuh"

namespace dspark::cuda {
namespace {

constexpr int kBlockRows = 128;
constexpr int kRowWarps = 8;

__device__ __forceinline__ void add_float4(float (&v)[4], const float* p) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] += q.x, v[1] += q.y, v[2] += q.z, v[3] += q.w;
}

// Block (8 128-blocks of channels, pair p): h' [p] of w2's input from the gate_up partials [S][2][P][I].
__global__ void __launch_bounds__(kRowWarps * 32)
    exl3_gate_up_finish_kernel(const float* part, int64_t S, int64_t P, int64_t I, const int32_t* ids,
                               int64_t E, const float* weights, float limit,
                               const __grid_constant__ Exl3Table table, uint16_t* hh) {
  wait_for_previous_kernels();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t b = blockIdx.x * static_cast<int64_t>(kRowWarps) + warp, p = blockIdx.y;
  if (b * kBlockRows >= I) return;
  const int32_t e = ids ? ids[p] : -1;
  if (ids && (e < 0 || e >= E)) return;
  const int64_t c0 = b * kBlockRows + 4 * lane;
  float gv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, uv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t s = 0; s < S; ++s) {
    add_float4(gv, part + ((s * 2 + 0) * P + p) * I + c0);
    add_float4(uv, part + ((s * 2 + 1) * P + p) * I + c0);
  }
  exl3_output_block(gv, static_cast<const uint16_t*>(table.svh[0][e + 1]) + c0, lane);
  exl3_output_block(uv, static_cast<const uint16_t*>(table.svh[1][e + 1]) + c0, lane);
  const float rw = ids ? weights[p] : 1.0f;
  float h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = bf16_bits_to_float(swiglu_h(gv[i], uv[i], limit, ids != nullptr, rw));
  const uint2 x = exl3_input_block(h, static_cast<const uint16_t*>(table.suh[2][e + 1]) + c0, lane);
  *reinterpret_cast<uint2*>(hh + p * I + c0) = x;
}

// Block (8 128-blocks of outputs, pair p): y[p] = bf16 of w2's output transform of the partials [S][P][H].
__global__ void __launch_bounds__(kRowWarps * 32)
    exl3_down_finish_kernel(const float* part, int64_t S, int64_t P, int64_t H, const int32_t* ids, int64_t E,
                            const __grid_constant__ Exl3Table table, float* y) {
  wait_for_previous_kernels();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t b = blockIdx.x * static_cast<int64_t>(kRowWarps) + warp, p = blockIdx.y;
  if (b * kBlockRows >= H) return;
  const int32_t e = ids ? ids[p] : -1;
  if (ids && (e < 0 || e >= E)) return;
  const int64_t o0 = b * kBlockRows + 4 * lane;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t s = 0; s < S; ++s) add_float4(v, part + (s * P + p) * H + o0);
  exl3_output_block(v, static_cast<const uint16_t*>(table.svh[2][e + 1]) + o0, lane);
  *reinterpret_cast<float4*>(y + p * H + o0) =
      make_float4(round_bf16(v[0]), round_bf16(v[1]), round_bf16(v[2]), round_bf16(v[3]));
}

// The scratch after the unit table: x' [2][P][H] f16, gate_up partials, h' [P][I] f16, down partials.
struct Buffers {
  uint16_t* xh;
  float* part13;
  uint16_t* hh;
  float* part2;
};
size_t buffers_bytes(int64_t P, int64_t U, int64_t I, int64_t H) {
  return align256(2 * P * H * 2) + align256(exl3_splits(H, I, 2 * U, 2 * P) * 2 * P * I * 4) +
         align256(P * I * 2) + align256(exl3_splits(I, H, U, P) * P * H * 4);
}
Buffers buffers_at(char* p, int64_t P, int64_t U, int64_t I, int64_t H) {
  Buffers b{};
  b.xh = reinterpret_cast<uint16_t*>(p);
  p += align256(2 * P * H * 2);
  b.part13 = reinterpret_cast<float*>(p);
  p += align256(exl3_splits(H, I, 2 * U, 2 * P) * 2 * P * I * 4);
  b.hh = reinterpret_cast<uint16_t*>(p);
  p += align256(P * I * 2);
  b.part2 = reinterpret_cast<float*>(p);
  return b;
}

bool valid_shapes(int64_t H, int64_t I, const Exl3Shape& w13, const Exl3Shape& w2) {
  return w13.in == H && w13.out == I && w2.in == I && w2.out == H && H % kBlockRows == 0 &&
         I % kBlockRows == 0;
}

// Pairs p < P (row p / C; ids: expert ids[p], else the shared expert) through the units of g.
cudaError_t run_units(const void* x, int64_t P, int64_t C, const int32_t* ids, int64_t E,
                      const float* weights, MoeGroups g, int64_t U, int64_t H, int64_t I, Exl3Shape w13,
                      Exl3Shape w2, const Exl3Table& table, float limit, Buffers b, float* y,
                      cudaStream_t s) {
  cudaError_t err = launch_exl3_transform_rows(x, H, P, C, ids, E, H, 0, 2, table, b.xh, s);
  if (err != cudaSuccess) return err;
  // A routed unit holds a few of the pairs (a row picks an expert once, and the rows spread over the
  // experts): passes of 8, a unit with more taking several; the shared expert's one unit holds every row.
  const int64_t unit_rows = ids ? 8 : P;
  err = launch_exl3_gemm(b.xh, P, g.base, U, g.shared_rows, unit_rows, 0, 2, w13, table, b.part13, s);
  if (err != cudaSuccess) return err;
  err =
      launch_kernel(exl3_gate_up_finish_kernel,
                    dim3(grid_for(I / kBlockRows, kRowWarps), static_cast<unsigned>(P)), kRowWarps * 32, 0, s,
                    b.part13, exl3_splits(H, I, 2 * U, 2 * P), P, I, ids, E, weights, limit, table, b.hh);
  if (err != cudaSuccess) return err;
  err = launch_exl3_gemm(b.hh, P, g.base, U, g.shared_rows, unit_rows, 2, 1, w2, table, b.part2, s);
  if (err != cudaSuccess) return err;
  return launch_kernel(exl3_down_finish_kernel,
                       dim3(grid_for(H / kBlockRows, kRowWarps), static_cast<unsigned>(P)), kRowWarps * 32, 0,
                       s, b.part2, exl3_splits(I, H, U, P), P, H, ids, E, table, y);
}

size_t table_bytes(int64_t U, int64_t P) {
  return align256((2 + 2 * U + P) * 4);
}

}  // namespace

size_t moe_exl3_routed_scratch_bytes(int64_t T, int64_t top_k, int64_t E, int64_t I, int64_t H) {
  const int64_t P = T * top_k;
  const int64_t U = moe_max_units(T, top_k, E);
  return table_bytes(U, P) + buffers_bytes(P, U, I, H);
}

size_t moe_exl3_shared_scratch_bytes(int64_t T, int64_t I, int64_t H) {
  return buffers_bytes(T, 1, I, H);
}

cudaError_t launch_moe_routed_exl3(const void* x, const int32_t* ids, const float* weights, int64_t T,
                                   int64_t H, int64_t top_k, int64_t E, int64_t I, Exl3Shape w13,
                                   Exl3Shape w2, const Exl3Table& table, float swiglu_limit, void* scratch,
                                   float* y, cudaStream_t s) {
  if (T <= 0 || E <= 0) return cudaSuccess;
  if (!valid_shapes(H, I, w13, w2) || E > kMaxExperts || !aligned16(scratch) || !aligned16(y))
    return cudaErrorInvalidValue;
  const int64_t U = moe_max_units(T, top_k, E), P = T * top_k;
  char* p = static_cast<char*>(scratch);
  const MoeGroups g{reinterpret_cast<int32_t*>(p), U, 0};
  const cudaError_t err = launch_moe_group(ids, T, top_k, E, g, s);
  if (err != cudaSuccess) return err;
  return run_units(x, P, top_k, ids, E, weights, g, U, H, I, w13, w2, table, swiglu_limit,
                   buffers_at(p + table_bytes(U, P), P, U, I, H), y, s);
}

cudaError_t launch_moe_shared_exl3(const void* x, int64_t T, int64_t H, int64_t I, Exl3Shape w13,
                                   Exl3Shape w2, const Exl3Table& table, float swiglu_limit, void* scratch,
                                   float* out, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (!valid_shapes(H, I, w13, w2) || !aligned16(scratch) || !aligned16(out)) return cudaErrorInvalidValue;
  const MoeGroups g{nullptr, 0, static_cast<int32_t>(T)};
  return run_units(x, T, 1, nullptr, 0, nullptr, g, 1, H, I, w13, w2, table, swiglu_limit,
                   buffers_at(static_cast<char*>(scratch), T, 1, I, H), out, s);
}

}  // namespace dspark::cuda
