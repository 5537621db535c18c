// The block quantisation rules of SPEC §3 on plain arrays: fp8 e4m3 weights with one e8m0 scale per B x B
// block, fp4 e2m1 weights (two codes a byte, low nibble first) with one e8m0 scale per 32 inputs, and the
// per-block activation quantisation every fp8 / fp4 linear applies to its input. The CPU reference, the
// synthetic checkpoint writer and the tests all use these, so a format has one definition.
#pragma once

#include <cstdint>

namespace dspark {

constexpr int64_t kFp4Block = 32;  // inputs per fp4 scale
constexpr float kE2m1Max = 6.0f;

// e such that 2^e is the smallest power of two >= v, read from v's bits as DeepSeek's kernels do (exponent
// field, plus one when any mantissa bit is set); v >= 0 and finite. Subnormal v gives -126, 0 gives -127.
int ceil_pow2_exponent(float v);

// The activation scale of a block whose largest magnitude is amax: 2^ceil(log2(max(amax, 1e-4) *
// fp32(1/448))).
float activation_block_scale(float amax);

// One row of n activations quantised in blocks of `block` consecutive elements and returned dequantised:
// out[i] = e4m3(clamp(x[i] / s, +-448)) * s with s the block's activation_block_scale (exact in fp32).
void quantize_activation_row(const float* x, int64_t n, int64_t block, float* out);

// e2m1 code (bit 3 sign) of f rounded to nearest, ties to the even code, saturating at +-6.
uint8_t float_to_e2m1(float f);

// The e8m0 byte of the smallest power-of-two scale that maps amax into +-max_code (2^ceil(log2(amax / max))),
// clamped to [0, 254]: 255 is NaN.
uint8_t weight_scale_byte(float amax, float max_code);

// fp8 block: w [rows, cols] fp32 -> codes [rows, cols] e4m3 and scales [ceil(rows/B), ceil(cols/B)] e8m0.
void quantize_fp8_block(const float* w, int64_t rows, int64_t cols, int64_t block, uint8_t* codes,
                        uint8_t* scales);
// The value of element (r, c) of an fp8 block weight with `cols` columns.
float fp8_block_value(const uint8_t* codes, const uint8_t* scales, int64_t cols, int64_t block, int64_t r,
                      int64_t c);

// fp4: w [rows, cols] fp32 (cols a multiple of 32) -> packed [rows, cols/2] (element 2j in the low nibble of
// byte j) and scales [rows, cols/32] e8m0.
void quantize_fp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scales);
float fp4_value(const uint8_t* packed, const uint8_t* scales, int64_t cols, int64_t r, int64_t c);

}  // namespace dspark
