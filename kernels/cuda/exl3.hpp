// EXL3 trellis linears (SPEC §9) on the tensor cores: the input transform, the few-row product that decodes
// each 16 x 16 tile in registers straight from the trellis (exl3_linear.cu, decode: exl3_decode.cuh) and the
// output transform; the grouped experts over the selected experts only (moe_exl3.cu). Every matrix is read as
// the checkpoint stores it: there is no prepared copy. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch_common.hpp"
#include "kernels/cuda/moe.hpp"

namespace dspark::cuda {

// The codebooks of SPEC §9, in lib/core/exl3.hpp's order.
enum class Exl3Cb : int32_t { inst3 = 0, mcg = 1, mul1 = 2 };

// The matrices of one launch by (matrix m, expert e + 1): e = -1 is a plain linear or the shared expert, m
// 0 / 1 / 2 the expert's w1 / w3 / w2 (a plain linear: 0). trellis i16 [in/16, out/16, 16K], suh f16 [in],
// svh f16 [out]. Passed by value (graph capture records the pointers).
constexpr int kExl3Mats = 3;
struct Exl3Table {
  const void* trellis[kExl3Mats][kMaxExperts + 1];
  const void* suh[kExl3Mats][kMaxExperts + 1];
  const void* svh[kExl3Mats][kMaxExperts + 1];
};

// One EXL3 matrix's shape and code: W_dec [in, out] (in, out multiples of 128), K bits per weight (1..8).
struct Exl3Shape {
  int64_t in, out;
  int K;
  Exl3Cb codebook;
};

// The k splits of a launch of `jobs` matrices of this shape (the units' capacity times the matrices per
// unit) whose partials have `partial_rows` rows per split (rows or pairs, times the matrices per unit): a
// fixed function of the launch's shape alone, so every rank sums in the same order.
int64_t exl3_splits(int64_t in, int64_t out, int64_t jobs, int64_t partial_rows);

// ---- a plain linear: out [T, out] = the EXL3 forward of x bf16 [T, in] (row stride x_stride elements)
size_t exl3_linear_scratch_bytes(int64_t T, int64_t in, int64_t out);
cudaError_t launch_exl3_linear(const void* x, int64_t T, int64_t x_stride, const void* trellis,
                               const void* suh, const void* svh, Exl3Shape shape, void* out, Elt out_t,
                               void* scratch, cudaStream_t s);

// ---- the pieces, shared with the experts (moe_exl3.cu)
// xh [m][p] (f16, `in` each) = the input transform of row p / C of x (bf16 [*, in], row stride x_stride) with
// the suh of matrix mat0 + m of pair p's expert, for m < M and p < P; ids (nullable): pair p's expert (ids[p]
// outside [0, E): not written); no ids: expert -1.
cudaError_t launch_exl3_transform_rows(const void* x, int64_t x_stride, int64_t P, int64_t C,
                                       const int32_t* ids, int64_t E, int64_t in, int mat0, int M,
                                       const Exl3Table& table, uint16_t* xh, cudaStream_t s);
// part [split][m][p][out] f32 = xh's rows times W_dec of matrix mat0 + m of each unit, partial over the k
// split. units: moe_group's table of U units (moe_units.cuh's MoeGroups), or null for one unit of the
// shared expert / plain linear holding rows 0 .. shared_rows - 1; unit_rows: the rows of a pass (8, 16 or 40:
// a unit with more pairs takes several passes, each decoding its weights again).
cudaError_t launch_exl3_gemm(const uint16_t* xh, int64_t P, int32_t* units, int64_t U, int32_t shared_rows,
                             int64_t unit_rows, int mat0, int M, Exl3Shape shape, const Exl3Table& table,
                             float* part, cudaStream_t s);

// ---- the experts (moe_exl3.cu): every matrix EXL3, w1 and w3 of one shape (w13: [H, I] as W_dec), w2 of
// another ([I, H]); table rows 0 / 1 / 2 = w1 / w3 / w2 by expert id (routed) or at -1 (shared). y and out
// as launch_moe_routed's and launch_moe_shared's; h rounds to bf16 as the reference's, then takes w2's
// input transform.
size_t moe_exl3_routed_scratch_bytes(int64_t T, int64_t top_k, int64_t E, int64_t I, int64_t H);
size_t moe_exl3_shared_scratch_bytes(int64_t T, int64_t I, int64_t H);
cudaError_t launch_moe_routed_exl3(const void* x, const int32_t* ids, const float* weights, int64_t T,
                                   int64_t H, int64_t top_k, int64_t E, int64_t I, Exl3Shape w13,
                                   Exl3Shape w2, const Exl3Table& table, float swiglu_limit, void* scratch,
                                   float* y, cudaStream_t s);
cudaError_t launch_moe_shared_exl3(const void* x, int64_t T, int64_t H, int64_t I, Exl3Shape w13,
                                   Exl3Shape w2, const Exl3Table& table, float swiglu_limit, void* scratch,
                                   float* out, cudaStream_t s);

}  // namespace dspark::cuda
