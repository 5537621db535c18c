#include "lib/serve/host_server.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "lib/host/codec.hpp"

namespace dspark::host {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(50);        // how often liveness and stop are looked at
constexpr auto kHeartbeat = std::chrono::milliseconds(100);  // worker heartbeat period
constexpr size_t kRecentSteps = 1024;                        // latency window of the stats

}  // namespace

HostServer::HostServer(const ServerOptions& options, const ModelDescription& model,
                       const std::atomic<bool>& stop)
    : opt_(options),
      model_(model),
      stop_(stop),
      segment_(Segment::create(options.name, options.mode, model)),
      requests_(segment_.requests()),
      responses_(segment_.responses()),
      touched_(model.slots, false) {
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
  spdlog::info("host interface: shared memory {} (mode {:o}), protocol {}", opt_.name, opt_.mode,
               kProtocolVersion);
}

HostServer::~HostServer() {
  segment_.header().worker_state.store(static_cast<uint32_t>(WorkerState::stopped));
  quit_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
}

void HostServer::heartbeat_loop() {
  while (!quit_.load()) {
    segment_.header().worker_heartbeat_ns.store(monotonic_ns());
    std::this_thread::sleep_for(kHeartbeat);
  }
}

void HostServer::set_weight_formats(uint32_t weight_formats, uint32_t head_format) {
  model_.weight_formats = weight_formats;
  model_.head_format = head_format;
  segment_.header().model.weight_formats = weight_formats;
  segment_.header().model.head_format = head_format;
}

void HostServer::set_serving() {
  segment_.header().worker_state.store(static_cast<uint32_t>(WorkerState::serving));
}
void HostServer::set_unhealthy() {
  segment_.header().worker_state.store(static_cast<uint32_t>(WorkerState::unhealthy));
}

bool HostServer::host_lost() const {
  const SegmentHeader& h = segment_.header();
  const int32_t pid = h.host_pid.load();
  if (pid == 0) return false;
  if (host_unresponsive_) return true;
  const uint64_t beat = h.host_heartbeat_ns.load(), now = monotonic_ns();
  const uint64_t age = now > beat ? now - beat : 0;  // the host may stamp between the two reads
  return !process_alive(pid) ||
         age > static_cast<uint64_t>(std::chrono::nanoseconds(opt_.host_timeout).count());
}

StepPlan HostServer::release_host(const char* why) {
  SegmentHeader& h = segment_.header();
  spdlog::info("host pid {} {}: resetting its slots", h.host_pid.load(), why);
  // Nobody else touches the rings until host_pid is released, so both can start over.
  reset_ring(segment_.requests());
  reset_ring(segment_.responses());
  requests_ = RingReader(segment_.requests());
  responses_ = RingWriter(segment_.responses());
  attached_ = false;
  host_unresponsive_ = false;
  StepPlan plan;
  plan.id = next_plan_id_++;
  for (size_t s = 0; s < touched_.size(); ++s)
    if (touched_[s]) plan.resets.push_back(static_cast<int32_t>(s));
  std::fill(touched_.begin(), touched_.end(), false);
  in_flight_ = {0, MessageType::step, false, std::chrono::steady_clock::now()};
  h.host_pid.store(0);  // last: the next host may claim the segment now
  return plan;
}

std::optional<StepPlan> HostServer::next() {
  SegmentHeader& h = segment_.header();
  for (;;) {
    if (stop_.load()) {
      h.worker_state.store(static_cast<uint32_t>(WorkerState::draining));
      spdlog::info("stop requested: leaving the step loop");
      return std::nullopt;
    }
    if (host_lost()) {
      ++stats_.hosts_lost;
      StepPlan plan = release_host("is gone");
      if (!plan.resets.empty()) return plan;
      continue;
    }
    // Sleeps on the ring's futex (a new host's attach message wakes it too).
    if (!requests_.wait(kPoll)) continue;
    if (h.host_pid.load() == 0) {  // written without claiming the segment: not a host of the protocol
      requests_.discard_all();
      continue;
    }
    if (std::optional<StepPlan> plan = take_message()) return plan;
  }
}

