// An EXL3 weight's stored parts (SPEC §9) checked against its matrix and config.json before anything is read:
// the trellis, the input and output scales (or the legacy sign vectors), the codebook marker and the bit
// width its role may have.
#pragma once

#include <cstdint>
#include <string>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"

namespace dspark {

// Checks `base`'s parts for an [out, in] matrix; returns its bits per weight K. Each problem is an error
// naming the tensor and its file: a trellis that is not I16 [in/16, out/16, 16K] with K in 1..8, in or out
// not a multiple of 128, suh / svh not F16 [in] / [out] (or .su / .sv not I16 [in/16] / [out/16]), both
// codebook markers, a marker other than the config's codebook, K other than exl3_bits' for the role, a
// .bias (no linear of the drafter has one).
int64_t check_exl3_parts(const Checkpoint& ckpt, const ModelConfig& cfg, const std::string& base, int64_t out,
                         int64_t in);

}  // namespace dspark
