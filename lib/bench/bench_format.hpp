// The weight formats dspark_bench measures a synthetic drafter in.
#pragma once

#include "lib/config/model_config.hpp"

namespace dspark::bench {

// bf16 (every linear dense); fp8 (the released layout: the linears config.json's dtype governs fp8 block, the
// routed experts fp4, SPEC §3, quantised from the bf16 values by SPEC §3's weight rules); fp8_head (fp8, and
// the head re-quantised to fp8 block as the load-time option does).
enum class BenchFormat { bf16, fp8, fp8_head, exl3 };
const char* bench_format_name(BenchFormat f);
// The config a format's weights are described by (fp8: dtype fp8, expert_dtype fp4; exl3: the seed's EXL3
// mix, synthetic_model_config's).
ModelConfig config_for_format(ModelConfig cfg, BenchFormat f);

}  // namespace dspark::bench
