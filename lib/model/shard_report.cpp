#include "lib/model/shard_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "lib/core/error.hpp"
#include "lib/model/load_weights.hpp"

namespace dspark {
namespace {

// Total payload of every stored part of a quantised linear weight that is present.
uint64_t stored_bytes(const Checkpoint& ckpt, const std::string& base) {
  uint64_t n = 0;
  for (const char* part : {".weight", ".scale", ".trellis", ".suh", ".svh", ".mcg", ".mul1"})
    if (const TensorInfo* t = ckpt.find(base + part)) n += t->nbytes;
  return n;
}

// dtype and representation of t as stored: the table's dense dtype without a checkpoint.
struct Stored {
  DType dtype;
  WeightFormat format = WeightFormat::dense;
  uint64_t quantised_bytes = 0;  // all stored parts, for a quantised representation
};

Stored stored(const DrafterTensor& t, const Checkpoint* ckpt) {
  if (!ckpt) return {t.dense_dtype};
  Stored s{t.dense_dtype};
  if (t.linear) s.format = detect_weight_format(*ckpt, t.name);  // throws when no representation is present
  if (s.format != WeightFormat::dense) {
    const std::string main = t.name + (s.format == WeightFormat::exl3 ? ".trellis" : ".weight");
    s.dtype = ckpt->get(main).dtype;
    s.quantised_bytes = stored_bytes(*ckpt, t.name);
    return s;
  }
  const TensorInfo& info = ckpt->get(t.weight_name());
  if (info.shape != t.shape)
    fail("tensor '{}' in {}: shape {} but config.json implies {}", info.name, info.file.string(),
         shape_str(info.shape), shape_str(t.shape));
  s.dtype = info.dtype;
  return s;
}

uint64_t shard_bytes(const DrafterTensor& t, const Stored& s, const TensorSplit& split) {
  if (s.format == WeightFormat::dense)
    return static_cast<uint64_t>(split_numel(t, split)) * dtype_size(s.dtype);
  if (split.kind == TensorSplit::Kind::replicated) return s.quantised_bytes;
  const auto whole = static_cast<uint64_t>(t.shape[split.kind == TensorSplit::Kind::rows ? 0 : 1]);
  return (s.quantised_bytes * static_cast<uint64_t>(split.count) + whole - 1) / whole;
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
    TensorReport tr{t.weight_name(), t.shape, s.dtype, s.format, {}};
    for (int r = 0; r < ranks; ++r) {
      const TensorSplit split = tensor_split(t, cfg, rep.plans[static_cast<size_t>(r)]);
      tr.shards.push_back({split, shard_bytes(t, s, split)});
    }
    // The split kind decides, so at N = 1 the shardable tensors count as sharded too and the per-rank sharded
    // bytes of any N add up to the N = 1 figure.
    for (size_t r = 0; r < tr.shards.size(); ++r)
      (tr.sharded() ? rep.bytes[r].sharded : rep.bytes[r].replicated) += tr.shards[r].bytes;
    rep.tensors.push_back(std::move(tr));
  }
  return rep;
}

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
                          {"total_bytes", r.bytes[i].total()}});
  }
  j["tensors"] = nlohmann::ordered_json::array();
  for (const TensorReport& t : r.tensors) {
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    for (const TensorShard& s : t.shards)
      shards.push_back({{"kind", kind_name(s.split.kind)},
                        {"begin", s.split.begin},
                        {"count", s.split.count},
                        {"bytes", s.bytes}});
    j["tensors"].push_back({{"name", t.name},
                            {"shape", t.shape},
                            {"dtype", std::string(dtype_name(t.dtype))},
                            {"format", weight_format_name(t.format)},
                            {"shards", std::move(shards)}});
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
  return out;
}

std::string format_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b < 1e9 ? fmt::format("{:.2f} MB", b / 1e6) : fmt::format("{:.2f} GB", b / 1e9);
}

}  // namespace dspark
