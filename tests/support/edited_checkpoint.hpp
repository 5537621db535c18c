// Broken checkpoints for the load-error tests: a copy of a checkpoint with tensors changed or dropped, and
// the message a CPU-backend load of it throws.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/error.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark::test {

// Returns false to drop the tensor; may change its spec and bytes.
using TensorEdit = std::function<bool(TensorSpec&, std::vector<uint8_t>&)>;

// A tensor a copy adds.
struct ExtraTensor {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};

// Copies `source` (config.json and every tensor, one shard) into the scratch folder `name`, through `edit`,
// then adds `extra`.
inline std::filesystem::path edited_checkpoint(const std::filesystem::path& source, const std::string& name,
                                               const TensorEdit& edit,
                                               const std::vector<ExtraTensor>& extra = {}) {
  const Checkpoint src(source);
  const std::filesystem::path dir = scratch_dir(name);
  std::filesystem::copy_file(src.config_path(), dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::vector<TensorSpec> specs;
  std::vector<std::vector<uint8_t>> data;
  for (const std::string& n : src.names()) {
    const TensorInfo& info = src.get(n);
    TensorSpec spec{n, info.dtype, info.shape};
    std::vector<uint8_t> bytes(info.nbytes);
    src.read(n, bytes.data());
    if (!edit(spec, bytes)) continue;
    specs.push_back(spec);
    data.push_back(std::move(bytes));
  }
  for (const ExtraTensor& e : extra) {
    specs.push_back(e.spec);
    data.push_back(e.bytes);
  }
  SafetensorsWriter w(dir / "model.safetensors", specs);
  for (size_t i = 0; i < specs.size(); ++i) w.write(specs[i].name, data[i].data(), data[i].size());
  w.finish();
  return dir;
}

// The error a tp = 1 load of `dir` on the CPU backend throws, or "loaded without error".
inline std::string load_error(const std::filesystem::path& dir) {
  try {
    const Checkpoint ckpt(dir);
    const ModelConfig cfg = load_model_config(ckpt.config_path());
    CpuBackend be;
    load_drafter_weights(ckpt, cfg, make_shard_plan(cfg, 0, 1), be);
  } catch (const Error& e) {
    return e.what();
  }
  return "loaded without error";
}

}  // namespace dspark::test
