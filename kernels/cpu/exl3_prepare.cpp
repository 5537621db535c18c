// CpuBackend::prepare_weights: every EXL3 weight's trellis decoded once (SPEC §9), so that a product reads
// fp16 rows of W_dec instead of decoding tiles per call.
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/core/exl3.hpp"

namespace dspark {

void CpuBackend::prepare_weights(DrafterWeights& w) {
  for_each_linear(w, [&](LinearWeight& l) {
    if (l.format != WeightFormat::exl3 || !l.dequantised.empty()) return;
    const std::span<const int16_t> trellis(l.weight.as<const int16_t>(),
                                           static_cast<size_t>(l.weight.numel()));
    std::vector<f16_t> w_dec(static_cast<size_t>(l.in * l.out));  // [in, out], row = input
    exl3_decode(trellis, l.in, l.out, static_cast<int>(l.bits), l.codebook, w_dec);
    l.dequantised = alloc(DType::f16, {l.out, l.in});
    f16_t* rows = l.dequantised.as<f16_t>();
    for (int64_t i = 0; i < l.in; ++i)
      for (int64_t o = 0; o < l.out; ++o) rows[o * l.in + i] = w_dec[static_cast<size_t>(i * l.out + o)];
  });
}

}  // namespace dspark
