#include "tests/fuzz/host_fuzz.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "comm/communicator.hpp"
#include "lib/runtime/step_loop.hpp"
#include "tests/fuzz/fake_drafter.hpp"
#include "tests/fuzz/slot_model.hpp"

namespace dspark::fuzz {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Aborts the process when one message has been running longer than the limit: a hang is reported, naming the
// message, instead of stalling the run.
class Watchdog {
 public:
  Watchdog(double limit_s, uint64_t seed) : limit_ns_(static_cast<int64_t>(limit_s * 1e9)), seed_(seed) {
    thread_ = std::thread([this] { watch(); });
  }
  ~Watchdog() {
    stop_ = true;
    thread_.join();
  }
  void started(int64_t message) {
    message_.store(message);
    since_.store(now_ns());
  }
  void finished() { since_.store(0); }

 private:
  void watch() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int64_t since = since_.load();
      if (since != 0 && now_ns() - since > limit_ns_) {
        std::fprintf(stderr, "host fuzz: message %lld (seed %llu) has run past %.1f s: a hang\n",
                     static_cast<long long>(message_.load()), static_cast<unsigned long long>(seed_),
                     static_cast<double>(limit_ns_) / 1e9);
        std::abort();
      }
    }
  }
  int64_t limit_ns_;
  uint64_t seed_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> since_{0}, message_{0};
  std::thread thread_;
};

class FuzzSource final : public PlanSource {
 public:
  FuzzSource(const Shape& shape, const FuzzOptions& o, MessageHandler& handler, FakeDrafter& fake,
             FuzzReport& r)
      : o_(o),
        gen_(shape, o.seed),
        handler_(handler),
        fake_(fake),
        model_(shape),
        r_(r),
        dog_(o.watchdog_s, o.seed) {}

  std::optional<StepPlan> next() override {
    while (r_.messages < o_.messages) {
      const Message m = gen_.next(model_.max_model_len());
      index_ = r_.messages++;
      ++r_.by_mutation[static_cast<int>(m.mutation)];
      start_ = now_ns();
      dog_.started(index_);
      Handled h;
      try {
        h = handler_.handle(m.bytes);
      } catch (const std::exception& e) {
        ++r_.exceptions;
        failure(fmt::format("the handler threw: {}", e.what()));
        finish();
        continue;
      }
      if (h.has_plan) {
        before_ = fake_.state();
        sets_max_model_len_ = h.type == host::MessageType::set_max_model_len;
        return std::move(h.plan);
      }
      if (h.status.ok()) {
        ++r_.answered;
      } else {
        ++r_.decode_rejected;
        if (h.status.status != Status::invalid_argument || h.status.message.empty())
          failure(fmt::format("a message that does not decode answered {} '{}'", status_name(h.status.status),
                              h.status.message));
      }
      finish();
    }
    return std::nullopt;
  }

  void complete(const StepPlan& plan, const StepResult& result) override {
    const Expected e = model_.expect(plan, sets_max_model_len_);
    const Status s = result.status.status;
    if (s == Status::ok) {
      ++r_.accepted;
      if (!e.accepted()) mismatch(r_.verdict_mismatches, "accepted, but the model rejects it", e);
      model_.apply(plan);
      if (fake_.state() != model_.drafter_state())
        mismatch(r_.state_mismatches, "after the step the slots differ from the model's", e);
      if (!plan.drafts.empty()) check_answer(plan, result.draft, e);
    } else if (s == Status::invalid_argument || s == Status::resource_exhausted) {
      ++(s == Status::invalid_argument ? r_.rejected_invalid : r_.rejected_exhausted);
      if (fake_.state() != before_) mismatch(r_.changes_on_reject, "rejected, but the slots changed", e);
      const bool kind_expected = s == Status::invalid_argument ? e.invalid : e.exhausted;
      if (!kind_expected)
        mismatch(r_.verdict_mismatches,
                 fmt::format("rejected {} '{}', not what the model expects", status_name(s),
                             result.status.message),
                 e);
    } else {
      mismatch(r_.failed_steps,
               fmt::format("the step failed: {} '{}'", status_name(s), result.status.message), e);
      model_.resync(fake_.state());
    }
    finish();
  }

 private:
  void check_answer(const StepPlan& plan, const DraftResult& got, const Expected& e) {
    const DraftResult want = model_.expected_draft(plan);
    if (got.batch != want.batch || got.k != want.k || got.ids != want.ids) {
      mismatch(r_.answer_mismatches, "the draft answer differs from the model's", e);
      return;
    }
    r_.drafts_checked += got.batch;
  }
  void mismatch(int64_t& counter, const std::string& what, const Expected& e) {
    ++counter;
    failure(fmt::format("{} (model: invalid {}, exhausted {})", what, e.invalid, e.exhausted));
  }
  void failure(const std::string& what) {
    if (r_.first_failure.empty())
      r_.first_failure = fmt::format("message {} (seed {}): {}", index_, o_.seed, what);
  }
  void finish() {
    dog_.finished();
    const double us = static_cast<double>(now_ns() - start_) / 1e3;
    r_.max_message_us = std::max(r_.max_message_us, us);
    if (us > o_.max_message_ms * 1e3) {
      ++r_.slow_messages;
      failure(fmt::format("took {:.0f} us, over the {} ms bound", us, o_.max_message_ms));
    }
  }

  const FuzzOptions& o_;
  MessageGen gen_;
  MessageHandler& handler_;
  FakeDrafter& fake_;
  SlotModel model_;
  FuzzReport& r_;
  Watchdog dog_;
  DrafterState before_;
  bool sets_max_model_len_ = false;
  int64_t index_ = 0, start_ = 0;
};

}  // namespace

std::string FuzzReport::summary() const {
  return fmt::format(
      "messages {} (unmutated {}, field {}, wire rows {}, bytes {}); decode rejected {}; answered without a "
      "step {}; plans accepted {}, rejected invalid {}, exhausted {}; draft answers checked {}; failures {} "
      "(changes on reject {}, verdict {}, state {}, answer {}, not canonical {}, exceptions {}, failed steps "
      "{}, slow {}); slowest message {:.0f} us; {:.1f} s",
      messages, by_mutation[0], by_mutation[1], by_mutation[2], by_mutation[3], decode_rejected, answered,
      accepted, rejected_invalid, rejected_exhausted, drafts_checked, failures(), changes_on_reject,
      verdict_mismatches, state_mismatches, answer_mismatches, not_canonical, exceptions, failed_steps,
      slow_messages, max_message_us, seconds);
}

FuzzReport run_host_fuzz(const FuzzOptions& options) {
  const Shape shape;
  FuzzReport r;
  FakeDrafter fake(shape);
  CodecHandler handler(shape.description());
  LocalCommunicator comm;
  const auto t0 = Clock::now();
  {
    FuzzSource source(shape, options, handler, fake, r);
    LoopOptions loop;
    loop.max_failed_steps = std::numeric_limits<int64_t>::max();  // a failed step is counted, never fatal
    try {
      run_step_loop(fake, comm, &source, shape.limits(), loop);
    } catch (const std::exception& e) {
      ++r.exceptions;
      if (r.first_failure.empty()) r.first_failure = fmt::format("the step loop threw: {}", e.what());
    }
  }
  r.not_canonical = handler.not_canonical();
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace dspark::fuzz
