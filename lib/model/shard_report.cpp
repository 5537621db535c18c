#include "lib/model/shard_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "lib/core/error.hpp"
#include "lib/model/load_weights.hpp"

namespace dspark {
namespace {

// Total payload of every stored part of an EXL3 weight that is present.
// An EXL3 weight's stored parts that the loader reads, by what a split cuts: the trellis (either split), the
// input vector (suh or the legacy su: an input split), the output vector (svh or sv: an output split). The
// codebook marker is not read.
struct Exl3Parts {
  uint64_t trellis = 0, inputs = 0, outputs = 0;
};

uint64_t bytes_of(const Checkpoint& ckpt, const std::string& base, std::initializer_list<const char*> parts) {
  uint64_t n = 0;
  for (const char* part : parts)
    if (const TensorInfo* t = ckpt.find(base + part)) n += t->nbytes;
  return n;
}

Exl3Parts exl3_parts(const Checkpoint& ckpt, const std::string& base) {
  return {bytes_of(ckpt, base, {".trellis"}), bytes_of(ckpt, base, {".suh", ".su"}),
          bytes_of(ckpt, base, {".svh", ".sv"})};
}

// dtype and representation of t as stored: the table's dense dtype without a checkpoint.
struct Stored {
  DType dtype;
  WeightFormat format = WeightFormat::dense;
  const TensorInfo* weight = nullptr;  // fp8 block / fp4: the ".weight" and ".scale" parts
  const TensorInfo* scale = nullptr;
  Exl3Parts exl3;         // EXL3: its stored parts
  std::string exl3_base;  // EXL3: the parts' base name
};

Stored stored(const DrafterTensor& t, const Checkpoint* ckpt) {
  if (!ckpt) return Stored{t.dense_dtype, WeightFormat::dense, nullptr, nullptr, {}, {}};
  Stored s{t.dense_dtype, WeightFormat::dense, nullptr, nullptr, {}, {}};
  if (t.linear) s.format = detect_weight_format(*ckpt, t.name);  // throws when no representation is present
  if (const std::string base = exl3_stored_plain(*ckpt, t);
      !base.empty()) {  // the head, as exllamav3 stores it
    s.format = WeightFormat::exl3;
    s.dtype = ckpt->get(base + ".trellis").dtype;
    s.exl3 = exl3_parts(*ckpt, base);
    s.exl3_base = base;
    return s;
  }
  if (s.format == WeightFormat::exl3) {
    s.dtype = ckpt->get(t.name + ".trellis").dtype;
    s.exl3 = exl3_parts(*ckpt, t.name);
    s.exl3_base = t.name;
    return s;
  }
  if (s.format != WeightFormat::dense) {
    s.weight = &ckpt->get(t.name + ".weight");
    s.scale = &ckpt->get(t.name + ".scale");
    s.dtype = s.weight->dtype;
    return s;
  }
  const TensorInfo& info = ckpt->get(t.weight_name());
  if (info.shape != t.shape)
    fail("tensor '{}' in {}: shape {} but config.json implies {}", info.name, info.file.string(),
         shape_str(info.shape), shape_str(t.shape));
  s.dtype = info.dtype;
  return s;
}

// The bytes of one stored part held under the linear's split.
uint64_t part_bytes(const Stored& s, const TensorInfo& part, StoredPart which, const TensorSplit& split,
                    int64_t block) {
  const TensorSplit p = stored_part_split(s.format, which, split, block, part.shape);
  return static_cast<uint64_t>(split_numel(part.shape, p)) * dtype_size(part.dtype);
}

PartBytes shard_bytes(const DrafterTensor& t, const Stored& s, const TensorSplit& split, int64_t block) {
  switch (s.format) {
    case WeightFormat::dense:
      return {static_cast<uint64_t>(split_numel(t, split)) * dtype_size(s.dtype), 0};
    case WeightFormat::fp8_block:
    case WeightFormat::fp4:
      return {part_bytes(s, *s.weight, StoredPart::weight, split, block),
              part_bytes(s, *s.scale, StoredPart::scale, split, block)};
    default: {  // EXL3, as the loader slices it: the trellis's tiles and the split side's vector
      const Exl3Parts& p = s.exl3;
      const bool rows = split.kind == TensorSplit::Kind::rows, cols = split.kind == TensorSplit::Kind::cols;
      const auto count = static_cast<uint64_t>(split.count);
      const auto cut = [&](uint64_t bytes, int64_t whole) {
        return bytes * count / static_cast<uint64_t>(whole);
      };
      const uint64_t trellis = rows   ? cut(p.trellis, t.shape[0])
                               : cols ? cut(p.trellis, t.shape[1])
                                      : p.trellis;
      return {trellis + (cols ? cut(p.inputs, t.shape[1]) : p.inputs) +
                  (rows ? cut(p.outputs, t.shape[0]) : p.outputs),
              0};
    }
  }
}

// Keys of the JSON's per-rank "formats".
const char* format_key(WeightFormat f) {
  switch (f) {
    case WeightFormat::dense:
      return "dense";
    case WeightFormat::fp8_block:
      return "fp8_block";
    case WeightFormat::fp4:
      return "fp4";
    case WeightFormat::exl3:
      return "exl3";
    case WeightFormat::bf16_mma_tiles:
      return "bf16_mma_tiles";
    case WeightFormat::fp8_mma_tiles:
      return "fp8_mma_tiles";
    case WeightFormat::fp4_mma_tiles:
      return "fp4_mma_tiles";
  }
  return "?";
}

const char* kind_name(TensorSplit::Kind k) {
  switch (k) {
    case TensorSplit::Kind::replicated:
      return "replicated";
    case TensorSplit::Kind::rows:
      return "rows";
    case TensorSplit::Kind::cols:
      return "cols";
  }
  return "?";
}

std::string range_str(const Range& r) {
  return fmt::format("[{}, {})", r.begin, r.end);
}

std::string split_str(const TensorSplit& s) {
  return fmt::format("{} [{}, {})", kind_name(s.kind), s.begin, s.begin + s.count);
}

// Left-aligned columns two spaces apart.
using Rows = std::vector<std::vector<std::string>>;
void render(const Rows& rows, std::string& out) {
  std::vector<size_t> width;
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) {
      if (c >= width.size()) width.push_back(0);
      width[c] = std::max(width[c], row[c].size());
    }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c)
      line += c + 1 == row.size() ? row[c] : fmt::format("{:<{}}  ", row[c], width[c]);
    out += line + "\n";
  }
}

}  // namespace

