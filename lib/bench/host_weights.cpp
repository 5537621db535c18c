#include "lib/bench/host_weights.hpp"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/synthetic.hpp"
#include "lib/model/load_weights.hpp"

namespace dspark::bench {
namespace {

// A directory removed when the object goes, whatever ends the load.
struct TemporaryDirectory {
  std::filesystem::path path;
  explicit TemporaryDirectory(int rank)
      : path(std::filesystem::temp_directory_path() /
             ("dspark-bench-" + std::to_string(::getpid()) + "-rank" + std::to_string(rank))) {}
  ~TemporaryDirectory() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
};

}  // namespace

DrafterWeights load_host_weights(const ModelConfig& cfg, const ShardPlan& plan, Backend& backend,
                                 uint64_t seed, BenchFormat format, int rank) {
  const ModelConfig stored =
      format == BenchFormat::exl3
          ? cfg  // config_for_format's: the seed's mix
          : synthetic_model_config(cfg,
                                   format == BenchFormat::bf16 ? SyntheticFormat::bf16 : SyntheticFormat::fp8,
                                   ConfigLayout::inference);
  TemporaryDirectory dir(rank);
  SyntheticOptions opt;
  opt.seed = seed;
  opt.force = true;  // a directory left by an earlier process of the same pid
  opt.threads = 1;   // the ranks share the host's cores
  write_synthetic_checkpoint(stored, dir.path, opt);
  const Checkpoint ckpt(dir.path);
  LoadOptions load;
  load.head_fp8 = format == BenchFormat::fp8_head;
  return load_drafter_weights(ckpt, load_model_config(ckpt.config_path()), plan, backend, load);
}

}  // namespace dspark::bench
