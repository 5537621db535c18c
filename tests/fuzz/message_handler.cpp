#include "tests/fuzz/message_handler.hpp"

#include <algorithm>

namespace dspark::fuzz {

Handled CodecHandler::handle(std::span<const uint8_t> message) {
  Handled h;
  h.status = host::decode_request(message, model_, req_);
  h.type = req_.type;
  if (!h.status.ok()) return h;
  again_.resize(host::encoded_size(req_, model_));
  host::encode_request(req_, model_, again_.data());
  if (!std::equal(again_.begin(), again_.end(), message.begin(), message.end())) ++not_canonical_;
  switch (req_.type) {
    case host::MessageType::set_max_model_len:
      h.has_plan = true;
      h.plan.max_model_len = req_.max_model_len;
      break;
    case host::MessageType::step:
      h.has_plan = true;
      h.plan = std::move(req_.step);
      break;
    default:  // attach, detach, stats, health: answered without a step
      break;
  }
  return h;
}

}  // namespace dspark::fuzz
