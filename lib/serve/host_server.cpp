#include "lib/serve/host_server.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "lib/host/codec.hpp"
#include "lib/host/liveness.hpp"
#include "lib/host/protocol_version.hpp"

namespace dspark::host {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);  // how often liveness and stop are looked at

}  // namespace

HostServer::HostServer(const ServerOptions& options, const ModelDescription& model,
                       const std::atomic<bool>& stop)
    : opt_(options),
      model_(model),
      stop_(stop),
      stats_(options.metrics),
      door_(DoorOptions{options.path, options.group, model, std::chrono::milliseconds(500), true,
                        options.sampling.max_distributions},
            [this](Observation& o, StatsMore& more) {
              o.stats = stats_.snapshot();
              o.failed_in_a_row = stats_.failed_in_a_row();
              more = stats_.snapshot_more();
            }),
      touched_(model.slots, false),
      acceptance_(model.slots, model.block_size) {}

HostServer::~HostServer() {
  door_.set_state(WorkerState::stopped);
}

void HostServer::set_weight_formats(uint32_t weight_formats, uint32_t head_format) {
  model_.weight_formats = weight_formats;
  model_.head_format = head_format;
  door_.set_model(model_);
}

void HostServer::set_serving() {
  door_.set_state(WorkerState::serving);
}
void HostServer::set_unhealthy() {
  door_.set_state(WorkerState::unhealthy);
}

std::optional<std::string> HostServer::host_lost() const {
  if (door_.host_hung_up()) return std::string("closed its socket");
  if (host_unresponsive_) return std::string("does not read its answers");
  // The heartbeat is the host's to write: judged by this process's clock, from the admission on (a host that
  // never stamps gets host_timeout from then), and never fresh when stamped ahead of this clock.
  const AdmittedHost& h = *host_->host;
  const uint64_t now = monotonic_ns();
  const uint64_t beat = h.areas.host().host_heartbeat_ns.load();
  const std::optional<uint64_t> age = heartbeat_age_ns(std::max(beat, h.admitted_ns), now);
  if (!age)
    return fmt::format("stamped its heartbeat {} ms ahead of the worker's clock", (beat - now) / 1'000'000);
  const auto timeout = static_cast<uint64_t>(std::chrono::nanoseconds(opt_.host_timeout).count());
  if (*age > timeout) return fmt::format("has been silent for {} ms", *age / 1'000'000);
  return std::nullopt;
}

StepPlan HostServer::release_host(const std::string& why) {
  spdlog::info("host pid {} {}: resetting its slots", host_->host->peer.pid, why);
  door_.release();  // first: the host sees its socket close, and no heartbeat goes to its area any more
  host_.reset();    // then its memory is unmapped: the next host gets new memfds
  attached_ = false;
  host_unresponsive_ = false;
  step_answered_.reset();  // the next host keeps its own rhythm
  step_gaps_.clear();
  StepPlan plan;
  plan.id = next_plan_id_++;
  for (size_t s = 0; s < touched_.size(); ++s)
    if (touched_[s]) plan.resets.push_back(static_cast<int32_t>(s));
  std::fill(touched_.begin(), touched_.end(), false);
  acceptance_.forget_all();
  if (opt_.metrics) opt_.metrics->set_slots_in_use(0);
  in_flight_ = {0, MessageType::step, false, std::chrono::steady_clock::now()};
  return plan;
}

