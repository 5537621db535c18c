// An activation quantised as SPEC §3 states (per row, blocks of B consecutive elements): the layout the fp8
// and fp4 products read (quant_linear.cu, moe_quant.cu) and the norms write beside their output
// (norm_rope.cu, mhc.cu). Plain C++ (g++ and nvcc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "lib/core/host_device.hpp"

namespace dspark::cuda {

// An activation [T, K] quantised per block of B elements (SPEC §3): codes [T, K] e4m3 and, per 32-element
// chunk, the power-of-two scale of the block it lies in, f32 [T, K / 32].
struct QuantAct {
  uint8_t* codes;
  float* scales;
};
// Bytes of a QuantAct of T rows of K (codes, then scales at a 256-byte boundary).
size_t quant_act_bytes(int64_t T, int64_t K);
// The QuantAct laid out in buf for up to T rows: the first t <= T rows are a QuantAct of t rows at the same
// addresses (row r's codes at r K, its scales at r K / 32).
QuantAct quant_act_at(void* buf, int64_t T, int64_t K);

// Where a kernel that produces a bf16 activation also writes its quantisation: q.codes null for none; block
// a multiple of 32 that divides 256 (the kernels' 256-element blocks) and the row length.
struct QuantActOut {
  QuantAct q{};
  int64_t block = 0;
  DSPARK_HOST_DEVICE bool wanted() const { return q.codes != nullptr; }
};
// Whether a kernel can write the codes of rows of K elements in block B beside its output.
inline bool quant_act_out_fits(int64_t K, int64_t B) {
  return B >= 32 && B <= 256 && B % 32 == 0 && 256 % B == 0 && K % B == 0;
}

}  // namespace dspark::cuda
