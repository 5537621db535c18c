// A fake dspark worker for the client tests: creates a real segment (host::Segment), keeps the worker side of
// the liveness protocol (state, pid, heartbeat; host loss and detach release the host slot after emptying the
// rings) and answers requests with the real codec, drafting deterministically (fake_draft) instead of running
// a model.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lib/host/codec.hpp"
#include "lib/host/segment.hpp"

namespace dspark::test {

// A tiny model: 48-byte rows, k = 5, 16 context rows per message (so that splits are easy to provoke).
host::ModelDescription fake_model();

// The fake's answer for request r: output j < k' gets a token, logit, sigmoid and (with margins) a margin;
// outputs past k' are 0.
void fake_draft(const host::ModelDescription& m, const DraftRequest& r, bool margins, int64_t j, int32_t& id,
                float& conf, float& conf_logit, float& margin);

struct FakeOptions {
  host::ModelDescription model = fake_model();
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
  FakeWorker(const std::string& name, FakeOptions options = {});
  ~FakeWorker();  // stops its threads; the segment is removed
  FakeWorker(const FakeWorker&) = delete;
  FakeWorker& operator=(const FakeWorker&) = delete;

  host::SegmentHeader& header() { return segment_.header(); }
  void set_state(host::WorkerState s) { header().worker_state.store(static_cast<uint32_t>(s)); }
  // Stops refreshing the heartbeat and backdates it (a hung worker).
  void freeze_heartbeat(std::chrono::milliseconds age);
  void set_answer_steps(bool on) { answer_steps_ = on; }

  uint64_t attaches() const { return attaches_; }
  uint64_t detaches() const { return detaches_; }
  uint64_t hosts_lost() const { return hosts_lost_; }
  std::vector<ReceivedStep> steps() const;

 private:
  void serve();
  void heartbeat();
  void handle(const host::Request& r);
  void answer(const host::Response& r);
  void release_host();
  bool host_lost() const;

  FakeOptions opt_;
  host::Segment segment_;
  host::RingReader requests_;
  host::RingWriter responses_;
  std::atomic<bool> quit_{false};
  std::atomic<bool> beat_{true};
  std::atomic<bool> answer_steps_{true};
  std::atomic<uint64_t> attaches_{0}, detaches_{0}, hosts_lost_{0};
  uint64_t session_ = 0;
  int64_t max_model_len_ = 0;
  mutable std::mutex mu_;
  std::vector<ReceivedStep> steps_;
  std::vector<uint8_t> msg_;
  std::thread heartbeat_thread_;
  std::thread serve_thread_;
};

}  // namespace dspark::test
