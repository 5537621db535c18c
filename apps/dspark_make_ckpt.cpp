// dspark_make_ckpt: writes a synthetic drafter checkpoint (config.json + safetensors, SPEC §3) with
// deterministic weights, for tests and benchmarks. All the work is in lib/checkpoint/synthetic.
//   dspark_make_ckpt --preset tiny --out out/tiny-ckpt
//   dspark_make_ckpt --preset v41-flash --seed 1 --out /data/v41-synthetic   (about 31 GB)
//   dspark_make_ckpt --preset v41-flash --format fp8 --config-layout release --out /data/v41-fp8   (the
//   released representation and config.json shape)
//   dspark_make_ckpt --preset tiny --format exl3 --out out/tiny-exl3   (the seed's EXL3 mix, SPEC §9)
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "lib/checkpoint/synthetic.hpp"
#include "lib/checkpoint/synthetic_exl3.hpp"
#include "lib/config/model_config.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Progress lines on stderr every few seconds, only for outputs that take a while.
dspark::SyntheticProgressFn progress_printer(Clock::time_point t0) {
  constexpr uint64_t kQuietBelow = uint64_t{1} << 30;
  return [t0, last = t0](const dspark::SyntheticProgress& p) mutable {
    if (p.bytes_total < kQuietBelow || Clock::now() - last < std::chrono::seconds(3)) return;
    last = Clock::now();
    const double s = seconds_since(t0);
    fmt::print(stderr, "dspark_make_ckpt: {}/{} tensors, {:.2f}/{:.2f} GB, {:.0f} MB/s\n", p.tensors_done,
               p.tensors_total, p.bytes_done / 1e9, p.bytes_total / 1e9, p.bytes_done / 1e6 / s);
  };
}

// --exl3-bits ROLE=K entries, each a known role and K in 1..8.
std::map<std::string, int64_t> parse_role_bits(const std::vector<std::string>& entries) {
  const std::map<std::string, int64_t> roles = dspark::seed_exl3_bits();
  std::map<std::string, int64_t> out;
  for (const std::string& e : entries) {
    const size_t eq = e.find('=');
    const std::string role = e.substr(0, eq);
    int64_t k = 0;
    try {
      if (eq == std::string::npos) throw std::invalid_argument("no =");
      size_t used = 0;
      k = std::stoll(e.substr(eq + 1), &used);
      if (used != e.size() - eq - 1) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      throw CLI::ValidationError("--exl3-bits", fmt::format("'{}': expected ROLE=K", e));
    }
    if (!roles.contains(role))
      throw CLI::ValidationError("--exl3-bits", fmt::format("'{}': unknown role '{}'", e, role));
    if (k < 1 || k > 8) throw CLI::ValidationError("--exl3-bits", fmt::format("'{}': K must be 1..8", e));
    out[role] = k;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a synthetic DSpark drafter checkpoint with deterministic weights."};
  std::string preset, config_file, out;
  uint64_t seed = 0;
  double max_shard_gb = 4.0;
  bool force = false;
  std::string format = "bf16", layout = "dspark", codebook = "mul1";
  std::vector<std::string> exl3_bits;
  auto* p =
      app.add_option("--preset", preset, "Model config preset")->check(CLI::IsMember({"tiny", "v41-flash"}));
  auto* c = app.add_option("--config", config_file, "Model config.json to use instead of a preset")
                ->check(CLI::ExistingFile);
  p->excludes(c);
  c->excludes(p);
  app.add_option("--seed", seed, "Generator seed (default 0)");
  app.add_option("--out", out, "Output directory")->required();
  app.add_option("--max-shard-gb", max_shard_gb, "Largest shard in GB (1e9 bytes); more shards get an index")
      ->check(CLI::PositiveNumber);
  app.add_option(
         "--format", format,
         "bf16: every linear dense (default); fp8: the released representation (fp8 block linears, fp4 "
         "routed experts); exl3: the seed's EXL3 mix (trellises for the head, main_proj, attention and "
         "experts, wo_a fp8 block)")
      ->check(CLI::IsMember({"bf16", "fp8", "exl3"}));
  app.add_option("--codebook", codebook, "exl3: the trellis codebook (mul1, default; mcg; 3inst)")
      ->check(CLI::IsMember({"mul1", "mcg", "3inst"}));
  app.add_option("--exl3-bits", exl3_bits,
                 "exl3: ROLE=K (1..8) replacing the seed's bits for a role, e.g. main_proj=4 ffn.experts=3 "
                 "(roles: head, main_proj, attn.wq_a, attn.wkv, attn.wq_b, attn.wo_b, "
                 "ffn.shared_experts.w1/w3/w2, ffn.experts)");
  app.add_option(
         "--config-layout", layout,
         "config.json's shape: dspark (the inference code's keys, default) or release (the Hugging Face "
         "layout published with the weights)")
      ->check(CLI::IsMember({"dspark", "release"}));
  app.add_flag("--force", force, "Overwrite the checkpoint files of a non-empty output directory");
  CLI11_PARSE(app, argc, argv);

  try {
    if (preset.empty() && config_file.empty()) throw CLI::RequiredError("--preset or --config");
    const dspark::ModelConfig base = !config_file.empty() ? dspark::load_model_config(config_file)
                                     : preset == "tiny"   ? dspark::tiny_model_config()
                                                          : dspark::ModelConfig{};  // the V4.1 defaults
    if (format != "exl3" && (!exl3_bits.empty() || codebook != "mul1"))
      throw CLI::ValidationError("--codebook / --exl3-bits", "only with --format exl3");
    const std::map<std::string, int64_t> bits = parse_role_bits(exl3_bits);
    const dspark::SyntheticFormat f = format == "fp8"    ? dspark::SyntheticFormat::fp8
                                      : format == "exl3" ? dspark::SyntheticFormat::exl3
                                                         : dspark::SyntheticFormat::bf16;
    const dspark::ModelConfig cfg = dspark::synthetic_model_config(
        base, f, layout == "release" ? dspark::ConfigLayout::release : dspark::ConfigLayout::inference,
        codebook, bits);
    dspark::SyntheticOptions opt;
    opt.seed = seed;
    opt.force = force;
    opt.max_shard_bytes = static_cast<uint64_t>(max_shard_gb * 1e9);
    const auto t0 = Clock::now();
    const auto r = dspark::write_synthetic_checkpoint(cfg, out, opt, progress_printer(t0));
    const double s = seconds_since(t0);
    fmt::print(
        stderr,
        "dspark_make_ckpt: wrote {} tensors ({}), {:.3f} GB in {} file(s) to {} in {:.1f} s ({:.0f} MB/s)\n",
        r.tensors, format, r.bytes / 1e9, r.files.size(), out, s, r.bytes / 1e6 / std::max(s, 1e-6));
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dspark_make_ckpt: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
