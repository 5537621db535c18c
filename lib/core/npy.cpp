// .npy reader/writer. The header is a Python dict literal; only the three keys numpy writes are understood
// ('descr', 'fortran_order', 'shape'), parsed by hand so no Python-literal library is needed.
#include "lib/core/npy.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {
namespace {

static_assert(std::endian::native == std::endian::little, "npy I/O assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

struct Descr {
  std::string_view text;
  DType dtype;
};
// The first spelling of each dtype is the one written; '<u2' stands for bf16 bits (numpy has no bf16).
constexpr Descr kDescrs[] = {
    {"<f4", DType::f32}, {"<f2", DType::f16}, {"<u2", DType::bf16}, {"<i8", DType::i64}, {"<i4", DType::i32},
    {"<i2", DType::i16}, {"|u1", DType::u8},  {"<u1", DType::u8},   {"|i1", DType::i8},  {"<i1", DType::i8},
};

std::optional<DType> dtype_of_descr(std::string_view d) {
  for (const auto& e : kDescrs)
    if (e.text == d) return e.dtype;
  return std::nullopt;
}

std::string_view descr_of_dtype(DType t, const std::filesystem::path& path) {
  for (const auto& e : kDescrs)
    if (e.dtype == t) return e.text;
  fail("{}: dtype {} cannot be written to .npy", path.string(), dtype_name(t));
}

// A cursor over the header dict text; every error names the file.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::filesystem::path& path) : s_(text), path_(path) {}

  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool accept(char c) {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!accept(c)) bad(fmt::format("expected '{}'", c));
  }
  std::string quoted() {
    skip_ws();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) bad("expected a quoted string");
    const char q = s_[i_++];
    const size_t end = s_.find(q, i_);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string out(s_.substr(i_, end - i_));
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_ws();
    for (auto [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}})
      if (s_.substr(i_, word.size()) == word) return i_ += word.size(), value;
    bad("expected True or False");
  }
  Shape tuple() {
    Shape shape;
    expect('(');
    while (!accept(')')) {
      skip_ws();
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) bad("bad shape entry");
      int64_t v = 0;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) bad("shape entry too large");
        v = v * 10 + (s_[i_++] - '0');
      }
      shape.push_back(v);
      if (!accept(',')) {
        expect(')');
        break;
      }
    }
    return shape;
  }
  [[noreturn]] void bad(const std::string& what) const {
    fail("{}: bad .npy header ({} at offset {}): {}", path_.string(), what, i_, s_.substr(0, 200));
  }

 private:
  std::string_view s_;
  const std::filesystem::path& path_;
  size_t i_ = 0;
};

struct Header {
  std::string descr;
  bool fortran = false;
  Shape shape;
};

Header parse_header(std::string_view text, const std::filesystem::path& path) {
  HeaderParser p(text, path);
  Header h;
  bool seen_descr = false, seen_order = false, seen_shape = false;
  p.expect('{');
  while (!p.accept('}')) {
    const std::string key = p.quoted();
    p.expect(':');
    if (key == "descr") {
      h.descr = p.quoted(), seen_descr = true;
    } else if (key == "fortran_order") {
      h.fortran = p.boolean(), seen_order = true;
    } else if (key == "shape") {
      h.shape = p.tuple(), seen_shape = true;
    } else {
      p.bad(fmt::format("unknown key '{}'", key));
    }
    if (!p.accept(',')) {
      p.expect('}');
      break;
    }
  }
  if (!seen_descr || !seen_order || !seen_shape) p.bad("missing descr, fortran_order or shape");
  return h;
}

template <typename T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

std::vector<float> NpyArray::to_float() const {
  const size_t n = static_cast<size_t>(numel());
  std::vector<float> out(n);
  const uint8_t* p = bytes.data();
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::f32:
        out[i] = load_le<float>(p + 4 * i);
        break;
      case DType::f16:
        out[i] = f16_to_float(load_le<uint16_t>(p + 2 * i));
        break;
      case DType::bf16:
        out[i] = bf16_to_float(load_le<uint16_t>(p + 2 * i));
        break;
      case DType::i64:
        out[i] = static_cast<float>(load_le<int64_t>(p + 8 * i));
        break;
      case DType::i32:
        out[i] = static_cast<float>(load_le<int32_t>(p + 4 * i));
        break;
      case DType::i16:
        out[i] = static_cast<float>(load_le<int16_t>(p + 2 * i));
        break;
      case DType::i8:
        out[i] = static_cast<float>(static_cast<int8_t>(p[i]));
        break;
      case DType::u8:
        out[i] = static_cast<float>(p[i]);
        break;
      default:
        fail("npy: cannot convert dtype {} to float", dtype_name(dtype));
    }
  }
  return out;
}

