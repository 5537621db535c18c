// The sequential Markov fix-up of the drafted block (greedy or sampled), the whole draft distribution of a
// sampled position, and the confidence head.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"
#include "lib/core/sampling.hpp"

namespace dspark {
namespace {
int32_t req_field(const Tensor& requests, int64_t b, int64_t f) {
  return requests.as<const int32_t>()[b * kReqFields + f];
}

// A request's draw at position j: its temperature (0: greedy), seed and noise position P + j.
struct Draw {
  float tau;
  uint64_t seed;
  uint32_t pos;
};
Draw draw_of(const Tensor& requests, const Tensor& sampling, int64_t b, int64_t j) {
  if (sampling.empty()) return {0.0f, 0, 0};  // a greedy batch
  const int32_t* f = sampling.as<const int32_t>() + b * kSampleFields;
  const uint64_t seed = static_cast<uint32_t>(f[kSampleSeedLow]) |
                        static_cast<uint64_t>(static_cast<uint32_t>(f[kSampleSeedHigh])) << 32;
  return {std::bit_cast<float>(f[kSampleTemperature]), seed,
          static_cast<uint32_t>(req_field(requests, b, kReqAnchorPos) + j)};
}
}  // namespace

void CpuBackend::markov_top2(const Tensor& logits, const Tensor& markov_head,
                             const Tensor& /*markov_head_tiles*/, const Tensor& markov_embed,
                             const Tensor& prev, const Tensor& requests, const Tensor& sampling, int64_t j,
                             int64_t k, int64_t vocab_offset, const MarkovCache& cache, const Tensor& cand) {
  const int64_t Vr = logits.dim(1), R = markov_head.dim(1), B = prev.numel();
  MarkovRecord* out = reinterpret_cast<MarkovRecord*>(cand.as<int32_t>());
  std::vector<MarkovRecord> best(static_cast<size_t>(B), markov_empty());
  std::vector<int64_t> active;       // the requests drafting position j
  std::vector<const float*> cached;  // per active request: its cached bias row, or null
  std::vector<std::vector<float>> embed;
  std::vector<Draw> draws;  // per active request: its temperature, seed and noise position
  bool any_live = false;    // an active request without a cached row: markov_head is read
  for (int64_t b = 0; b < B; ++b)
    if (j < req_field(requests, b, kReqOutputs)) {
      const int32_t pv = prev.as<const int32_t>()[b];
      const int32_t slot =
          cache.empty() || pv < 0 || pv >= cache.slot.numel() ? -1 : cache.slot.as<const int32_t>()[pv];
      active.push_back(b);
      cached.push_back(slot >= 0 ? cache.rows.as<const float>() + slot * Vr : nullptr);
      embed.push_back(slot >= 0 ? std::vector<float>{} : cpu::load_span(markov_embed, pv * R, R));
      draws.push_back(draw_of(requests, sampling, b, j));
      any_live = any_live || slot < 0;
    }
  // Each markov_head row read once for every request; each request still sees the ids in ascending order.
  std::vector<float> head_row(static_cast<size_t>(R));
  for (int64_t v = 0; v < Vr && !active.empty(); ++v) {
    if (any_live) cpu::load_into(markov_head, v * R, R, head_row.data());
    for (size_t a = 0; a < active.size(); ++a) {
      const int64_t b = active[a];
      const float bias = cached[a] ? cached[a][v] : cpu::dot(head_row.data(), embed[a].data(), R);
      const float val = logits.as<const float>()[(b * k + j) * Vr + v] + bias;
      const Draw& d = draws[a];
      markov_scan_add(best[static_cast<size_t>(b)], val, static_cast<int32_t>(vocab_offset + v), d.tau,
                      d.seed, d.pos);
    }
  }
  for (int64_t b = 0; b < B; ++b) out[b] = best[static_cast<size_t>(b)];
}

void CpuBackend::markov_bias_rows(const Tensor& markov_head, const Tensor& /*markov_head_tiles*/,
                                  const Tensor& markov_embed, const Tensor& tokens, const Tensor& out) {
  const int64_t Vr = markov_head.dim(0), R = markov_head.dim(1), n = tokens.numel();
  std::vector<std::vector<float>> embed;
  for (int64_t i = 0; i < n; ++i)
    embed.push_back(cpu::load_span(markov_embed, tokens.as<const int32_t>()[i] * R, R));
  std::vector<float> head_row(static_cast<size_t>(R));
  for (int64_t v = 0; v < Vr; ++v) {
    cpu::load_into(markov_head, v * R, R, head_row.data());
    for (int64_t i = 0; i < n; ++i)
      out.as<float>()[i * Vr + v] = cpu::dot(head_row.data(), embed[static_cast<size_t>(i)].data(), R);
  }
}

void CpuBackend::markov_commit(const Tensor& cand, const Tensor& requests, int64_t j, const Tensor& prev,
                               const MarkovOutputs& out) {
  const int64_t B = prev.numel(), k = out.ids.dim(1);
  const MarkovRecord* c = reinterpret_cast<const MarkovRecord*>(cand.as<const int32_t>());
  for (int64_t b = 0; b < B; ++b) {
    if (j >= req_field(requests, b, kReqOutputs)) continue;
    const MarkovRecord& r = c[b];
    const int32_t tok = drafted_token(r);
    const bool drawn = r.sample_index >= 0;
    out.ids.as<int32_t>()[b * k + j] = tok;
    out.margin.as<float>()[b * k + j] = r.best - r.second;
    out.q.as<float>()[b * k + j] = drafted_probability(r);
    out.norm.as<float>()[(b * k + j) * 2] = drawn ? r.z_max : 0.0f;
    out.norm.as<float>()[(b * k + j) * 2 + 1] = drawn ? r.z_sum : 0.0f;
    prev.as<int32_t>()[b] = tok;
  }
}

void CpuBackend::draft_distribution(const Tensor& logits, const Tensor& bias, const Tensor& rows,
                                    const Tensor& sampling, const Tensor& norm, int64_t k,
                                    int64_t vocab_offset, const Tensor& out) {
  const int64_t Vr = logits.dim(1), V = out.dim(1), n = rows.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = rows.as<const int32_t>()[i], b = t / k;
    const float tau =
        std::bit_cast<float>(sampling.as<const int32_t>()[b * kSampleFields + kSampleTemperature]);
    const float z_max = norm.as<const float>()[t * 2], z_sum = norm.as<const float>()[t * 2 + 1];
    float* q = out.as<float>() + i * V;
    std::fill_n(q, V, 0.0f);
    for (int64_t c = 0; c < Vr; ++c) {
      const float z = (logits.as<const float>()[t * Vr + c] + bias.as<const float>()[i * Vr + c]) / tau;
      q[vocab_offset + c] = std::exp(z - z_max) / z_sum;
    }
  }
}

