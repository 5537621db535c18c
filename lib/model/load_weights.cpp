#include "lib/model/load_weights.hpp"

#include <spdlog/spdlog.h>

#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "lib/checkpoint/tensor_table.hpp"
#include "lib/core/block_quant.hpp"
#include "lib/core/error.hpp"
#include "lib/core/exl3.hpp"
#include "lib/core/non_finite.hpp"
#include "lib/model/assemble_weights.hpp"
#include "lib/model/exl3_parts.hpp"
#include "lib/model/requantize.hpp"
#include "lib/model/tensor_split.hpp"

namespace dspark {
namespace {

const char* governing_key(const DrafterTensor& t, const ModelConfig& cfg) {
  if (t.routed_expert && !cfg.expert_dtype.empty()) return "expert_dtype";
  return cfg.layout == ConfigLayout::release ? "quantization_config.quant_method" : "dtype";
}

void check_backend_runs(const Backend& backend, const std::string& name, const std::string& file,
                        WeightFormat f) {
  if (!backend.supports_format(f))
    fail("tensor '{}' in {}: the {} backend does not run {} weights", name, file, backend.name(),
         weight_format_name(f));
}

// Existence, representation, shape and dtype of a linear entry's parts; the format it is stored in.
WeightFormat check_linear(const Checkpoint& ckpt, const ModelConfig& cfg, const DrafterTensor& t,
                          const Backend& backend) {
  const WeightFormat f = detect_weight_format(ckpt, t.name);
  const TensorInfo* w = ckpt.find(t.name + (f == WeightFormat::exl3 ? ".trellis" : ".weight"));
  const std::string file = w ? w->file.string() : ckpt.dir().string();
  if (f == WeightFormat::exl3) {
    // wo_a's product is grouped (block-diagonal, its input unquantised: SPEC §3's exception), which an EXL3
    // matrix's transforms over whole 128-blocks of outputs do not keep apart.
    if (t.name.ends_with(".attn.wo_a"))
      fail(
          "tensor '{}.trellis' in {}: wo_a is a grouped product, stored dense or fp8 block; EXL3 is not "
          "supported for it (the seed's mix keeps it fp8)",
          t.name, file);
    check_exl3_parts(ckpt, cfg, t.name, t.shape[0], t.shape[1]);
    check_backend_runs(backend, t.name, file, f);
    return f;
  }
  if (f == WeightFormat::fp4 && !t.routed_expert)
    fail(
        "tensor '{}' in {}: fp4 (packed e2m1) is only for routed experts; this linear must be fp8 block or "
        "dense",
        t.name, file);
  const WeightFormat want = configured_format(t, cfg);
  // An exl3 checkpoint is read from its tensors: its other linears are dense or fp8 block (wo_a).
  const bool exl3_mix =
      cfg.quant_method == "exl3" && (f == WeightFormat::dense || f == WeightFormat::fp8_block);
  if (f != want && !exl3_mix)
    fail("tensor '{}' in {}: stored {} but config.json's {} says {}", t.name, file, weight_format_name(f),
         governing_key(t, cfg), weight_format_name(want));
  const int64_t out = t.shape[0], in = t.shape[1];
  if (f == WeightFormat::fp4 && in % kFp4Block != 0)
    fail("tensor '{}' in {}: fp4 needs a multiple of {} inputs, the config implies {}", t.name, file,
         kFp4Block, in);
  const Shape ws = stored_weight_shape(f, out, in);
  if (w->shape != ws)
    fail("tensor '{}.weight' in {}: shape {} but config.json implies {} ({} of [{}, {}])", t.name, file,
         shape_str(w->shape), shape_str(ws), weight_format_name(f), out, in);
  if (!is_weight_dtype(f, w->dtype))
    fail("tensor '{}.weight' in {}: dtype {} cannot hold {} weights", t.name, file, dtype_name(w->dtype),
         weight_format_name(f));
  if (const std::optional<Shape> ss = stored_scale_shape(f, out, in, cfg.weight_block_size)) {
    const TensorInfo& sc = ckpt.get(t.name + ".scale");
    if (sc.shape != *ss)
      fail("tensor '{}.scale' in {}: shape {} does not match its weight: {} of [{}, {}] needs {}", t.name,
           sc.file.string(), shape_str(sc.shape), weight_format_name(f), out, in, shape_str(*ss));
    if (sc.dtype != DType::f8_e8m0)
      fail("tensor '{}.scale' in {}: dtype {}, expected float8_e8m0", t.name, sc.file.string(),
           dtype_name(sc.dtype));
  }
  check_backend_runs(backend, t.name, file, f);
  return f;
}

// Existence, shape and dtype of a plain (never quantised) entry; an entry stored as an EXL3 trellis (the
// head, as exllamav3 converts it) gets its parts checked and its base returned.
std::string check_plain(const Checkpoint& ckpt, const ModelConfig& cfg, const DrafterTensor& t,
                        const Backend& backend) {
  const std::string name = t.weight_name();
  if (std::string base = exl3_stored_plain(ckpt, t); !base.empty()) {
    check_exl3_parts(ckpt, cfg, base, t.shape[0], t.shape[1]);
    check_backend_runs(backend, base, ckpt.get(base + ".trellis").file.string(), WeightFormat::exl3);
    return base;
  }
  const TensorInfo* info = ckpt.find(name);
  if (!info) fail("checkpoint {}: tensor '{}' is missing", ckpt.dir().string(), name);
  if (info->shape != t.shape)
    fail("tensor '{}' in {}: shape {} but config.json implies {}", name, info->file.string(),
         shape_str(info->shape), shape_str(t.shape));
  if (info->dtype != t.dense_dtype)
    fail("tensor '{}' in {}: dtype {}, expected {}", name, info->file.string(), dtype_name(info->dtype),
         dtype_name(t.dense_dtype));
  return {};
}

// A shard's cut must not split a quantisation block between two ranks.
void check_cut(const DrafterTensor& t, WeightFormat f, const TensorSplit& split, const ModelConfig& cfg,
               const ShardPlan& plan) {
  if (split.kind == TensorSplit::Kind::replicated) return;
  const bool rows = split.kind == TensorSplit::Kind::rows;
  const int64_t align =
      rows ? row_alignment(f, cfg.weight_block_size) : col_alignment(f, cfg.weight_block_size);
  const int64_t extent = rows ? t.shape[0] : t.shape[1], end = split.begin + split.count;
  if (split.begin % align != 0 || (end % align != 0 && end != extent))
    fail("tensor '{}' ({}): this rank's {} [{}, {}) of {} at tp = {} do not fall on its {}-wide blocks",
         t.name, weight_format_name(f), rows ? "rows" : "columns", split.begin, end, extent, plan.ranks,
         align);
}

// weights.head fp8 before anything is read: the backend runs fp8 block, and this rank's vocabulary rows start
// on a block (B divides the 256-column tiles of the split unless B is larger or uneven).
void check_head_requantization(const Checkpoint& ckpt, const ModelConfig& cfg, const ShardPlan& plan,
                               const Backend& backend) {
  if (const TensorInfo* trellis = ckpt.find("head.trellis"))
    fail(
        "weights.head fp8: the head in {} is stored as EXL3 (head.trellis), and only a bf16 head is "
        "re-quantised; keep it (weights.head: keep)",
        trellis->file.string());
  const TensorInfo& head = ckpt.get("head.weight");
  const int64_t B = cfg.weight_block_size, v0 = plan.vocab.begin, v1 = plan.vocab.end;
  if (!backend.supports_format(WeightFormat::fp8_block))
    fail("weights.head fp8: tensor 'head.weight' in {}: the {} backend does not run fp8 block weights",
         head.file.string(), backend.name());
  if (v0 % B != 0 || (v1 % B != 0 && v1 != cfg.vocab_size))
    fail(
        "weights.head fp8: tensor 'head.weight' in {}: this rank's vocabulary rows [{}, {}) at tp = {} do "
        "not "
        "fall on the {}-row fp8 blocks (quantization_config.weight_block_size), so the ranks' blocks would "
        "not "
        "be the whole head's; keep the head (weights.head: keep) or use a block size that divides 256",
        head.file.string(), v0, v1, plan.ranks, B);
}

// SPEC §3: a weight that is not finite (bf16 / f16 / f32 NaN or Inf, an e4m3 NaN code, an e8m0 NaN scale)
// would reach every draft; it is refused at load, naming tensor, file and the first such element of this
// rank's part. One pass over the bytes just read, before they are uploaded: the check covers every backend.
void check_finite(const std::string& name, const std::string& file, DType dtype,
                  const std::vector<uint8_t>& bytes) {
  const int64_t count = static_cast<int64_t>(bytes.size() / dtype_size(dtype));
  const int64_t i = first_non_finite(dtype, bytes.data(), count);
  if (i < 0) return;
  const uint8_t* at = bytes.data() + static_cast<size_t>(i) * dtype_size(dtype);
  switch (dtype) {
    case DType::f8_e8m0:
      fail("tensor '{}' in {}: scale byte {} of this rank's part is 255, the e8m0 NaN", name, file, i);
    case DType::f8_e4m3:
      fail("tensor '{}' in {}: byte {} of this rank's part is {:#04x}, an e4m3 NaN code", name, file, i, *at);
    default: {
      uint32_t bits = 0;
      std::memcpy(&bits, at, dtype_size(dtype));  // little-endian: the element's bits in the low bytes
      fail("tensor '{}' in {}: element {} of this rank's part is not finite ({} bits {:#x}, NaN or Inf)",
           name, file, i, dtype_name(dtype), bits);
    }
  }
}

// Reads, for one tensor of the table, the part this rank owns (tensor_split) and uploads it.
class Loader {
 public:
  Loader(const Checkpoint& ckpt, const ModelConfig& cfg, const ShardPlan& plan, Backend& backend,
         const std::function<void(uint64_t)>& on_read)
      : ckpt_(ckpt), cfg_(cfg), plan_(plan), backend_(backend), on_read_(on_read) {}

