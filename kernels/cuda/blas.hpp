// The cuBLAS state of a CudaBackend: one handle bound to the backend's stream, with a user workspace (so that
// GEMMs can be captured in a CUDA graph) and math mode that keeps split-K reductions in fp32. Host code only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_backend.hpp"

namespace dspark {

struct CudaBackend::Blas {
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;

  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
};

struct CudaBackend::Scratch {
  static constexpr size_t kInitialBytes = size_t{64} << 20;
  static constexpr size_t kSideInitialBytes = size_t{1} << 20;  // side work rarely needs any
  void* data = nullptr;
  size_t bytes = 0;
  std::vector<void*> retired;  // outgrown buffers, freed with the backend
  // The split attention's per-(head, request) arrival counters (cuda::kAttentionSplitPairs): zeroed once at
  // construction, and each launch leaves them at zero. One array per stream: a launch on one stream never
  // shares them with a concurrent one on the other (attention runs on the main stream today).
  uint32_t* counters = nullptr;
  ~Scratch();
};

}  // namespace dspark
