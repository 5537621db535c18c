// Safetensors reading/writing and the checkpoint directory: round trips through SafetensorsWriter, the golden
// checkpoint's slices, sharding through an index, and the load errors (each naming the tensor or the file).
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

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/safetensors.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"

namespace fs = std::filesystem;
using namespace dspark;

namespace {

const fs::path kGoldenCkpt = fs::path(DSPARK_SHARED_DIR) / "golden" / "tiny-v41" / "ckpt";

// A fresh directory under the system temp dir (with a config.json, so it can be a checkpoint), removed at the
// end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("dspark_st_" + std::to_string(::getpid()) + "_" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "_" +
            std::to_string(counter++));
    fs::create_directories(path);
    write_text(path / "config.json", "{}");
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static void write_text(const fs::path& p, const std::string& s) {
    std::ofstream(p, std::ios::binary).write(s.data(), static_cast<std::streamsize>(s.size()));
  }
};

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A safetensors file with a hand-written header (for the error cases) and `data_size` zero bytes of data.
void write_raw(const fs::path& p, const std::string& header, size_t data_size) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  TempDir::write_text(p, out + header + std::string(data_size, '\0'));
}

// One tensor per spec, written whole.
void write_file(const fs::path& p, const std::vector<std::pair<TensorSpec, std::vector<uint8_t>>>& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& [spec, data] : tensors) specs.push_back(spec);
  SafetensorsWriter w(p, specs);
  for (const auto& [spec, data] : tensors) w.write(spec.name, data.data(), data.size());
  w.finish();
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

#define EXPECT_CONTAINS(msg, needle) EXPECT_NE((msg).find(needle), std::string::npos) << (msg)

}  // namespace