  Tensor tensor(const DrafterTensor& t) {
    const TensorSplit split = tensor_split(t, cfg_, plan_);
    return read(t.weight_name(), split.kind, split.begin, split.count);
  }

  LinearWeight linear(const DrafterTensor& t) {
    const WeightFormat f = detect_weight_format(ckpt_, t.name);
    const TensorSplit s = tensor_split(t, cfg_, plan_);
    if (f == WeightFormat::exl3) return exl3(t.name, s, t.shape[0], t.shape[1]);
    const bool rows = s.kind == TensorSplit::Kind::rows, cols = s.kind == TensorSplit::Kind::cols;
    LinearWeight l;
    l.name = t.name;
    l.format = f;
    l.out = rows ? s.count : t.shape[0];
    l.in = cols ? s.count : t.shape[1];
    const int64_t B = cfg_.weight_block_size;
    l.weight = read_part(t.name + ".weight", f, StoredPart::weight, s);
    if (f == WeightFormat::fp8_block || f == WeightFormat::fp4) {
      l.block = B;
      l.scale = read_part(t.name + ".scale", f, StoredPart::scale, s);
    }
    return l;
  }

  // The head: a plain tensor of the table, dense or (as exllamav3 converts it) EXL3.
  LinearWeight head(const DrafterTensor& t) {
    const std::string base = exl3_stored_plain(ckpt_, t);
    if (base.empty()) return dense_linear(t.name, tensor(t));
    return exl3(base, tensor_split(t, cfg_, plan_), t.shape[0], t.shape[1]);
  }

