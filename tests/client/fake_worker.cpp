#include "fake_worker.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "lib/host/liveness.hpp"
#include "lib/host/socket_path.hpp"

namespace dspark::test {

using namespace std::chrono_literals;

host::ModelDescription fake_model() {
  host::ModelDescription m{};
  m.vocab_size = 1000;
  m.hidden = 8;
  m.taps = 3;
  m.row_bytes = 3 * 8 * 2;
  m.block_size = 5;
  m.window = 32;
  m.slots = 8;
  m.max_batch = 4;
  m.max_context_rows = 16;
  m.tp = 1;
  m.max_model_len = 512;
  m.weight_formats = (1u << host::kFormatDense) | (1u << host::kFormatFp4);
  m.head_format = host::kFormatFp8Block;
  return m;
}

host::ModelTaps fake_taps() {
  host::ModelTaps t{};
  t.noise_token = 998;
  t.layers = 3;
  t.layer_ids[0] = 7;
  t.layer_ids[1] = 9;
  t.layer_ids[2] = 8;
  return t;
}

void fake_draft(const host::ModelDescription& m, const DraftRequest& r, bool margins, int64_t j, int32_t& id,
                float& conf, float& conf_logit, float& margin) {
  const int64_t kk = r.outputs == 0 ? m.block_size : r.outputs;
  if (j >= kk) {
    id = 0;
    conf = conf_logit = margin = 0.0f;
    return;
  }
  id = static_cast<int32_t>((int64_t{r.anchor_token} * 31 + int64_t{r.anchor_pos} * 7 + r.slot * 3 + j) %
                            m.vocab_size);
  conf_logit = 0.5f * static_cast<float>(r.slot + 1) - 0.25f * static_cast<float>(j);
  conf = 1.0f / (1.0f + std::exp(-conf_logit));
  margin = margins ? 0.125f * static_cast<float>(r.anchor_pos % 8) + static_cast<float>(j) : 0.0f;
}

float fake_q(const host::ModelDescription& m, const DraftRequest& r, int64_t j) {
  const int64_t kk = r.outputs == 0 ? m.block_size : r.outputs;
  if (j >= kk) return 0.0f;
  return r.temperature > 0.0f ? 1.0f / static_cast<float>(j + 2) : 1.0f;
}

float fake_distribution(const host::ModelDescription& m, const DraftRequest& r, int64_t j, int32_t v) {
  int32_t id = 0;
  float conf = 0, logit = 0, margin = 0;
  fake_draft(m, r, false, j, id, conf, logit, margin);
  const float q = fake_q(m, r, j);
  return v == id ? q : (1.0f - q) / static_cast<float>(m.vocab_size - 1);
}

FakeWorker::FakeWorker(const std::string& name, FakeOptions options)
    : opt_(options),
      door_(host::DoorOptions{host::socket_path(name), "", options.model, std::chrono::milliseconds(500),
                              false, options.sampling.max_distributions},
            [this](host::Observation& o, host::StatsMore& more) {
              o.stats.hosts_attached = attaches_;
              more = stats_more();
            }),
      answer_steps_(options.answer_steps),
      max_model_len_(options.model.max_model_len) {
  set_state(opt_.initial_state);
  heartbeat_thread_ = std::thread([this] { heartbeat(); });
  serve_thread_ = std::thread([this] { serve(); });
}

FakeWorker::~FakeWorker() {
  set_state(host::WorkerState::stopped);
  quit_ = true;
  serve_thread_.join();
  heartbeat_thread_.join();
}

void FakeWorker::freeze_heartbeat(std::chrono::milliseconds age) {
  beat_ = false;
  std::this_thread::sleep_for(150ms);  // let a refresh in progress land first
  std::lock_guard<std::mutex> lock(mu_);
  if (host_)
    host_->areas.worker().worker_heartbeat_ns.store(host::monotonic_ns() -
                                                    static_cast<uint64_t>(age.count()) * 1'000'000u);
}

std::vector<ReceivedStep> FakeWorker::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_;
}

void FakeWorker::heartbeat() {
  while (!quit_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (beat_ && host_) host_->areas.worker().worker_heartbeat_ns.store(host::monotonic_ns());
    }
    std::this_thread::sleep_for(20ms);
  }
}

// As the real worker: the socket closed, or the heartbeat silent (or ahead of this clock) for host_timeout.
bool FakeWorker::host_lost() const {
  if (door_.host_hung_up()) return true;
  const uint64_t beat = std::max(host_->areas.host().host_heartbeat_ns.load(), host_->admitted_ns);
  const std::optional<uint64_t> age = host::heartbeat_age_ns(beat, host::monotonic_ns());
  return !age || *age > static_cast<uint64_t>(opt_.host_timeout.count()) * 1'000'000u;
}

// As the real worker: the session ends (the door closes the socket), its memory goes.
void FakeWorker::release_host() {
  door_.release();
  requests_.reset();
  responses_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  host_.reset();
}

