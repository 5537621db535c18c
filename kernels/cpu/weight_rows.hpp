// A linear weight's rows as fp32 in any stored format, and what its format does to the input and the output
// (SPEC §3, §9): the CPU reference dequantises fp8 block / fp4 weights exactly and multiplies them with the
// input quantised per block of B; an EXL3 weight's rows are its decoded W_dec (transform domain), between the
// input transform (suh, Hadamard, fp16) and the output transform (Hadamard, svh). Sums are fp32.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/element.hpp"
#include "lib/model/weights.hpp"

namespace dspark::cpu {

// Row r (of this rank's [out, in] part) of w, dequantised into out (w.in values).
void weight_row(const LinearWeight& w, int64_t r, float* out);
// n bf16 values as fp32 (exact).
void bf16_to_floats(const uint16_t* in, int64_t n, float* out);
// Row r of a dense bf16 weight as stored (cpu::dot_rows reads it so), or null for any other representation.
inline const uint16_t* bf16_row(const LinearWeight& w, int64_t r) {
  return w.format == WeightFormat::dense && w.weight.dtype == DType::bf16
             ? w.weight.as<const uint16_t>() + r * w.in
             : nullptr;
}
// out[p] = dot(a[p], row r of w) for p < m, in cpu::dot's order: the stored row read directly where it is
// dense bf16, else dequantised into `scratch` (w.in floats) first.
inline void dot_weight_row(const float* const* a, int64_t m, const LinearWeight& w, int64_t r, int64_t n,
                           float* scratch, float* out) {
  if (const uint16_t* row = bf16_row(w, r)) return dot_rows(a, m, row, n, out);
  weight_row(w, r, scratch);
  dot_rows(a, m, scratch, n, out);
}

// Whether a product with w changes its input (fp8 block and fp4 quantise it, EXL3 transforms it; dense does
// not).
bool quantizes_input(const LinearWeight& w);

// x as the product with w reads it: quantised per block of w.block and dequantised (fp8 block, fp4), through
// the input transform (EXL3), unchanged otherwise. x is one row of w.in values.
std::vector<float> linear_input(const LinearWeight& w, std::vector<float> x);

// y (one row of the w.out sums of the product) made the linear's output: the output transform for EXL3,
// nothing for the other formats.
void linear_output(const LinearWeight& w, float* y);

}  // namespace dspark::cpu