 private:
  // This rank's part of an EXL3 linear [out, in] (SPEC §9): an output split takes trellis tiles along dim 1
  // and svh, an input split tiles along dim 0 and suh; the cuts are on 128-boundaries (check_cut).
  LinearWeight exl3(const std::string& base, const TensorSplit& s, int64_t out, int64_t in) {
    const bool rows = s.kind == TensorSplit::Kind::rows, cols = s.kind == TensorSplit::Kind::cols;
    const std::string trellis = base + ".trellis";
    const Shape stored = ckpt_.get(trellis).shape;  // [in/16, out/16, 16K], checked by check_exl3_parts
    LinearWeight l;
    l.name = base;
    l.format = WeightFormat::exl3;
    l.out = rows ? s.count : out;
    l.in = cols ? s.count : in;
    l.bits = stored[2] / 16;
    l.codebook = ckpt_.has(base + ".mcg")    ? Exl3Codebook::mcg
                 : ckpt_.has(base + ".mul1") ? Exl3Codebook::mul1
                                             : Exl3Codebook::inst3;
    if (rows) {
      const uint64_t tile_bytes = static_cast<uint64_t>(stored[2]) * sizeof(int16_t);
      l.weight = read_bytes_of_rows(trellis, {stored[0], s.count / 16, stored[2]},
                                    static_cast<uint64_t>(s.begin / 16) * tile_bytes);
    } else {
      l.weight = read(trellis, cols ? TensorSplit::Kind::rows : TensorSplit::Kind::replicated,
                      cols ? s.begin / 16 : 0, cols ? s.count / 16 : stored[0]);
    }
    l.suh = exl3_scales(base, ".suh", ".su", cols ? s.begin : 0, l.in);
    l.svh = exl3_scales(base, ".svh", ".sv", rows ? s.begin : 0, l.out);
    return l;
  }

