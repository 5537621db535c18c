#include "kernels/cpu/weight_rows.hpp"

#include "kernels/cpu/element.hpp"
#include "lib/core/block_quant.hpp"

namespace dspark::cpu {

std::vector<float> weight_row(const LinearWeight& w, int64_t r) {
  switch (w.format) {
    case WeightFormat::dense:
      return load_span(w.weight, r * w.in, w.in);
    case WeightFormat::fp8_block: {
      std::vector<float> row(static_cast<size_t>(w.in));
      // The rank's part starts on a block boundary (the loader checks the cut), so block indices are local.
      const auto* codes = w.weight.as<const uint8_t>();
      const auto* scales = w.scale.as<const uint8_t>();
      for (int64_t c = 0; c < w.in; ++c)
        row[static_cast<size_t>(c)] = fp8_block_value(codes, scales, w.in, w.block, r, c);
      return row;
    }
    case WeightFormat::fp4: {
      std::vector<float> row(static_cast<size_t>(w.in));
      const auto* packed = w.weight.as<const uint8_t>();
      const auto* scales = w.scale.as<const uint8_t>();
      for (int64_t c = 0; c < w.in; ++c) row[static_cast<size_t>(c)] = fp4_value(packed, scales, w.in, r, c);
      return row;
    }
    default:
      fail("cpu backend: weight '{}' is {}, which it does not run", w.name, weight_format_name(w.format));
  }
}

bool quantizes_input(const LinearWeight& w) {
  return w.format == WeightFormat::fp8_block || w.format == WeightFormat::fp4;
}

std::vector<float> linear_input(const LinearWeight& w, std::vector<float> x) {
  if (!quantizes_input(w)) return x;
  std::vector<float> q(x.size());
  quantize_activation_row(x.data(), static_cast<int64_t>(x.size()), w.block, q.data());
  return q;
}

}  // namespace dspark::cpu