std::vector<int64_t> NpyArray::to_int64() const {
  const size_t n = static_cast<size_t>(numel());
  std::vector<int64_t> out(n);
  const uint8_t* p = bytes.data();
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::i64:
        out[i] = load_le<int64_t>(p + 8 * i);
        break;
      case DType::i32:
        out[i] = load_le<int32_t>(p + 4 * i);
        break;
      case DType::i16:
        out[i] = load_le<int16_t>(p + 2 * i);
        break;
      case DType::i8:
        out[i] = static_cast<int8_t>(p[i]);
        break;
      case DType::u8:
        out[i] = p[i];
        break;
      default:
        fail("npy: cannot convert dtype {} to int64 (integer dtypes only)", dtype_name(dtype));
    }
  }
  return out;
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open .npy file", path.string());
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("{}: read error", path.string());

  if (file.size() < kMagicLen + 2 || std::memcmp(file.data(), kMagic, kMagicLen) != 0)
    fail("{}: not a .npy file (bad magic)", path.string());
  const uint8_t major = file[kMagicLen];
  size_t pos = kMagicLen + 2;
  size_t header_len = 0;
  if (major == 1) {
    if (file.size() < pos + 2) fail("{}: truncated .npy header", path.string());
    header_len = load_le<uint16_t>(file.data() + pos), pos += 2;
  } else if (major == 2 || major == 3) {  // 3.0 only changes the header's encoding to UTF-8
    if (file.size() < pos + 4) fail("{}: truncated .npy header", path.string());
    header_len = load_le<uint32_t>(file.data() + pos), pos += 4;
  } else {
    fail("{}: unsupported .npy format version {}.{}", path.string(), major, file[kMagicLen + 1]);
  }
  if (header_len > file.size() - pos) fail("{}: truncated .npy header", path.string());
  const std::string_view text(reinterpret_cast<const char*>(file.data() + pos), header_len);
  pos += header_len;

  const Header h = parse_header(text, path);
  if (h.fortran) fail("{}: fortran-order .npy arrays are not supported", path.string());
  if (!h.descr.empty() && h.descr[0] == '>')
    fail("{}: big-endian .npy data ('{}') is not supported", path.string(), h.descr);
  const auto dtype = dtype_of_descr(h.descr);
  if (!dtype) fail("{}: unsupported .npy descr '{}'", path.string(), h.descr);

  NpyArray a;
  a.dtype = *dtype;
  a.shape = h.shape;
  uint64_t nbytes = dtype_size(a.dtype);
  for (int64_t d : a.shape) {
    if (d != 0 && nbytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      fail("{}: .npy shape {} is too large", path.string(), shape_str(a.shape));
    nbytes *= static_cast<uint64_t>(d);
  }
  if (nbytes > file.size() - pos)
    fail("{}: .npy data is {} bytes, shape {} {} needs {}", path.string(), file.size() - pos,
         shape_str(a.shape), dtype_name(a.dtype), nbytes);
  a.bytes.assign(file.begin() + static_cast<std::ptrdiff_t>(pos),
                 file.begin() + static_cast<std::ptrdiff_t>(pos + nbytes));
  return a;
}

void write_npy(const std::filesystem::path& path, const NpyArray& array) {
  std::string dims;
  for (int64_t d : array.shape) {
    if (d < 0) fail("{}: negative dimension in shape {}", path.string(), shape_str(array.shape));
    dims += std::to_string(d) + ", ";
  }
  if (array.shape.size() > 1) dims.resize(dims.size() - 2);  // (n,) keeps its comma, (a, b) does not
  const size_t nbytes = static_cast<size_t>(array.numel()) * dtype_size(array.dtype);
  if (array.bytes.size() != nbytes)
    fail("{}: array holds {} bytes, shape {} {} needs {}", path.string(), array.bytes.size(),
         shape_str(array.shape), dtype_name(array.dtype), nbytes);
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   descr_of_dtype(array.dtype, path), dims);

  // As numpy does: the whole preamble (magic, version, length, dict, '\n') is padded with spaces to 64 bytes;
  // version 2.0 (4-byte length) only when the padded dict does not fit version 1.0's 2-byte length.
  const auto padded = [&](size_t preamble) {
    return (preamble + header.size() + 1 + 63) / 64 * 64 - preamble;
  };
  const bool v1 = padded(kMagicLen + 4) <= std::numeric_limits<uint16_t>::max();
  const size_t header_len = padded(kMagicLen + (v1 ? 4 : 6));
  header.append(header_len - header.size() - 1, ' ');
  header.push_back('\n');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create .npy file", path.string());
  out.write(kMagic, kMagicLen);
  const char version[2] = {static_cast<char>(v1 ? 1 : 2), 0};
  out.write(version, 2);
  if (v1) {
    const auto len = static_cast<uint16_t>(header.size());
    out.write(reinterpret_cast<const char*>(&len), 2);
  } else {
    const auto len = static_cast<uint32_t>(header.size());
    out.write(reinterpret_cast<const char*>(&len), 4);
  }
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(array.bytes.data()), static_cast<std::streamsize>(nbytes));
  out.close();
  if (!out) fail("{}: write failed", path.string());
}

}  // namespace dspark
