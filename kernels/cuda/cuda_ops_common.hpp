// Checks that the op wrappers of several kernel families share (attention_ops.cpp, markov_ops.cpp): the grid
// limit on requests, the request and sampling rows. Host code only (fmt through core/error.hpp).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_check.hpp"
#include "lib/core/error.hpp"
#include "lib/core/tensor.hpp"
#include "lib/model/backend.hpp"

namespace dspark::cuda {

constexpr int64_t kMaxGridYZ = 65535;

inline void request_rows_check(const Tensor& requests, int64_t B, const char* op) {
  expect_dtype(requests, DType::i32, op, "requests");
  if (requests.numel() < B * kReqFields)
    fail("cuda {}: requests {} hold fewer than {} rows of {}", op, shape_str(requests.shape), B, kReqFields);
}

inline void sampling_rows_check(const Tensor& sampling, int64_t B, const char* op) {
  expect_dtype(sampling, DType::i32, op, "sampling");
  if (sampling.numel() < B * kSampleFields)
    fail("cuda {}: sampling {} holds fewer than {} rows of {}", op, shape_str(sampling.shape), B,
         kSampleFields);
}

}  // namespace dspark::cuda
