// A checkpoint directory: config.json plus one or more safetensors files, found through
// model.safetensors.index.json ("weight_map": tensor -> file) when present, else every *.safetensors file.
// Reads copy out of the mappings and are counted, so a test can check that a rank read only its shard.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/checkpoint/safetensors.hpp"

namespace dspark {

// Which tensors a Checkpoint holds, by name; an empty filter takes every tensor.
using TensorFilter = std::function<bool(const std::string&)>;

class Checkpoint {
 public:
  // Errors: missing directory, missing config.json, no safetensors file, an index naming a missing file, a
  // tensor listed in the index but absent from its file, the same tensor in two files. With a filter only the
  // tensors it takes are indexed; with model.safetensors.index.json only the files the index names for them
  // are opened, and the index's entries of other tensors (a target checkpoint's thousands, in files the
  // drafter never needs) are neither checked nor followed.
  explicit Checkpoint(const std::filesystem::path& dir, const TensorFilter& wanted = {});
  ~Checkpoint();

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path config_path() const { return dir_ / "config.json"; }

  bool has(const std::string& name) const;
  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  // Throws "checkpoint <dir>: tensor '<name>' is missing".
  const TensorInfo& get(const std::string& name) const;
  std::vector<std::string> names() const;

  // Copies the whole tensor (raw bytes, its own dtype) into dst (info.nbytes bytes).
  void read(const std::string& name, void* dst) const;
  // Rows [row0, row0 + rows) of a tensor of rank >= 1 (a row = product of the trailing dims). Throws when the
  // range is out of bounds.
  void read_rows(const std::string& name, int64_t row0, int64_t rows, void* dst) const;
  // Columns [col0, col0 + cols) of a 2-D tensor, every row: dst is [rows, cols] contiguous. Reads only those
  // bytes of each row.
  void read_cols(const std::string& name, int64_t col0, int64_t cols, void* dst) const;
  // For packed formats where a "column" is not one element (fp4: 2 per byte) callers pass byte columns:
  // bytes [byte0, byte0 + nbytes) of every row (index of dim 0) of a tensor of rank >= 2, a row being the
  // product of the trailing dims (an EXL3 trellis [in/16, out/16, 16K]: a range of its output tiles).
  void read_col_bytes(const std::string& name, uint64_t byte0, uint64_t nbytes, void* dst) const;

  // Total payload bytes copied out by the read_* calls since construction (or reset).
  uint64_t bytes_read() const { return bytes_read_.load(); }
  void reset_bytes_read() { bytes_read_ = 0; }

 private:
  const SafetensorsFile& file_of(const TensorInfo& info) const;

  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const TensorInfo*, const SafetensorsFile*>> index_;
  mutable std::atomic<uint64_t> bytes_read_{0};
};

// Streams tensors into one safetensors file: the header (padded to 8 bytes) is written by the constructor
// from the specs, then each tensor's data in the specs' order, so outputs of many GB never sit in memory.
struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
};
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorSpec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // Appends bytes of the next tensor; a tensor may be written in several calls. Throws when more bytes are
  // given than the specs leave or the name is not the one expected next.
  void write(const std::string& name, const void* data, size_t nbytes);
  // Checks every tensor was written completely and closes the file.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dspark
