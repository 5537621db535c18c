// One offline drafting run (the dspark_draft app): load a checkpoint, insert context rows for some slots,
// draft one batch, return the answer as JSON, so that results can be compared with another implementation on
// the same inputs. Every rank of a tp group runs it; rank 0's JSON is the answer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.hpp"
#include "lib/model/backend.hpp"
#include "lib/model/drafter.hpp"

namespace dspark {

struct ContextInput {
  int32_t slot = 0;
  int64_t first_pos = 0;
  std::filesystem::path npy;  // [n, 3H] float32, or uint16 holding bf16 bits
  int64_t random_rows = 0;    // when no file: this many N(0, 1) rows drawn from the job's seed
};

struct DraftJob {
  std::filesystem::path checkpoint;
  std::vector<ContextInput> contexts;
  std::vector<DraftRequest> requests;  // empty: one request per context, anchor at its next position
  uint64_t seed = 0;
  bool margin = true;
  DrafterOptions options;
};

// Reads requests in the golden case's format: [{"slot", "token", "pos", "k_out", optional "low"}, ...].
std::vector<DraftRequest> read_requests_json(const std::filesystem::path& path);

// Runs the job with the given backend and communicator (plan from comm.rank() / comm.size()).
// Result: {"backend", "tp", "requests": [...], "ids", "conf", "conf_logit", "margin"} ([B][k] arrays).
nlohmann::json run_draft_job(const DraftJob& job, Backend& backend, Communicator& comm);

}  // namespace dspark