TEST(Safetensors, WriterRoundTripEveryDtype) {
  TempDir dir;
  const std::vector<std::pair<TensorSpec, std::vector<uint8_t>>> tensors = {
      {{"a.bf16", DType::bf16, {2, 2}},
       bytes_of<uint16_t>(
           {float_to_bf16(1.0f), float_to_bf16(-2.0f), float_to_bf16(0.5f), float_to_bf16(3e38f)})},
      {{"b.f16", DType::f16, {3}}, bytes_of<uint16_t>({float_to_f16(1.5f), float_to_f16(-0.25f), 0x7c00})},
      {{"c.f32", DType::f32, {1, 3}}, bytes_of<float>({3.5f, -1e-20f, 42.0f})},
      {{"d.i8", DType::i8, {2}}, bytes_of<int8_t>({-128, 127})},
      {{"e.i16", DType::i16, {2}}, bytes_of<int16_t>({-300, 300})},
      {{"f.i32", DType::i32, {2}}, bytes_of<int32_t>({-70000, 70000})},
      {{"g.i64", DType::i64, {1}}, bytes_of<int64_t>({int64_t{1} << 40})},
      {{"h.u8", DType::u8, {3}}, bytes_of<uint8_t>({0, 128, 255})},
      {{"i.e4m3", DType::f8_e4m3, {2, 2}},
       bytes_of<uint8_t>({float_to_e4m3(448.0f), float_to_e4m3(-1.0f), float_to_e4m3(0.0f), 0x01})},
      {{"j.e8m0", DType::f8_e8m0, {2}}, bytes_of<uint8_t>({127, 130})},
      {{"k.empty", DType::f32, {0, 4}}, {}},
  };
  std::vector<TensorSpec> specs;
  for (const auto& [spec, data] : tensors) specs.push_back(spec);
  {
    SafetensorsWriter w(dir.path / "model.safetensors", specs, {{"format", "pt"}, {"note", "test"}});
    for (const auto& [spec, data] : tensors) {  // in two pieces, to exercise partial writes
      const size_t half = data.size() / 2;
      w.write(spec.name, data.data(), half);
      w.write(spec.name, data.data() + half, data.size() - half);
    }
    w.finish();
  }

  SafetensorsFile f(dir.path / "model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "test");
  EXPECT_EQ(f.tensors().size(), tensors.size());
  std::ifstream in(dir.path / "model.safetensors", std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);

  Checkpoint ck(dir.path);
  for (const auto& [spec, data] : tensors) {
    SCOPED_TRACE(spec.name);
    const TensorInfo& t = ck.get(spec.name);
    EXPECT_EQ(t.dtype, spec.dtype);
    EXPECT_EQ(t.shape, spec.shape);
    EXPECT_EQ(t.nbytes, data.size());
    std::vector<uint8_t> got(data.size());
    ck.read(spec.name, got.data());
    EXPECT_EQ(got, data);
    if (!data.empty()) {
      EXPECT_EQ(std::memcmp(f.data(*f.find(spec.name)), data.data(), data.size()), 0);
    }
  }
}

TEST(Safetensors, WriterErrors) {
  TempDir dir;
  const fs::path p = dir.path / "w.safetensors";
  const std::vector<TensorSpec> specs = {{"first", DType::f32, {2}}, {"second", DType::u8, {3}}};
  const float two[2] = {1.0f, 2.0f};
  {
    SafetensorsWriter w(p, specs);
    EXPECT_CONTAINS(error_of([&] { w.write("second", two, 3); }), "'first'");  // out of order
    EXPECT_CONTAINS(error_of([&] { w.write("first", two, 9); }), "'first'");   // too many bytes
    w.write("first", two, 8);
    EXPECT_CONTAINS(error_of([&] { w.write("first", two, 1); }), "only 0 of its 8");  // first is complete
    w.write("second", two, 2);
    const std::string msg = error_of([&] { w.finish(); });
    EXPECT_CONTAINS(msg, "'second'");
    EXPECT_CONTAINS(msg, "2 of 3");
  }  // destroyed unfinished: closes without throwing
  EXPECT_CONTAINS(error_of([&] {
                    SafetensorsWriter w(p, {{"x", DType::f32, {1}}, {"x", DType::f32, {1}}});
                  }),
                  "'x'");
}

TEST(Safetensors, GoldenCheckpointShapesAndDtypes) {
  DSPARK_SKIP_WITHOUT_GOLDEN();
  Checkpoint ck(kGoldenCkpt);
  EXPECT_TRUE(fs::exists(ck.config_path()));
  const TensorInfo& embed = ck.get("embed.weight");
  EXPECT_EQ(embed.dtype, DType::bf16);
  EXPECT_EQ(embed.shape, (Shape{1024, 256}));
  EXPECT_EQ(embed.nbytes, 1024u * 256u * 2u);
  const TensorInfo& fn = ck.get("mtp.0.hc_attn_fn");
  EXPECT_EQ(fn.dtype, DType::f32);
  EXPECT_EQ(fn.shape, (Shape{24, 1024}));
  const TensorInfo& sink = ck.get("mtp.0.attn.attn_sink");
  EXPECT_EQ(sink.dtype, DType::f32);
  EXPECT_EQ(sink.shape, (Shape{8}));
  EXPECT_TRUE(ck.has("embed.weight"));
  EXPECT_FALSE(ck.has("no.such.tensor"));
  EXPECT_EQ(ck.find("no.such.tensor"), nullptr);
  EXPECT_EQ(ck.names().size(), 143u);  // the header's 144 entries less __metadata__
  EXPECT_EQ(ck.bytes_read(), 0u);
}

TEST(Safetensors, GoldenSlicesMatchWholeReads) {
  DSPARK_SKIP_WITHOUT_GOLDEN();
  Checkpoint ck(kGoldenCkpt);
  std::vector<uint16_t> embed(1024 * 256);
  ck.read("embed.weight", embed.data());
  EXPECT_EQ(ck.bytes_read(), embed.size() * 2);
  std::vector<float> fn(24 * 1024);
  ck.read("mtp.0.hc_attn_fn", fn.data());
  ck.reset_bytes_read();

  // Rows [100, 110) of the bf16 embedding.
  std::vector<uint16_t> rows(10 * 256);
  ck.read_rows("embed.weight", 100, 10, rows.data());
  EXPECT_EQ(ck.bytes_read(), 10u * 256u * 2u);
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), embed.begin() + 100 * 256));

  // Columns [32, 96) of every row.
  ck.reset_bytes_read();
  std::vector<uint16_t> cols(1024 * 64);
  ck.read_cols("embed.weight", 32, 64, cols.data());
  EXPECT_EQ(ck.bytes_read(), 1024u * 64u * 2u);
  for (size_t r = 0; r < 1024; ++r)
    for (size_t c = 0; c < 64; ++c) ASSERT_EQ(cols[r * 64 + c], embed[r * 256 + 32 + c]) << r << "," << c;

  // The f32 mix projection: the last column block, and the same through read_col_bytes.
  ck.reset_bytes_read();
  std::vector<float> fcols(24 * 256), fbytes(24 * 256);
  ck.read_cols("mtp.0.hc_attn_fn", 768, 256, fcols.data());
  ck.read_col_bytes("mtp.0.hc_attn_fn", 768 * 4, 256 * 4, fbytes.data());
  EXPECT_EQ(ck.bytes_read(), 2u * 24u * 256u * 4u);
  EXPECT_EQ(fcols, fbytes);
  for (size_t r = 0; r < 24; ++r)
    for (size_t c = 0; c < 256; ++c) ASSERT_EQ(fcols[r * 256 + c], fn[r * 1024 + 768 + c]);

  // The 1-D sink: rows of a vector are its elements.
  ck.reset_bytes_read();
  std::vector<float> sink(8), tail(3);
  ck.read("mtp.0.attn.attn_sink", sink.data());
  ck.read_rows("mtp.0.attn.attn_sink", 5, 3, tail.data());
  EXPECT_EQ(ck.bytes_read(), 8u * 4u + 3u * 4u);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), sink.begin() + 5));
}

