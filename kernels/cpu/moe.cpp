// Mixture of experts: sqrt-softplus routing with a selection-only bias, and the routed + shared experts of
// this rank's intermediate channels.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"
#include "kernels/cpu/weight_rows.hpp"

namespace dspark {
namespace {

float softplus(float v) {
  return v > 20.0f ? v : std::log1p(std::exp(v));
}  // torch's threshold

// One expert on one row: bf16(w2 · bf16(scale * silu(min(g, L)) * clamp(u, +-L))), added to acc in fp32.
void expert_row(const std::vector<float>& x, const ExpertWeights& e, float scale, bool scaled, float limit,
                std::vector<float>& acc) {
  const int64_t I = e.w1.out, H = e.w2.out;
  // Quantised formats read their input quantised per block (SPEC §3): x for w1 and w3, h for w2.
  const std::vector<float> x1 = cpu::linear_input(e.w1, x), x3 = cpu::linear_input(e.w3, x);
  std::vector<float> h(static_cast<size_t>(I));
  for (int64_t c = 0; c < I; ++c) {
    const float g = round_bf16(cpu::dot(x1.data(), cpu::weight_row(e.w1, c).data(), H));
    const float u = round_bf16(cpu::dot(x3.data(), cpu::weight_row(e.w3, c).data(), H));
    const float gc = std::min(g, limit), uc = std::clamp(u, -limit, limit);
    float v = gc / (1.0f + std::exp(-gc)) * uc;
    if (scaled) v *= scale;
    h[static_cast<size_t>(c)] = round_bf16(v);
  }
  const std::vector<float> h2 = cpu::linear_input(e.w2, std::move(h));
  for (int64_t o = 0; o < H; ++o)
    acc[static_cast<size_t>(o)] += round_bf16(cpu::dot(h2.data(), cpu::weight_row(e.w2, o).data(), I));
}

}  // namespace

void CpuBackend::moe_route(const Tensor& x, const Tensor& gate, const Tensor& bias, const RouteParams& p,
                           const Tensor& ids, const Tensor& weights) {
  const int64_t E = gate.dim(0), H = gate.dim(1), T = x.numel() / H;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> xv = cpu::load_span(x, t * H, H);
    std::vector<float> score(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const float logit = cpu::dot(xv.data(), cpu::load_span(gate, e * H, H).data(), H) / p.gate_temp;
      score[static_cast<size_t>(e)] = std::sqrt(softplus(logit));
      biased[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] + bias.as<const float>()[e];
    }
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return biased[static_cast<size_t>(a)] > biased[static_cast<size_t>(b)];
    });
    float sum = 0.0f;
    for (int64_t c = 0; c < p.top_k; ++c) sum += score[static_cast<size_t>(order[static_cast<size_t>(c)])];
    for (int64_t c = 0; c < p.top_k; ++c) {
      const int32_t e = order[static_cast<size_t>(c)];
      float w = score[static_cast<size_t>(e)];
      if (p.normalize) w /= sum + 1e-20f;
      ids.as<int32_t>()[t * p.top_k + c] = e;
      weights.as<float>()[t * p.top_k + c] = w * p.route_scale;
    }
  }
}

void CpuBackend::moe_shared_expert(const Tensor& x, const StageWeights& stage, float swiglu_limit,
                                   const Tensor& out) {
  const int64_t H = x.shape.back(), T = x.numel() / H;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> y(static_cast<size_t>(H), 0.0f);
    expert_row(cpu::load_span(x, t * H, H), stage.shared, 1.0f, false, swiglu_limit, y);
    std::copy(y.begin(), y.end(), out.as<float>() + t * H);
  }
}

void CpuBackend::moe_routed_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                    const StageWeights& stage, float swiglu_limit, const Tensor& y) {
  const int64_t H = x.shape.back(), T = x.numel() / H, top_k = ids.numel() / T;
  const int64_t E = static_cast<int64_t>(stage.experts.size());
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> xv = cpu::load_span(x, t * H, H);
    for (int64_t c = 0; c < top_k; ++c) {
      const int32_t e = ids.as<const int32_t>()[t * top_k + c];
      if (e < 0 || e >= E) continue;
      std::vector<float> yc(static_cast<size_t>(H), 0.0f);
      expert_row(xv, stage.experts[static_cast<size_t>(e)], weights.as<const float>()[t * top_k + c], true,
                 swiglu_limit, yc);
      std::copy(yc.begin(), yc.end(), y.as<float>() + (t * top_k + c) * H);
    }
  }
}

void CpuBackend::moe_combine(const Tensor& ids, const Tensor& y, const Tensor& shared, int64_t n_experts,
                             const Tensor& out) {
  const int64_t H = out.shape.back(), T = out.numel() / H, top_k = ids.numel() / T;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* row = ids.as<const int32_t>() + t * top_k;
    // Routed experts in ascending expert id (the reference's loop order), then the shared expert.
    std::vector<int64_t> choice(static_cast<size_t>(top_k));
    std::iota(choice.begin(), choice.end(), 0);
    std::stable_sort(choice.begin(), choice.end(), [&](int64_t a, int64_t b) { return row[a] < row[b]; });
    for (int64_t o = 0; o < H; ++o) {
      float acc = 0.0f;
      for (int64_t c : choice)
        if (row[c] >= 0 && row[c] < n_experts) acc += y.as<const float>()[(t * top_k + c) * H + o];
      out.as<float>()[t * H + o] = acc + shared.as<const float>()[t * H + o];
    }
  }
}

}  // namespace dspark
