// A checkpoint directory: opens its safetensors files, builds one name -> tensor index and copies byte ranges
// out of the mappings. Every read is bounds-checked and counted, so ranks provably read only their shards.
#include "lib/checkpoint/checkpoint.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lib/core/error.hpp"

namespace dspark {
namespace {

namespace fs = std::filesystem;
constexpr const char* kIndexName = "model.safetensors.index.json";

// A shard of the index must be a plain file name in the checkpoint directory (no directory part, no "..").
bool plain_file_name(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
         f.find('\0') == std::string::npos;
}

// A shard file, by its resolved path (symlinks followed), must lie inside the checkpoint directory, or, in
// the Hugging Face cache's layout (<repo>/snapshots/<revision>/<file> linking to <repo>/blobs/<hash>), in its
// repository's blobs folder.
void check_inside(const fs::path& dir, const fs::path& file) {
  std::error_code ec;
  const fs::path d = fs::canonical(dir, ec), f = fs::canonical(file, ec);
  if (ec)
    fail("checkpoint {}: cannot resolve '{}': {}", dir.string(), file.filename().string(), ec.message());
  if (f.parent_path() == d) return;
  if (d.parent_path().filename() == "snapshots" && f.parent_path() == d.parent_path().parent_path() / "blobs")
    return;
  fail("checkpoint {}: shard '{}' resolves to {}, outside the checkpoint directory", dir.string(),
       file.filename().string(), f.string());
}

// The files named by the index's weight_map (tensor -> file): plain file names (SPEC §3: the shards sit in
// the checkpoint directory), each checked to exist when opened.
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  std::ifstream in(index_path);
  if (!in) fail("{}: cannot open", index_path.string());
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("{}: not well-formed JSON", index_path.string());
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail("{}: has no \"weight_map\" object", index_path.string());
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      fail("{}: weight_map entry of tensor '{}' is not a file name", index_path.string(), name);
    const std::string f = file.get<std::string>();
    if (!plain_file_name(f))
      fail("{}: weight_map entry of tensor '{}' names '{}', not a file name in the checkpoint directory",
           index_path.string(), name, f);
    map[name] = f;
  }
  return map;
}

}  // namespace

Checkpoint::Checkpoint(const fs::path& dir, const TensorFilter& wanted) : dir_(dir) {
  if (!fs::is_directory(dir_)) fail("checkpoint {}: not a directory", dir_.string());
  if (!fs::is_regular_file(config_path())) fail("checkpoint {}: config.json is missing", dir_.string());

  std::vector<fs::path> paths;
  std::map<std::string, std::string> weight_map;
  const fs::path index_path = dir_ / kIndexName;
  const auto take = [&](const std::string& name) { return !wanted || wanted(name); };
  if (fs::exists(index_path)) {
    weight_map = read_weight_map(index_path);
    std::erase_if(weight_map, [&](const auto& entry) { return !take(entry.first); });
    std::map<std::string, std::string> files;  // file -> the first tensor naming it, for the error message
    for (const auto& [name, file] : weight_map) files.emplace(file, name);
    for (const auto& [file, tensor] : files) {
      if (!fs::is_regular_file(dir_ / file))
        fail("checkpoint {}: {} names file '{}' (for tensor '{}'), which is missing", dir_.string(),
             kIndexName, file, tensor);
      check_inside(dir_, dir_ / file);
      paths.push_back(dir_ / file);
    }
  } else {
    for (const auto& entry : fs::directory_iterator(dir_))
      if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
        check_inside(dir_, entry.path());
        paths.push_back(entry.path());
      }
    std::sort(paths.begin(), paths.end());
  }
  if (paths.empty())
    fail("checkpoint {}: no safetensors file{}", dir_.string(),
         fs::exists(index_path) ? fmt::format(" ({} lists none of the tensors wanted)", kIndexName) : "");

  for (const auto& p : paths) {
    files_.push_back(std::make_unique<SafetensorsFile>(p));
    const SafetensorsFile& f = *files_.back();
    for (const auto& [name, info] : f.tensors()) {
      if (!take(name)) continue;
      const auto [it, inserted] = index_.emplace(name, std::pair{&info, &f});
      if (!inserted)
        fail("checkpoint {}: tensor '{}' is in both {} and {}", dir_.string(), name,
             it->second.second->path().filename().string(), p.filename().string());
    }
  }
  for (const auto& [name, file] : weight_map) {
    const auto it = index_.find(name);
    if (it == index_.end() || it->second.second->path() != dir_ / file)
      fail("checkpoint {}: tensor '{}' is listed in {} under {} but is not in that file", dir_.string(), name,
           kIndexName, file);
  }
}

