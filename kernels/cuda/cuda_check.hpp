// Host-side helpers of the CUDA backend's op wrappers: CUDA / cuBLAS errors as dspark::Error naming the op,
// and the dtype / shape checks. Host code only (includes fmt through core/error.hpp): never include from a
// .cu file.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch_common.hpp"
#include "lib/core/error.hpp"
#include "lib/core/tensor.hpp"

namespace dspark::cuda {

inline void check(cudaError_t err, const char* op) {
  if (err != cudaSuccess) fail("cuda {}: {} ({})", op, cudaGetErrorString(err), cudaGetErrorName(err));
}

inline void check(cublasStatus_t status, const char* op) {
  if (status != CUBLAS_STATUS_SUCCESS) fail("cuda {}: cuBLAS: {}", op, cublasGetStatusString(status));
}

// The float storage type of t, or an error naming the op and the operand.
inline Elt elt(const Tensor& t, const char* op, const char* what) {
  switch (t.dtype) {
    case DType::bf16:
      return Elt::bf16;
    case DType::f16:
      return Elt::f16;
    case DType::f32:
      return Elt::f32;
    default:
      fail("cuda {}: {} must be bf16, f16 or f32, got {}", op, what, dtype_name(t.dtype));
  }
}

inline void expect_dtype(const Tensor& t, DType want, const char* op, const char* what) {
  if (t.dtype != want)
    fail("cuda {}: {} must be {}, got {}", op, what, dtype_name(want), dtype_name(t.dtype));
}

inline void expect_numel(const Tensor& t, int64_t want, const char* op, const char* what) {
  if (t.numel() != want) fail("cuda {}: {} {} must hold {} elements", op, what, shape_str(t.shape), want);
}

inline void expect_rank(const Tensor& t, size_t rank, const char* op, const char* what) {
  if (t.shape.size() != rank)
    fail("cuda {}: {} {} must have {} dimensions", op, what, shape_str(t.shape), rank);
}

inline void expect_data(const Tensor& t, const char* op, const char* what) {
  if (t.numel() > 0 && t.data == nullptr) fail("cuda {}: {} has no storage", op, what);
}

inline const int32_t* i32_in(const Tensor& t) {
  return t.as<const int32_t>();
}

}  // namespace dspark::cuda
