// Switches of the CUDA backend's optimisations. Each is on by default, the configuration production runs; the
// worker reads them from its config (`tuning:`, docs/configuration.md) and dspark_bench from its command
// line, and both log them once at start-up. Turning one off measures what that optimisation buys on the same
// binary. The CPU backend ignores them.
#pragma once

#include <string>

namespace dspark {

struct Tuning {
  // Programmatic dependent launch (sm_90+; kernels/cuda/launch_policy.cpp): a kernel's launch and block
  // scheduling overlap the tail of the kernel before it. The same bits either way: every kernel waits for its
  // predecessors before it reads anything they write.
  bool pdl = true;
  // CudaBackend::prepare_weights rearranges the expert matrices into mma tiles and adds tiled copies of the
  // attention layers' matrices, the head and markov_head for the few-row kernels. Off, every matrix stays
  // row-major only: the experts and the Markov head give the same bits, the attention layers and the head go
  // through cuBLAS, whose own (deterministic) summation order may change the last bits.
  bool weight_tiles = true;
  // The head's tiled copy (about 4 % of the weights), read by the few-row kernel instead of cuBLAS; only with
  // weight_tiles. Off saves that memory.
  bool head_tiles = true;
  // Every rank on one host (2 to 8 ranks): each exchange point's buffers in peer memory over CUDA IPC, read
  // by the op that consumes them (the halves' sums inside the expand kernel, the argmax exchange inside the
  // Markov commit; NcclCommunicator::make_exchange), in rank order. Off, NCCL's collectives run instead.
  bool peer_sum = true;
  // The insert's fp8 block products, main_proj and each stage's wkv, also get bf16 copies, dequantised
  // exactly (LinearWeight::dequantised; twice their fp8 bytes), for products of many rows: a bf16 matrix
  // product on the activations' quantised values in place of the few-row kernel, whose cost grows with the
  // rows. Off saves that memory.
  bool bf16_copies = true;

  bool operator==(const Tuning&) const = default;
};

// One line for the start-up log, e.g. "pdl on, weight_tiles on, head_tiles off, peer_sum on".
std::string describe(const Tuning& t);

}  // namespace dspark
