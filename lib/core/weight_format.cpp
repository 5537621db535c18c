#include "lib/core/weight_format.hpp"

#include "lib/core/block_quant.hpp"
#include "lib/core/error.hpp"
#include "lib/core/exl3.hpp"

namespace dspark {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::dense:
      return "dense";
    case WeightFormat::fp8_block:
      return "fp8 block";
    case WeightFormat::fp4:
      return "fp4";
    case WeightFormat::exl3:
      return "EXL3";
    case WeightFormat::bf16_mma_tiles:
      return "bf16 in mma tiles";
    case WeightFormat::fp8_mma_tiles:
      return "fp8 block in mma tiles";
    case WeightFormat::fp4_mma_tiles:
      return "fp4 in mma tiles";
  }
  return "?";
}

Shape stored_weight_shape(WeightFormat f, int64_t out, int64_t in) {
  switch (f) {
    case WeightFormat::dense:
    case WeightFormat::fp8_block:
      return {out, in};
    case WeightFormat::fp4:
      return {out, in / 2};
    default:
      fail("stored_weight_shape: {} has no stored weight of this kind", weight_format_name(f));
  }
}

std::optional<Shape> stored_scale_shape(WeightFormat f, int64_t out, int64_t in, int64_t block) {
  switch (f) {
    case WeightFormat::fp8_block:
      return Shape{ceil_div(out, block), ceil_div(in, block)};
    case WeightFormat::fp4:
      return Shape{out, in / kFp4Block};
    default:
      return std::nullopt;
  }
}

bool is_weight_dtype(WeightFormat f, DType t) {
  switch (f) {
    case WeightFormat::dense:
      return t == DType::bf16 || t == DType::f16 || t == DType::f32;
    case WeightFormat::fp8_block:
      return t == DType::f8_e4m3;
    case WeightFormat::fp4:
      return t == DType::i8 || t == DType::u8;
    case WeightFormat::exl3:
      return t == DType::i16;  // the trellis
    default:
      return false;
  }
}

int64_t row_alignment(WeightFormat f, int64_t block) {
  switch (f) {
    case WeightFormat::fp8_block:
      return block;
    case WeightFormat::exl3:  // the output transform's 128-blocks
      return kExl3HadamardBlock;
    default:
      return 1;
  }
}

int64_t col_alignment(WeightFormat f, int64_t block) {
  switch (f) {
    case WeightFormat::fp8_block:
      return block;
    case WeightFormat::fp4:
      return kFp4Block;
    case WeightFormat::exl3:  // the input transform's 128-blocks
      return kExl3HadamardBlock;
    default:
      return 1;
  }
}

}  // namespace dspark
