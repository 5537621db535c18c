// dspark_inspect: what each rank of a tp = N run would hold (SPEC §5), from config.json and the safetensors
// headers only (no tensor data is read), and whether the chosen backend runs every tensor's representation.
// All the work is in lib/model/shard_report.
//   dspark_inspect out/tiny-ckpt --tp 2 --tensors
//   dspark_inspect /data/v41 --tp 8 --backend cuda --json plan.json
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/shard_report.hpp"
#ifdef DSPARK_WITH_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace {

// The formats a backend's linear ops run; empty when this build has no such backend.
std::function<bool(dspark::WeightFormat)> backend_formats(const std::string& backend) {
  if (backend == "cpu") return dspark::CpuBackend::runs_format;
#ifdef DSPARK_WITH_CUDA
  if (backend == "cuda") return dspark::CudaBackend::runs_format;
#endif
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Show how a DSpark drafter checkpoint splits over tp = N ranks: ranges, tensors, bytes."};
  std::string dir, json_out, backend = "cpu";
  int tp = 1;
  bool tensors = false;
  app.add_option("CHECKPOINT_DIR", dir, "Checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--tp", tp, "Tensor-parallel ranks N")->required()->check(CLI::Range(1, 4096));
  app.add_option("--json", json_out,
                 "Also write the report as JSON to FILE ('-': stdout, instead of the table)");
  app.add_flag("--tensors", tensors, "List every tensor's split per rank");
  app.add_option("--backend", backend,
                 "Check that this backend runs every tensor's representation: cpu (default) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  CLI11_PARSE(app, argc, argv);

  try {
    const dspark::Checkpoint ckpt(dir, dspark::is_drafter_tensor);
    const dspark::ModelConfig cfg = dspark::load_model_config(ckpt.config_path());
    dspark::ShardReport report = dspark::make_shard_report(cfg, tp, &ckpt);
    if (report.ok()) dspark::check_backend(report, backend, backend_formats(backend));
    // The JSON carries a refusal too ("ok": false, "error"), so scripts need not parse stderr.
    if (json_out == "-") {
      fmt::print("{}\n", dspark::shard_report_json(report).dump(2));
    } else if (!json_out.empty()) {
      std::ofstream f(json_out);
      f << dspark::shard_report_json(report).dump(2) << "\n";
      if (!f) throw std::runtime_error("cannot write " + json_out);
    }
    if (!report.ok()) {
      fmt::print(stderr, "dspark_inspect: error: {} cannot run at tp {}: {}\n", dir, tp, report.refusal);
      return 1;
    }
    if (json_out != "-") fmt::print("{}", dspark::shard_report_table(report, tensors));
    if (!report.backend->runs()) {
      fmt::print(stderr, "dspark_inspect: error: {} cannot run on the {} backend: {}\n", dir, backend,
                 report.backend->built ? report.backend->reason()
                                       : "this build has no CUDA backend (it was configured without nvcc)");
      return 1;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "dspark_inspect: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
