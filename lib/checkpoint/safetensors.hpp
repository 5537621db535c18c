// One safetensors file, memory-mapped: an 8-byte little-endian header length, a JSON header (parsed with
// nlohmann-json) naming each tensor's dtype, shape and [begin, end) data offsets, then the data.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "lib/core/dtype.hpp"
#include "lib/core/tensor.hpp"

namespace dspark {

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t offset = 0;  // absolute byte offset of the first element in the file
  uint64_t nbytes = 0;
  std::filesystem::path file;
};

class SafetensorsFile {
 public:
  // Maps the file read-only and validates the header: JSON well-formed, every dtype known, offsets inside the
  // data section, nbytes == numel * element size, no overlaps. Errors name the file (and the tensor).
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  // Pointer to the first byte of the tensor's data inside the mapping.
  const uint8_t* data(const TensorInfo& info) const;

 private:
  std::filesystem::path path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dspark