  // Elements [begin, begin + count) of an EXL3 scale vector as f16: stored (".suh"), or the legacy sign bits
  // (".su") as +-1.
  Tensor exl3_scales(const std::string& base, const char* scaled, const char* legacy, int64_t begin,
                     int64_t count) {
    if (ckpt_.has(base + scaled)) return read(base + scaled, TensorSplit::Kind::rows, begin, count);
    const std::string name = base + legacy;
    std::vector<int16_t> words(static_cast<size_t>(count / 16));
    ckpt_.read_rows(name, begin / 16, count / 16, words.data());
    const std::vector<f16_t> signs = exl3_unpack_signs(words);
    Tensor dst = backend_.alloc(DType::f16, {count});
    backend_.upload(dst, signs.data());
    if (on_read_) on_read_(words.size() * sizeof(int16_t));
    return dst;
  }

  // Bytes [byte0, byte0 + the slice's bytes) of every row (dim 0) of a stored tensor: `shape` is the slice.
  Tensor read_bytes_of_rows(const std::string& name, const Shape& shape, uint64_t byte0) {
    return read_into(name, shape, [&](uint8_t* host, uint64_t bytes) {
      ckpt_.read_col_bytes(name, byte0, bytes / static_cast<uint64_t>(shape[0]), host);
    });
  }

  // This rank's part of one stored part of a linear (stored_part_split).
  Tensor read_part(const std::string& name, WeightFormat f, StoredPart part, const TensorSplit& s) {
    const TensorSplit p = stored_part_split(f, part, s, cfg_.weight_block_size, ckpt_.get(name).shape);
    return read(name, p.kind, p.begin, p.count);
  }

  // Rows or columns [begin, begin + count) of one stored tensor (all of it when replicated), checked to be
  // finite.
  Tensor read(const std::string& name, TensorSplit::Kind kind, int64_t begin, int64_t count) {
    Shape shape = ckpt_.get(name).shape;
    if (kind == TensorSplit::Kind::cols) shape[1] = count;
    if (kind == TensorSplit::Kind::rows) shape[0] = count;
    return read_into(name, shape, [&](uint8_t* host, uint64_t) {
      if (kind == TensorSplit::Kind::cols)
        ckpt_.read_cols(name, begin, count, host);
      else
        ckpt_.read_rows(name, kind == TensorSplit::Kind::rows ? begin : 0, shape[0], host);
    });
  }

