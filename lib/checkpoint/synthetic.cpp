#include "lib/checkpoint/synthetic.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/synthetic_exl3.hpp"
#include "lib/checkpoint/synthetic_quantized.hpp"
#include "lib/checkpoint/synthetic_random.hpp"
#include "lib/core/block_quant.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {
namespace {

namespace fs = std::filesystem;

using synthetic::element_bits;
using synthetic::tensor_key;
using synthetic::unit_normal;

void check_dtype(const DrafterTensor& t) {
  if (t.dense_dtype != DType::bf16 && t.dense_dtype != DType::f32)
    fail("synthetic checkpoint: tensor '{}' has dtype {}, only bf16 and f32 are generated", t.weight_name(),
         dtype_name(t.dense_dtype));
}

// synthetic_values over `threads` slices of the range; every slice computes the same values it would alone.
void generate(const DrafterTensor& t, uint64_t seed, int64_t elem0, int64_t count, uint8_t* dst,
              int threads) {
  constexpr int64_t kMinPerThread = int64_t{1} << 16;
  const int64_t n = std::clamp<int64_t>(count / kMinPerThread, 1, threads);
  if (n == 1) return synthetic_values(t, seed, elem0, count, dst);
  const size_t esz = dtype_size(t.dense_dtype);
  std::vector<std::jthread> pool;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t b = count * k / n, e = count * (k + 1) / n;
    pool.emplace_back([&, b, e] { synthetic_values(t, seed, elem0 + b, e - b, dst + b * esz); });
  }
}

// Tensors split into shards in table order, greedily up to max_bytes.
std::vector<std::vector<size_t>> plan_shards(const std::vector<uint64_t>& sizes, uint64_t max_bytes) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t used = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!shards.back().empty() && used + sizes[i] > max_bytes) shards.emplace_back(), used = 0;
    shards.back().push_back(i);
    used += sizes[i];
  }
  return shards;
}

bool is_checkpoint_file(const fs::path& p) {
  const std::string f = p.filename().string();
  return f == "config.json" || f == "model.safetensors.index.json" ||
         (f.starts_with("model") && p.extension() == ".safetensors");
}

void prepare_dir(const fs::path& out, bool force) {
  if (fs::exists(out) && !fs::is_directory(out)) fail("{}: exists and is not a directory", out.string());
  if (fs::exists(out) && !fs::is_empty(out)) {
    if (!force)
      fail("{}: directory is not empty (--force / SyntheticOptions::force overwrites its checkpoint files)",
           out.string());
    std::vector<fs::path> stale;  // collected first: removing while iterating is unspecified
    for (const auto& e : fs::directory_iterator(out))
      if (e.is_regular_file() && is_checkpoint_file(e.path())) stale.push_back(e.path());
    for (const fs::path& p : stale) fs::remove(p);
  }
  fs::create_directories(out);
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) fail("{}: write failed", path.string());
}

// One entry of the table as stored: its parts ("<name>.weight" [+ "<name>.scale"]) in file order.
struct Entry {
  const DrafterTensor* tensor;
  WeightFormat format;
  std::vector<TensorSpec> parts;
};

// How t is stored: as configured_format says, and in an EXL3 checkpoint as the seed's mix has it (SPEC §9).
WeightFormat synthetic_format(const DrafterTensor& t, const ModelConfig& cfg) {
  if (cfg.quant_method != "exl3") return configured_format(t, cfg);
  if (synthetic_exl3_tensor(t)) return WeightFormat::exl3;
  return t.linear ? WeightFormat::fp8_block : WeightFormat::dense;  // wo_a, then the plain tensors
}

