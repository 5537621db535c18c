// One rank's best two logits of one request at one Markov position, and the one rule that merges two of them.
// Dependency-free and callable from kernels: the CPU communicators, the NCCL merge kernel and the CUDA Markov
// kernels all fold records with merge_top2, so every rank and every backend agree on every Markov token.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSPARK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DSPARK_HOST_DEVICE inline
#endif

namespace dspark {

// `index` is the global vocabulary id of `best`; ties go to the lower id.
struct Top2 {
  float best;
  float second;
  int32_t index;
  int32_t pad;
};
static_assert(sizeof(Top2) == 16);

// The top two of the union of two candidate sets: the better best (ties to the lower id; on equal ids, a),
// and the larger of the winner's second and the loser's best. Commutative and associative on distinct ids, so
// any merge order gives a sequential scan's answer.
DSPARK_HOST_DEVICE Top2 merge_top2(const Top2& a, const Top2& b) {
  const bool a_wins = a.best > b.best || (a.best == b.best && a.index <= b.index);
  // Selects on values rather than references to a or b: kernels keep the records in registers.
  const float w_second = a_wins ? a.second : b.second;
  const float l_best = a_wins ? b.best : a.best;
  Top2 out;
  out.best = a_wins ? a.best : b.best;
  out.index = a_wins ? a.index : b.index;
  out.second = (w_second < l_best) ? l_best : w_second;
  out.pad = 0;
  return out;
}

}  // namespace dspark