  // A tensor of `shape` in the stored tensor's dtype, its bytes filled by `fill`, checked to be finite and
  // uploaded.
  template <typename Fill>
  Tensor read_into(const std::string& name, const Shape& shape, Fill&& fill) {
    const TensorInfo& info = ckpt_.get(name);
    Tensor dst = backend_.alloc(info.dtype, shape);
    std::vector<uint8_t> host(dst.nbytes());
    fill(host.data(), static_cast<uint64_t>(host.size()));
    check_finite(name, info.file.string(), info.dtype, host);
    backend_.upload(dst, host.data());
    if (on_read_) on_read_(host.size());
    return dst;
  }

  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  const ShardPlan& plan_;
  Backend& backend_;
  const std::function<void(uint64_t)>& on_read_;
};

}  // namespace

std::string exl3_stored_plain(const Checkpoint& ckpt, const DrafterTensor& t) {
  constexpr std::string_view kSuffix = ".weight";
  const std::string& n = t.name;
  if (t.linear || !n.ends_with(kSuffix) || ckpt.has(n)) return {};
  std::string base = n.substr(0, n.size() - kSuffix.size());
  return ckpt.has(base + ".trellis") ? base : std::string();
}

WeightFormat detect_weight_format(const Checkpoint& ckpt, const std::string& base) {
  if (ckpt.has(base + ".trellis")) return WeightFormat::exl3;
  const TensorInfo* w = ckpt.find(base + ".weight");
  if (!w) fail("checkpoint {}: tensor '{}.weight' is missing", ckpt.dir().string(), base);
  if (ckpt.has(base + ".scale")) {
    if (w->dtype == DType::f8_e4m3) return WeightFormat::fp8_block;
    if (w->dtype == DType::i8 || w->dtype == DType::u8) return WeightFormat::fp4;
    fail("tensor '{}.weight' in {}: has a .scale but dtype {} is neither fp8 nor packed fp4", base,
         w->file.string(), dtype_name(w->dtype));
  }
  return WeightFormat::dense;
}

DrafterWeights load_drafter_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const ShardPlan& plan,
                                    Backend& backend, const LoadOptions& options) {
  for (const DrafterTensor& t : drafter_tensors(cfg)) {  // the whole table before any read
    if (!t.linear) {
      if (const std::string base = check_plain(ckpt, cfg, t, backend); !base.empty())
        check_cut(t, WeightFormat::exl3, tensor_split(t, cfg, plan), cfg, plan);
      continue;
    }
    const WeightFormat f = check_linear(ckpt, cfg, t, backend);
    check_cut(t, f, tensor_split(t, cfg, plan), cfg, plan);
  }
  if (options.head_fp8) check_head_requantization(ckpt, cfg, plan, backend);
  Loader load(ckpt, cfg, plan, backend, options.on_read);
  DrafterWeights w = assemble_drafter_weights(
      cfg, [&](const DrafterTensor& t) { return load.tensor(t); },
      [&](const DrafterTensor& t) { return load.linear(t); },
      [&](const DrafterTensor& t) { return load.head(t); });
  if (options.head_fp8) {
    const uint64_t dense_bytes = w.head.weight.nbytes();
    w.head = requantize_fp8_block(w.head, cfg.weight_block_size, plan.vocab.begin, cfg.vocab_size, backend);
    const uint64_t fp8_bytes = w.head.weight.nbytes() + w.head.scale.nbytes();
    w.bytes = w.bytes - dense_bytes + fp8_bytes;
    spdlog::info(
        "weights.head fp8: head.weight rows [{}, {}) re-quantised to fp8 block ({} x {} blocks): {:.2f} MB "
        "{} -> {:.2f} MB",
        plan.vocab.begin, plan.vocab.end, cfg.weight_block_size, cfg.weight_block_size,
        static_cast<double>(dense_bytes) / 1e6, dtype_name(ckpt.get("head.weight").dtype),
        static_cast<double>(fp8_bytes) / 1e6);
  }
  return w;
}

}  // namespace dspark
