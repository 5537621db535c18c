// dspark_fake_worker NAME [--no-answer] [--version V] [--dump FILE]: the tests' fake worker as a process (for
// the Python binding's test). Prints "ready" once serving; on SIGTERM or SIGINT writes what it received to
// FILE (one line per context block: slot first_pos rows, then the rows' bf16 bits) and exits 0.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "fake_worker.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s NAME [--no-answer] [--version V] [--dump FILE]\n", argv[0]);
    return 2;
  }
  dspark::test::FakeOptions opt;
  std::string dump;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-answer") {
      opt.answer_steps = false;
    } else if (a == "--version" && i + 1 < argc) {
      opt.answer_version = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (a == "--dump" && i + 1 < argc) {
      dump = argv[++i];
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  // Blocked before the worker's threads start, so that sigwait below is the only taker.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  try {
    dspark::test::FakeWorker worker(argv[1], opt);
    std::printf("ready\n");
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    if (!dump.empty()) {
      std::ofstream out(dump);
      const uint32_t values = opt.model.row_bytes / 2;
      for (const dspark::test::ReceivedStep& s : worker.steps()) {
        size_t at = 0;
        for (const dspark::ContextBlock& c : s.contexts) {
          out << c.slot << ' ' << c.first_pos << ' ' << c.rows;
          for (size_t i = 0; i < static_cast<size_t>(c.rows) * values; ++i) out << ' ' << s.rows[at++];
          out << '\n';
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fake worker: %s\n", e.what());
    return 1;
  }
  return 0;
}
