// A fake dspark worker for the client tests: the real worker side of the attach (host::HostDoor: socket,
// credentials, sealed memfds), the worker's liveness (state, heartbeat; a lost or detached host's session
// ends) and the real codec, drafting deterministically (fake_draft) instead of running a model.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lib/host/codec.hpp"
#include "lib/host/host_door.hpp"

namespace dspark::test {

// A tiny model: 48-byte rows, k = 5, 16 context rows per message (so that splits are easy to provoke).
host::ModelDescription fake_model();
// Its taps: target layers 7, 9 and 8 in that row order (not sorted, so order is checked) and noise token 998.
host::ModelTaps fake_taps();

// The fake's answer for request r: output j < k' gets a token, logit, sigmoid and (with margins) a margin;
// outputs past k' are 0.
void fake_draft(const host::ModelDescription& m, const DraftRequest& r, bool margins, int64_t j, int32_t& id,
                float& conf, float& conf_logit, float& margin);

// The fake's q(tok) for output j of request r: 1 greedy, 1 / (j + 2) sampled, 0 past k'; and value v of its
// whole distribution at j: q at the drafted id, the rest spread evenly.
float fake_q(const host::ModelDescription& m, const DraftRequest& r, int64_t j);
float fake_distribution(const host::ModelDescription& m, const DraftRequest& r, int64_t j, int32_t v);

struct FakeOptions {
  host::ModelDescription model = fake_model();
  host::ModelTaps taps = fake_taps();
  host::SamplingLimits sampling{2, 100.0f};  // what its attach answers say
  host::WorkerState initial_state = host::WorkerState::serving;
  uint32_t answer_version = host::kProtocolVersion;  // what an attach answer says
  Status attach_status = Status::ok;                 // non-ok: refuse attaches with it
  bool answer_steps = true;                          // false: take steps but never answer (a hung worker)
  int answer_delay_ms = 0;                           // before each step's answer
  bool stale_answers = false;                        // send an answer with a wrong id before each real one
  std::chrono::milliseconds host_timeout{1000};
};

// What one step message carried.
struct ReceivedStep {
  std::vector<int32_t> resets;
  std::vector<ContextBlock> contexts;
  std::vector<bf16_t> rows;
  size_t drafts = 0;
};

class FakeWorker {
 public:
  // Serves ring name `name` (its socket in the default directory).
  FakeWorker(const std::string& name, FakeOptions options = {});
  ~FakeWorker();  // stops its threads; the socket is removed
  FakeWorker(const FakeWorker&) = delete;
  FakeWorker& operator=(const FakeWorker&) = delete;

  void set_state(host::WorkerState s) { door_.set_state(s); }
  // Stops refreshing the heartbeat and backdates it (a hung worker).
  void freeze_heartbeat(std::chrono::milliseconds age);
  void set_answer_steps(bool on) { answer_steps_ = on; }
  // Ends the attached host's session, as a worker that found it lost.
  void drop_host() { drop_ = true; }

  // The attached host's pid (0: none).
  int32_t host_pid() const { return door_.host_pid(); }
  const std::string& path() const { return door_.path(); }
  uint64_t attaches() const { return attaches_; }
  uint64_t detaches() const { return detaches_; }
  uint64_t hosts_lost() const { return hosts_lost_; }
  // The fixed acceptance and Markov cache figures its stats answers carry (version 6): 3 reports of 7
  // tokens, 20 look-ups with 11 hits, hot uncached tokens 42 (9 times) and 7 (4 times).
  static host::StatsMore stats_more() {
    host::StatsMore m{};
    m.acceptance_reports = 3;
    m.accepted_tokens = 7;
    m.markov_lookups = 20;
    m.markov_hits = 11;
    m.hot_uncached = 2;
    m.hot_tokens[0] = 42;
    m.hot_seen[0] = 9;
    m.hot_tokens[1] = 7;
    m.hot_seen[1] = 4;
    return m;
  }
  uint64_t refused() const { return door_.refused(); }
  std::vector<ReceivedStep> steps() const;

 private:
  void serve();
  void heartbeat();
  void handle(const host::Request& r);
  void answer(const host::Response& r);
  void release_host();
  bool host_lost() const;

  FakeOptions opt_;
  host::HostDoor door_;
  std::shared_ptr<host::AdmittedHost> host_;  // the serve thread's
  std::unique_ptr<host::RingReader> requests_;
  std::unique_ptr<host::RingWriter> responses_;
  std::atomic<bool> quit_{false};
  std::atomic<bool> beat_{true};
  std::atomic<bool> drop_{false};
  std::atomic<bool> answer_steps_{true};
  std::atomic<uint64_t> attaches_{0}, detaches_{0}, hosts_lost_{0};
  int64_t max_model_len_ = 0;
  mutable std::mutex mu_;  // steps_, and host_ against the heartbeat thread
  std::vector<ReceivedStep> steps_;
  std::vector<uint8_t> msg_;
  std::thread heartbeat_thread_;
  std::thread serve_thread_;
};

}  // namespace dspark::test