void FakeWorker::serve() {
  while (!quit_) {
    if (!host_) {
      std::shared_ptr<host::AdmittedHost> h = door_.wait_admitted(20ms);
      if (!h) continue;
      requests_ = std::make_unique<host::RingReader>(h->areas.requests());
      responses_ = std::make_unique<host::RingWriter>(h->areas.responses());
      std::lock_guard<std::mutex> lock(mu_);
      host_ = std::move(h);
      continue;
    }
    if (drop_.exchange(false)) {
      release_host();
      continue;
    }
    if (host_lost()) {
      ++hosts_lost_;
      release_host();
      continue;
    }
    if (!requests_->wait(20ms)) continue;
    bool corrupt = false;
    const host::MessageHeader* m = requests_->peek(corrupt);
    if (corrupt) {
      release_host();
      continue;
    }
    if (m == nullptr) continue;
    msg_.resize(requests_->peeked_bytes());
    std::memcpy(msg_.data(), m, msg_.size());
    requests_->consume();
    host::Request req;
    const StatusOr s = host::decode_request(msg_, opt_.model, req);
    if (!s.ok()) {
      host::Response r;
      r.type = req.type;
      r.id = req.id;
      r.status = s;
      answer(r);
      continue;
    }
    handle(req);
  }
}

void FakeWorker::handle(const host::Request& req) {
  host::Response r;
  r.type = req.type;
  r.id = req.id;
  switch (req.type) {
    case host::MessageType::attach:
      if (opt_.attach_status != Status::ok) {
        r.status = {opt_.attach_status, "the fake worker refuses attaches"};
      } else {
        ++attaches_;
        r.attach = {opt_.answer_version, 0, host_->session, opt_.model};
        r.taps = opt_.taps;
        r.sampling = opt_.sampling;
      }
      break;
    case host::MessageType::detach:
      ++detaches_;
      release_host();
      return;
    case host::MessageType::set_max_model_len:
      if (req.max_model_len < 1 || req.max_model_len > opt_.model.max_model_len)
        r.status = {Status::invalid_argument, "max_model_len out of range"};
      else
        max_model_len_ = req.max_model_len;
      break;
    case host::MessageType::stats: {
      std::lock_guard<std::mutex> lock(mu_);
      r.stats.steps = steps_.size();
      for (const ReceivedStep& st : steps_) {
        r.stats.drafts += st.drafts;
        r.stats.resets += st.resets.size();
        for (const ContextBlock& c : st.contexts) r.stats.context_rows += static_cast<uint64_t>(c.rows);
      }
      r.stats.hosts_attached = attaches_;
      r.stats.hosts_lost = hosts_lost_;
      r.stats.hosts_refused = door_.refused();
      r.stats_more = stats_more();
      r.stats.step_us_p50 = 1.5;
      r.stats.step_us_p99 = 2.5;
      r.stats.step_us_max = 3.5;
      break;
    }
    case host::MessageType::health: {
      std::lock_guard<std::mutex> lock(mu_);
      r.health = {static_cast<uint32_t>(door_.state()), opt_.model.tp, steps_.size(), 0, 0};
      break;
    }
    case host::MessageType::step: {
      const StepPlan& p = req.step;
      {
        std::lock_guard<std::mutex> lock(mu_);
        steps_.push_back({p.resets, p.contexts, {p.rows.begin(), p.rows.end()}, p.drafts.size()});
      }
      for (const DraftRequest& d : p.drafts)
        if (d.slot < 0 || d.slot >= static_cast<int32_t>(opt_.model.slots)) {
          r.status = {Status::invalid_argument, "fake: slot out of range"};
          break;
        }
      if (r.status.ok() && !p.drafts.empty()) {
        const int64_t k = opt_.model.block_size;
        DraftResult& out = r.draft;
        out.batch = static_cast<int64_t>(p.drafts.size());
        out.k = k;
        const auto nk = static_cast<size_t>(out.batch * k);
        out.ids.resize(nk);
        out.conf.resize(nk);
        out.conf_logit.resize(nk);
        out.margin.resize(nk);
        out.q.resize(nk);
        for (size_t b = 0; b < p.drafts.size(); ++b)
          for (int64_t j = 0; j < k; ++j) {
            const DraftRequest& d = p.drafts[b];
            const size_t i = b * static_cast<size_t>(k) + static_cast<size_t>(j);
            fake_draft(opt_.model, d, p.margin, j, out.ids[i], out.conf[i], out.conf_logit[i], out.margin[i]);
            out.q[i] = fake_q(opt_.model, d, j);
            if (!d.distribution || out.q[i] == 0.0f) continue;
            out.distribution_rows.push_back(static_cast<int32_t>(i));
            for (uint32_t v = 0; v < opt_.model.vocab_size; ++v)
              out.distribution.push_back(fake_distribution(opt_.model, d, j, static_cast<int32_t>(v)));
          }
      }
      if (!answer_steps_) return;
      if (opt_.answer_delay_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(opt_.answer_delay_ms));
      break;
    }
    default:
      r.status = {Status::invalid_argument, "fake: unexpected message"};
  }
  if (opt_.stale_answers) {
    host::Response stale;
    stale.type = r.type;
    stale.id = r.id ^ 0xdeadull;
    stale.status = {Status::internal, "a stale answer the client must skip"};
    answer(stale);
  }
  answer(r);
}

void FakeWorker::answer(const host::Response& r) {
  const uint32_t bytes = host::encoded_size(r);
  uint8_t* dst = responses_->reserve(bytes, 1s);
  if (dst == nullptr) return;  // the host stopped reading
  host::encode_response(r, dst);
  responses_->publish();
}

}  // namespace dspark::test