std::optional<StepPlan> HostServer::next() {
  auto waiting_since = std::chrono::steady_clock::now();  // for the ring-wait metric
  for (;;) {
    if (stop_.load()) {
      door_.set_state(WorkerState::draining);
      spdlog::info("stop requested: leaving the step loop");
      return std::nullopt;
    }
    if (!host_) {
      std::shared_ptr<AdmittedHost> h = door_.wait_admitted(kPoll);
      if (h) host_.emplace(Attached{h, RingReader(h->areas.requests()), RingWriter(h->areas.responses())});
      waiting_since = std::chrono::steady_clock::now();
      continue;
    }
    if (const std::optional<std::string> why = host_lost()) {
      stats_.host_lost();
      StepPlan plan = release_host(*why);
      if (!plan.resets.empty()) return plan;
      continue;
    }
    // Sleeps on the ring's futex; spins through the window of the next step's expected arrival.
    const SpinWindow window =
        opt_.spin_ahead && step_answered_ ? step_gaps_.window(*step_answered_) : SpinWindow{};
    if (!host_->requests.wait(kPoll, window)) continue;
    if (std::optional<StepPlan> plan = take_message()) {
      if (opt_.metrics && in_flight_.answer)
        opt_.metrics->ring_waited(std::chrono::duration<double>(in_flight_.started - waiting_since).count());
      return plan;
    }
  }
}

std::optional<StepPlan> HostServer::take_message() {
  bool corrupt = false;
  const MessageHeader* head = host_->requests.peek(corrupt);
  if (corrupt) {
    stats_.rejected_message();
    StepPlan plan = release_host("wrote a corrupt message header (session ended)");
    return plan.resets.empty() ? std::nullopt : std::optional<StepPlan>(std::move(plan));
  }
  if (!head) return std::nullopt;
  // Decoded from the ring itself, each byte read once into private memory (codec.hpp), for the length
  // peek() checked; the ring space goes back to the host only after.
  const size_t bytes = host_->requests.peeked_bytes();
  Request req;
  const StatusOr decoded =
      decode_request({reinterpret_cast<const uint8_t*>(head), bytes}, model_, req, host_->host->version);
  host_->requests.consume();
  if (!decoded.ok()) {
    stats_.rejected_message();
    answer_status(req.type, req.id, decoded.status, decoded.message);
    return std::nullopt;
  }
  switch (req.type) {
    case MessageType::attach: {
      // The door admitted this host's hello, so its areas and messages are in that version's layout: an
      // attach message of another version is a host that contradicts its own hello.
      if (req.attach.version != host_->host->version) {
        answer_status(req.type, req.id, Status::invalid_argument,
                      protocol_served(req.attach.version)
                          ? fmt::format("attach request of protocol version {} after a hello of version {}",
                                        req.attach.version, host_->host->version)
                          : version_refusal(req.attach.version));
        return std::nullopt;
      }
      attached_ = true;
      stats_.host_attached();
      Response r;
      r.type = req.type;
      r.id = req.id;
      r.attach = {host_->host->version, 0, host_->host->session, model_};
      r.taps = opt_.taps;
      r.sampling = opt_.sampling;
      answer(r);
      spdlog::info("host pid {} attached (session {})", host_->host->peer.pid, r.attach.session);
      return std::nullopt;
    }
    case MessageType::detach: {
      StepPlan plan = release_host("detached");
      return plan.resets.empty() ? std::nullopt : std::optional<StepPlan>(std::move(plan));
    }
    case MessageType::stats: {
      Response r;
      r.type = req.type;
      r.id = req.id;
      r.stats = stats_.snapshot();
      r.stats.hosts_refused = door_.refused();
      refresh_hot_tokens(true);
      r.stats_more = stats_.snapshot_more();
      answer(r);
      return std::nullopt;
    }
    case MessageType::health: {
      Response r;
      r.type = req.type;
      r.id = req.id;
      r.health = {static_cast<uint32_t>(door_.state()), model_.tp, stats_.steps(), stats_.failed_in_a_row(),
                  0};
      answer(r);
      return std::nullopt;
    }
    default:
      break;
  }
  if (!attached_) {
    answer_status(req.type, req.id, Status::unavailable, "attach first");
    return std::nullopt;
  }
  StepPlan plan;
  if (req.type == MessageType::set_max_model_len) {
    plan.max_model_len = req.max_model_len;
  } else {
    plan = std::move(req.step);
  }
  plan.id = next_plan_id_++;
  in_flight_ = {req.id, req.type, true, std::chrono::steady_clock::now()};
  if (req.type == MessageType::step && step_answered_)
    step_gaps_.record(in_flight_.started - *step_answered_);
  return plan;
}

