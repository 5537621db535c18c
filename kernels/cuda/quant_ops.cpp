// The fp8 block linear ops of CudaBackend (kernels: quant_act.cu, quant_linear.cu): the input quantised per
// block into the stream's scratch (or its codes as its producer wrote them), then the tiled product, in
// launches of at most kQuantLinearMaxRows rows; from kDequantisedMinRows rows on, where the weight has a bf16
// copy (main_proj, wkv), the quantised values in bf16 through cuBLAS against it.
#include <algorithm>
#include <optional>

#include "kernels/cuda/act_codes.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/quant_linear.hpp"

namespace dspark {

using cuda::check;
using cuda::Elt;
using cuda::elt;

namespace {

// An fp8 weight as the tiled kernels read it: packed by prepare_weights, scales present.
void expect_fp8_tiles(const LinearWeight& w, const char* op) {
  if (w.format == WeightFormat::fp8_block)
    fail("cuda {}: fp8 block weight '{}' is still row-major: the backend's prepare_weights puts it in tiles",
         op, w.name);
  cuda::expect_data(w.weight, op, "weight");
  cuda::expect_data(w.scale, op, "scale");
  if (w.weight.numel() != w.out * w.in || w.block <= 0 || w.block % 32 != 0 || w.in % w.block != 0)
    fail("cuda {}: fp8 weight '{}' [{}, {}] block {} is not a shape the fp8 kernels take", op, w.name, w.out,
         w.in, w.block);
}

void expect_bf16_rows(const Tensor& x, const char* op) {
  if (x.dtype != DType::bf16 || !cuda::aligned16(x.data))
    fail("cuda {}: an fp8 product needs x bf16 and 16-byte aligned (x is {})", op, dtype_name(x.dtype));
}

}  // namespace

void CudaBackend::fp8_linear(const char* op, const Tensor& x, const LinearWeight& w, int64_t rows,
                             const Tensor& out, const ActCodes* codes) {
  const LinearWeight* const ws[1] = {&w};
  fp8_products(op, x, codes, ws, {&out, 1}, rows);
}

bool CudaBackend::fp8_linear_same_input(const char* op, const Tensor& x, const ActCodes* codes,
                                        std::span<const LinearWeight* const> ws, std::span<const Tensor> outs,
                                        int64_t rows) {
  if (ws.empty() || ws.size() > static_cast<size_t>(cuda::kFp8LinearMaxMatrices) || outs.size() != ws.size())
    return false;
  const LinearWeight& w0 = *ws.front();
  if (x.numel() != rows * w0.in) return false;
  for (size_t i = 0; i < ws.size(); ++i) {
    const LinearWeight& w = *ws[i];
    if (w.format != WeightFormat::fp8_mma_tiles || w.out != w0.out || w.in != w0.in || w.block != w0.block ||
        w.dequantised.empty() != w0.dequantised.empty() || outs[i].dtype != outs.front().dtype ||
        outs[i].numel() != rows * w.out)
      return false;
  }
  fp8_products(op, x, codes, ws, outs, rows);
  return true;
}

void CudaBackend::fp8_products(const char* op, const Tensor& x, const ActCodes* codes,
                               std::span<const LinearWeight* const> ws, std::span<const Tensor> outs,
                               int64_t rows) {
  for (const LinearWeight* w : ws) expect_fp8_tiles(*w, op);
  expect_bf16_rows(x, op);
  const LinearWeight& w0 = *ws.front();
  const Elt ot = elt(outs.front(), op, "out");
  if (!w0.dequantised.empty() && rows >= kDequantisedMinRows) {
    // The quantised activations' values in bf16 (made once for every weight) times each exact bf16 copy:
    // SPEC §3's products, summed in fp32 in cuBLAS's order.
    Tensor xq{DType::bf16, {rows, w0.in}, scratch(static_cast<size_t>(rows * w0.in) * 2, op), nullptr};
    check(cuda::launch_quantize_act_bf16(x.data, rows, w0.in, w0.in, w0.block, xq.data, cur_), op);
    for (size_t i = 0; i < ws.size(); ++i) {
      LinearWeight copy;
      copy.name = ws[i]->name;
      copy.out = ws[i]->out;
      copy.in = ws[i]->in;
      copy.weight = ws[i]->dequantised;
      gemm_bf16(op, xq, copy, 1, rows, outs[i]);
    }
    return;
  }
  const std::optional<cuda::QuantAct> given =
      codes != nullptr ? cuda::usable_codes(*codes, rows, w0.in, w0.block) : std::nullopt;
  cuda::QuantAct q;
  if (given) {
    q = *given;  // written by x's producer
  } else {
    q = cuda::quant_act_at(scratch(cuda::quant_act_bytes(rows, w0.in), op), rows, w0.in);
    check(cuda::launch_quantize_act(x.data, rows, w0.in, w0.in, w0.block, q, cur_), op);
  }
  const void* w[cuda::kFp8LinearMaxMatrices];
  const uint8_t* sc[cuda::kFp8LinearMaxMatrices];
  void* out[cuda::kFp8LinearMaxMatrices];
  const int64_t out_size = outs.front().dtype == DType::f32 ? 4 : 2, C = w0.in / 32;
  for (int64_t t0 = 0; t0 < rows; t0 += cuda::kQuantLinearMaxRows) {
    const int64_t n = std::min(rows - t0, cuda::kQuantLinearMaxRows);
    for (size_t i = 0; i < ws.size(); ++i) {
      w[i] = ws[i]->weight.data;
      sc[i] = ws[i]->scale.as<const uint8_t>();
      out[i] = static_cast<char*>(outs[i].data) + t0 * w0.out * out_size;
    }
    const cuda::QuantAct part{q.codes + t0 * w0.in, q.scales + t0 * C};
    check(cuda::launch_fp8_linear_multi(part, n, w, sc, static_cast<int>(ws.size()), w0.out, w0.in, w0.block,
                                        out, ot, cur_),
          op);
  }
}

void CudaBackend::fp8_grouped(const char* op, const Tensor& x, const LinearWeight& w, int64_t groups,
                              int64_t rows, const Tensor& out) {
  expect_fp8_tiles(w, op);
  expect_bf16_rows(x, op);
  const Elt ot = elt(out, op, "out");
  const int64_t out_size = out.dtype == DType::f32 ? 4 : 2;
  for (int64_t t0 = 0; t0 < rows; t0 += cuda::kQuantLinearMaxRows) {
    const int64_t n = std::min(rows - t0, cuda::kQuantLinearMaxRows);
    check(cuda::launch_fp8_grouped_bf16(x.as<const uint16_t>() + t0 * groups * w.in, n, groups, w.weight.data,
                                        w.scale.as<const uint8_t>(), w.out / groups, w.in, w.block,
                                        static_cast<char*>(out.data) + t0 * w.out * out_size, ot, cur_),
          op);
  }
}

}  // namespace dspark
