#include "lib/bench/bench_format.hpp"

#include "lib/checkpoint/synthetic.hpp"

namespace dspark::bench {

const char* bench_format_name(BenchFormat f) {
  switch (f) {
    case BenchFormat::bf16:
      return "bf16";
    case BenchFormat::fp8:
      return "fp8";
    case BenchFormat::fp8_head:
      return "fp8 + fp8 head";
    case BenchFormat::exl3:
      return "exl3";
  }
  return "?";
}

ModelConfig config_for_format(ModelConfig cfg, BenchFormat f) {
  if (f == BenchFormat::exl3) return synthetic_model_config(cfg, SyntheticFormat::exl3, cfg.layout);
  if (f != BenchFormat::bf16) {
    cfg.dtype = "fp8";
    cfg.expert_dtype = "fp4";
  }
  return cfg;
}

}  // namespace dspark::bench
