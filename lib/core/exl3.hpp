// EXL3 trellis weights (SPEC §9, exllamav3's format): the tile's circular bit stream and 16-bit states, the
// three codebooks, the in-tile element order, the 128-point Hadamard transforms and the reference forward
// (fp32 accumulation). Format code only: a backend's kernels are checked against it.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "lib/core/numeric.hpp"

namespace dspark {

enum class Exl3Codebook { inst3, mcg, mul1 };
// The codebook named as config.json and exllamav3 name it ("3inst", "mcg", "mul1"); fails on another name.
Exl3Codebook exl3_codebook_named(std::string_view name);

constexpr int kExl3TileSide = 16;                      // a tile is 16 inputs x 16 outputs
constexpr int kExl3TileWeights = 256;                  // elements t = 0..255
constexpr int kExl3HadamardBlock = 128;                // the transforms' block
constexpr float kExl3HadamardScale = 0.088388347648f;  // 1 / sqrt(128) as exllamav3 rounds it
constexpr int kExl3MinBits = 1, kExl3MaxBits = 8;      // K

// The state of element t of a tile stored as 16K int16 values: stream bits [(t+1)K - 16, (t+1)K) mod 256K,
// the first most significant.
uint16_t exl3_state(std::span<const int16_t> tile, int K, int t);

// A legacy conversion's sign vector (".su" / ".sv", I16 [n / 16]) as the scales it stands for: element c is
// bit c % 16 (least significant first) of word c / 16, a set bit -1 and a clear one +1, as fp16.
std::vector<f16_t> exl3_unpack_signs(std::span<const int16_t> words);

// The codebook's fp16 weight for a state.
f16_t exl3_weight(uint16_t state, Exl3Codebook codebook);

// Where element t sits in its tile: row (input) and column (output), each 0..15.
struct Exl3Place {
  int row, col;
};
Exl3Place exl3_place(int t);

// One tile decoded: out[row * 16 + col] fp16 bits.
void exl3_decode_tile(std::span<const int16_t> tile, int K, Exl3Codebook codebook, std::span<f16_t> out);

// How a decoded W_dec is laid out: [in, out] (row = input, as exl3_forward reads it) or transposed, [out, in]
// (row = output, as a row-wise product reads it).
enum class Exl3Layout { in_out, out_in };

// trellis [in/16, out/16, 16K] -> W_dec fp16 bits, row-major in `layout`.
void exl3_decode(std::span<const int16_t> trellis, int64_t in, int64_t out, int K, Exl3Codebook codebook,
                 std::span<f16_t> w_dec, Exl3Layout layout = Exl3Layout::in_out);

// The 128-point Walsh-Hadamard butterfly in fp32, in place: stages over index bits 0..6, (a, b) -> (a + b,
// a - b). Unscaled.
void fwht128(std::span<float, kExl3HadamardBlock> v);

// The input transform of one row (SPEC §9): x16 = fp16(x), fp16(x16 * suh), then per 128-block the
// butterfly in fp32 times kExl3HadamardScale, rounded to fp16: x_had (the values of the fp16 x').
void exl3_input_transform(std::span<const float> x, std::span<const f16_t> suh, std::span<float> x_had);
// The output transform, in place: per 128-block the butterfly of y' in fp32, times kExl3HadamardScale, times
// svh (fp32, in that order).
void exl3_output_transform(std::span<float> y, std::span<const f16_t> svh);

// The reference forward of one input row (SPEC §9): x (in values, bf16 as the activations are) through suh,
// the input transform (x' fp16, written to x_had when not empty), W_dec [in, out] with fp32 accumulation in
// ascending input order, the output transform and svh: y fp32 [out].
void exl3_forward(std::span<const float> x, std::span<const f16_t> suh, std::span<const f16_t> w_dec,
                  std::span<const f16_t> svh, std::span<float> y, std::span<f16_t> x_had = {});

}  // namespace dspark
