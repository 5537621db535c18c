// How the fuzz turns one host message into work, the way rank 0 does: answered at once (a message that does
// not decode, or one that needs no step: attach, detach, stats, health), or a StepPlan for the step loop.
// CodecHandler is the codec's part of that; the server's own handling (lib/serve/host_server.cpp: sessions,
// attach first, detach resetting the host's slots) can be plugged in as another MessageHandler.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "lib/api/step_plan.hpp"
#include "lib/host/codec.hpp"

namespace dspark::fuzz {

struct Handled {
  bool has_plan = false;
  StatusOr status;  // without a plan: the answer
  StepPlan plan;    // with one: what the step loop runs
  host::MessageType type = host::MessageType::health;
};

class MessageHandler {
 public:
  virtual ~MessageHandler() = default;
  virtual Handled handle(std::span<const uint8_t> message) = 0;
};

// decode_request, and the plan a decoded step or set_max_model_len makes. Counts decoded messages that do not
// encode back to their own bytes (the codec's promise: a message decodes only when it is exactly canonical).
class CodecHandler final : public MessageHandler {
 public:
  explicit CodecHandler(const host::ModelDescription& m) : model_(m) {}
  Handled handle(std::span<const uint8_t> message) override;
  int64_t not_canonical() const { return not_canonical_; }

 private:
  host::ModelDescription model_;
  host::Request req_;
  std::vector<uint8_t> again_;
  int64_t not_canonical_ = 0;
};

}  // namespace dspark::fuzz
