// RoPE on the last rope_dim dims of each head, and the fp8 quantise-dequantise of KV rows.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"

namespace dspark {

void CpuBackend::rope(const Tensor& x, const Tensor& pos, int64_t rope_dim, double theta, bool inverse) {
  const int64_t T = x.dim(0), d = x.shape.back(), heads = x.numel() / (T * d);
  const int64_t first = d - rope_dim;
  for (int64_t t = 0; t < T; ++t) {
    const float p = static_cast<float>(pos.as<const int32_t>()[t]);
    for (int64_t j = 0; j < rope_dim / 2; ++j) {
      // As DeepSeek's precompute_freqs_cis: fp32 frequency and angle, then cos/sin of that fp32 angle.
      const float freq = 1.0f / std::pow(static_cast<float>(theta),
                                         static_cast<float>(2 * j) / static_cast<float>(rope_dim));
      const float angle = p * freq;
      const float c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t i = (t * heads + h) * d + first + 2 * j;
        const float a = cpu::load(x, i), b = cpu::load(x, i + 1);
        cpu::store(x, i, a * c - b * s);
        cpu::store(x, i + 1, a * s + b * c);
      }
    }
  }
}

// Power-of-two scale 2^ceil(log2(max(amax, 1e-4) / 448)) of one fp8 block (exact: frexp, no log2 rounding).
float fp8_block_scale(float amax) {
  const float v = std::max(amax, 1e-4f) / kE4m3Max;
  int e = 0;
  const float m = std::frexp(v, &e);  // v = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
}

void CpuBackend::kv_qdq(const Tensor& x, int64_t block) {
  const int64_t n = x.numel();
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t len = std::min(block, n - b0);
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(cpu::load(x, b0 + i)));
    const float s = fp8_block_scale(amax);
    for (int64_t i = 0; i < len; ++i) {
      const float q = round_e4m3(std::clamp(cpu::load(x, b0 + i) / s, -kE4m3Max, kE4m3Max));
      cpu::store(x, b0 + i, q * s);
    }
  }
}

}  // namespace dspark
