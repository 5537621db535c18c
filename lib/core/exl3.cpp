#include "lib/core/exl3.hpp"

#include <algorithm>
#include <vector>

#include "lib/core/error.hpp"

namespace dspark {
namespace {

// Stream bit b of a tile (0 = the first word's most significant bit).
int stream_bit(std::span<const int16_t> tile, int64_t b) {
  const auto w = static_cast<size_t>(b / 32);
  const uint32_t word = static_cast<uint16_t>(tile[2 * w]) |
                        static_cast<uint32_t>(static_cast<uint16_t>(tile[2 * w + 1])) << 16;
  return static_cast<int>((word >> (31 - b % 32)) & 1u);
}

void check_bits(int K) {
  if (K < kExl3MinBits || K > kExl3MaxBits)
    fail("EXL3: {} bits per weight; expected {} to {}", K, kExl3MinBits, kExl3MaxBits);
}

// 3INST and MCG: the two fp16 halves of the masked word, added and rounded once (their exponents are within 3
// of each other, so the float sum is exact).
f16_t two_halves(uint32_t x) {
  x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  const float lo = f16_to_float(static_cast<f16_t>(x & 0xFFFFu)),
              hi = f16_to_float(static_cast<f16_t>(x >> 16));
  return float_to_f16(lo + hi);
}

}  // namespace

Exl3Codebook exl3_codebook_named(std::string_view name) {
  if (name == "3inst") return Exl3Codebook::inst3;
  if (name == "mcg") return Exl3Codebook::mcg;
  if (name == "mul1") return Exl3Codebook::mul1;
  fail("EXL3: unknown codebook '{}' (expected 3inst, mcg or mul1)", name);
}

uint16_t exl3_state(std::span<const int16_t> tile, int K, int t) {
  check_bits(K);
  if (static_cast<int64_t>(tile.size()) != 16 * K)
    fail("EXL3: a tile of {} values for K = {}", tile.size(), K);
  const int64_t L = 256 * K;
  uint32_t s = 0;
  for (int64_t i = int64_t{t + 1} * K - 16; i < int64_t{t + 1} * K; ++i)
    s = (s << 1) | static_cast<uint32_t>(stream_bit(tile, ((i % L) + L) % L));
  return static_cast<uint16_t>(s);
}

f16_t exl3_weight(uint16_t state, Exl3Codebook codebook) {
  uint32_t x = state;
  switch (codebook) {
    case Exl3Codebook::inst3:
      return two_halves(x * 89226354u + 64248484u);
    case Exl3Codebook::mcg:
      return two_halves(x * 0xCBAC1FEDu);
    case Exl3Codebook::mul1: {
      x *= 0x83DCD12Du;
      const uint32_t s = (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
      // fp16 fma(1024 + s, 0x1EEE, 0xC931): the product (11 x 11 bits) and the sum are exact in double, so
      // the one rounding is to fp16.
      const double r = (1024.0 + s) * f16_to_float(0x1EEE) + f16_to_float(0xC931);
      return float_to_f16(static_cast<float>(r));
    }
  }
  fail("EXL3: unknown codebook");
}

Exl3Place exl3_place(int t) {
  const int lane = t / 8, j = t % 8;
  static constexpr int kRow[4] = {0, 1, 8, 9};
  return {2 * (lane % 4) + kRow[j % 4], lane / 4 + 8 * (j / 4)};
}

void exl3_decode_tile(std::span<const int16_t> tile, int K, Exl3Codebook codebook, std::span<f16_t> out) {
  if (out.size() != kExl3TileWeights) fail("EXL3: a decoded tile needs {} values", kExl3TileWeights);
  for (int t = 0; t < kExl3TileWeights; ++t) {
    const Exl3Place p = exl3_place(t);
    out[static_cast<size_t>(p.row * kExl3TileSide + p.col)] = exl3_weight(exl3_state(tile, K, t), codebook);
  }
}

void exl3_decode(std::span<const int16_t> trellis, int64_t in, int64_t out, int K, Exl3Codebook codebook,
                 std::span<f16_t> w_dec, Exl3Layout layout) {
  check_bits(K);
  if (in % kExl3TileSide != 0 || out % kExl3TileSide != 0)
    fail("EXL3: {} x {} is not made of 16 x 16 tiles", in, out);
  const int64_t tiles_in = in / kExl3TileSide, tiles_out = out / kExl3TileSide, per_tile = 16 * K;
  if (static_cast<int64_t>(trellis.size()) != tiles_in * tiles_out * per_tile)
    fail("EXL3: a trellis of {} values for {} x {} at K = {}", trellis.size(), in, out, K);
  if (static_cast<int64_t>(w_dec.size()) != in * out)
    fail("EXL3: W_dec of {} values for {} x {}", w_dec.size(), in, out);
  f16_t tile[kExl3TileWeights];
  for (int64_t ti = 0; ti < tiles_in; ++ti)
    for (int64_t to = 0; to < tiles_out; ++to) {
      exl3_decode_tile(trellis.subspan(static_cast<size_t>((ti * tiles_out + to) * per_tile),
                                       static_cast<size_t>(per_tile)),
                       K, codebook, tile);
      for (int r = 0; r < kExl3TileSide; ++r)
        for (int c = 0; c < kExl3TileSide; ++c) {
          const int64_t i = ti * kExl3TileSide + r, o = to * kExl3TileSide + c;
          w_dec[static_cast<size_t>(layout == Exl3Layout::out_in ? o * in + i : i * out + o)] =
              tile[r * kExl3TileSide + c];
        }
    }
}

std::vector<f16_t> exl3_unpack_signs(std::span<const int16_t> words) {
  constexpr f16_t kPlusOne = 0x3c00, kMinusOne = 0xbc00;
  std::vector<f16_t> out(words.size() * 16);
  for (size_t c = 0; c < out.size(); ++c)
    out[c] = (static_cast<uint16_t>(words[c / 16]) >> (c % 16)) & 1u ? kMinusOne : kPlusOne;
  return out;
}

void fwht128(std::span<float, kExl3HadamardBlock> v) {
  for (int h = 1; h < kExl3HadamardBlock; h *= 2)
    for (int i = 0; i < kExl3HadamardBlock; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = v[static_cast<size_t>(j)], b = v[static_cast<size_t>(j + h)];
        v[static_cast<size_t>(j)] = a + b;
        v[static_cast<size_t>(j + h)] = a - b;
      }
}

void exl3_input_transform(std::span<const float> x, std::span<const f16_t> suh, std::span<float> x_had) {
  const size_t in = x.size();
  if (in % kExl3HadamardBlock != 0 || suh.size() != in || x_had.size() != in)
    fail("EXL3: an input transform of {} values with {} scales into {}", in, suh.size(), x_had.size());
  for (size_t i = 0; i < in; ++i) x_had[i] = round_f16(round_f16(x[i]) * f16_to_float(suh[i]));
  for (size_t b = 0; b < in; b += kExl3HadamardBlock) {
    fwht128(std::span<float, kExl3HadamardBlock>(x_had.data() + b, kExl3HadamardBlock));
    for (size_t i = b; i < b + kExl3HadamardBlock; ++i) x_had[i] = round_f16(x_had[i] * kExl3HadamardScale);
  }
}

void exl3_output_transform(std::span<float> y, std::span<const f16_t> svh) {
  const size_t out = y.size();
  if (out % kExl3HadamardBlock != 0 || svh.size() != out)
    fail("EXL3: an output transform of {} values with {} scales", out, svh.size());
  for (size_t b = 0; b < out; b += kExl3HadamardBlock) {
    fwht128(std::span<float, kExl3HadamardBlock>(y.data() + b, kExl3HadamardBlock));
    for (size_t o = b; o < b + kExl3HadamardBlock; ++o)
      y[o] = y[o] * kExl3HadamardScale * f16_to_float(svh[o]);
  }
}

void exl3_forward(std::span<const float> x, std::span<const f16_t> suh, std::span<const f16_t> w_dec,
                  std::span<const f16_t> svh, std::span<float> y, std::span<f16_t> x_had) {
  const auto in = static_cast<int64_t>(x.size()), out = static_cast<int64_t>(y.size());
  if (in % kExl3HadamardBlock != 0 || out % kExl3HadamardBlock != 0)
    fail("EXL3: {} -> {} is not made of 128-blocks", in, out);
  if (static_cast<int64_t>(suh.size()) != in || static_cast<int64_t>(svh.size()) != out ||
      static_cast<int64_t>(w_dec.size()) != in * out ||
      (!x_had.empty() && static_cast<int64_t>(x_had.size()) != in))
    fail("EXL3: the forward's sizes disagree (in {}, out {}, suh {}, svh {}, W_dec {})", in, out, suh.size(),
         svh.size(), w_dec.size());
  std::vector<float> xs(static_cast<size_t>(in)), acc(static_cast<size_t>(out), 0.0f);
  exl3_input_transform(x, suh, xs);
  if (!x_had.empty())
    for (int64_t i = 0; i < in; ++i) x_had[static_cast<size_t>(i)] = float_to_f16(xs[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o)
      acc[static_cast<size_t>(o)] +=
          xs[static_cast<size_t>(i)] * f16_to_float(w_dec[static_cast<size_t>(i * out + o)]);
  exl3_output_transform(acc, svh);
  std::copy(acc.begin(), acc.end(), y.begin());
}

}  // namespace dspark
