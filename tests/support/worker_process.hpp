// A dspark_worker started by a test under mpirun, in its own process group (so a signal reaches mpirun and
// every rank), with a fresh tiny checkpoint config and a unique ring name (its socket in the default
// directory).
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "lib/host/socket_path.hpp"
#include "tests/support/tiny_checkpoint.hpp"

extern char** environ;

namespace dspark::test {

class WorkerProcess {
 public:
  // Starts `mpirun -np ranks dspark_worker <config>`; extra YAML lines are appended to the config.
  WorkerProcess(int ranks, const std::string& ring, const std::string& extra_yaml = "") : ring_(ring) {
    const auto dir = scratch_dir("worker-" + ring.substr(1));
    config_ = dir / "worker.yaml";
    std::ofstream(config_)
        << "checkpoint: " << tiny_checkpoint().string() << "\n"
        << "backend: cpu\nslots: 4\nmax_batch: 4\nmax_model_len: 512\nmax_context_rows: 64\n"
        << "ring:\n  name: " << ring << "\n"
        << "health:\n  host_timeout_ms: 1000\n"
        << extra_yaml;
    const std::string worker = std::string(DSPARK_BINARY_DIR) + "/apps/dspark_worker";
    std::vector<std::string> args = {"mpirun", "-np", std::to_string(ranks), worker, config_.string()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    if (posix_spawnp(&pid_, "mpirun", nullptr, &attr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawnattr_destroy(&attr);
  }
  ~WorkerProcess() {
    if (pid_ > 0 && !exited_) {
      (void)signal_ranks(SIGKILL);  // may find none left
      ::kill(pid_, SIGKILL);
      wait_exit(std::chrono::seconds(10));
    }
    ::unlink(host::socket_path(ring_).c_str());  // a killed worker leaves its socket behind
  }
  pid_t pid() const { return pid_; }
  const std::string& ring() const { return ring_; }
  // Sends a signal to every rank (mpirun's children: Open MPI puts them in process groups of their own, and
  // mpirun itself reports a signal it receives as a failure).
  // True when at least one rank was signalled.
  bool signal_ranks(int sig) const {
    return std::system(("pkill -" + std::to_string(sig) + " -P " + std::to_string(pid_)).c_str()) == 0;
  }
  // The exit status of mpirun (-1 if it did not exit in time, 128 + signal when killed).
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  std::string ring_;
  std::filesystem::path config_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

}  // namespace dspark::test
