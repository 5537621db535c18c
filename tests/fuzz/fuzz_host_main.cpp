// dspark_fuzz_host: the host-message fuzz (host_fuzz.hpp) as a program, for long runs (docs/robustness.md):
//   dspark_fuzz_host --messages 1000000 --seed 1
// Prints the figures; exits 0 when no failure was found, 1 otherwise (naming the first).
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cstdio>

#include "tests/fuzz/host_fuzz.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dspark_fuzz_host: mutated host messages through the codec, check_plan and the step loop"};
  dspark::fuzz::FuzzOptions o;
  app.add_option("--messages", o.messages, "messages to send")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "generator seed");
  app.add_option("--max-message-ms", o.max_message_ms, "a message slower than this counts as a hang");
  app.add_option("--watchdog-s", o.watchdog_s, "a message running longer than this aborts the run");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::off);  // failed steps are counted, not logged
  const dspark::fuzz::FuzzReport r = dspark::fuzz::run_host_fuzz(o);
  std::printf("%s\n", r.summary().c_str());
  if (r.failures() == 0) return 0;
  std::printf("first failure: %s\n", r.first_failure.c_str());
  return 1;
}
