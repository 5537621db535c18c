// Test helpers for the codec: a small model, encoding to a vector, and a valid message of every kind.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/host/codec.hpp"

namespace dspark::host::test {

// Rows of 3 * 2 bf16 (12 bytes): an odd number of rows leaves padding after them.
inline ModelDescription codec_model() {
  ModelDescription m{};
  m.vocab_size = 50;
  m.hidden = 2;
  m.taps = 3;
  m.row_bytes = 12;
  m.block_size = 4;
  m.window = 16;
  m.slots = 8;
  m.max_batch = 4;
  m.max_context_rows = 32;
  m.tp = 1;
  m.max_model_len = 256;
  return m;
}

inline std::vector<uint8_t> encode(const Request& r, const ModelDescription& m = codec_model()) {
  std::vector<uint8_t> b(encoded_size(r, m));
  encode_request(r, m, b.data());
  return b;
}

inline std::vector<uint8_t> encode(const Response& r, uint32_t version = kProtocolVersion) {
  std::vector<uint8_t> b(encoded_size(r, version));
  encode_response(r, b.data(), version);
  return b;
}

inline Request step_request(uint64_t id, std::vector<int32_t> resets, std::vector<ContextBlock> contexts,
                            std::vector<DraftRequest> drafts, bool margin) {
  Request r;
  r.type = MessageType::step;
  r.id = id;
  r.step.id = id;
  r.step.resets = std::move(resets);
  int64_t rows = 0;
  for (const ContextBlock& c : contexts) rows += c.rows;
  r.step.contexts = std::move(contexts);
  r.step.rows.resize(static_cast<size_t>(rows) * codec_model().row_bytes / 2);
  for (size_t i = 0; i < r.step.rows.size(); ++i) r.step.rows[i] = static_cast<bf16_t>(0x3f80 + i * 7);
  r.step.drafts = std::move(drafts);
  r.step.margin = margin;
  return r;
}

inline Request simple_request(MessageType t, uint64_t id) {
  Request r;
  r.type = t;
  r.id = id;
  if (t == MessageType::attach) r.attach = AttachRequest{kProtocolVersion, 4242};
  if (t == MessageType::set_max_model_len) r.max_model_len = 128;
  return r;
}

inline std::vector<Request> sample_requests() {
  std::vector<Request> v;
  for (MessageType t : {MessageType::attach, MessageType::detach, MessageType::stats, MessageType::health,
                        MessageType::set_max_model_len})
    v.push_back(simple_request(t, 100 + v.size()));
  v.push_back(step_request(7, {3, 1}, {{0, 5, 2}, {7, 0, 1}}, {{0, 11, 7, -1, 0}, {7, 12, 1, 0, 3}}, false));
  v.push_back(step_request(8, {}, {}, {}, true));
  v.push_back(step_request(9, {1, 2, 3}, {}, {}, true));
  v.push_back(step_request(10, {}, {{2, 0, 5}}, {}, true));
  v.push_back(step_request(11, {}, {}, {{1, 2, 3, -1, 4}}, true));
  v.push_back(step_request(12, {4}, {{1, 0, 2}, {2, 3, 4}, {3, 9, 1}}, {{1, 4, 2, -1, 0}}, true));
  return v;
}

inline DraftResult sample_draft(int64_t batch, int64_t k) {
  DraftResult d;
  d.batch = batch;
  d.k = k;
  for (int64_t i = 0; i < batch * k; ++i) {
    d.ids.push_back(static_cast<int32_t>(i * 3 + 1));
    d.conf.push_back(0.5f + static_cast<float>(i) / 64);
    d.conf_logit.push_back(-1.0f + static_cast<float>(i));
    d.margin.push_back(static_cast<float>(i) * 0.25f);
    d.q.push_back(1.0f / static_cast<float>(i + 2));
  }
  return d;
}

// sample_draft with the whole distributions of cells `rows` (ascending), vocab values each: row r's value v
// is r + v / 1024.
inline DraftResult sampled_draft(int64_t batch, int64_t k, std::vector<int32_t> rows, uint32_t vocab) {
  DraftResult d = sample_draft(batch, k);
  d.distribution_rows = std::move(rows);
  for (size_t r = 0; r < d.distribution_rows.size(); ++r)
    for (uint32_t v = 0; v < vocab; ++v)
      d.distribution.push_back(static_cast<float>(r) + static_cast<float>(v) / 1024);
  return d;
}

inline Response ok_response(MessageType t, uint64_t id) {
  Response r;
  r.type = t;
  r.id = id;
  switch (t) {
    case MessageType::attach:
      r.attach.version = kProtocolVersion;
      r.attach.session = 5;
      r.attach.model = codec_model();
      r.taps.noise_token = 49;  // the vocabulary's last id
      r.taps.layers = 3;
      r.taps.layer_ids[0] = 4;
      r.taps.layer_ids[1] = 6;
      r.taps.layer_ids[2] = 5;
      r.sampling = {2, 100.0f};
      break;
    case MessageType::step:
      r.draft = sample_draft(2, 3);
      break;
    case MessageType::stats:
      r.stats = StatsResponse{10, 1, 2, 30, 400, 5, 1, 0, 120.5, 900.25, 1500.0, 3};
      break;
    case MessageType::health:
      r.health = HealthResponse{1, 2, 10, 0, 0};
      break;
    default:
      break;
  }
  return r;
}

inline Response error_response(MessageType t, uint64_t id, Status s, std::string message) {
  Response r;
  r.type = t;
  r.id = id;
  r.status = StatusOr{s, std::move(message)};
  return r;
}

inline std::vector<Response> sample_responses() {
  std::vector<Response> v;
  for (MessageType t : {MessageType::attach, MessageType::detach, MessageType::step,
                        MessageType::set_max_model_len, MessageType::stats, MessageType::health})
    v.push_back(ok_response(t, 200 + v.size()));
  Response no_drafts = ok_response(MessageType::step, 300);
  no_drafts.draft = DraftResult{};
  v.push_back(no_drafts);
  Response one = ok_response(MessageType::step, 301);
  one.draft = sample_draft(1, 1);
  v.push_back(one);
  Response sampled = ok_response(MessageType::step, 307);
  sampled.draft = sampled_draft(2, 3, {1, 2, 4}, codec_model().vocab_size);
  v.push_back(sampled);
  v.push_back(
      error_response(MessageType::step, 302, Status::invalid_argument, "slot 9 out of range (8 slots)"));
  v.push_back(
      error_response(MessageType::step, 303, Status::resource_exhausted, "batch of 9 over max_batch 4"));
  v.push_back(error_response(MessageType::attach, 304, Status::unavailable, "starting"));
  v.push_back(error_response(MessageType::step, 305, Status::internal, ""));
  v.push_back(
      error_response(static_cast<MessageType>(42), 306, Status::invalid_argument, "request of unknown type"));
  return v;
}

}  // namespace dspark::host::test
