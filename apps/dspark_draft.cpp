// dspark_draft: load a checkpoint, insert context rows, draft one batch, print tokens, confidences and
// margins (or write them as JSON) so that results can be compared with another implementation on the same
// inputs.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>

#include "comm/communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/core/error.hpp"
#include "lib/runtime/draft_job.hpp"

namespace {

// "SLOT:FILE.npy" or "SLOT@FIRST_POS:FILE.npy"
dspark::ContextInput parse_rows(const std::string& s, bool random) {
  const auto colon = s.find(':');
  if (colon == std::string::npos)
    dspark::fail("'{}': expected SLOT[@FIRST_POS]:{}", s, random ? "N" : "FILE");
  dspark::ContextInput c;
  const std::string head = s.substr(0, colon), tail = s.substr(colon + 1);
  const auto at = head.find('@');
  c.slot = std::stoi(head.substr(0, at));
  if (at != std::string::npos) c.first_pos = std::stoll(head.substr(at + 1));
  if (random)
    c.random_rows = std::stoll(tail);
  else
    c.npy = tail;
  return c;
}

// "SLOT:TOKEN:POS[:K_OUT[:LOW]]"
dspark::DraftRequest parse_request(const std::string& s) {
  std::vector<int32_t> f;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(':', start), s.size());
    f.push_back(std::stoi(s.substr(start, end - start)));
    start = end + 1;
  }
  if (f.size() < 3 || f.size() > 5) dspark::fail("'{}': expected SLOT:TOKEN:POS[:K_OUT[:LOW]]", s);
  return {f[0], f[1], f[2], f.size() > 4 ? f[4] : -1, f.size() > 3 ? f[3] : 0};
}

void print_table(const nlohmann::json& r) {
  for (size_t b = 0; b < r["requests"].size(); ++b) {
    const auto& q = r["requests"][b];
    fmt::print("request {}: slot {} anchor {} @ {}, k' = {}\n", b, q["slot"].get<int>(),
               q["token"].get<int>(), q["pos"].get<int>(), q["k_out"].get<int>());
    fmt::print("  {:>2}  {:>8}  {:>8}  {:>9}\n", "j", "token", "conf", "margin");
    for (int j = 0; j < q["k_out"].get<int>(); ++j)
      fmt::print("  {:>2}  {:>8}  {:>8.4f}  {:>9.4f}\n", j, r["ids"][b][j].get<int>(),
                 r["conf"][b][j].get<float>(), r["margin"][b][j].get<float>());
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun every rank loads its shard and drafts; rank 0 prints. A plain run is one rank.
  dspark::MpiSession mpi(&argc, &argv);
  CLI::App app{"dspark_draft: draft one batch from a checkpoint and print or save the result"};
  dspark::DraftJob job;
  std::vector<std::string> rows, random_rows, requests;
  std::string requests_file, json_out;
  app.add_option("checkpoint", job.checkpoint, "checkpoint directory (config.json + safetensors)")
      ->required();
  app.add_option("--rows", rows,
                 "context rows of a slot from a .npy [n, 3H] (f32 or u16 bf16): SLOT[@POS]:FILE");
  app.add_option("--random-rows", random_rows, "N seeded random context rows for a slot: SLOT[@POS]:N");
  app.add_option("--request", requests,
                 "a draft request SLOT:TOKEN:POS[:K_OUT[:LOW]] (default: one per slot)");
  app.add_option("--requests", requests_file, "draft requests as JSON [{slot, token, pos, k_out, low?}]");
  app.add_option("--seed", job.seed, "seed of random rows and default anchor tokens")->default_val(0);
  app.add_option("--slots", job.options.slots, "slots held")->default_val(8);
  app.add_option("--max-model-len", job.options.max_model_len, "positions clamp to this - 1")
      ->default_val(1 << 20);
  app.add_flag(
      "--no-margin", [&](int64_t) { job.margin = false; }, "do not report margins");
  app.add_option("--json", json_out, "write the result as JSON to this file ('-' = stdout)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return mpi.rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }

  try {
    for (const auto& s : rows) job.contexts.push_back(parse_rows(s, false));
    for (const auto& s : random_rows) job.contexts.push_back(parse_rows(s, true));
    for (const auto& s : requests) job.requests.push_back(parse_request(s));
    if (!requests_file.empty()) {
      const auto more = dspark::read_requests_json(requests_file);
      job.requests.insert(job.requests.end(), more.begin(), more.end());
    }
    job.options.max_batch =
        std::max<int64_t>(1, static_cast<int64_t>(std::max(job.requests.size(), job.contexts.size())));
    dspark::CpuBackend backend;
    dspark::LocalCommunicator local;
    dspark::MpiCommunicator world(MPI_COMM_WORLD);
    dspark::Communicator& comm = mpi.size() > 1 ? static_cast<dspark::Communicator&>(world) : local;
    const nlohmann::json result = dspark::run_draft_job(job, backend, comm);
    if (mpi.rank() != 0) return 0;
    if (json_out == "-") {
      std::cout << result.dump(1) << "\n";
    } else {
      print_table(result);
      if (!json_out.empty()) {
        std::ofstream(json_out) << result.dump(1) << "\n";
        spdlog::info("wrote {}", json_out);
      }
    }
  } catch (const std::exception& e) {
    spdlog::error("rank {}: {}", mpi.rank(), e.what());
    // A rank that fails alone would leave the others waiting in a collective: end the whole job.
    if (mpi.size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  return 0;
}
