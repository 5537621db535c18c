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

// One expert on a set of rows: out_p += bf16(w2 · bf16(scale_p * silu(min(g, L)) * clamp(u, +-L))) for each
// row x_p, with g = bf16(w1 · x_p), u = bf16(w3 · x_p) (fp32 sums). The rows share each dequantised weight
// row; every row's result is what it would be alone.
void expert_rows(const ExpertWeights& e, const std::vector<const float*>& xs,
                 const std::vector<float>& scales, bool scaled, float limit,
                 const std::vector<float*>& outs) {
  const int64_t I = e.w1.out, H = e.w2.out, P = static_cast<int64_t>(xs.size());
  if (P == 0) return;
  // Quantised formats read their input quantised per block (SPEC §3): x for w1 and w3, h for w2.
  std::vector<std::vector<float>> x1(static_cast<size_t>(P)), x3(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) {
    const std::vector<float> x(xs[static_cast<size_t>(p)], xs[static_cast<size_t>(p)] + H);
    x1[static_cast<size_t>(p)] = cpu::linear_input(e.w1, x);
    x3[static_cast<size_t>(p)] = cpu::linear_input(e.w3, x);
  }
  std::vector<float> h(static_cast<size_t>(P * I)), r1(static_cast<size_t>(H)), r3(static_cast<size_t>(H));
  std::vector<const float*> a1(static_cast<size_t>(P)), a3(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) {
    a1[static_cast<size_t>(p)] = x1[static_cast<size_t>(p)].data();
    a3[static_cast<size_t>(p)] = x3[static_cast<size_t>(p)].data();
  }
  // The whole rows of both products first: an EXL3 output transform mixes each 128-block of channels.
  std::vector<float> gs(static_cast<size_t>(P)), us(static_cast<size_t>(P)), g(static_cast<size_t>(P * I)),
      u(static_cast<size_t>(P * I));
  for (int64_t c = 0; c < I; ++c) {
    cpu::dot_weight_row(a1.data(), P, e.w1, c, H, r1.data(), gs.data());
    cpu::dot_weight_row(a3.data(), P, e.w3, c, H, r3.data(), us.data());
    for (int64_t p = 0; p < P; ++p) {
      g[static_cast<size_t>(p * I + c)] = gs[static_cast<size_t>(p)];
      u[static_cast<size_t>(p * I + c)] = us[static_cast<size_t>(p)];
    }
  }
  for (int64_t p = 0; p < P; ++p) {
    cpu::linear_output(e.w1, g.data() + p * I);
    cpu::linear_output(e.w3, u.data() + p * I);
    for (int64_t c = 0; c < I; ++c) {
      const float gv = round_bf16(g[static_cast<size_t>(p * I + c)]);
      const float uv = round_bf16(u[static_cast<size_t>(p * I + c)]);
      const float gc = std::min(gv, limit), uc = std::clamp(uv, -limit, limit);
      float v = gc / (1.0f + std::exp(-gc)) * uc;
      if (scaled) v *= scales[static_cast<size_t>(p)];
      h[static_cast<size_t>(p * I + c)] = round_bf16(v);
    }
  }
  std::vector<std::vector<float>> h2(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p)
    h2[static_cast<size_t>(p)] =
        cpu::linear_input(e.w2, std::vector<float>(h.begin() + p * I, h.begin() + (p + 1) * I));
  std::vector<float> r2(static_cast<size_t>(I));
  std::vector<const float*> a2(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) a2[static_cast<size_t>(p)] = h2[static_cast<size_t>(p)].data();
  std::vector<float> d(static_cast<size_t>(P * H));
  for (int64_t o = 0; o < H; ++o) {
    cpu::dot_weight_row(a2.data(), P, e.w2, o, I, r2.data(), gs.data());
    for (int64_t p = 0; p < P; ++p) d[static_cast<size_t>(p * H + o)] = gs[static_cast<size_t>(p)];
  }
  for (int64_t p = 0; p < P; ++p) {
    cpu::linear_output(e.w2, d.data() + p * H);
    for (int64_t o = 0; o < H; ++o)
      outs[static_cast<size_t>(p)][o] += round_bf16(d[static_cast<size_t>(p * H + o)]);
  }
}

}  // namespace

void CpuBackend::moe_route(const Tensor& x, const Tensor& gate, const Tensor& bias, const RouteParams& p,
                           const Tensor& ids, const Tensor& weights) {
  const int64_t E = gate.dim(0), H = gate.dim(1), T = x.numel() / H;
  const std::vector<float> xs = cpu::load_span(x, 0, T * H);
  std::vector<float> logit(static_cast<size_t>(T * E)), row(static_cast<size_t>(H)),
      sums(static_cast<size_t>(T));
  std::vector<const float*> rows(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rows[static_cast<size_t>(t)] = xs.data() + t * H;
  for (int64_t e = 0; e < E; ++e) {  // each gate row read once for all tokens
    cpu::load_into(gate, e * H, H, row.data());
    cpu::dot_rows(rows.data(), T, row.data(), H, sums.data());
    for (int64_t t = 0; t < T; ++t)
      logit[static_cast<size_t>(t * E + e)] = sums[static_cast<size_t>(t)] / p.gate_temp;
  }
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> score(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      score[static_cast<size_t>(e)] = std::sqrt(softplus(logit[static_cast<size_t>(t * E + e)]));
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

void CpuBackend::moe_shared_expert(const Tensor& x, const ActCodes& /*x_codes*/, const StageWeights& stage,
                                   float swiglu_limit, const Tensor& out) {
  const int64_t H = x.shape.back(), T = x.numel() / H;
  const std::vector<float> xs = cpu::load_span(x, 0, T * H);
  std::vector<const float*> rows(static_cast<size_t>(T));
  std::vector<float*> outs(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    rows[static_cast<size_t>(t)] = xs.data() + t * H;
    outs[static_cast<size_t>(t)] = out.as<float>() + t * H;
  }
  std::fill(out.as<float>(), out.as<float>() + T * H, 0.0f);
  expert_rows(stage.shared, rows, std::vector<float>(static_cast<size_t>(T), 1.0f), false, swiglu_limit,
              outs);
}

void CpuBackend::moe_routed_experts(const Tensor& x, const ActCodes& /*x_codes*/, const Tensor& ids,
                                    const Tensor& weights, const StageWeights& stage, float swiglu_limit,
                                    const Tensor& y) {
  const int64_t H = x.shape.back(), T = x.numel() / H, top_k = ids.numel() / T;
  const int64_t E = static_cast<int64_t>(stage.experts.size());
  const std::vector<float> xs = cpu::load_span(x, 0, T * H);
  // Each expert runs once, on every (row, choice) routed to it.
  for (int64_t e = 0; e < E; ++e) {
    std::vector<const float*> rows;
    std::vector<float> scales;
    std::vector<float*> outs;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < top_k; ++c)
        if (ids.as<const int32_t>()[t * top_k + c] == e) {
          rows.push_back(xs.data() + t * H);
          scales.push_back(weights.as<const float>()[t * top_k + c]);
          float* o = y.as<float>() + (t * top_k + c) * H;
          std::fill(o, o + H, 0.0f);
          outs.push_back(o);
        }
    expert_rows(stage.experts[static_cast<size_t>(e)], rows, scales, true, swiglu_limit, outs);
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
