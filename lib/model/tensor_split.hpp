// Which part of each drafter tensor a rank holds (SPEC §5): the whole tensor, a range of rows (the leading
// dimension) or a range of columns. The weight loader reads exactly this part and dspark_inspect prints it.
#pragma once

#include <cstdint>
#include <string>

#include "lib/checkpoint/tensor_table.hpp"
#include "lib/core/weight_format.hpp"
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
// Elements of a stored tensor of this shape held under a split of its own rows / columns.
int64_t split_numel(const Shape& shape, const TensorSplit& s);

// The split of one stored part of a linear in format f ("<name>.weight" or "<name>.scale", of shape
// `part_shape`) that the linear's split s holds, in that part's own rows or columns: the weight of dense and
// fp8 block as s; fp4's packed weight columns halved (two elements a byte); fp8 block scales the B x B blocks
// the range touches; fp4 scales the rows, or the columns / 32. A replicated s holds every row. What the
// loader reads and dspark_inspect counts.
enum class StoredPart { weight, scale };
TensorSplit stored_part_split(WeightFormat f, StoredPart part, const TensorSplit& s, int64_t block,
                              const Shape& part_shape);

}  // namespace dspark
