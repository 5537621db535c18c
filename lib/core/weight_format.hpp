// The representations a linear weight is stored in (SPEC §3) and what each one is made of: its stored parts
// with their dtypes and shapes, and the alignment a shard's cut must keep. The weight loader checks a
// checkpoint against this table rather than knowing the formats itself.
#pragma once

#include <cstdint>
#include <optional>

#include "lib/core/dtype.hpp"
#include "lib/core/tensor.hpp"

namespace dspark {

// dense: [out, in] row-major bf16 / f16 / f32. fp8_block: e4m3 [out, in] + e8m0 scales per B x B block. fp4:
// packed e2m1 [out, in / 2] + e8m0 scales per 32 inputs of a row. exl3: exllamav3's trellis (SPEC §9).
// bf16_mma_tiles: a dense bf16 matrix rearranged by the CUDA backend (Backend::prepare_weights) into the
// order its tensor-core kernels load it (kernels/cuda/mma_tile.cuh); fp8_mma_tiles / fp4_mma_tiles: an fp8
// block / fp4 weight (and fp4's scales) rearranged likewise (kernels/cuda/quant_tile.cuh), same bytes. No
// checkpoint holds those three.
enum class WeightFormat { dense, fp8_block, fp4, exl3, bf16_mma_tiles, fp8_mma_tiles, fp4_mma_tiles };

const char* weight_format_name(WeightFormat f);

// The stored shape of the weight part ("<name>.weight") of an [out, in] matrix.
Shape stored_weight_shape(WeightFormat f, int64_t out, int64_t in);
// The stored shape of the scale part ("<name>.scale"), for the formats that have one; B = the fp8 block size.
std::optional<Shape> stored_scale_shape(WeightFormat f, int64_t out, int64_t in, int64_t block);
// Whether `t` may hold the weight part of format f.
bool is_weight_dtype(WeightFormat f, DType t);

// A row or column cut of a shard must fall on a multiple of these (a block must not straddle two ranks).
int64_t row_alignment(WeightFormat f, int64_t block);
int64_t col_alignment(WeightFormat f, int64_t block);

}  // namespace dspark
