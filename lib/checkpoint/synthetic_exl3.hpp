// Synthetic EXL3 weights (SPEC §9) in the seed's mix: the head, main_proj, the attention projections but
// wo_a, and both kinds of experts as trellises (random bits: every bit stream is a valid tail-biting
// trellis), with suh = +-a m_i and svh = +-n_j scales (m, n in [e^-0.35, e^0.35], a = 1 / (sqrt(in) * the
// codebook's std)) that keep a linear's output at its input's scale; wo_a in fp8 block; everything else
// dense.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"

namespace dspark {

// The seed's bits per weight by role (SPEC §9, the golden case's exl3_bits): head 6, main_proj 5, attention
// and shared expert 4, routed experts 2.
std::map<std::string, int64_t> seed_exl3_bits();

// Whether t is a trellis in a synthetic EXL3 checkpoint, and the base name of its parts ("head" for
// head.weight, else t.name).
bool synthetic_exl3_tensor(const DrafterTensor& t);
std::string synthetic_exl3_base(const DrafterTensor& t);
// K for t: cfg.exl3's bits for its role, else head_bits (the head) or bits.
int64_t synthetic_exl3_bits(const DrafterTensor& t, const ModelConfig& cfg);

// t's stored parts in file order: <base>.trellis I16 [in/16, out/16, 16K], <base>.suh F16 [in], <base>.svh
// F16 [out], and the codebook's marker (<base>.mul1 or .mcg, I32 []; 3inst has none).
std::vector<TensorSpec> synthetic_exl3_parts(const DrafterTensor& t, const ModelConfig& cfg);

// Tile rows [row0, row0 + rows) of t's trellis for `seed` ([rows, out/16, 16K] int16 into dst).
void synthetic_trellis_rows(const DrafterTensor& t, const ModelConfig& cfg, uint64_t seed, int64_t row0,
                            int64_t rows, int16_t* dst, int threads = 1);
// The value of every other part (suh, svh, the marker), whole, as stored.
std::vector<uint8_t> synthetic_exl3_part(const DrafterTensor& t, const ModelConfig& cfg,
                                         const TensorSpec& part, uint64_t seed);

}  // namespace dspark