TEST(Safetensors, SliceBoundsErrorsNameTheTensor) {
  DSPARK_SKIP_WITHOUT_GOLDEN();
  Checkpoint ck(kGoldenCkpt);
  std::vector<uint8_t> buf(1 << 20);
  EXPECT_CONTAINS(error_of([&] { ck.read_rows("embed.weight", 1000, 25, buf.data()); }), "'embed.weight'");
  EXPECT_CONTAINS(error_of([&] { ck.read_rows("embed.weight", -1, 2, buf.data()); }), "'embed.weight'");
  EXPECT_CONTAINS(error_of([&] { ck.read_cols("embed.weight", 200, 57, buf.data()); }), "'embed.weight'");
  EXPECT_CONTAINS(error_of([&] { ck.read_col_bytes("embed.weight", 0, 513, buf.data()); }), "'embed.weight'");
  EXPECT_CONTAINS(error_of([&] { ck.read_cols("mtp.0.attn.attn_sink", 0, 1, buf.data()); }),
                  "'mtp.0.attn.attn_sink'");
  EXPECT_EQ(ck.bytes_read(), 0u);
}

TEST(Safetensors, MissingTensor) {
  DSPARK_SKIP_WITHOUT_GOLDEN();
  Checkpoint ck(kGoldenCkpt);
  std::vector<uint8_t> buf(16);
  EXPECT_CONTAINS(error_of([&] { ck.get("mtp.7.attn.wq_a.weight"); }), "'mtp.7.attn.wq_a.weight' is missing");
  EXPECT_CONTAINS(error_of([&] { ck.read("head.weight.nope", buf.data()); }), "'head.weight.nope'");
}

