// Embedding, linear layers and RMSNorm.
#include <cmath>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"
#include "kernels/cpu/weight_rows.hpp"

namespace dspark {
namespace {

// out[t, o0 + o] = sum_i x[t, x0 + i] w[w_row0 + o, i] for o < n_out, i < n_in (fp32, cpu::dot's order),
// with w's rows dequantised (each once per call) and, when `quantize` (the format's rule, SPEC §3), x
// quantised per block; an EXL3 product is the whole matrix between its input and output transforms.
void linear_block(const Tensor& x, int64_t x_stride, int64_t x0, const LinearWeight& w, int64_t w_row0,
                  int64_t n_out, int64_t n_in, const Tensor& out, int64_t out_stride, int64_t o0,
                  bool quantize) {
  const int64_t T = x.dim(0);
  std::vector<std::vector<float>> xs(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> v = cpu::load_span(x, t * x_stride + x0, n_in);
    xs[static_cast<size_t>(t)] = quantize ? cpu::linear_input(w, std::move(v)) : std::move(v);
  }
  std::vector<const float*> rows(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) rows[static_cast<size_t>(t)] = xs[static_cast<size_t>(t)].data();
  std::vector<float> row(static_cast<size_t>(w.in)), sums(static_cast<size_t>(T)),
      y(static_cast<size_t>(T * n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    cpu::dot_weight_row(rows.data(), T, w, w_row0 + o, n_in, row.data(), sums.data());
    for (int64_t t = 0; t < T; ++t) y[static_cast<size_t>(t * n_out + o)] = sums[static_cast<size_t>(t)];
  }
  for (int64_t t = 0; t < T; ++t) {
    float* yt = y.data() + t * n_out;
    if (quantize) cpu::linear_output(w, yt);
    for (int64_t o = 0; o < n_out; ++o) cpu::store(out, t * out_stride + o0 + o, yt[o]);
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
  if (x.dim(x.shape.size() - 1) != w.in || out.numel() != x.numel() / w.in * w.out)
    fail("linear '{}': x {} and out {} do not fit [{}, {}]", w.name, shape_str(x.shape), shape_str(out.shape),
         w.out, w.in);
  const Tensor x2 = x.reshaped({x.numel() / w.in, w.in});
  linear_block(x2, w.in, 0, w, 0, w.out, w.in, out, w.out, 0, true);
}

// wo_a's product (SPEC §3's exception): an fp8 block weight is dequantised and the input is not quantised.
void CpuBackend::grouped_linear(const Tensor& x, const LinearWeight& w, int64_t groups, const Tensor& out) {
  if (w.format != WeightFormat::dense && w.format != WeightFormat::fp8_block)
    fail("cpu backend: grouped weight '{}' is {}; only dense or fp8 block", w.name,
         weight_format_name(w.format));
  const int64_t out_g = w.out / groups, in_g = w.in;
  const Tensor x2 = x.reshaped({x.numel() / (groups * in_g), groups * in_g});
  for (int64_t g = 0; g < groups; ++g)
    linear_block(x2, groups * in_g, g * in_g, w, g * out_g, out_g, in_g, out, w.out, g * out_g, false);
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
