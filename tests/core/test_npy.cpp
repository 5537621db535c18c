// .npy round trips of every supported dtype, files written by numpy (the golden case), and header errors.
#include <gtest/gtest.h>

#include <unistd.h>
#include "tests/support/golden.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lib/core/error.hpp"
#include "lib/core/npy.hpp"
#include "lib/core/numeric.hpp"

namespace fs = std::filesystem;
using namespace dspark;

namespace {

const fs::path kGolden = fs::path(DSPARK_SHARED_DIR) / "golden" / "tiny-v41";

// A fresh directory under the system temp dir, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("dspark_npy_" + std::to_string(::getpid()) + "_" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "_" +
            std::to_string(counter++));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

template <typename T>
NpyArray make_array(DType dtype, Shape shape, const std::vector<T>& values) {
  NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(a.bytes.data(), values.data(), a.bytes.size());
  return a;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A minimal version-1.0 .npy file with the given header dict and data.
std::string npy_v1(const std::string& dict, const std::string& data) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h + data;
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Npy, RoundTripEveryDtype) {
  TempDir dir;
  const std::vector<NpyArray> arrays = {
      make_array<float>(DType::f32, {2, 3}, {0.0f, -1.5f, 3.25f, 1e-30f, -65504.0f, 7.0f}),
      make_array<uint16_t>(
          DType::f16, {4},
          {float_to_f16(1.0f), float_to_f16(-2.5f), float_to_f16(0.0f), float_to_f16(65504.0f)}),
      make_array<uint16_t>(DType::bf16, {3, 1},
                           {float_to_bf16(1.0f), float_to_bf16(-0.375f), float_to_bf16(3e38f)}),
      make_array<int64_t>(DType::i64, {2, 2}, {0, -1, int64_t{1} << 40, -(int64_t{1} << 50)}),
      make_array<int32_t>(DType::i32, {3}, {7, -8, 2147483647}),
      make_array<int16_t>(DType::i16, {2}, {-32768, 12}),
      make_array<uint8_t>(DType::u8, {5}, {0, 1, 127, 128, 255}),
      make_array<int8_t>(DType::i8, {2}, {-128, 127}),
  };
  for (const NpyArray& a : arrays) {
    SCOPED_TRACE(std::string(dtype_name(a.dtype)));
    const fs::path p = dir.path / (std::string(dtype_name(a.dtype)) + ".npy");
    write_npy(p, a);
    const NpyArray b = read_npy(p);
    EXPECT_EQ(b.dtype, a.dtype);
    EXPECT_EQ(b.shape, a.shape);
    EXPECT_EQ(b.bytes, a.bytes);
    EXPECT_EQ(fs::file_size(p) % 64, a.bytes.size() % 64);  // the header is padded to 64 bytes, as numpy does
  }
  EXPECT_EQ(read_npy(dir.path / "f32.npy").to_float(),
            (std::vector<float>{0.0f, -1.5f, 3.25f, 1e-30f, -65504.0f, 7.0f}));
  EXPECT_EQ(read_npy(dir.path / "f16.npy").to_float(), (std::vector<float>{1.0f, -2.5f, 0.0f, 65504.0f}));
  EXPECT_EQ(read_npy(dir.path / "bf16.npy").to_float()[1], -0.375f);
  EXPECT_EQ(read_npy(dir.path / "i64.npy").to_int64(),
            (std::vector<int64_t>{0, -1, int64_t{1} << 40, -(int64_t{1} << 50)}));
  EXPECT_EQ(read_npy(dir.path / "i32.npy").to_int64(), (std::vector<int64_t>{7, -8, 2147483647}));
  EXPECT_EQ(read_npy(dir.path / "u8.npy").to_int64(), (std::vector<int64_t>{0, 1, 127, 128, 255}));
  EXPECT_EQ(read_npy(dir.path / "i8.npy").to_float(), (std::vector<float>{-128.0f, 127.0f}));
  EXPECT_THROW(read_npy(dir.path / "f32.npy").to_int64(), Error);
}

