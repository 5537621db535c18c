// Which part of each drafter tensor a rank holds (SPEC §5): the whole tensor, a range of rows (the leading
// dimension) or a range of columns. The weight loader reads exactly this part and dspark_inspect prints it.
#pragma once

#include <cstdint>
#include <string>

#include "lib/checkpoint/tensor_table.hpp"
#include "lib/model/shard_plan.hpp"

namespace dspark {

struct TensorSplit {
  enum class Kind { replicated, rows, cols } kind = Kind::replicated;
  int64_t begin = 0;  // first row / column held (0 when replicated)
  int64_t count = 0;  // rows / columns held (the whole leading dimension when replicated)
};

TensorSplit tensor_split(const DrafterTensor& t, const ModelConfig& cfg, const ShardPlan& plan);

// Elements of t this rank holds under the split.
int64_t split_numel(const DrafterTensor& t, const TensorSplit& s);

}  // namespace dspark