void HostServer::complete(const StepPlan& plan, const StepResult& result) {
  if (!in_flight_.answer) return;  // the worker's own plan (a lost host's resets)
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - in_flight_.started)
          .count();
  const Status s = result.status.status;
  uint64_t rows = 0;
  if (s == Status::ok)
    for (const ContextBlock& c : plan.contexts) rows += static_cast<uint64_t>(c.rows);
  track_slots(plan, s);
  const AcceptanceBook::Taken reports = acceptance_.take(plan, s);
  for (const AcceptanceBook::Report& a : reports.counted) stats_.acceptance_counted(a.accepted);
  if (opt_.metrics) {
    for (const AcceptanceBook::Report& a : reports.counted)
      opt_.metrics->acceptance_reported(a.k, a.temperature_class, a.accepted);
    if (reports.unmatched > 0) opt_.metrics->acceptance_unmatched(reports.unmatched);
  }
  if (s == Status::ok) stats_.markov_looked_up(result.draft.markov_lookups, result.draft.markov_hits);
  refresh_hot_tokens(false);
  stats_.step_answered(s, us, plan.drafts.size(), plan.resets.size(), rows);
  if (!host_) return;  // the step's host was released meanwhile: nobody to answer
  Response r;
  r.type = in_flight_.type;
  r.id = in_flight_.request_id;
  r.status = result.status;
  if (s == Status::ok) r.draft = result.draft;
  answer(r);
  if (r.type == MessageType::step) step_answered_ = std::chrono::steady_clock::now();
}

void HostServer::refresh_hot_tokens(bool now) {
  if (!markov_tokens_ || markov_tokens_->lookups() == 0) return;
  const auto t = std::chrono::steady_clock::now();
  if (!now && t - hot_refreshed_ < kHotTokensRefresh) return;
  hot_refreshed_ = t;
  stats_.set_hot_uncached(markov_tokens_->hottest(kHotUncachedTokens, /*uncached_only=*/true));
}

void HostServer::track_slots(const StepPlan& plan, Status s) {
  if (s != Status::ok && s != Status::internal) return;  // rejected before the ranks: nothing changed
  // The step loop runs the resets first; a failed step resets the slots it wrote or drafted on every rank.
  for (const int32_t slot : plan.resets) touched_[static_cast<size_t>(slot)] = false;
  for (const ContextBlock& c : plan.contexts) touched_[static_cast<size_t>(c.slot)] = s == Status::ok;
  if (s == Status::internal)
    for (const DraftRequest& r : plan.drafts) touched_[static_cast<size_t>(r.slot)] = false;
  if (opt_.metrics) opt_.metrics->set_slots_in_use(std::count(touched_.begin(), touched_.end(), true));
}

void HostServer::answer_status(MessageType type, uint64_t id, Status s, std::string message) {
  Response r;
  r.type = type;
  r.id = id;
  r.status = {s, std::move(message)};
  answer(r);
}

void HostServer::answer(const Response& r) {
  // In the layout of the attached host's version (its hello's), encoded straight into the ring.
  const uint32_t bytes = encoded_size(r, host_->host->version);
  // Waits for ring space in slices: a host that is gone or silent meanwhile ends the wait.
  const auto deadline = std::chrono::steady_clock::now() + opt_.host_timeout;
  uint8_t* dst = nullptr;
  while ((dst = host_->responses.reserve(bytes, kPoll)) == nullptr) {
    if (host_lost() || std::chrono::steady_clock::now() >= deadline) {
      // The host stopped reading: it is treated as lost on the next poll.
      spdlog::warn("host does not read its answers: dropping answer {}", r.id);
      host_unresponsive_ = true;
      return;
    }
  }
  encode_response(r, dst, host_->host->version);
  host_->responses.publish();
}

}  // namespace dspark::host
