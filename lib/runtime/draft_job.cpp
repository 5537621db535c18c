#include "lib/runtime/draft_job.hpp"

#include <fstream>
#include <random>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/error.hpp"
#include "lib/core/npy.hpp"
#include "lib/model/load_weights.hpp"

namespace dspark {
namespace {

std::vector<bf16_t> context_rows(const ContextInput& c, int64_t row_dim, uint64_t seed) {
  std::vector<bf16_t> rows;
  if (!c.npy.empty()) {
    const NpyArray a = read_npy(c.npy);
    if (a.shape.size() != 2 || a.shape[1] != row_dim)
      fail("{}: context rows must be [n, {}] (3H), got {}", c.npy.string(), row_dim, shape_str(a.shape));
    if (a.dtype == DType::bf16) {
      rows.resize(static_cast<size_t>(a.numel()));
      std::memcpy(rows.data(), a.bytes.data(), a.bytes.size());
    } else if (a.dtype == DType::f32) {
      for (float v : a.to_float()) rows.push_back(float_to_bf16(v));
    } else {
      fail("{}: context rows must be float32 or uint16 (bf16 bits), got {}", c.npy.string(),
           dtype_name(a.dtype));
    }
    return rows;
  }
  std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(c.slot + 1)));
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < c.random_rows * row_dim; ++i) rows.push_back(float_to_bf16(normal(rng)));
  return rows;
}

nlohmann::json per_request(const std::vector<float>& v, int64_t B, int64_t k) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t b = 0; b < B; ++b)
    out.push_back(std::vector<float>(v.begin() + b * k, v.begin() + (b + 1) * k));
  return out;
}

}  // namespace

std::vector<DraftRequest> read_requests_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path.string());
  std::vector<DraftRequest> out;
  try {
    for (const auto& r : nlohmann::json::parse(in)) {
      DraftRequest q;
      q.slot = r.at("slot").get<int32_t>();
      q.anchor_token = r.at("token").get<int32_t>();
      q.anchor_pos = r.at("pos").get<int32_t>();
      q.outputs = r.value("k_out", 0);
      q.window_low = r.value("low", -1);
      out.push_back(q);
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", path.string(), e.what());
  }
  return out;
}

nlohmann::json run_draft_job(const DraftJob& job, Backend& backend, Communicator& comm) {
  const Checkpoint ckpt(job.checkpoint, is_drafter_tensor);
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const ShardPlan plan = make_shard_plan(cfg, comm.rank(), comm.size());
  Drafter drafter(cfg, load_drafter_weights(ckpt, cfg, plan, backend), plan, backend, comm, job.options);

  std::vector<DraftRequest> requests = job.requests;
  std::mt19937_64 rng(job.seed);
  for (const ContextInput& c : job.contexts) {
    // Rank 0 reads (or draws) the rows and broadcasts them: every rank inserts the same bits.
    std::vector<bf16_t> rows;
    if (comm.rank() == 0) rows = context_rows(c, cfg.row_dim(), job.seed);
    uint64_t count = rows.size();
    comm.broadcast(&count, sizeof(count), 0);
    rows.resize(count);
    comm.broadcast(rows.data(), count * sizeof(bf16_t), 0);
    const int64_t n = static_cast<int64_t>(rows.size()) / cfg.row_dim();
    drafter.insert(c.slot, c.first_pos, rows.data(), n);
    if (job.requests.empty()) {
      DraftRequest q;
      q.slot = c.slot;
      q.anchor_token = static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab_size));
      q.anchor_pos = static_cast<int32_t>(c.first_pos + n);
      requests.push_back(q);
    }
  }
  if (requests.empty()) fail("nothing to draft: give context rows or requests");
  const DraftResult r = drafter.draft(requests, job.margin);

  nlohmann::json out;
  out["backend"] = backend.name();
  out["tp"] = comm.size();
  out["requests"] = nlohmann::json::array();
  for (const DraftRequest& q : requests)
    out["requests"].push_back({{"slot", q.slot},
                               {"token", q.anchor_token},
                               {"pos", q.anchor_pos},
                               {"k_out", q.outputs == 0 ? cfg.block_size : q.outputs},
                               {"low", q.window_low}});
  nlohmann::json ids = nlohmann::json::array();
  for (int64_t b = 0; b < r.batch; ++b)
    ids.push_back(std::vector<int32_t>(r.ids.begin() + b * r.k, r.ids.begin() + (b + 1) * r.k));
  out["ids"] = ids;
  out["conf"] = per_request(r.conf, r.batch, r.k);
  out["conf_logit"] = per_request(r.conf_logit, r.batch, r.k);
  out["margin"] = per_request(r.margin, r.batch, r.k);
  return out;
}

}  // namespace dspark
