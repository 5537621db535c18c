#include "lib/model/shard_plan.hpp"

#include <algorithm>

#include "lib/core/error.hpp"

namespace dspark {

Range split_even(int64_t units, int rank, int ranks) {
  const int64_t base = units / ranks, extra = units % ranks;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

namespace {

// Channels [0, n) cut on `unit` boundaries; the last unit may be partial only for the vocabulary.
Range split_units(int64_t n, int64_t unit, int rank, int ranks, const char* what, bool allow_partial_unit) {
  if (ranks == 1) return {0, n};
  if (!allow_partial_unit && n % unit != 0)
    fail("cannot split {} ({}) over {} ranks: not a multiple of {}", what, n, ranks, unit);
  const int64_t units = (n + unit - 1) / unit;
  if (units < ranks)
    fail("cannot split {} ({}) over {} ranks: only {} units of {}", what, n, ranks, units, unit);
  const Range r = split_even(units, rank, ranks);
  return {r.begin * unit, std::min(n, r.end * unit)};
}

}  // namespace

ShardPlan make_shard_plan(const ModelConfig& c, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) fail("bad rank {} of {}", rank, ranks);
  if (c.n_heads % ranks != 0) fail("cannot split {} attention heads evenly over {} ranks", c.n_heads, ranks);
  if (c.o_groups % ranks != 0) fail("cannot split {} output groups evenly over {} ranks", c.o_groups, ranks);
  ShardPlan p;
  p.rank = rank;
  p.ranks = ranks;
  const int64_t heads = c.n_heads / ranks, groups = c.o_groups / ranks;
  p.heads = {rank * heads, (rank + 1) * heads};
  p.groups = {rank * groups, (rank + 1) * groups};
  p.inter = split_units(c.moe_inter_dim, kInterUnit, rank, ranks, "moe_inter_dim", false);
  p.shared_inter = split_units(c.moe_inter_dim * c.n_shared_experts, kInterUnit, rank, ranks,
                               "the shared expert width", false);
  p.vocab = split_units(c.vocab_size, kVocabTile, rank, ranks, "vocab_size", true);
  return p;
}

}  // namespace dspark