TEST(Safetensors, ShardedThroughIndex) {
  TempDir dir;
  write_file(dir.path / "part-1.safetensors",
             {{{"x.weight", DType::f32, {2, 2}}, bytes_of<float>({1, 2, 3, 4})},
              {{"x.bias", DType::f32, {2}}, bytes_of<float>({5, 6})}});
  write_file(dir.path / "part-2.safetensors",
             {{{"y.weight", DType::bf16, {1, 3}}, bytes_of<uint16_t>({7, 8, 9})}});
  // A stray file the index does not name is not opened.
  write_raw(dir.path / "stray.safetensors", "{not json", 0);
  TempDir::write_text(dir.path / "model.safetensors.index.json",
                      R"({"metadata": {"total_size": 30}, "weight_map": {"x.weight": "part-1.safetensors",
                         "x.bias": "part-1.safetensors", "y.weight": "part-2.safetensors"}})");
  Checkpoint ck(dir.path);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"x.bias", "x.weight", "y.weight"}));
  EXPECT_EQ(ck.get("y.weight").file, dir.path / "part-2.safetensors");
  std::vector<uint16_t> y(3);
  ck.read("y.weight", y.data());
  EXPECT_EQ(y, (std::vector<uint16_t>{7, 8, 9}));
  std::vector<float> col(2);
  ck.read_cols("x.weight", 1, 1, col.data());
  EXPECT_EQ(col, (std::vector<float>{2, 4}));
  EXPECT_EQ(ck.bytes_read(), 6u + 8u);

  // The index naming a file that does not exist.
  TempDir::write_text(
      dir.path / "model.safetensors.index.json",
      R"({"weight_map": {"x.weight": "part-1.safetensors", "z.weight": "part-9.safetensors"}})");
  std::string msg = error_of([&] { Checkpoint bad(dir.path); });
  EXPECT_CONTAINS(msg, "part-9.safetensors");
  EXPECT_CONTAINS(msg, "'z.weight'");

  // The index listing a tensor its file does not hold.
  TempDir::write_text(
      dir.path / "model.safetensors.index.json",
      R"({"weight_map": {"x.weight": "part-1.safetensors", "y.weight": "part-1.safetensors"}})");
  msg = error_of([&] { Checkpoint bad(dir.path); });
  EXPECT_CONTAINS(msg, "'y.weight'");
  EXPECT_CONTAINS(msg, "part-1.safetensors");

  TempDir::write_text(dir.path / "model.safetensors.index.json", R"({"weight_map": )");
  EXPECT_CONTAINS(error_of([&] { Checkpoint bad(dir.path); }), "model.safetensors.index.json");
}

TEST(Safetensors, IndexShardsStayInsideTheCheckpoint) {
  TempDir dir, other;
  write_file(dir.path / "part-1.safetensors", {{{"x.weight", DType::f32, {1}}, bytes_of<float>({1})}});
  write_file(other.path / "outside.safetensors", {{{"y.weight", DType::f32, {1}}, bytes_of<float>({2})}});
  const auto index_naming = [&](const std::string& file) {
    TempDir::write_text(
        dir.path / "model.safetensors.index.json",
        R"({"weight_map": {"x.weight": "part-1.safetensors", "y.weight": ")" + file + R"("}})");
  };
  // A directory part, a parent reference, an absolute path: refused by name before anything is opened.
  for (const std::string& bad : {std::string("../") + other.path.filename().string() + "/outside.safetensors",
                                 (other.path / "outside.safetensors").string(), std::string(".."),
                                 std::string("sub/part-1.safetensors")}) {
    index_naming(bad);
    const std::string msg = error_of([&] { Checkpoint ck(dir.path); });
    EXPECT_CONTAINS(msg, "'y.weight'");
    EXPECT_CONTAINS(msg, "not a file name in the checkpoint directory");
  }
  // A plain name that is a symlink out of the directory: refused by where it resolves.
  fs::create_symlink(other.path / "outside.safetensors", dir.path / "link.safetensors");
  index_naming("link.safetensors");
  EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir.path); }), "outside the checkpoint directory");
  // Without an index the directory scan refuses it too.
  fs::remove(dir.path / "model.safetensors.index.json");
  EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir.path); }), "outside the checkpoint directory");
  // A symlink to a file of the directory is fine (the index names the link, not its target).
  fs::remove(dir.path / "link.safetensors");
  write_file(dir.path / "y.safetensors", {{{"y.weight", DType::f32, {1}}, bytes_of<float>({2})}});
  fs::create_symlink(dir.path / "y.safetensors", dir.path / "alias.safetensors");
  index_naming("alias.safetensors");
  EXPECT_NO_THROW(Checkpoint ck(dir.path));

  // The Hugging Face cache: snapshots/<revision>/<shard> links to the repository's blobs/<hash>.
  TempDir repo;
  const fs::path snap = repo.path / "snapshots" / "abc123", blobs = repo.path / "blobs";
  fs::create_directories(snap);
  fs::create_directories(blobs);
  fs::copy_file(dir.path / "config.json", snap / "config.json");
  write_file(blobs / "f00d", {{{"x.weight", DType::f32, {1}}, bytes_of<float>({1})}});
  fs::create_symlink("../../blobs/f00d", snap / "model.safetensors");
  EXPECT_EQ(Checkpoint(snap).names(), (std::vector<std::string>{"x.weight"}));
}

