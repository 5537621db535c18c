// CudaBackend's activation codes: their storage, the norms that write them beside their output, and the
// products that read them (linear_coded in dense_ops.cpp, the experts in moe_ops.cpp, fp8_linear in
// quant_ops.cpp).
#include "kernels/cuda/act_codes.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace dspark {
namespace cuda {

std::optional<QuantAct> usable_codes(const ActCodes& codes, int64_t rows, int64_t cols, int64_t block) {
  if (codes.empty() || codes.cols != cols || codes.block != block || rows > codes.rows) return std::nullopt;
  return quant_act_at(codes.data.data, codes.rows, codes.cols);
}

QuantActOut codes_out(const ActCodes& codes, int64_t rows, int64_t cols, const char* op) {
  if (codes.empty()) return {};
  if (codes.cols != cols || rows > codes.rows)
    fail("cuda {}: activation codes for up to {} rows of {} cannot hold {} rows of {}", op, codes.rows,
         codes.cols, rows, cols);
  return {quant_act_at(codes.data.data, codes.rows, codes.cols), codes.block};
}

}  // namespace cuda

ActCodes CudaBackend::alloc_act_codes(int64_t rows, int64_t cols, int64_t block) {
  if (rows <= 0 || !cuda::quant_act_out_fits(cols, block)) return {};
  const Tensor data = alloc(DType::u8, {static_cast<int64_t>(cuda::quant_act_bytes(rows, cols))});
  return {data, rows, cols, block};
}

}  // namespace dspark
