// Finding NaN and Inf in raw tensor bytes, as the loader reads them: one pass over the bytes while they are
// hot, cheap enough to run on every weight of a checkpoint.
#pragma once

#include <cstdint>

#include "lib/core/dtype.hpp"

namespace dspark {

// The index of the first element of `count` elements of `dtype` at `data` that is not finite: bf16, f16 and
// f32 with an exponent of all ones (NaN or +-Inf), e4m3fn's NaN codes 0x7f / 0xff (it has no infinities),
// e8m0's NaN 0xff. -1 when every element is finite, and always for integer types. `data` needs no alignment.
int64_t first_non_finite(DType dtype, const void* data, int64_t count);

// Copies `count` bf16 values from src to dst and returns first_non_finite of them, in one pass: each 4 KiB
// piece is checked in dst right after its copy, while it is in the cache. The buffers must not overlap.
int64_t copy_bf16_first_non_finite(void* dst, const void* src, int64_t count);

}  // namespace dspark
