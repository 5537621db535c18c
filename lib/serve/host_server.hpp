// Rank 0's side of the host interface: a PlanSource over the attached host's rings. Steps, resets, context
// rows and set_max_model_len become step plans of the SPMD loop; attach, stats and health are answered here.
// The HostDoor admits hosts and answers observers; the server checks the attached host's liveness (socket,
// heartbeat by this process's clock, answers read), resets a lost host's slots, and ends the loop after a
// stop request (SIGTERM), once the step in flight has been answered.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/host/codec.hpp"
#include "lib/host/host_door.hpp"
#include "lib/host/protocol.hpp"
#include "lib/host/ring.hpp"
#include "lib/model/markov_cache.hpp"
#include "lib/runtime/step_loop.hpp"
#include "lib/serve/acceptance_book.hpp"
#include "lib/serve/stats_book.hpp"

namespace dspark::host {

struct ServerOptions {
  std::string path;   // the socket (socket_path.hpp)
  std::string group;  // ring.group ("" = the worker's uid only)
  std::chrono::milliseconds host_timeout{5000};
  Metrics* metrics = nullptr;  // counts, step and ring-wait times, slot use (start_metrics; nullptr = off)
  ModelTaps taps{};            // the attach answer's tapped layers and noise token (protocol version 5 on)
  SamplingLimits sampling{};   // the attach answer's sampling limits (version 7 on); the response ring's room
  // Spin through a window around a step request's expected arrival (the last two gaps after an answer)
  // instead of sleeping on the futex there: a core busy for up to about 1 ms a step, some tens of us less a
  // step's round trip.
  bool spin_ahead = false;
};

class HostServer final : public PlanSource {
 public:
  // Binds the socket (state starting). `stop` is polled between steps (set by the SIGTERM handler).
  HostServer(const ServerOptions& options, const ModelDescription& model, const std::atomic<bool>& stop);
  ~HostServer() override;  // state stopped; the socket is closed and removed

  // The weight formats the worker loaded, for the model description (before set_serving: attach answers and
  // the worker area then carry them).
  void set_weight_formats(uint32_t weight_formats, uint32_t head_format);
  // The worker has loaded its weights: hosts may attach.
  void set_serving();
  // The loop ended unhealthy: hosts see it before the worker exits.
  void set_unhealthy();
  // The drafter's previous-token book, for the stats answers' hottest uncached tokens: read on the step
  // loop's thread, which is the one that drafts (at most once a second after a step, and at a host's stats
  // request), into the stats book that observers read. Null: none listed.
  void set_markov_tokens(const MarkovTokenBook* book) { markov_tokens_ = book; }

  std::optional<StepPlan> next() override;
  void complete(const StepPlan& plan, const StepResult& result) override;

 private:
  struct InFlight {
    uint64_t request_id = 0;
    MessageType type = MessageType::step;
    bool answer = true;  // false for the worker's own plans (a lost host's resets)
    std::chrono::steady_clock::time_point started;
  };
  // The host the door admitted, its rings as this side uses them.
  struct Attached {
    std::shared_ptr<AdmittedHost> host;
    RingReader requests;
    RingWriter responses;
  };
  // One message from the ring: a plan to run, or nullopt when it was handled here (or there was none).
  std::optional<StepPlan> take_message();
  void answer(const Response& r);
  void answer_status(MessageType type, uint64_t id, Status s, std::string message);
  // After a step's answer: which slots hold context now.
  void track_slots(const StepPlan& plan, Status s);
  // A detached or lost host: its session ends (the door closes its socket); returns the plan resetting its
  // slots.
  StepPlan release_host(const std::string& why);
  // Why the attached host counts as lost, or nothing while it is alive.
  std::optional<std::string> host_lost() const;

  ServerOptions opt_;
  ModelDescription model_;
  const std::atomic<bool>& stop_;
  StatsBook stats_;
  HostDoor door_;
  std::optional<Attached> host_;
  bool attached_ = false;           // the attach message was answered
  bool host_unresponsive_ = false;  // an answer could not be written in time
  std::vector<bool> touched_;       // slots holding the current host's context (written, not reset since)
  AcceptanceBook acceptance_;       // the host's reports on its drafts
  const MarkovTokenBook* markov_tokens_ = nullptr;
  std::chrono::steady_clock::time_point hot_refreshed_{};
  static constexpr std::chrono::seconds kHotTokensRefresh{1};
  void refresh_hot_tokens(bool now);
  InFlight in_flight_;
  uint64_t next_plan_id_ = 0;
  // When the last step's answer went out, and the last two gaps from a step's answer to the next step's
  // request: the request wait spins around the expected arrival instead of waking from the futex (an engine
  // sends its next step after its own forward pass, in a rhythm).
  std::optional<std::chrono::steady_clock::time_point> step_answered_;
  RecentWaits step_gaps_;
};

}  // namespace dspark::host
