// Streaming safetensors writer: the header is fixed up front from the specs (offsets in spec order), then the
// data is appended tensor by tensor through a large buffer, so multi-GB outputs never sit in memory.
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/error.hpp"

namespace dspark {

struct SafetensorsWriter::Impl {
  std::filesystem::path path;
  std::vector<TensorSpec> specs;
  std::vector<uint64_t> sizes;
  FILE* f = nullptr;
  std::vector<char> buffer;  // stdio buffer: few, large write(2) calls
  size_t cur = 0;            // the tensor being written
  uint64_t written = 0;      // bytes of specs[cur] written so far

  ~Impl() {
    if (f) std::fclose(f);
  }
  [[noreturn]] void io_error(const char* what) const { fail("{}: {} failed", path.string(), what); }
  // Moves past tensors that are complete (including empty ones), unless `name` is the current one.
  void skip_complete(const std::string& name) {
    while (cur < specs.size() && written == sizes[cur] && specs[cur].name != name) ++cur, written = 0;
  }
};

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  m.specs = std::move(specs);

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorSpec& s : m.specs) {
    if (s.name.empty() || s.name == "__metadata__")
      fail("{}: invalid tensor name '{}'", path.string(), s.name);
    if (!seen.insert(s.name).second) fail("{}: tensor '{}' is specified twice", path.string(), s.name);
    uint64_t bytes = dtype_size(s.dtype);
    for (int64_t d : s.shape) {
      if (d < 0) fail("{}: tensor '{}' has negative shape {}", path.string(), s.name, shape_str(s.shape));
      bytes *= static_cast<uint64_t>(d);
    }
    header[s.name] = {{"dtype", dtype_safetensors_name(s.dtype)},
                      {"shape", s.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    m.sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  m.f = std::fopen(path.string().c_str(), "wb");
  if (!m.f) fail("{}: cannot create safetensors file", path.string());
  m.buffer.resize(size_t{8} << 20);
  std::setvbuf(m.f, m.buffer.data(), _IOFBF, m.buffer.size());
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, m.f) != 8 || std::fwrite(text.data(), 1, text.size(), m.f) != text.size())
    m.io_error("writing the header");
}

SafetensorsWriter::~SafetensorsWriter() = default;  // Impl closes the file; never throws

void SafetensorsWriter::write(const std::string& name, const void* data, size_t nbytes) {
  Impl& m = *impl_;
  if (!m.f) fail("{}: write of tensor '{}' after finish()", m.path.string(), name);
  m.skip_complete(name);
  if (m.cur == m.specs.size())
    fail("{}: tensor '{}' written, but every specified tensor is already complete", m.path.string(), name);
  const TensorSpec& s = m.specs[m.cur];
  if (s.name != name)
    fail("{}: tensor '{}' written, expected '{}' next ({} of {} bytes written)", m.path.string(), name,
         s.name, m.written, m.sizes[m.cur]);
  if (nbytes > m.sizes[m.cur] - m.written)
    fail("{}: {} bytes given for tensor '{}', only {} of its {} bytes are left", m.path.string(), nbytes,
         name, m.sizes[m.cur] - m.written, m.sizes[m.cur]);
  if (nbytes > 0 && std::fwrite(data, 1, nbytes, m.f) != nbytes) m.io_error("writing tensor data");
  m.written += nbytes;
}

void SafetensorsWriter::finish() {
  Impl& m = *impl_;
  if (!m.f) return;
  m.skip_complete("");
  if (m.cur < m.specs.size())
    fail("{}: tensor '{}' incomplete at finish() ({} of {} bytes written)", m.path.string(),
         m.specs[m.cur].name, m.written, m.sizes[m.cur]);
  FILE* f = m.f;
  m.f = nullptr;
  const bool flushed = std::fflush(f) == 0;
  if (std::fclose(f) != 0 || !flushed) m.io_error("closing the file");
}

}  // namespace dspark
