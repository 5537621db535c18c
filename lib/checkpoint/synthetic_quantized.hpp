// Synthetic linear weights in a quantised representation (SPEC §3): a linear's bf16 synthetic values
// (synthetic_values) quantised by lib/core/block_quant's weight rules, a range of whole rows at a time, so a
// tensor of many GB is written in chunks and the bytes do not depend on the chunking or the threads.
#pragma once

#include <cstdint>

#include "lib/checkpoint/tensor_table.hpp"
#include "lib/core/weight_format.hpp"

namespace dspark {

// Rows [row0, row0 + rows) of linear t ([out, in], bf16 synthetic values for `seed`) stored as f:
//   fp8_block: e4m3 codes [rows, in] into `weight`, e8m0 scales [ceil(rows / B), ceil(in / B)] into `scale`,
//              B = block; row0 must be a multiple of B, and so must rows unless the range ends at row out.
//   fp4: packed e2m1 [rows, in / 2] (element 2j in the low nibble of byte j) into `weight`, e8m0 scales
//        [rows, in / 32] into `scale`; in must be a multiple of 32.
// `threads` workers split the rows on block boundaries. Throws, naming the tensor, for any other format or a
// range that breaks these rules.
void synthetic_quantized_rows(const DrafterTensor& t, WeightFormat f, int64_t block, uint64_t seed,
                              int64_t row0, int64_t rows, uint8_t* weight, uint8_t* scale, int threads = 1);

}  // namespace dspark