TEST(Npy, RoundTripScalarEmptyAndOneDim) {
  TempDir dir;
  for (const Shape& shape : {Shape{}, Shape{0}, Shape{1}, Shape{3, 0, 2}}) {
    SCOPED_TRACE(shape_str(shape));
    NpyArray a = make_array<float>(DType::f32, shape,
                                   std::vector<float>(static_cast<size_t>(shape_numel(shape)), 2.0f));
    write_npy(dir.path / "a.npy", a);
    const NpyArray b = read_npy(dir.path / "a.npy");
    EXPECT_EQ(b.shape, a.shape);
    EXPECT_EQ(b.bytes, a.bytes);
  }
}

TEST(Npy, ReadsFloat32WrittenByNumpy) {
  DSPARK_SKIP_WITHOUT_GOLDEN();
  const NpyArray a = read_npy(kGolden / "rows_slot0.npy");
  EXPECT_EQ(a.dtype, DType::f32);
  EXPECT_EQ(a.shape, (Shape{11, 768}));
  ASSERT_EQ(a.bytes.size(), 11u * 768u * 4u);
  EXPECT_EQ(a.to_float()[0], -0.11181640625f);  // bytes 00 00 e5 bd
}

TEST(Npy, WritesTheSameBytesAsNumpy) {
  DSPARK_SKIP_WITHOUT_GOLDEN();
  TempDir dir;
  write_npy(dir.path / "copy.npy", read_npy(kGolden / "rows_slot0.npy"));
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(slurp(dir.path / "copy.npy"), slurp(kGolden / "rows_slot0.npy"));
}

TEST(Npy, ReadsInt64WrittenByNumpy) {
  DSPARK_SKIP_WITHOUT_GOLDEN();
  const NpyArray a = read_npy(kGolden / "trace" / "key_index.npy");
  EXPECT_EQ(a.dtype, DType::i64);
  EXPECT_EQ(a.shape, (Shape{2, 21}));
  const std::vector<int64_t> v = a.to_int64();
  const std::vector<int64_t> expect = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 17, 18, 19, 20, -1};
  EXPECT_EQ(std::vector<int64_t>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(expect.size())), expect);
}

TEST(Npy, ReadsFormatVersion2) {
  TempDir dir;
  std::string h = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }";
  while ((12 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string file = "\x93NUMPY\x02";
  file += '\0';
  for (int i = 0; i < 4; ++i) file += static_cast<char>((h.size() >> (8 * i)) & 0xff);
  const int32_t data[2] = {-3, 9};
  file += h + std::string(reinterpret_cast<const char*>(data), sizeof(data));
  write_bytes(dir.path / "v2.npy", file);
  EXPECT_EQ(read_npy(dir.path / "v2.npy").to_int64(), (std::vector<int64_t>{-3, 9}));
}

TEST(Npy, Errors) {
  TempDir dir;
  const fs::path p = dir.path / "bad_file.npy";
  write_bytes(p, "NOTNUMPY-at-all");
  std::string msg = error_of([&] { read_npy(p); });
  EXPECT_NE(msg.find("bad_file.npy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;

  EXPECT_NE(error_of([&] { read_npy(dir.path / "absent.npy"); }).find("absent.npy"), std::string::npos);

  const std::string four_floats(16, '\0');
  struct Case {
    std::string dict, data, needle;
  };
  const std::vector<Case> cases = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", four_floats, "needs 20"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", four_floats, "fortran"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", four_floats, "big-endian"},
      {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", four_floats, "'<c8'"},
      {"{'descr': '<f4', 'shape': (4,), }", four_floats, "missing"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", four_floats, "bad shape"},
  };
  for (const Case& c : cases) {
    write_bytes(p, npy_v1(c.dict, c.data));
    msg = error_of([&] { read_npy(p); });
    EXPECT_NE(msg.find("bad_file.npy"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }

  NpyArray wrong = make_array<float>(DType::f32, {3}, {1.0f, 2.0f});
  EXPECT_NE(error_of([&] { write_npy(dir.path / "w.npy", wrong); }).find("w.npy"), std::string::npos);
}