void CpuBackend::confidence(const Tensor& h, const Tensor& markov_embed, const Tensor& proj,
                            const Tensor& anchor, const Tensor& ids, const Tensor& requests, int64_t k,
                            const Tensor& conf, const Tensor& conf_logit) {
  const int64_t H = h.dim(1), R = markov_embed.dim(1), B = anchor.numel();
  const std::vector<float> w = cpu::load_span(proj, 0, H + R);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t outputs = req_field(requests, b, kReqOutputs);
    for (int64_t j = 0; j < k; ++j) {
      float logit = 0.0f, c = 0.0f;
      if (j < outputs) {
        const int32_t prev = j == 0 ? anchor.as<const int32_t>()[b] : ids.as<const int32_t>()[b * k + j - 1];
        std::vector<float> feat = cpu::load_span(h, (b * k + j) * H, H);
        const std::vector<float> e = cpu::load_span(markov_embed, prev * R, R);
        feat.insert(feat.end(), e.begin(), e.end());
        logit = cpu::dot(w.data(), feat.data(), H + R);
        c = 1.0f / (1.0f + std::exp(-logit));
      }
      conf_logit.as<float>()[b * k + j] = logit;
      conf.as<float>()[b * k + j] = c;
    }
  }
}

}  // namespace dspark
