// The sequential Markov fix-up of the drafted block and the confidence head.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"

namespace dspark {
namespace {
int32_t req_field(const Tensor& requests, int64_t b, int64_t f) {
  return requests.as<const int32_t>()[b * kReqFields + f];
}
}  // namespace

void CpuBackend::markov_top2(const Tensor& logits, const Tensor& markov_head,
                             const Tensor& /*markov_head_tiles*/, const Tensor& markov_embed,
                             const Tensor& prev, const Tensor& requests, int64_t j, int64_t k,
                             int64_t vocab_offset, const MarkovCache& cache, const Tensor& cand) {
  const int64_t Vr = logits.dim(1), R = markov_head.dim(1), B = prev.numel();
  Top2* out = reinterpret_cast<Top2*>(cand.as<int32_t>());
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<Top2> best(static_cast<size_t>(B), Top2{-inf, -inf, 0, 0});
  std::vector<int64_t> active;       // the requests drafting position j
  std::vector<const float*> cached;  // per active request: its cached bias row, or null
  std::vector<std::vector<float>> embed;
  bool any_live = false;  // an active request without a cached row: markov_head is read
  for (int64_t b = 0; b < B; ++b)
    if (j < req_field(requests, b, kReqOutputs)) {
      const int32_t pv = prev.as<const int32_t>()[b];
      const int32_t slot =
          cache.empty() || pv < 0 || pv >= cache.slot.numel() ? -1 : cache.slot.as<const int32_t>()[pv];
      active.push_back(b);
      cached.push_back(slot >= 0 ? cache.rows.as<const float>() + slot * Vr : nullptr);
      embed.push_back(slot >= 0 ? std::vector<float>{} : cpu::load_span(markov_embed, pv * R, R));
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
      Top2& t = best[static_cast<size_t>(b)];
      if (val > t.best) {  // strict: the first (lowest) id wins a tie
        t.second = t.best;
        t.best = val;
        t.index = static_cast<int32_t>(vocab_offset + v);
      } else if (val > t.second) {
        t.second = val;
      }
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
                               const Tensor& ids, const Tensor& margin) {
  const int64_t B = prev.numel(), k = ids.dim(1);
  const Top2* c = reinterpret_cast<const Top2*>(cand.as<const int32_t>());
  for (int64_t b = 0; b < B; ++b) {
    if (j >= req_field(requests, b, kReqOutputs)) continue;
    ids.as<int32_t>()[b * k + j] = c[b].index;
    margin.as<float>()[b * k + j] = c[b].best - c[b].second;
    prev.as<int32_t>()[b] = c[b].index;
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
