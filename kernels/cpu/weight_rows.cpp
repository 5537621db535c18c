#include "kernels/cpu/weight_rows.hpp"

#include <algorithm>
#include <array>
#include <bit>

#include "kernels/cpu/element.hpp"
#include "lib/core/block_quant.hpp"
#include "lib/core/exl3.hpp"

namespace dspark::cpu {

namespace {

// Every e4m3 code's value and every e2m1 nibble's, looked up instead of decoded per element.
template <size_t N>
std::array<float, N> values_of(float (*decode)(uint8_t)) {
  std::array<float, N> t{};
  for (size_t i = 0; i < N; ++i) t[i] = decode(static_cast<uint8_t>(i));
  return t;
}
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = values_of<256>(e4m3_to_float);
  return table;
}
const std::array<float, 16>& e2m1_values() {
  static const std::array<float, 16> table = values_of<16>(e2m1_to_float);
  return table;
}
// Every fp16 pattern's value (256 KB), for the decoded EXL3 rows.
const std::vector<float>& f16_values() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (size_t i = 0; i < t.size(); ++i) t[i] = f16_to_float(static_cast<f16_t>(i));
    return t;
  }();
  return table;
}

}  // namespace

// A shift per element (exact): built for AVX2 too, picked at load time.
__attribute__((target_clones("avx2", "default"))) void bf16_to_floats(const uint16_t* in, int64_t n,
                                                                      float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
}

void weight_row(const LinearWeight& w, int64_t r, float* out) {
  switch (w.format) {
    case WeightFormat::dense:
      if (w.weight.dtype == DType::bf16) {
        bf16_to_floats(w.weight.as<const uint16_t>() + r * w.in, w.in, out);
      } else {
        load_into(w.weight, r * w.in, w.in, out);
      }
      return;
    case WeightFormat::fp8_block: {
      // The rank's part starts on a block boundary (the loader checks the cut), so block indices are local.
      const uint8_t* codes = w.weight.as<const uint8_t>() + r * w.in;
      const uint8_t* scales = w.scale.as<const uint8_t>() + (r / w.block) * ((w.in + w.block - 1) / w.block);
      const std::array<float, 256>& value = e4m3_values();
      for (int64_t c0 = 0, b = 0; c0 < w.in; c0 += w.block, ++b) {
        const float s = e8m0_to_float(scales[b]);
        for (int64_t c = c0; c < std::min(c0 + w.block, w.in); ++c) out[c] = value[codes[c]] * s;
      }
      return;
    }
    case WeightFormat::fp4: {
      const uint8_t* packed = w.weight.as<const uint8_t>() + r * (w.in / 2);
      const uint8_t* scales = w.scale.as<const uint8_t>() + r * (w.in / kFp4Block);
      const std::array<float, 16>& value = e2m1_values();
      for (int64_t c = 0; c < w.in; c += 2) {
        const float s = e8m0_to_float(scales[c / kFp4Block]);
        const uint8_t byte = packed[c / 2];
        out[c] = value[byte & 0xfu] * s;
        out[c + 1] = value[byte >> 4] * s;
      }
      return;
    }
    case WeightFormat::exl3: {
      if (w.dequantised.empty())
        fail("cpu backend: EXL3 weight '{}' has no decoded copy (CpuBackend::prepare_weights makes it)",
             w.name);
      const f16_t* row = w.dequantised.as<const f16_t>() + r * w.in;
      const std::vector<float>& value = f16_values();
      for (int64_t c = 0; c < w.in; ++c) out[c] = value[row[c]];
      return;
    }
    default:
      fail("cpu backend: weight '{}' is {}, which it does not run", w.name, weight_format_name(w.format));
  }
}

bool quantizes_input(const LinearWeight& w) {
  return w.format == WeightFormat::fp8_block || w.format == WeightFormat::fp4 ||
         w.format == WeightFormat::exl3;
}

std::vector<float> linear_input(const LinearWeight& w, std::vector<float> x) {
  if (!quantizes_input(w)) return x;
  std::vector<float> q(x.size());
  if (w.format == WeightFormat::exl3) {
    exl3_input_transform(x, {w.suh.as<const f16_t>(), static_cast<size_t>(w.in)}, q);
    return q;
  }
  quantize_activation_row(x.data(), static_cast<int64_t>(x.size()), w.block, q.data());
  return q;
}

void linear_output(const LinearWeight& w, float* y) {
  if (w.format == WeightFormat::exl3)
    exl3_output_transform({y, static_cast<size_t>(w.out)},
                          {w.svh.as<const f16_t>(), static_cast<size_t>(w.out)});
}

}  // namespace dspark::cpu