Entry make_entry(const DrafterTensor& t, WeightFormat f, const ModelConfig& cfg) {
  const int64_t block = cfg.weight_block_size;
  if (f == WeightFormat::dense) return {&t, f, {{t.weight_name(), t.dense_dtype, t.shape}}};
  if (f == WeightFormat::exl3) return {&t, f, synthetic_exl3_parts(t, cfg)};
  const int64_t out = t.shape[0], in = t.shape[1];
  if (f == WeightFormat::fp4 && in % kFp4Block != 0)
    fail("synthetic checkpoint: tensor '{}': fp4 needs a multiple of {} inputs, the config implies {}",
         t.name, kFp4Block, in);
  if (f != WeightFormat::fp8_block && f != WeightFormat::fp4)
    fail("synthetic checkpoint: tensor '{}': {} weights are not generated", t.name, weight_format_name(f));
  const DType wt = f == WeightFormat::fp8_block ? DType::f8_e4m3 : DType::i8;
  return {&t,
          f,
          {{t.name + ".weight", wt, stored_weight_shape(f, out, in)},
           {t.name + ".scale", DType::f8_e8m0, *stored_scale_shape(f, out, in, block)}}};
}

struct Stream {
  uint64_t seed;
  size_t chunk;  // bytes generated and written at a time
  int threads;
  int64_t block;  // fp8 block edge B
};
using WroteFn = std::function<void(uint64_t)>;

void write_dense(const DrafterTensor& t, const Stream& st, std::vector<uint8_t>& buf, SafetensorsWriter& w,
                 const WroteFn& wrote) {
  const size_t esz = dtype_size(t.dense_dtype);
  const int64_t per_chunk = static_cast<int64_t>(st.chunk / esz), numel = shape_numel(t.shape);
  for (int64_t e0 = 0; e0 < numel; e0 += per_chunk) {
    const int64_t n = std::min(per_chunk, numel - e0);
    generate(t, st.seed, e0, n, buf.data(), st.threads);
    w.write(t.weight_name(), buf.data(), static_cast<size_t>(n) * esz);
    wrote(static_cast<uint64_t>(n) * esz);
  }
}

// The weight in chunks of whole scale blocks (B rows for fp8 block), then the scales, kept meanwhile (1 / B^2
// of the codes for fp8 block, 1 / 16 of the packed bytes for fp4).
void write_quantized(const Entry& e, const Stream& st, std::vector<uint8_t>& buf, SafetensorsWriter& w,
                     const WroteFn& wrote, const std::function<void()>& weight_done) {
  const DrafterTensor& t = *e.tensor;
  const TensorSpec &wp = e.parts[0], &sp = e.parts[1];
  const int64_t out = t.shape[0];
  const int64_t row_bytes = wp.shape[1], unit = e.format == WeightFormat::fp8_block ? st.block : 1;
  const int64_t scale_unit_bytes = shape_numel(sp.shape) / ((out + unit - 1) / unit);
  const int64_t rows =
      std::max<int64_t>(1, static_cast<int64_t>(st.chunk) / (row_bytes * st.block)) * st.block;
  if (buf.size() < static_cast<size_t>(rows * row_bytes)) buf.resize(static_cast<size_t>(rows * row_bytes));
  std::vector<uint8_t> scales(static_cast<size_t>(shape_numel(sp.shape)));
  for (int64_t r0 = 0; r0 < out; r0 += rows) {
    const int64_t n = std::min(rows, out - r0);
    synthetic_quantized_rows(t, e.format, st.block, st.seed, r0, n, buf.data(),
                             scales.data() + r0 / unit * scale_unit_bytes, st.threads);
    w.write(wp.name, buf.data(), static_cast<size_t>(n * row_bytes));
    wrote(static_cast<uint64_t>(n * row_bytes));
  }
  weight_done();
  w.write(sp.name, scales.data(), scales.size());
  wrote(scales.size());
}

// The trellis in chunks of whole tile rows, then the scales and the marker (small).
void write_exl3(const Entry& e, const ModelConfig& cfg, const Stream& st, std::vector<uint8_t>& buf,
                SafetensorsWriter& w, const WroteFn& wrote, const std::function<void()>& part_done) {
  const TensorSpec& trellis = e.parts[0];
  const int64_t row_bytes = trellis.shape[1] * trellis.shape[2] * static_cast<int64_t>(sizeof(int16_t));
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(st.chunk) / row_bytes);
  if (buf.size() < static_cast<size_t>(rows * row_bytes)) buf.resize(static_cast<size_t>(rows * row_bytes));
  for (int64_t r0 = 0; r0 < trellis.shape[0]; r0 += rows) {
    const int64_t n = std::min(rows, trellis.shape[0] - r0);
    synthetic_trellis_rows(*e.tensor, cfg, st.seed, r0, n, reinterpret_cast<int16_t*>(buf.data()),
                           st.threads);
    w.write(trellis.name, buf.data(), static_cast<size_t>(n * row_bytes));
    wrote(static_cast<uint64_t>(n * row_bytes));
  }
  for (size_t i = 1; i < e.parts.size(); ++i) {
    part_done();
    const std::vector<uint8_t> b = synthetic_exl3_part(*e.tensor, cfg, e.parts[i], st.seed);
    w.write(e.parts[i].name, b.data(), b.size());
    wrote(b.size());
  }
}

}  // namespace

