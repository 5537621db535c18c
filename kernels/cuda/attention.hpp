// The attention of one stage (attention.cu on the CUDA cores, attention_mma.cu and attention_whole.cu on the
// tensor cores): one block per (head, request); its CudaBackend ops are in attention_ops.cpp. Plain C++ (g++
// and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch_common.hpp"
#include "kernels/cuda/norm_rope.hpp"

namespace dspark::cuda {

struct AttentionArgs {
  const void* q;
  Elt q_t;
  const void* block_kv;
  Elt block_kv_t;
  const void* ring_kv;
  Elt ring_kv_t;
  const int32_t* ring_pos;
  const int32_t* requests;  // [B, 4]
  const float* sink;        // [heads]
  void* out;
  Elt out_t;
  int64_t B, k, heads, d, slots, W;
  float scale;  // 1 / sqrt(d), computed on the host as the CPU does
  // Optional: the inverse RoPE of the output's last rope_dim dims at rope_pos[t] (nullptr: none), the same
  // bits as launch_rope(inverse) run afterwards.
  const int32_t* rope_pos;
  int64_t rope_dim;
  RopeFreqs freqs;
  int64_t query_group;  // queries per block: set by launch_attention
  // Key splits of the tensor-core kernel (attention_splits; 0 or 1: unsplit) and, when > 1, their device
  // scratch (attention_split_scratch_bytes, any contents) and heads * B counters (zero between launches).
  int64_t splits;
  float* split_partials;
  uint32_t* split_counters;
};
// Dynamic shared memory of one block (the host refuses shapes over what the GPU allows).
size_t attention_smem_bytes(int64_t d, int64_t W, int64_t k);
cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t s);
// Flash-decoding on the tensor-core kernel: a small grid of (head, request) blocks splits each request's key
// blocks over `splits` blocks, and the last of them to finish merges the partials in split order. The count
// depends on the shape only (not on the GPU), so every rank and every GPU sums in the same order.
constexpr int64_t kMaxAttentionSplits = 16;
constexpr int64_t kAttentionSplitPairs = 1024;  // (head, request) counters a backend reserves per stream
// The splits launch_attention will take for `a` (1 off the tensor-core path or with more than
// kAttentionSplitPairs pairs), and the scratch they need.
int64_t attention_splits(const AttentionArgs& a);
size_t attention_split_scratch_bytes(const AttentionArgs& a, int64_t splits);
// Tests: force the split count of the tensor-core kernel (clamped to [1, kMaxAttentionSplits]; 0 =
// automatic).
void set_attention_splits_for_testing(int splits);

}  // namespace dspark::cuda
