// Re-sharded copies of a checkpoint for the index tests: every tensor of a source checkpoint written into the
// shard file a function picks, with model.safetensors.index.json listing them, plus index entries of tensors
// that exist in no file at all (a target checkpoint's shards the copy leaves out).
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/checkpoint/checkpoint.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark::test {

struct ExtraTensor {  // a tensor written into a shard beside the source's
  TensorSpec spec;
  std::string file;
};

// Copies `source` into the scratch folder `name`: tensor n goes into file shard_of(n); `extra` tensors (zero
// bytes of their shape) into theirs; `index_only` entries (tensor -> file) are listed in the index only.
inline std::filesystem::path sharded_copy(const std::filesystem::path& source, const std::string& name,
                                          const std::function<std::string(const std::string&)>& shard_of,
                                          const std::vector<ExtraTensor>& extra = {},
                                          const std::map<std::string, std::string>& index_only = {}) {
  const Checkpoint src(source);
  const std::filesystem::path dir = scratch_dir(name);
  std::filesystem::copy_file(src.config_path(), dir / "config.json");
  std::map<std::string, std::vector<TensorSpec>> specs;           // file -> its tensors
  std::map<std::string, std::vector<std::vector<uint8_t>>> data;  // in the same order
  nlohmann::json weight_map = nlohmann::json::object();
  for (const std::string& n : src.names()) {
    const TensorInfo& info = src.get(n);
    const std::string file = shard_of(n);
    specs[file].push_back({n, info.dtype, info.shape});
    data[file].emplace_back(info.nbytes);
    src.read(n, data[file].back().data());
    weight_map[n] = file;
  }
  for (const ExtraTensor& x : extra) {
    specs[x.file].push_back(x.spec);
    data[x.file].emplace_back(static_cast<size_t>(shape_numel(x.spec.shape)) * dtype_size(x.spec.dtype));
    weight_map[x.spec.name] = x.file;
  }
  for (const auto& [tensor, file] : index_only) weight_map[tensor] = file;
  for (const auto& [file, s] : specs) {
    SafetensorsWriter w(dir / file, s);
    for (size_t i = 0; i < s.size(); ++i) w.write(s[i].name, data[file][i].data(), data[file][i].size());
    w.finish();
  }
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", weight_map}}.dump(1);
  return dir;
}

}  // namespace dspark::test
