#include "lib/bench/bench_format.hpp"

namespace dspark::bench {

const char* bench_format_name(BenchFormat f) {
  switch (f) {
    case BenchFormat::bf16:
      return "bf16";
    case BenchFormat::fp8:
      return "fp8";
    case BenchFormat::fp8_head:
      return "fp8 + fp8 head";
  }
  return "?";
}

ModelConfig config_for_format(ModelConfig cfg, BenchFormat f) {
  if (f != BenchFormat::bf16) {
    cfg.dtype = "fp8";
    cfg.expert_dtype = "fp4";
  }
  return cfg;
}

}  // namespace dspark::bench