SyntheticInit synthetic_init(const DrafterTensor& t) {
  const std::string& n = t.name;
  const auto inv_sqrt = [](int64_t in) { return 1.0f / std::sqrt(static_cast<float>(in)); };
  const int64_t in = t.shape.size() == 2 ? t.shape[1] : 1;
  // Linear layers and the shared LM head: N(0, 1/in) keeps each output at the input's scale.
  if (t.linear || n == "head.weight" || n.ends_with("ffn.gate.weight") ||
      n.ends_with("confidence_head.proj.weight"))
    return {0.0f, inv_sqrt(in)};
  // Embedding rows of unit RMS, like the normalised stream they enter.
  if (n == "embed.weight" || n.ends_with("markov_head.embed.weight")) return {0.0f, 1.0f};
  // Markov bias = embed[prev] . head[v]: N(0, 1/R) makes it O(1), comparable to the logits.
  if (n.ends_with("markov_head.head.weight")) return {0.0f, inv_sqrt(in)};
  // RMSNorm gains near 1; the noise makes a dropped or misplaced gain visible in tests.
  if (n.ends_with("norm.weight")) return {1.0f, 0.02f};
  // Routing bias only breaks ties between similar scores.
  if (n.ends_with("ffn.gate.bias")) return {0.0f, 0.01f};
  // mHC mixes: fn [24, 4H] on the normalised 4H stream gives O(1) mix logits; small bases, scales near 1.
  if (n.find(".hc_") != std::string::npos) {
    if (n.ends_with("_fn")) return {0.0f, inv_sqrt(in)};
    if (n.ends_with("_base")) return {0.0f, 0.1f};
    if (n.ends_with("_scale")) return {1.0f, 0.1f};
  }
  if (n.ends_with("attn_sink")) return {0.0f, 1.0f};
  fail("synthetic checkpoint: no initialisation rule for tensor '{}'", t.weight_name());
}

void synthetic_values(const DrafterTensor& t, uint64_t seed, int64_t elem0, int64_t count, void* dst) {
  check_dtype(t);
  const SyntheticInit init = synthetic_init(t);
  const uint64_t key = tensor_key(seed, t.weight_name());
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t x = element_bits(key, elem0 + i);
    const float v = init.mean + init.std * unit_normal(x);
    if (t.dense_dtype == DType::bf16) {
      static_cast<bf16_t*>(dst)[i] = float_to_bf16(v);
    } else {
      static_cast<float*>(dst)[i] = v;
    }
  }
}

ModelConfig synthetic_model_config(ModelConfig cfg, SyntheticFormat format, ConfigLayout layout,
                                   const std::string& codebook,
                                   const std::map<std::string, int64_t>& exl3_bits) {
  cfg.layout = layout;
  cfg.exl3 = {};
  if (format == SyntheticFormat::bf16) {
    cfg.dtype = "bf16";
    cfg.expert_dtype.clear();
    if (layout == ConfigLayout::release) cfg.quant_method.clear();
  } else if (format == SyntheticFormat::exl3) {
    // exllamav3's quantization_config keys with the seed's bits, and the fp8 keys of wo_a's blocks.
    cfg.dtype = "bf16";
    cfg.expert_dtype.clear();
    cfg.quant_method = "exl3";
    cfg.quant_fmt = "e4m3";
    cfg.scale_fmt = "ue8m0";
    cfg.exl3.codebook = codebook;
    cfg.exl3.bits = 2;
    cfg.exl3.head_bits = 6;
    cfg.exl3.role_bits = seed_exl3_bits();
    for (const auto& [role, k] : exl3_bits) cfg.exl3.role_bits[role] = k;
  } else {
    cfg.dtype = "fp8";
    cfg.expert_dtype = "fp4";
    cfg.quant_method = "fp8";
    cfg.quant_fmt = "e4m3";
    cfg.scale_fmt = "ue8m0";
  }
  return cfg;
}

