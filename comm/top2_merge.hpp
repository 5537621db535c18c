// Merging per-rank Top2 records into the global one: the same rule on every rank and in every communicator,
// so all ranks agree on every Markov token.
#pragma once

#include "model/backend.hpp"

// Callable from host code and, compiled by nvcc, from kernels (the NCCL communicator's merge kernel).
#if defined(__CUDACC__)
#define DSPARK_HOST_DEVICE __host__ __device__
#else
#define DSPARK_HOST_DEVICE
#endif

namespace dspark {

// The best of a and b (ties to the lower vocabulary id) with the larger of the remaining values as second.
inline DSPARK_HOST_DEVICE Top2 merge_top2(const Top2& a, const Top2& b) {
  const bool a_wins = a.best > b.best || (a.best == b.best && a.index <= b.index);
  const Top2& w = a_wins ? a : b;
  const Top2& l = a_wins ? b : a;
  Top2 out = w;
  out.second = w.second > l.best ? w.second : l.best;
  return out;
}

}  // namespace dspark
