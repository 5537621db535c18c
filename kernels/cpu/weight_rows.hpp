// A linear weight's rows as fp32 in any stored format, and the input quantisation its format implies (SPEC
// §3): the CPU reference dequantises fp8 block / fp4 weights exactly and multiplies them with the input
// quantised per block of B, accumulating in fp32.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/model/weights.hpp"

namespace dspark::cpu {

// Row r (of this rank's [out, in] part) of w, dequantised into out (w.in values).
void weight_row(const LinearWeight& w, int64_t r, float* out);

// Whether a product with w quantises its input (fp8 block and fp4 do; dense does not).
bool quantizes_input(const LinearWeight& w);

// x as the product with w reads it: quantised per block of w.block and dequantised when quantizes_input(w),
// unchanged otherwise. x is one row of w.in values.
std::vector<float> linear_input(const LinearWeight& w, std::vector<float> x);

}  // namespace dspark::cpu