ShardReport make_shard_report(const ModelConfig& cfg, int ranks, const Checkpoint* ckpt) {
  ShardReport rep;
  rep.ranks = ranks;
  try {
    for (int r = 0; r < std::max(ranks, 1); ++r) rep.plans.push_back(make_shard_plan(cfg, r, ranks));
  } catch (const Error& e) {
    rep.refusal = e.what();
    rep.plans.clear();
    return rep;
  }
  rep.bytes.resize(static_cast<size_t>(ranks));
  for (const DrafterTensor& t : drafter_tensors(cfg)) {
    const Stored s = stored(t, ckpt);
    // An EXL3 weight is named by its trellis, the part that stands for the weight.
    TensorReport tr{s.format == WeightFormat::exl3 ? s.exl3_base + ".trellis" : t.weight_name(),
                    t.shape,
                    s.dtype,
                    s.format,
                    {}};
    for (int r = 0; r < ranks; ++r) {
      const TensorSplit split = tensor_split(t, cfg, rep.plans[static_cast<size_t>(r)]);
      const PartBytes b = shard_bytes(t, s, split, cfg.weight_block_size);
      tr.shards.push_back({split, b.total(), b.scale});
      PartBytes& f = rep.bytes[static_cast<size_t>(r)].formats[s.format];
      f.weight += b.weight;
      f.scale += b.scale;
    }
    // The split kind decides, so at N = 1 the shardable tensors count as sharded too and the per-rank sharded
    // bytes of any N add up to the N = 1 figure.
    for (size_t r = 0; r < tr.shards.size(); ++r)
      (tr.sharded() ? rep.bytes[r].sharded : rep.bytes[r].replicated) += tr.shards[r].bytes;
    rep.tensors.push_back(std::move(tr));
  }
  return rep;
}

void check_backend(ShardReport& r, const std::string& name, const std::function<bool(WeightFormat)>& runs) {
  BackendFit fit;
  fit.backend = name;
  fit.built = static_cast<bool>(runs);
  if (fit.built)
    for (const TensorReport& t : r.tensors) {
      if (runs(t.format)) continue;
      if (fit.tensor.empty()) {
        fit.tensor = t.name;
        fit.format = t.format;
      }
      ++fit.tensors_not_run;
    }
  r.backend = fit;
}

std::string BackendFit::reason() const {
  if (!built) return fmt::format("this build has no {} backend", backend);
  if (tensor.empty()) return "";
  return fmt::format(
      "tensor '{}' is stored {}, a format the {} backend does not run ({} of the checkpoint's "
      "tensors are)",
      tensor, weight_format_name(format), backend, tensors_not_run);
}

namespace {

nlohmann::ordered_json formats_json(const RankBytes& b) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [f, p] : b.formats)
    j[format_key(f)] = {{"weight_bytes", p.weight}, {"scale_bytes", p.scale}, {"total_bytes", p.total()}};
  return j;
}

}  // namespace

