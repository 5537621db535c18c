// Synthetic tiny checkpoints (SPEC §2's tiny config), dense or in the released fp8 / fp4 format, written once
// per test binary into a temp folder.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "lib/checkpoint/synthetic.hpp"
#include "lib/config/model_config.hpp"

namespace dspark::test {

// This process's scratch root, removed when the test binary exits.
inline const std::filesystem::path& scratch_root() {
  struct Root {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("dspark-test-" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Root root;
  return root.path;
}

inline std::filesystem::path scratch_dir(const std::string& name) {
  const auto dir = scratch_root() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The tiny checkpoint for `seed`, written on first use.
inline const std::filesystem::path& tiny_checkpoint(uint64_t seed = 7) {
  static const std::filesystem::path dir = [&] {
    auto d = scratch_dir("tiny-ckpt");
    SyntheticOptions opt;
    opt.seed = seed;
    opt.force = true;
    write_synthetic_checkpoint(tiny_model_config(), d, opt);
    return d;
  }();
  return dir;
}

// The same model in the released format (SyntheticFormat::fp8), written on first use.
inline const std::filesystem::path& tiny_fp8_checkpoint(uint64_t seed = 7) {
  static const std::filesystem::path dir = [&] {
    auto d = scratch_dir("tiny-fp8-ckpt");
    SyntheticOptions opt;
    opt.seed = seed;
    opt.force = true;
    write_synthetic_checkpoint(
        synthetic_model_config(tiny_model_config(), SyntheticFormat::fp8, ConfigLayout::inference), d, opt);
    return d;
  }();
  return dir;
}

}  // namespace dspark::test
