// The host-message fuzz: seeded messages (message_gen.hpp) through a MessageHandler (the codec), check_plan
// and the step loop (run_step_loop, one rank) into the FakeDrafter test double, each answer held to the naive
// SlotModel. Failures it counts: a rejected message that changed the drafter's state, a verdict (accepted,
// INVALID_ARGUMENT, RESOURCE_EXHAUSTED) other than the model's, a state or draft answer after an accepted
// step other than the model's, a decoded message that is not canonical, an exception out of a layer, a failed
// step, and a message slower than the per-message bound. A crash ends the process (under ASan/UBSan: with the
// report); a message that runs past the watchdog's limit aborts it, naming the message.
#pragma once

#include <cstdint>
#include <string>

#include "tests/fuzz/message_gen.hpp"
#include "tests/fuzz/message_handler.hpp"

namespace dspark::fuzz {

struct FuzzOptions {
  int64_t messages = 20000;
  uint64_t seed = 1;
  double max_message_ms = 1000;  // a message slower than this is counted as a hang
  double watchdog_s = 60;        // a message still running after this aborts the run
};

struct FuzzReport {
  int64_t messages = 0;
  int64_t by_mutation[4] = {};  // Mutation::none, field, wire_rows, bytes
  int64_t decode_rejected = 0;  // answered INVALID_ARGUMENT by the codec
  int64_t answered = 0;         // attach, detach, stats, health: answered without a step
  int64_t accepted = 0;         // plans the step loop ran with OK
  int64_t rejected_invalid = 0, rejected_exhausted = 0;  // plans check_plan refused
  int64_t drafts_checked = 0;                            // draft requests whose answer matched the model's
  // Failures (each must be 0).
  int64_t changes_on_reject = 0, verdict_mismatches = 0, state_mismatches = 0, answer_mismatches = 0;
  int64_t not_canonical = 0, exceptions = 0, failed_steps = 0, slow_messages = 0;
  double max_message_us = 0, seconds = 0;
  std::string first_failure;

  int64_t failures() const {
    return changes_on_reject + verdict_mismatches + state_mismatches + answer_mismatches + not_canonical +
           exceptions + failed_steps + slow_messages;
  }
  std::string summary() const;
};

FuzzReport run_host_fuzz(const FuzzOptions& options);

}  // namespace dspark::fuzz
