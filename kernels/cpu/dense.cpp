// Embedding, linear layers and RMSNorm.
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"

namespace dspark {
namespace {

void check_dense(const LinearWeight& w) {
  if (w.format != WeightFormat::dense) fail("cpu backend: weight '{}' is not dense", w.name);
}

// out[t, o0 + o] = sum_i x[t, x0 + i] w[w_row0 + o, i] for o < n_out, i < n_in (fp32 sum in index order).
void linear_block(const Tensor& x, int64_t x_stride, int64_t x0, const Tensor& w, int64_t w_row0,
                  int64_t n_out, int64_t n_in, const Tensor& out, int64_t out_stride, int64_t o0) {
  const int64_t T = x.dim(0);
  std::vector<std::vector<float>> xs(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) xs[static_cast<size_t>(t)] = cpu::load_span(x, t * x_stride + x0, n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    const std::vector<float> row = cpu::load_span(w, (w_row0 + o) * n_in, n_in);
    for (int64_t t = 0; t < T; ++t)
      cpu::store(out, t * out_stride + o0 + o, cpu::dot(xs[static_cast<size_t>(t)].data(), row.data(), n_in));
  }
}

}  // namespace

void CpuBackend::embed(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const int64_t V = table.dim(0), H = table.dim(1);
  for (int64_t t = 0; t < ids.numel(); ++t) {
    const int32_t id = ids.as<const int32_t>()[t];
    if (id < 0 || id >= V) fail("embed: token {} out of range [0, {})", id, V);
    for (int64_t i = 0; i < H; ++i) cpu::store(out, t * H + i, cpu::load(table, id * H + i));
  }
}

void CpuBackend::linear(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  check_dense(w);
  if (x.dim(x.shape.size() - 1) != w.in || out.numel() != x.numel() / w.in * w.out)
    fail("linear '{}': x {} and out {} do not fit [{}, {}]", w.name, shape_str(x.shape), shape_str(out.shape),
         w.out, w.in);
  const Tensor x2 = x.reshaped({x.numel() / w.in, w.in});
  linear_block(x2, w.in, 0, w.weight, 0, w.out, w.in, out, w.out, 0);
}

void CpuBackend::grouped_linear(const Tensor& x, const LinearWeight& w, int64_t groups, const Tensor& out) {
  check_dense(w);
  const int64_t out_g = w.out / groups, in_g = w.in;
  const Tensor x2 = x.reshaped({x.numel() / (groups * in_g), groups * in_g});
  for (int64_t g = 0; g < groups; ++g)
    linear_block(x2, groups * in_g, g * in_g, w.weight, g * out_g, out_g, in_g, out, w.out, g * out_g);
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  const int64_t n = w.numel(), T = x.numel() / n;
  const std::vector<float> wf = cpu::load_span(w, 0, n);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> v = cpu::load_span(x, t * n, n);
    const float ms = cpu::dot(v.data(), v.data(), n) / static_cast<float>(n);
    const float r = 1.0f / std::sqrt(ms + eps);
    for (int64_t i = 0; i < n; ++i)
      cpu::store(out, t * n + i, wf[static_cast<size_t>(i)] * (v[static_cast<size_t>(i)] * r));
  }
}

}  // namespace dspark