TEST(Safetensors, DirectoryErrors) {
  TempDir dir;
  EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir.path); }), "no safetensors file");
  // Without an index every *.safetensors file is read, and a tensor may be in only one of them.
  write_file(dir.path / "a.safetensors", {{{"t", DType::u8, {1}}, {1}}});
  write_file(dir.path / "b.safetensors", {{{"t", DType::u8, {1}}, {2}}});
  const std::string msg = error_of([&] { Checkpoint ck(dir.path); });
  EXPECT_CONTAINS(msg, "'t'");
  EXPECT_CONTAINS(msg, "a.safetensors");
  EXPECT_CONTAINS(msg, "b.safetensors");
  fs::remove(dir.path / "config.json");
  EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir.path); }), "config.json");
  EXPECT_CONTAINS(error_of([&] { Checkpoint ck(dir.path / "nowhere"); }), "nowhere");
}

TEST(Safetensors, TruncatedFile) {
  TempDir dir;
  const fs::path p = dir.path / "cut.safetensors";
  write_file(p, {{{"w.first", DType::f32, {4}}, bytes_of<float>({1, 2, 3, 4})},
                 {{"w.last", DType::f32, {4}}, bytes_of<float>({5, 6, 7, 8})}});
  const auto size = fs::file_size(p);
  fs::resize_file(p, size - 5);  // cut into the last tensor's data
  std::string msg = error_of([&] { Checkpoint ck(dir.path); });
  EXPECT_CONTAINS(msg, "cut.safetensors");
  EXPECT_CONTAINS(msg, "'w.last'");
  EXPECT_CONTAINS(msg, "truncated");
  fs::resize_file(p, 40);  // cut into the header
  msg = error_of([&] { SafetensorsFile f(p); });
  EXPECT_CONTAINS(msg, "cut.safetensors");
  EXPECT_CONTAINS(msg, "truncated");
  fs::resize_file(p, 3);  // not even the header length
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile f(p); }), "cut.safetensors");
}

TEST(Safetensors, HeaderErrors) {
  TempDir dir;
  const fs::path p = dir.path / "bad.safetensors";
  struct Case {
    std::string header;
    size_t data;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8])", 8, {"not well-formed JSON"}},
      {R"(["w"])", 0, {"not a JSON object"}},
      {R"({"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}})",
       8,
       {"unknown dtype 'Q7' of tensor 'w' in "}},
      {R"({"w.far": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}})", 8, {"'w.far'", "outside"}},
      {R"({"w.rev": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}})", 8, {"'w.rev'"}},
      {R"({"w.size": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, {"'w.size'", "needs 12"}},
      {R"({"w.neg": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8, {"'w.neg'", "negative"}},
      {R"({"w.nooff": {"dtype": "F32", "shape": [2]}})", 8, {"'w.nooff'", "data_offsets"}},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12,
       {"'a'", "'b'", "overlap"}},
  };
  for (const Case& c : cases) {
    write_raw(p, c.header, c.data);
    const std::string msg = error_of([&] { SafetensorsFile f(p); });
    EXPECT_CONTAINS(msg, "bad.safetensors");
    for (const auto& n : c.needles) EXPECT_CONTAINS(msg, n);
  }
  // An absurd header length.
  std::string huge(8, '\xff');
  TempDir::write_text(p, huge + "{}");
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile f(p); }), "bad.safetensors");
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile f(dir.path / "absent.safetensors"); }),
                  "absent.safetensors");
}