nlohmann::ordered_json shard_report_json(const ShardReport& r) {
  nlohmann::ordered_json j{{"tp", r.ranks}, {"ok", r.ok()}};
  if (!r.ok()) {
    j["error"] = r.refusal;
    return j;
  }
  auto range = [](const Range& x) { return nlohmann::ordered_json::array({x.begin, x.end}); };
  j["ranks"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.plans.size(); ++i) {
    const ShardPlan& p = r.plans[i];
    j["ranks"].push_back({{"rank", p.rank},
                          {"heads", range(p.heads)},
                          {"groups", range(p.groups)},
                          {"inter", range(p.inter)},
                          {"shared_inter", range(p.shared_inter)},
                          {"vocab", range(p.vocab)},
                          {"replicated_bytes", r.bytes[i].replicated},
                          {"sharded_bytes", r.bytes[i].sharded},
                          {"total_bytes", r.bytes[i].total()},
                          {"formats", formats_json(r.bytes[i])}});
  }
  j["tensors"] = nlohmann::ordered_json::array();
  for (const TensorReport& t : r.tensors) {
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    for (const TensorShard& s : t.shards)
      shards.push_back({{"kind", kind_name(s.split.kind)},
                        {"begin", s.split.begin},
                        {"count", s.split.count},
                        {"bytes", s.bytes},
                        {"scale_bytes", s.scale_bytes}});
    j["tensors"].push_back({{"name", t.name},
                            {"shape", t.shape},
                            {"dtype", std::string(dtype_name(t.dtype))},
                            {"format", weight_format_name(t.format)},
                            {"shards", std::move(shards)}});
  }
  if (r.backend) {
    const BackendFit& b = *r.backend;
    nlohmann::ordered_json bj{{"name", b.backend}, {"built", b.built}, {"runs", b.runs()}};
    if (!b.runs()) bj["error"] = b.reason();
    if (!b.tensor.empty()) {
      bj["tensor"] = b.tensor;
      bj["format"] = format_key(b.format);
      bj["tensors_not_run"] = b.tensors_not_run;
    }
    j["backend"] = std::move(bj);
  }
  return j;
}

std::string shard_report_table(const ShardReport& r, bool tensors) {
  if (!r.ok()) return fmt::format("tp {}: cannot split: {}\n", r.ranks, r.refusal);
  std::string out = fmt::format("tp {}: ranges per rank\n", r.ranks);
  Rows plan{{"rank", "heads", "groups", "inter", "shared_inter", "vocab"}};
  for (const ShardPlan& p : r.plans)
    plan.push_back({std::to_string(p.rank), range_str(p.heads), range_str(p.groups), range_str(p.inter),
                    range_str(p.shared_inter), range_str(p.vocab)});
  render(plan, out);

  if (tensors) {
    out += "\ntensors (split per rank)\n";
    Rows rows;
    for (const TensorReport& t : r.tensors) {
      std::string type(dtype_name(t.dtype));
      if (t.format != WeightFormat::dense) type += fmt::format(" ({})", weight_format_name(t.format));
      std::string where = "replicated";
      if (t.sharded()) {
        where.clear();
        for (const TensorShard& s : t.shards) where += (where.empty() ? "" : " | ") + split_str(s.split);
      }
      rows.push_back({t.name, shape_str(t.shape), type, where});
    }
    render(rows, out);
  }

  out += "\nbytes per rank\n";
  Rows bytes{{"rank", "replicated", "sharded", "total"}};
  RankBytes sum;
  for (size_t i = 0; i < r.bytes.size(); ++i) {
    const RankBytes& b = r.bytes[i];
    bytes.push_back(
        {std::to_string(i), format_bytes(b.replicated), format_bytes(b.sharded), format_bytes(b.total())});
    sum.replicated += b.replicated;
    sum.sharded += b.sharded;
  }
  if (r.bytes.size() > 1)
    bytes.push_back(
        {"sum", format_bytes(sum.replicated), format_bytes(sum.sharded), format_bytes(sum.total())});
  render(bytes, out);

  // By representation: the formats present on any rank, in enum order; "weight + scale" for those with
  // scales.
  std::map<WeightFormat, bool> present;  // format -> has scales
  for (const RankBytes& b : r.bytes)
    for (const auto& [f, p] : b.formats) present[f] = present[f] || p.scale > 0;
  out += "\nbytes per rank by format (weight + scale)\n";
  Rows formats{{"rank"}};
  for (const auto& [f, scaled] : present) formats[0].push_back(weight_format_name(f));
  for (size_t i = 0; i < r.bytes.size(); ++i) {
    formats.push_back({std::to_string(i)});
    for (const auto& [f, scaled] : present) {
      const auto it = r.bytes[i].formats.find(f);
      const PartBytes p = it == r.bytes[i].formats.end() ? PartBytes{} : it->second;
      formats.back().push_back(scaled ? fmt::format("{} + {}", format_bytes(p.weight), format_bytes(p.scale))
                                      : format_bytes(p.weight));
    }
  }
  render(formats, out);

  if (r.backend) {
    const BackendFit& b = *r.backend;
    if (b.runs()) {
      std::string names;
      for (const auto& [f, scaled] : present)
        names += (names.empty() ? "" : ", ") + std::string(weight_format_name(f));
      out += fmt::format("\nbackend {}: runs every tensor as stored ({})\n", b.backend, names);
    } else {
      out += fmt::format("\nbackend {}: cannot run this checkpoint: {}\n", b.backend, b.reason());
    }
  }
  return out;
}

std::string format_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < 1000) return fmt::format("{} B", bytes);
  if (b < 1e6) return fmt::format("{:.2f} kB", b / 1e3);
  return b < 1e9 ? fmt::format("{:.2f} MB", b / 1e6) : fmt::format("{:.2f} GB", b / 1e9);
}

}  // namespace dspark