std::optional<StepPlan> HostServer::take_message() {
  bool corrupt = false;
  const MessageHeader* head = requests_.peek(corrupt);
  if (corrupt) {
    ++stats_.rejected_messages;
    StepPlan plan = release_host("wrote a corrupt message header (ring dropped)");
    return plan.resets.empty() ? std::nullopt : std::optional<StepPlan>(std::move(plan));
  }
  if (!head) return std::nullopt;
  // A private copy of the length peek() checked: the host could still change the shared bytes, the length
  // too.
  const size_t bytes = requests_.peeked_bytes();
  message_.resize(bytes);
  std::memcpy(message_.data(), head, bytes);
  requests_.consume();
  MessageHeader copy;
  std::memcpy(&copy, message_.data(), sizeof(copy));
  const auto type = static_cast<MessageType>(copy.type);

  Request req;
  const StatusOr decoded = decode_request(message_, model_, req);
  if (!decoded.ok()) {
    ++stats_.rejected_messages;
    answer_status(type, copy.id, decoded.status, decoded.message);
    return std::nullopt;
  }
  switch (req.type) {
    case MessageType::attach: {
      if (req.attach.version != kProtocolVersion) {
        answer_status(req.type, req.id, Status::invalid_argument,
                      fmt::format("protocol version {} but this worker speaks {}", req.attach.version,
                                  kProtocolVersion));
        return std::nullopt;
      }
      attached_ = true;
      ++stats_.hosts_attached;
      Response r;
      r.type = req.type;
      r.id = req.id;
      r.attach = {kProtocolVersion, 0, segment_.header().host_session.fetch_add(1) + 1, model_};
      answer(r);
      spdlog::info("host pid {} attached (session {})", req.attach.pid, r.attach.session);
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
      r.stats = stats_;
      std::vector<double> v(recent_us_.begin(), recent_us_.end());
      std::sort(v.begin(), v.end());
      if (!v.empty()) {
        r.stats.step_us_p50 = v[v.size() / 2];
        r.stats.step_us_p99 = v[static_cast<size_t>(0.99 * static_cast<double>(v.size() - 1))];
        r.stats.step_us_max = v.back();
      }
      answer(r);
      return std::nullopt;
    }
    case MessageType::health: {
      Response r;
      r.type = req.type;
      r.id = req.id;
      r.health = {segment_.header().worker_state.load(), model_.tp, stats_.steps, failed_in_a_row_, 0};
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
  return plan;
}

void HostServer::complete(const StepPlan& plan, const StepResult& result) {
  if (!in_flight_.answer) return;  // the worker's own plan (a lost host's resets)
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - in_flight_.started)
          .count();
  const Status s = result.status.status;
  if (s == Status::invalid_argument || s == Status::resource_exhausted) {
    ++stats_.rejected_messages;
  } else {
    ++stats_.steps;
    recent_us_.push_back(us);
    if (recent_us_.size() > kRecentSteps) recent_us_.pop_front();
    if (s == Status::ok) {
      failed_in_a_row_ = 0;
      stats_.drafts += plan.drafts.size();
      stats_.resets += plan.resets.size();
      for (const ContextBlock& c : plan.contexts) {
        stats_.context_rows += static_cast<uint64_t>(c.rows);
        touched_[static_cast<size_t>(c.slot)] = true;
      }
    } else {
      ++stats_.failed_steps;
      ++failed_in_a_row_;
    }
  }
  Response r;
  r.type = in_flight_.type;
  r.id = in_flight_.request_id;
  r.status = result.status;
  if (s == Status::ok) r.draft = result.draft;
  answer(r);
}

void HostServer::answer_status(MessageType type, uint64_t id, Status s, std::string message) {
  Response r;
  r.type = type;
  r.id = id;
  r.status = {s, std::move(message)};
  answer(r);
}

void HostServer::answer(const Response& r) {
  encoded_.resize(encoded_size(r));
  encode_response(r, encoded_.data());
  uint8_t* dst = responses_.reserve(static_cast<uint32_t>(encoded_.size()), opt_.host_timeout);
  if (!dst) {  // the host stopped reading: it is treated as lost on the next poll
    spdlog::warn("host does not read its answers: dropping answer {}", r.id);
    host_unresponsive_ = true;
    return;
  }
  std::memcpy(dst, encoded_.data(), encoded_.size());
  responses_.publish();
}

}  // namespace dspark::host
