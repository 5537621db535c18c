// Manifold hyper-connections: the 24 mix coefficients with Sinkhorn, collapse of the hc copies to one row,
// and expansion of a half's output back into the stream. fp32 throughout, bf16 stream.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"

namespace dspark {
namespace {
float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}
}  // namespace

void CpuBackend::hc_replicate(const Tensor& x, const Tensor& X) {
  const int64_t T = x.dim(0), H = x.dim(1), hc = X.dim(1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hc; ++j)
      for (int64_t i = 0; i < H; ++i) cpu::store(X, (t * hc + j) * H + i, cpu::load(x, t * H + i));
}

void CpuBackend::hc_mixes(const Tensor& X, const HcMixWeights& w, const MixParams& p, const Tensor& pre,
                          const Tensor& post, const Tensor& comb) {
  const int64_t T = X.dim(0), hc = X.dim(1), n = X.numel() / T, nmix = w.fn.dim(0);
  const float* fn = w.fn.as<const float>();
  const float* base = w.base.as<const float>();
  const float* scale = w.scale.as<const float>();
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> x = cpu::load_span(X, t * n, n);
    const float r = 1.0f / std::sqrt(cpu::dot(x.data(), x.data(), n) / static_cast<float>(n) + p.norm_eps);
    std::vector<float> m(static_cast<size_t>(nmix));
    for (int64_t i = 0; i < nmix; ++i) m[static_cast<size_t>(i)] = cpu::dot(fn + i * n, x.data(), n) * r;
    float* pr = pre.as<float>() + t * hc;
    float* po = post.as<float>() + t * hc;
    float* c = comb.as<float>() + t * hc * hc;
    for (int64_t j = 0; j < hc; ++j) {
      pr[j] = sigmoid(m[static_cast<size_t>(j)] * scale[0] + base[j]) + p.hc_eps;
      po[j] = 2.0f * sigmoid(m[static_cast<size_t>(hc + j)] * scale[1] + base[hc + j]);
    }
    // C[j][l]: row softmax (+ eps), one column normalisation, then (iters - 1) row/column rounds.
    for (int64_t j = 0; j < hc; ++j) {
      float* row = c + j * hc;
      for (int64_t l = 0; l < hc; ++l)
        row[l] = m[static_cast<size_t>(2 * hc + j * hc + l)] * scale[2] + base[2 * hc + j * hc + l];
      const float mx = *std::max_element(row, row + hc);
      float sum = 0.0f;
      for (int64_t l = 0; l < hc; ++l) sum += (row[l] = std::exp(row[l] - mx));
      for (int64_t l = 0; l < hc; ++l) row[l] = row[l] / sum + p.hc_eps;
    }
    auto normalise_columns = [&] {
      for (int64_t l = 0; l < hc; ++l) {
        float sum = 0.0f;
        for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + l];
        for (int64_t j = 0; j < hc; ++j) c[j * hc + l] /= sum + p.hc_eps;
      }
    };
    auto normalise_rows = [&] {
      for (int64_t j = 0; j < hc; ++j) {
        float sum = 0.0f;
        for (int64_t l = 0; l < hc; ++l) sum += c[j * hc + l];
        for (int64_t l = 0; l < hc; ++l) c[j * hc + l] /= sum + p.hc_eps;
      }
    };
    normalise_columns();
    for (int64_t it = 1; it < p.sinkhorn_iters; ++it) {
      normalise_rows();
      normalise_columns();
    }
  }
}

// Row-wise (whole rows of H at a time, so the loops vectorise); per element the same sums in the same order
// as the element-wise definitions: collapse acc = sum_j pre[j] X[j][i] from 0.0f in j order, expand
// X'[l][i] = post[l] y[i] + (sum_j comb[j][l] X[j][i] from 0.0f in j order).
void CpuBackend::hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& out) {
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  std::vector<float> row(static_cast<size_t>(H)), acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    const float* pr = pre.as<const float>() + t * hc;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j = 0; j < hc; ++j) {
      cpu::load_into(X, (t * hc + j) * H, H, row.data());
      for (int64_t i = 0; i < H; ++i) acc[static_cast<size_t>(i)] += pr[j] * row[static_cast<size_t>(i)];
    }
    cpu::store_from(out, t * H, H, acc.data());
  }
}

void CpuBackend::hc_expand(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) {
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  std::vector<float> old(static_cast<size_t>(hc * H)), yr(static_cast<size_t>(H)),
      out(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    const float* po = post.as<const float>() + t * hc;
    const float* c = comb.as<const float>() + t * hc * hc;
    cpu::load_into(X, t * hc * H, hc * H, old.data());
    cpu::load_into(y, t * H, H, yr.data());
    for (int64_t l = 0; l < hc; ++l) {
      std::fill(out.begin(), out.end(), 0.0f);
      for (int64_t j = 0; j < hc; ++j) {
        const float w = c[j * hc + l];
        const float* o = old.data() + j * H;
        for (int64_t i = 0; i < H; ++i) out[static_cast<size_t>(i)] += w * o[i];
      }
      for (int64_t i = 0; i < H; ++i)
        out[static_cast<size_t>(i)] = po[l] * yr[static_cast<size_t>(i)] + out[static_cast<size_t>(i)];
      cpu::store_from(X, (t * hc + l) * H, H, out.data());
    }
  }
}

}  // namespace dspark