ModelConfig synthetic_model_config(ModelConfig cfg, SyntheticFormat format, ConfigLayout layout) {
  static const std::map<std::string, int64_t> kSeedBits;  // no role replaced
  return synthetic_model_config(std::move(cfg), format, layout, "mul1", kSeedBits);
}

SyntheticResult write_synthetic_checkpoint(const ModelConfig& cfg, const fs::path& out,
                                           const SyntheticOptions& opt, const SyntheticProgressFn& progress) {
  // Validates cfg and guarantees that the config.json written below parses back to it.
  const nlohmann::json config =
      cfg.layout == ConfigLayout::release ? model_config_to_release_json(cfg) : model_config_to_json(cfg);
  if (!(parse_model_config(config, "model config") == cfg))
    fail("synthetic checkpoint: the model config does not survive config.json{}",
         cfg.layout == ConfigLayout::release && cfg.dtype != "fp8" && !cfg.quant_method.empty()
             ? " (the released layout says dtype fp8 by quant_method fp8: a bf16 config has none)"
             : "");
  if (opt.max_shard_bytes == 0) fail("synthetic checkpoint: max_shard_bytes must be positive");

  const std::vector<DrafterTensor> tensors = drafter_tensors(cfg);
  std::vector<Entry> entries;
  std::vector<uint64_t> sizes;
  SyntheticProgress prog;
  for (const DrafterTensor& t : tensors) {
    check_dtype(t);
    synthetic_init(t);  // fail before writing anything
    entries.push_back(make_entry(t, synthetic_format(t, cfg), cfg));
    sizes.push_back(0);
    for (const TensorSpec& p : entries.back().parts)
      sizes.back() += static_cast<uint64_t>(shape_numel(p.shape)) * dtype_size(p.dtype);
    prog.tensors_total += entries.back().parts.size();
    prog.bytes_total += sizes.back();
  }
  prepare_dir(out, opt.force);

  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const Stream stream{opt.seed, std::max<size_t>(opt.chunk_bytes, 64),
                      opt.threads > 0 ? opt.threads : std::min(hw, 16), cfg.weight_block_size};
  std::vector<uint8_t> buf(stream.chunk);
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"generator", "dspark synthetic"}, {"seed", std::to_string(opt.seed)}};

  const auto shards = plan_shards(sizes, opt.max_shard_bytes);
  SyntheticResult result;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1
                                 ? std::string("model.safetensors")
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<TensorSpec> specs;
    for (size_t i : shards[s]) specs.insert(specs.end(), entries[i].parts.begin(), entries[i].parts.end());
    SafetensorsWriter writer(out / file, std::move(specs), metadata);
    for (size_t i : shards[s]) {
      const auto wrote = [&](uint64_t bytes) {
        prog.bytes_done += bytes;
        if (progress) progress(prog);
      };
      const auto finished = [&] {
        ++prog.tensors_done;
        if (progress) progress(prog);
      };
      if (entries[i].format == WeightFormat::dense)
        write_dense(*entries[i].tensor, stream, buf, writer, wrote);
      else if (entries[i].format == WeightFormat::exl3)
        write_exl3(entries[i], cfg, stream, buf, writer, wrote, finished);
      else
        write_quantized(entries[i], stream, buf, writer, wrote, finished);
      finished();
      for (const TensorSpec& p : entries[i].parts) weight_map[p.name] = file;
    }
    writer.finish();
    result.files.push_back(out / file);
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", prog.bytes_total}}},
                                  {"weight_map", weight_map}};
    write_text(out / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_text(out / "config.json", config.dump(1) + "\n");
  result.tensors = prog.tensors_total;
  result.bytes = prog.bytes_total;
  return result;
}

}  // namespace dspark
