// The load-time re-quantisation of SPEC §3: a dense linear weight re-stored as fp8 block, so that its product
// runs as an fp8 linear (the input quantised per block of B, the weight's blocks dequantised, fp32 sums).
#pragma once

#include <cstdint>

#include "lib/model/backend.hpp"
#include "lib/model/weights.hpp"

namespace dspark {

// `dense` (bf16 / f16 / f32 [out, in] in backend memory: rows [row0, row0 + out) of a tensor of `rows` rows)
// as fp8 block with B = block: e4m3 codes [out, in], each value rounded to nearest even, and one e8m0 scale
// per B x B block, 2^ceil(log2(amax / 448)) of the block's largest magnitude (lib/core/block_quant; for bf16
// weights the same power of two as SPEC's amax * fp32(1/448)). The blocks are the whole tensor's, so every
// rank's part holds the bytes a whole-tensor quantisation gives those rows: row0 must be a multiple of B, and
// so must out unless the part ends at the tensor's last row. Throws, naming the weight, otherwise, or when
// the weight is not dense or the backend does not run fp8 block weights.
LinearWeight requantize_fp8_block(const LinearWeight& dense, int64_t block, int64_t row0, int64_t rows,
                                  Backend& backend);

}  // namespace dspark
