// dspark_inspect: what each rank of a tp = N run would hold (SPEC §5), from config.json and the safetensors
// headers only (no tensor data is read). All the work is in lib/model/shard_report.
//   dspark_inspect out/tiny-ckpt --tp 2 --tensors
//   dspark_inspect /data/v41 --tp 8 --json plan.json
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/shard_report.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Show how a DSpark drafter checkpoint splits over tp = N ranks: ranges, tensors, bytes."};
  std::string dir, json_out;
  int tp = 1;
  bool tensors = false;
  app.add_option("CHECKPOINT_DIR", dir, "Checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--tp", tp, "Tensor-parallel ranks N")->required()->check(CLI::Range(1, 4096));
  app.add_option("--json", json_out,
                 "Also write the report as JSON to FILE ('-': stdout, instead of the table)");
  app.add_flag("--tensors", tensors, "List every tensor's split per rank");
  CLI11_PARSE(app, argc, argv);

  try {
    const dspark::Checkpoint ckpt(dir);
    const dspark::ModelConfig cfg = dspark::load_model_config(ckpt.config_path());
    const dspark::ShardReport report = dspark::make_shard_report(cfg, tp, &ckpt);
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
  } catch (const std::exception& e) {
    fmt::print(stderr, "dspark_inspect: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
