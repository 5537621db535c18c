// CpuBackend::prepare_weights: every EXL3 weight's trellis decoded once (SPEC §9), so that a product reads
// fp16 rows of W_dec instead of decoding tiles per call.
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/core/exl3.hpp"

namespace dspark {

void CpuBackend::prepare_weights(DrafterWeights& w) {
  for_each_linear(w, [&](LinearWeight& l) {
    if (l.format != WeightFormat::exl3 || !l.dequantised.empty()) return;
    const std::span<const int16_t> trellis(l.weight.as<const int16_t>(),
                                           static_cast<size_t>(l.weight.numel()));
    l.dequantised = alloc(DType::f16, {l.out, l.in});
    exl3_decode(trellis, l.in, l.out, static_cast<int>(l.bits), l.codebook,
                {l.dequantised.as<f16_t>(), static_cast<size_t>(l.out * l.in)}, Exl3Layout::out_in);
  });
}

}  // namespace dspark