Checkpoint::~Checkpoint() = default;

bool Checkpoint::has(const std::string& name) const {
  return index_.count(name) != 0;
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second.first;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) fail("checkpoint {}: tensor '{}' is missing", dir_.string(), name);
  return *t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, entry] : index_) out.push_back(name);
  return out;
}

const SafetensorsFile& Checkpoint::file_of(const TensorInfo& info) const {
  return *index_.at(info.name).second;
}

void Checkpoint::read(const std::string& name, void* dst) const {
  const TensorInfo& t = get(name);
  if (t.nbytes > 0) std::memcpy(dst, file_of(t).data(t), t.nbytes);
  bytes_read_ += t.nbytes;
}

void Checkpoint::read_rows(const std::string& name, int64_t row0, int64_t rows, void* dst) const {
  const TensorInfo& t = get(name);
  if (t.shape.empty()) fail("checkpoint {}: read_rows of scalar tensor '{}'", dir_.string(), name);
  const int64_t n = t.shape[0];
  if (row0 < 0 || rows < 0 || row0 > n || rows > n - row0)
    fail("checkpoint {}: rows [{}, {}) of tensor '{}' are outside its {} rows", dir_.string(), row0,
         row0 + rows, name, n);
  if (rows == 0) return;
  const uint64_t row_bytes = t.nbytes / static_cast<uint64_t>(n);
  const uint64_t bytes = row_bytes * static_cast<uint64_t>(rows);
  std::memcpy(dst, file_of(t).data(t) + row_bytes * static_cast<uint64_t>(row0), bytes);
  bytes_read_ += bytes;
}

void Checkpoint::read_cols(const std::string& name, int64_t col0, int64_t cols, void* dst) const {
  const TensorInfo& t = get(name);
  if (t.shape.size() != 2)
    fail("checkpoint {}: read_cols of tensor '{}' needs a 2-D tensor, shape is {}", dir_.string(), name,
         shape_str(t.shape));
  const int64_t n = t.shape[1];
  if (col0 < 0 || cols < 0 || col0 > n || cols > n - col0)
    fail("checkpoint {}: columns [{}, {}) of tensor '{}' are outside its {} columns", dir_.string(), col0,
         col0 + cols, name, n);
  const uint64_t es = dtype_size(t.dtype);
  read_col_bytes(name, static_cast<uint64_t>(col0) * es, static_cast<uint64_t>(cols) * es, dst);
}

void Checkpoint::read_col_bytes(const std::string& name, uint64_t byte0, uint64_t nbytes, void* dst) const {
  const TensorInfo& t = get(name);
  if (t.shape.size() < 2)
    fail("checkpoint {}: read_col_bytes of tensor '{}' needs a tensor of 2 or more dimensions, shape is {}",
         dir_.string(), name, shape_str(t.shape));
  const auto rows = static_cast<uint64_t>(t.shape[0]);
  const uint64_t row_bytes = rows == 0 ? 0 : t.nbytes / rows;
  if (byte0 > row_bytes || nbytes > row_bytes - byte0)
    fail("checkpoint {}: bytes [{}, {}) of each row of tensor '{}' are outside its {}-byte rows",
         dir_.string(), byte0, byte0 + nbytes, name, row_bytes);
  if (nbytes == 0 || rows == 0) return;
  // Only each row's slice is touched, so the pages of the other columns need never be faulted in.
  const uint8_t* src = file_of(t).data(t) + byte0;
  auto* out = static_cast<uint8_t*>(dst);
  for (uint64_t r = 0; r < rows; ++r) std::memcpy(out + r * nbytes, src + r * row_bytes, nbytes);
  bytes_read_ += rows * nbytes;
}

}  // namespace dspark
