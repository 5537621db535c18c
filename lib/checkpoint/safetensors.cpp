// Maps a safetensors file read-only and validates its header before anything reads from it, so a corrupt or
// truncated file fails at load time with the file and tensor named, never later with a bad read.
#include "lib/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "lib/core/error.hpp"

namespace dspark {
namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; a larger length means a corrupt file.
constexpr uint64_t kMaxHeader = 100'000'000;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A JSON value as a non-negative integer, or an error naming what it is.
uint64_t as_count(const json& v, const std::string& what, const std::string& tensor,
                  const std::string& file) {
  if (!v.is_number_integer())
    fail("{}: tensor '{}': {} must be an integer, got {}", file, tensor, what, v.dump());
  if (!v.is_number_unsigned()) fail("{}: tensor '{}': {} is negative ({})", file, tensor, what, v.dump());
  return v.get<uint64_t>();
}

TensorInfo parse_entry(const std::string& name, const json& e, uint64_t data_start, uint64_t data_size,
                       const std::filesystem::path& path) {
  const std::string file = path.string();
  if (!e.is_object()) fail("{}: header entry of tensor '{}' is not an object", file, name);
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) fail("{}: tensor '{}' has no '{}' in the header", file, name, key);

  TensorInfo t;
  t.name = name;
  t.file = path;
  const json& dt = e["dtype"];
  if (!dt.is_string()) fail("{}: tensor '{}': dtype is not a string", file, name);
  const auto dtype = dtype_from_safetensors(dt.get_ref<const std::string&>());
  if (!dtype) fail("unknown dtype '{}' of tensor '{}' in {}", dt.get_ref<const std::string&>(), name, file);
  t.dtype = *dtype;

  const json& shape = e["shape"];
  if (!shape.is_array()) fail("{}: tensor '{}': shape is not an array", file, name);
  uint64_t numel = 1;
  for (const json& d : shape) {
    const uint64_t v = as_count(d, "shape entry", name, file);
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        (v != 0 && numel > std::numeric_limits<uint64_t>::max() / v))
      fail("{}: tensor '{}': shape {} is too large", file, name, shape.dump());
    numel *= v;
    t.shape.push_back(static_cast<int64_t>(v));
  }

  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    fail("{}: tensor '{}': data_offsets is not [begin, end]", file, name);
  const uint64_t begin = as_count(off[0], "data_offsets[0]", name, file);
  const uint64_t end = as_count(off[1], "data_offsets[1]", name, file);
  if (begin > end) fail("{}: tensor '{}': data_offsets [{}, {}) has begin > end", file, name, begin, end);
  if (end > data_size)
    fail("{}: tensor '{}': data_offsets [{}, {}) lie outside the data section of {} bytes (truncated file?)",
         file, name, begin, end, data_size);
  const uint64_t esize = dtype_size(t.dtype);
  if (numel > std::numeric_limits<uint64_t>::max() / esize || end - begin != numel * esize)
    fail("{}: tensor '{}': {} bytes in data_offsets, shape {} {} needs {}", file, name, end - begin,
         shape_str(t.shape), dtype_name(t.dtype), numel * esize);
  t.offset = data_start + begin;
  t.nbytes = end - begin;
  return t;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : path_(path) {
  const std::string file = path.string();
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open safetensors file: {}", file, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", file, std::strerror(err));
  }
  map_size_ = static_cast<size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    fail("{}: truncated safetensors file ({} bytes, shorter than the 8-byte header length)", file, map_size_);
  }
  void* m = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) fail("{}: mmap failed: {}", file, std::strerror(map_err));
  map_ = static_cast<const uint8_t*>(m);

  try {
    const uint64_t header_len = read_u64_le(map_);
    if (header_len > kMaxHeader) fail("{}: header length {} is not sane (corrupt file?)", file, header_len);
    if (header_len > map_size_ - 8)
      fail("{}: truncated safetensors file: header length {} exceeds the {} bytes after it", file, header_len,
           map_size_ - 8);
    const uint64_t data_start = 8 + header_len;
    const uint64_t data_size = map_size_ - data_start;

    const json header = json::parse(map_ + 8, map_ + data_start, nullptr, /*allow_exceptions=*/false);
    if (header.is_discarded()) fail("{}: safetensors header is not well-formed JSON", file);
    if (!header.is_object()) fail("{}: safetensors header is not a JSON object", file);

    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) fail("{}: __metadata__ is not an object", file);
        for (const auto& [k, v] : entry.items())
          metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
        continue;
      }
      tensors_.emplace(name, parse_entry(name, entry, data_start, data_size, path));
    }

    // Sorted by offset, each non-empty tensor must start at or after the end of the previous one.
    std::vector<const TensorInfo*> by_offset;
    for (const auto& [name, t] : tensors_)
      if (t.nbytes > 0) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const TensorInfo& a = *by_offset[i - 1];
      const TensorInfo& b = *by_offset[i];
      if (b.offset < a.offset + a.nbytes)
        fail("{}: data of tensors '{}' and '{}' overlap", file, a.name, b.name);
    }
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const uint8_t* SafetensorsFile::data(const TensorInfo& info) const {
  if (info.offset + info.nbytes > map_size_)
    fail("{}: tensor '{}' lies outside the mapping", path_.string(), info.name);
  return map_ + info.offset;
}

}  // namespace dspark
