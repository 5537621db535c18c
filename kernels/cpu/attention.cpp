// Attention of one stage over each request's ring window plus its block rows, with a per-head sink logit.
// Follows the reference kernel's numerics: keys in blocks of 64 with an online max, probabilities rounded to
// bf16 before the value product, the denominator kept in fp32 from the unrounded probabilities.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"

namespace dspark {
namespace {
constexpr int64_t kKeyBlock = 64;
}

void CpuBackend::attention(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                           const Tensor& ring_pos, const Tensor& requests, const Tensor& sink, int64_t k,
                           const Tensor& out) {
  const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2);
  const int64_t B = T / k, W = ring_pos.dim(1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int32_t* req = requests.as<const int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int32_t slot = req[b * kReqFields + kReqSlot];
    const int32_t low = req[b * kReqFields + kReqLow];
    const int32_t P = req[b * kReqFields + kReqAnchorPos];
    // Keys: live ring entries in ring-index order, then the k block rows.
    std::vector<std::vector<float>> keys;
    const int32_t* pos = ring_pos.as<const int32_t>() + slot * W;
    for (int64_t e = 0; e < W; ++e)
      if (pos[e] >= 0 && pos[e] >= low && pos[e] <= P - 1)
        keys.push_back(cpu::load_span(ring_kv, (slot * W + e) * d, d));
    for (int64_t j = 0; j < k; ++j) keys.push_back(cpu::load_span(block_kv, (b * k + j) * d, d));
    const int64_t n = static_cast<int64_t>(keys.size());
    std::vector<const float*> key_rows(static_cast<size_t>(n));
    for (int64_t key = 0; key < n; ++key)
      key_rows[static_cast<size_t>(key)] = keys[static_cast<size_t>(key)].data();

    for (int64_t i = 0; i < k; ++i) {
      const int64_t t = b * k + i;
      for (int64_t h = 0; h < heads; ++h) {
        const std::vector<float> qv = cpu::load_span(q, (t * heads + h) * d, d);
        float m = -std::numeric_limits<float>::infinity(), denom = 0.0f;
        std::vector<float> acc(static_cast<size_t>(d), 0.0f);
        for (int64_t k0 = 0; k0 < n; k0 += kKeyBlock) {
          const int64_t k1 = std::min(n, k0 + kKeyBlock);
          std::vector<float> s(static_cast<size_t>(k1 - k0));
          float block_max = m;
          // The block's keys against the query in one pass (key . q has q . key's bits: products commute).
          cpu::dot_rows(key_rows.data() + k0, k1 - k0, qv.data(), d, s.data());
          for (float& v : s) {
            v *= scale;
            block_max = std::max(block_max, v);
          }
          const float rescale = std::exp(m - block_max);  // 0 on the first block (m = -inf)
          denom *= rescale;
          for (float& a : acc) a *= rescale;
          for (int64_t key = k0; key < k1; ++key) {
            const float p = std::exp(s[static_cast<size_t>(key - k0)] - block_max);
            denom += p;
            const float p16 = round_bf16(p);
            const std::vector<float>& kv = keys[static_cast<size_t>(key)];
            for (int64_t c = 0; c < d; ++c) acc[static_cast<size_t>(c)] += p16 * kv[static_cast<size_t>(c)];
          }
          m = block_max;
        }
        denom += std::exp(sink.as<const float>()[h] - m);
        for (int64_t c = 0; c < d; ++c)
          cpu::store(out, (t * heads + h) * d + c, acc[static_cast<size_t>(c)] / denom);
      }
    }
  }
}

}  // namespace dspark
