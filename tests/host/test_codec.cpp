// The codec: every request and answer round-trips with hand values; malformed messages are rejected with
// reasons.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

#include "codec_test_util.hpp"
#include "lib/core/error.hpp"

namespace dspark::host {
namespace {

using test::codec_model;
using test::encode;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Request decoded_request(const std::vector<uint8_t>& b, const ModelDescription& m = codec_model()) {
  Request out;
  const StatusOr st = decode_request(b, m, out);
  EXPECT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(encode(out, m), b);
  return out;
}

Response decoded_response(const std::vector<uint8_t>& b) {
  Response out;
  const StatusOr st = decode_response(b, out);
  EXPECT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(encode(out), b);
  return out;
}

StatusOr request_error(const std::vector<uint8_t>& b, Request* out_copy = nullptr) {
  Request out;
  StatusOr st = decode_request(b, codec_model(), out);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.status, Status::invalid_argument);
  if (out_copy != nullptr) *out_copy = out;
  return st;
}

StatusOr response_error(const std::vector<uint8_t>& b) {
  Response out;
  StatusOr st = decode_response(b, out);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.status, Status::invalid_argument);
  return st;
}

template <typename T>
T peek(const std::vector<uint8_t>& b, size_t offset) {
  T v;
  std::memcpy(&v, b.data() + offset, sizeof(T));
  return v;
}

template <typename T>
void poke(std::vector<uint8_t>& b, size_t offset, T v) {
  std::memcpy(b.data() + offset, &v, sizeof(v));
}

TEST(CodecRequest, SimpleRequestsRoundTrip) {
  const std::vector<uint8_t> attach = encode(test::simple_request(MessageType::attach, 1));
  EXPECT_EQ(attach.size(), sizeof(MessageHeader) + sizeof(AttachRequest));
  const Request a = decoded_request(attach);
  EXPECT_EQ(a.type, MessageType::attach);
  EXPECT_EQ(a.id, 1u);
  EXPECT_EQ(a.attach.version, kProtocolVersion);
  EXPECT_EQ(a.attach.pid, 4242);
  for (MessageType t : {MessageType::detach, MessageType::stats, MessageType::health}) {
    const std::vector<uint8_t> b = encode(test::simple_request(t, 77));
    EXPECT_EQ(b.size(), sizeof(MessageHeader));
    const Request r = decoded_request(b);
    EXPECT_EQ(r.type, t);
    EXPECT_EQ(r.id, 77u);
  }
  const Request s = decoded_request(encode(test::simple_request(MessageType::set_max_model_len, 3)));
  EXPECT_EQ(s.type, MessageType::set_max_model_len);
  EXPECT_EQ(s.max_model_len, 128);
}

TEST(CodecRequest, SetMaxModelLenBelowOneIsRefused) {
  // A plan's max_model_len 0 means "unchanged": 0 and below must not decode into a no-op that answers OK.
  for (int64_t v : {int64_t{0}, int64_t{-1}, INT64_MIN}) {
    Request r = test::simple_request(MessageType::set_max_model_len, 3);
    r.max_model_len = v;
    const StatusOr st = request_error(encode(r));
    EXPECT_EQ(st.status, Status::invalid_argument);
    EXPECT_EQ(st.message, fmt::format("set_max_model_len request: max_model_len {} must be at least 1", v));
  }
  Request one = test::simple_request(MessageType::set_max_model_len, 3);
  one.max_model_len = 1;
  EXPECT_EQ(decoded_request(encode(one)).max_model_len, 1);
}

TEST(CodecRequest, AStepRoundTripsEveryField) {
  Request in =
      test::step_request(7, {3, 1}, {{0, 5, 2}, {7, 0, 1}}, {{0, 11, 7, -1, 0}, {7, 12, 1, 0, 3, 2}}, false);
  in.step.drafts[1].temperature = 0.75f;
  in.step.drafts[1].distribution = true;
  in.step.drafts[1].seed = 0x123456789abcdef0ull;
  const std::vector<uint8_t> b = encode(in);
  // Header, StepRequest, 2 resets, 2 contexts, 2 drafts of 40 (144 bytes), then 3 rows of 12 bytes padded to
  // 40.
  EXPECT_EQ(b.size(), 144u + 40u);
  const size_t second_draft = 16 + 16 + 8 + 24 + 40;
  EXPECT_EQ(peek<float>(b, second_draft + 24), 0.75f);
  EXPECT_EQ(peek<uint32_t>(b, second_draft + 28), kDraftDistribution);
  EXPECT_EQ(peek<uint64_t>(b, second_draft + 32), 0x123456789abcdef0ull);
  MessageHeader h{};
  std::memcpy(&h, b.data(), sizeof(h));
  EXPECT_EQ(h.bytes, b.size());
  EXPECT_EQ(h.type, static_cast<uint32_t>(MessageType::step));
  EXPECT_EQ(h.id, 7u);
  const Request out = decoded_request(b);
  EXPECT_EQ(out.type, MessageType::step);
  EXPECT_EQ(out.step.id, 7u);
  EXPECT_FALSE(out.step.margin);
  EXPECT_FALSE(out.step.shutdown);
  EXPECT_EQ(out.step.max_model_len, 0);
  EXPECT_THAT(out.step.resets, ElementsAre(3, 1));
  ASSERT_EQ(out.step.contexts.size(), 2u);
  EXPECT_EQ(out.step.contexts[0].slot, 0);
  EXPECT_EQ(out.step.contexts[0].first_pos, 5);
  EXPECT_EQ(out.step.contexts[0].rows, 2);
  EXPECT_EQ(out.step.contexts[1].slot, 7);
  EXPECT_EQ(out.step.contexts[1].rows, 1);
  EXPECT_EQ(out.step.rows, in.step.rows);
  ASSERT_EQ(out.step.drafts.size(), 2u);
  const DraftRequest& d = out.step.drafts[1];
  EXPECT_EQ(d.slot, 7);
  EXPECT_EQ(d.anchor_token, 12);
  EXPECT_EQ(d.anchor_pos, 1);
  EXPECT_EQ(d.window_low, 0);
  EXPECT_EQ(d.outputs, 3);
  EXPECT_EQ(d.accepted, 2);
  EXPECT_EQ(d.temperature, 0.75f);
  EXPECT_TRUE(d.distribution);
  EXPECT_EQ(d.seed, 0x123456789abcdef0ull);
  EXPECT_EQ(out.step.drafts[0].window_low, -1);
  EXPECT_EQ(out.step.drafts[0].accepted, -1);
  EXPECT_EQ(out.step.drafts[0].temperature, 0.0f);
  EXPECT_FALSE(out.step.drafts[0].distribution);
  EXPECT_EQ(out.step.drafts[0].seed, 0u);
}

TEST(CodecRequest, DecodingAStepFindsItsRowsFirstNonFiniteValue) {
  // Two contexts of 2 and 1 rows of 6 bf16 values after 144 bytes of header, resets and drafts.
  const Request in =
      test::step_request(7, {3, 1}, {{0, 5, 2}, {7, 0, 1}}, {{0, 11, 7, -1, 0}, {7, 12, 1, 0, 3, 2}}, false);
  EXPECT_EQ(decoded_request(encode(in)).step.rows_first_non_finite, -1);
  std::vector<uint8_t> b = encode(in);
  poke<uint16_t>(b, 144 + 2 * 16, 0x7fc1);  // a NaN at row 2, element 4
  poke<uint16_t>(b, 144 + 2 * 17, 0x7f80);  // and +Inf after it
  Request out;
  ASSERT_TRUE(decode_request(b, codec_model(), out).ok());
  EXPECT_EQ(out.step.rows_first_non_finite, 16);
  EXPECT_EQ(out.step.rows[16], 0x7fc1);  // copied as sent: check_plan refuses it, naming the place
  // A message without rows leaves nothing scanned, even in a request that held rows before.
  ASSERT_TRUE(
      decode_request(encode(test::step_request(8, {}, {}, {{0, 11, 7, -1, 0}}, false)), codec_model(), out)
          .ok());
  EXPECT_EQ(out.step.rows_first_non_finite, kRowsNotScanned);
}

TEST(CodecRequest, RowsGivenAsPartsEncodeAsTheSameBytesAsRowsInThePlan) {
  // A host's rows stay in its own buffers: the three rows of the plan above, split 1 + 2 across two buffers
  // (row bytes 12), must give the bytes of the plan that holds them.
  const Request whole =
      test::step_request(7, {3, 1}, {{0, 5, 2}, {7, 0, 1}}, {{0, 11, 7, -1, 0}, {7, 12, 1, 0, 3, 2}}, false);
  ASSERT_EQ(whole.step.rows.size(), 3u * 6u);
  const auto* bytes = reinterpret_cast<const uint8_t*>(whole.step.rows.data());
  Request parts = whole;
  parts.step.rows.clear();
  parts.row_parts = {{bytes, 12}, {bytes + 12, 24}};
  const ModelDescription m = codec_model();
  EXPECT_EQ(encoded_size(parts, m), encoded_size(whole, m));
  EXPECT_EQ(encode(parts), encode(whole));
  const Request out = decoded_request(encode(parts));
  EXPECT_EQ(out.step.rows, whole.step.rows);
  EXPECT_TRUE(out.row_parts.empty());  // the decoder always gives rows in the plan

  Request short_parts = parts;
  short_parts.row_parts.pop_back();  // 12 bytes of rows for 3 rows of 12
  EXPECT_THROW(encoded_size(short_parts, m), Error);
  Request both = parts;
  both.step.rows = whole.step.rows;
  EXPECT_THROW(encoded_size(both, m), Error);
}

TEST(CodecRequest, DraftsBeforeVersion7AreGreedyAndUnknownSamplingFlagsAreRefused) {
  Request in = test::step_request(9, {}, {}, {{1, 11, 7, -1, 0, 4}}, true);
  in.step.drafts[0].temperature = 0.5f;
  in.step.drafts[0].seed = 99;
  const ModelDescription m = codec_model();
  std::vector<uint8_t> v6(encoded_size(in, m, 6));
  encode_request(in, m, v6.data(), 6);
  EXPECT_EQ(v6.size(), 16u + 16u + 24u);  // header, StepRequest, one 24-byte draft
  Request out;
  ASSERT_TRUE(decode_request(v6, m, out, 6).ok());
  EXPECT_EQ(out.step.drafts[0].accepted, 4);
  EXPECT_EQ(out.step.drafts[0].temperature, 0.0f);  // version 6 cannot ask for a sampled draft
  EXPECT_EQ(out.step.drafts[0].seed, 0u);
  EXPECT_FALSE(decode_request(v6, m, out, 7).ok());
  std::vector<uint8_t> v7 = encode(in);
  ASSERT_EQ(v7.size(), 16u + 16u + 40u);
  poke<uint32_t>(v7, 16 + 16 + 28, 2);  // the draft's flags
  EXPECT_THAT(request_error(v7).message, HasSubstr("draft 0 has unknown flags 0x2"));
}

TEST(CodecRequest, AVersion3StepHasNoReportsAndDecodesOnlyAsVersion3) {
  // Protocol 3's drafts are 20 bytes, without `accepted`: they decode as "no report". The layouts are told
  // apart by the session's version, never guessed from the size.
  const Request in = test::step_request(9, {}, {}, {{1, 11, 7, -1, 0, 4}, {2, 12, 1, 0, 3}}, true);
  const ModelDescription m = codec_model();
  std::vector<uint8_t> v3(encoded_size(in, m, 3));
  encode_request(in, m, v3.data(), 3);
  EXPECT_EQ(v3.size(), 16u + 16u + 2u * 20u);  // header, StepRequest, two 20-byte drafts
  Request out;
  ASSERT_TRUE(decode_request(v3, m, out, 3).ok());
  ASSERT_EQ(out.step.drafts.size(), 2u);
  EXPECT_EQ(out.step.drafts[0].slot, 1);
  EXPECT_EQ(out.step.drafts[0].accepted, -1);  // the report was not sent
  EXPECT_EQ(out.step.drafts[1].outputs, 3);
  EXPECT_EQ(out.step.drafts[1].accepted, -1);
  // The same bytes are not a version 4 message (its drafts do not fit), and version 4's are not version 3's.
  EXPECT_FALSE(decode_request(v3, m, out, 4).ok());
  EXPECT_FALSE(decode_request(encode(in), m, out, 3).ok());
}

TEST(CodecRequest, EveryPartOfAStepIsOptional) {
  for (const Request& in : test::sample_requests()) {
    const Request out = decoded_request(encode(in));
    EXPECT_EQ(out.step.resets, in.step.resets);
    EXPECT_EQ(out.step.contexts.size(), in.step.contexts.size());
    EXPECT_EQ(out.step.rows, in.step.rows);
    EXPECT_EQ(out.step.drafts.size(), in.step.drafts.size());
  }
}

TEST(CodecRequest, EncodingRefusesAnInconsistentPlan) {
  Request r = test::step_request(1, {}, {{0, 0, 2}}, {}, true);
  r.step.rows.pop_back();
  EXPECT_THROW(encoded_size(r, codec_model()), Error);
  r = test::step_request(1, {}, {{0, 0, 0}}, {}, true);
  EXPECT_THROW(encoded_size(r, codec_model()), Error);
  r = test::step_request(1, {}, {}, {}, true);
  r.step.resets.resize(kMaxStepCount + 1);
  EXPECT_THROW(encoded_size(r, codec_model()), Error);
  r.type = MessageType::padding;
  EXPECT_THROW(encoded_size(r, codec_model()), Error);
}

TEST(CodecRequest, RejectsAnUnknownTypeNamingItAndKeepsTheId) {
  std::vector<uint8_t> b = encode(test::simple_request(MessageType::health, 55));
  poke<uint32_t>(b, 4, 99);
  Request out;
  EXPECT_THAT(request_error(b, &out).message, HasSubstr("unknown type 99"));
  EXPECT_EQ(out.id, 55u);
  EXPECT_EQ(static_cast<uint32_t>(out.type), 99u);
  poke<uint32_t>(b, 4, 0);
  EXPECT_THAT(request_error(b).message, HasSubstr("padding"));
}

TEST(CodecRequest, RejectsSizeMismatches) {
  std::vector<uint8_t> b = encode(test::simple_request(MessageType::attach, 1));
  poke<uint32_t>(b, 0, 32);
  EXPECT_THAT(request_error(b).message, HasSubstr("says 32 bytes, the message has 24"));
  EXPECT_THAT(request_error({1, 2, 3}).message, HasSubstr("shorter than a message header"));
  b = encode(test::simple_request(MessageType::health, 1));
  b.resize(24);
  poke<uint32_t>(b, 0, 24);
  EXPECT_THAT(request_error(b).message, HasSubstr("8 bytes past its payload"));
  b = encode(test::simple_request(MessageType::attach, 1));
  b.resize(16);
  poke<uint32_t>(b, 0, 16);
  EXPECT_THAT(request_error(b).message, HasSubstr("too short"));
}

TEST(CodecRequest, RejectsMalformedSteps) {
  const std::vector<uint8_t> good =
      encode(test::step_request(7, {3, 1}, {{0, 5, 2}, {7, 0, 1}}, {{0, 1, 2, -1, 0}}, true));
  const size_t counts = sizeof(MessageHeader);
  std::vector<uint8_t> b = good;
  poke<uint32_t>(b, counts + 4, 1u << 20);  // n_contexts
  EXPECT_THAT(request_error(b).message, HasSubstr("at most 65536"));
  b = good;
  poke<uint32_t>(b, counts + 4, 60000);
  EXPECT_THAT(request_error(b).message, HasSubstr("do not fit"));
  b = good;
  poke<uint32_t>(b, counts + 12, 6);  // flags
  EXPECT_THAT(request_error(b).message, HasSubstr("unknown flags 0x6"));
  b = good;
  const size_t first_context = counts + sizeof(StepRequest) + 2 * sizeof(int32_t);
  poke<int32_t>(b, first_context + 8, 0);  // rows
  EXPECT_THAT(request_error(b).message, HasSubstr("has 0 rows"));
  b = good;
  poke<int32_t>(b, first_context + 8, 3);  // one row more than the message holds
  EXPECT_THAT(request_error(b).message, HasSubstr("do not fit"));
  b = good;
  poke<int32_t>(b, first_context + 8, 0x7fffffff);
  EXPECT_THAT(request_error(b).message, HasSubstr("do not fit"));
  b = good;
  b[b.size() - 1] = 1;  // the padding after the rows
  EXPECT_THAT(request_error(b).message, HasSubstr("padding"));
  b = good;
  b.resize(b.size() + 8);
  poke<uint32_t>(b, 0, static_cast<uint32_t>(b.size()));
  EXPECT_THAT(request_error(b).message, HasSubstr("8 bytes past its payload"));
  ModelDescription rowless = codec_model();
  rowless.row_bytes = 0;
  Request out;
  EXPECT_THAT(decode_request(good, rowless, out).message, HasSubstr("context rows of 0 bytes"));
}

// Version 5's attach answer: header 16 + status 8 + AttachResponse 72 + ModelTaps 72 (noise token, count, 16
// ids) = 168 bytes; versions 3 and 4 end after the AttachResponse, 96 bytes, and decode without taps; version
// 7 adds SamplingLimits (8 bytes).
TEST(CodecResponse, TheAttachAnswerCarriesTheTapsFromVersionFiveOn) {
  const Response r = test::ok_response(MessageType::attach, 1);
  EXPECT_EQ(encoded_size(r, 7), 176u);
  EXPECT_EQ(encoded_size(r, 6), 168u);
  EXPECT_EQ(encoded_size(r, 5), 168u);
  EXPECT_EQ(encoded_size(r, 4), 96u);
  EXPECT_EQ(encoded_size(r, 3), 96u);
  std::vector<uint8_t> v5(168), v4(96);
  encode_response(r, v5.data(), 5);
  encode_response(r, v4.data(), 4);
  EXPECT_TRUE(std::equal(v4.begin() + 4, v4.end(), v5.begin() + 4));  // the same bytes but the size word
  EXPECT_EQ(peek<int32_t>(v5, 96), 49);                               // noise token
  EXPECT_EQ(peek<uint32_t>(v5, 100), 3u);                             // layers
  EXPECT_EQ(peek<int32_t>(v5, 104), 4);
  EXPECT_EQ(peek<int32_t>(v5, 108), 6);
  EXPECT_EQ(peek<int32_t>(v5, 112), 5);
  Response out;
  ASSERT_TRUE(decode_response(v4, out, 4).ok());
  EXPECT_EQ(out.attach.session, 5u);
  EXPECT_EQ(out.taps.layers, 0u);
  EXPECT_THAT(decode_response(v4, out, 5).message, HasSubstr("too short for its ModelTaps"));
  EXPECT_THAT(decode_response(v5, out, 4).message, HasSubstr("72 bytes past its payload"));
  const std::vector<uint8_t> v7 = test::encode(r, 7);
  EXPECT_TRUE(std::equal(v5.begin() + 4, v5.end(), v7.begin() + 4));
  EXPECT_EQ(peek<uint32_t>(v7, 168), 2u);   // max_distributions
  EXPECT_EQ(peek<float>(v7, 172), 100.0f);  // max_temperature
  ASSERT_TRUE(decode_response(v7, out, 7).ok());
  EXPECT_EQ(out.sampling.max_distributions, 2u);
  EXPECT_EQ(out.sampling.max_temperature, 100.0f);
  EXPECT_THAT(decode_response(v5, out, 7).message, HasSubstr("too short for its SamplingLimits"));
}

TEST(CodecResponse, SamplingLimitsThatCannotBeAreRefused) {
  const auto refused = [](SamplingLimits l) {
    Response r = test::ok_response(MessageType::attach, 1);
    r.sampling = l;
    Response out;
    return decode_response(test::encode(r), out).message;
  };
  EXPECT_THAT(refused({5, 100.0f}), HasSubstr("5 distributions (max batch 4)"));
  EXPECT_THAT(refused({1, std::numeric_limits<float>::quiet_NaN()}), HasSubstr("temperature nan"));
  EXPECT_THAT(refused({1, -1.0f}), HasSubstr("temperature -1"));
}

// Version 7's step answer: header 16 + status 8 + DraftResponse 8 + 2 x 3 cells of 20 bytes (id, conf,
// conf_logit, margin, q) + DistributionHead 8 + 3 row indices padded to 16 + 3 rows of 50 floats = 776 bytes;
// version 6 ends after the margins (128 bytes).
TEST(CodecResponse, TheStepAnswerCarriesQAndTheDistributionsFromVersionSevenOn) {
  Response r = test::ok_response(MessageType::step, 2);
  r.draft = test::sampled_draft(2, 3, {1, 2, 4}, 50);
  EXPECT_EQ(encoded_size(r, 7), 776u);
  EXPECT_EQ(encoded_size(r, 6), 128u);
  const std::vector<uint8_t> v7 = test::encode(r, 7);
  EXPECT_EQ(peek<float>(v7, 32 + 96), 0.5f);           // q[0] = 1 / 2
  EXPECT_EQ(peek<float>(v7, 32 + 96 + 20), 1.0f / 7);  // q[5]
  EXPECT_EQ(peek<uint32_t>(v7, 152), 3u);              // rows
  EXPECT_EQ(peek<uint32_t>(v7, 156), 50u);             // vocab
  EXPECT_EQ(peek<int32_t>(v7, 160), 1);
  EXPECT_EQ(peek<int32_t>(v7, 168), 4);
  EXPECT_EQ(peek<int32_t>(v7, 172), 0);                                  // padding
  EXPECT_EQ(peek<float>(v7, 176 + 4 * 50 + 4 * 3), 1.0f + 3.0f / 1024);  // row 1, value 3
  Response out;
  ASSERT_TRUE(decode_response(v7, out, 7).ok());
  EXPECT_EQ(out.draft.q, r.draft.q);
  EXPECT_EQ(out.draft.distribution_rows, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(out.draft.distribution, r.draft.distribution);
  const std::vector<uint8_t> v6 = test::encode(r, 6);
  EXPECT_TRUE(std::equal(v6.begin() + 4, v6.end(), v7.begin() + 4));  // the same bytes but the size word
  ASSERT_TRUE(decode_response(v6, out, 6).ok());
  EXPECT_TRUE(out.draft.q.empty());
  EXPECT_TRUE(out.draft.distribution_rows.empty());
  EXPECT_THAT(decode_response(v6, out, 7).message, HasSubstr("do not fit"));

  // Rows that cannot be: past the cells, out of order, without a vocabulary, longer than the message, bad
  // padding.
  const auto refused = [&](size_t offset, uint32_t value) {
    std::vector<uint8_t> b = v7;
    poke<uint32_t>(b, offset, value);
    Response o;
    return decode_response(b, o, 7).message;
  };
  EXPECT_THAT(refused(152, 7), HasSubstr("7 distribution rows of 50 values for 2 x 3 drafts"));
  EXPECT_THAT(refused(156, 0), HasSubstr("3 distribution rows of 0 values"));
  EXPECT_THAT(refused(156, 51), HasSubstr("do not fit"));
  EXPECT_THAT(refused(164, 1), HasSubstr("distribution row 1 is for cell 1 (ascending, below 6)"));
  EXPECT_THAT(refused(168, 6), HasSubstr("distribution row 2 is for cell 6"));
  EXPECT_THAT(refused(172, 1), HasSubstr("padding after its distribution rows"));
  // The encoder refuses distributions that do not divide into their rows.
  r.draft.distribution.pop_back();
  EXPECT_THROW(encoded_size(r, 7), Error);
}

TEST(CodecResponse, TapsThatDoNotFitTheModelAreRefused) {
  const auto refused = [](const std::function<void(ModelTaps&)>& edit) {
    Response r = test::ok_response(MessageType::attach, 1);
    edit(r.taps);
    Response out;
    return decode_response(encode(r), out).message;
  };
  EXPECT_THAT(refused([](ModelTaps& t) { t.layers = 2; }),
              HasSubstr("2 tapped layers for a model of 3 taps"));
  EXPECT_THAT(refused([](ModelTaps& t) { t.layer_ids[3] = 7; }), HasSubstr("slot 3 is unused but not zero"));
  EXPECT_THAT(refused([](ModelTaps& t) { t.layer_ids[1] = -1; }), HasSubstr("tapped layer 1 is -1"));
  EXPECT_THAT(refused([](ModelTaps& t) { t.noise_token = 50; }),
              HasSubstr("noise token 50 outside the vocabulary of 50"));
  EXPECT_THAT(refused([](ModelTaps& t) { t.noise_token = -1; }), HasSubstr("noise token -1"));
}

// Version 6's stats answer: header 16 + status 8 + StatsResponse 96 + StatsMore 136 (4 counters, the hot
// count and its padding, 8 ids, 8 counts) = 256 bytes; versions 3 to 5 end after the StatsResponse, 120
// bytes.
TEST(CodecResponse, TheStatsAnswerCarriesStatsMoreFromVersionSixOn) {
  Response r = test::ok_response(MessageType::stats, 3);
  r.stats_more.acceptance_reports = 4;
  r.stats_more.accepted_tokens = 9;
  r.stats_more.markov_lookups = 30;
  r.stats_more.markov_hits = 12;
  r.stats_more.hot_uncached = 2;
  r.stats_more.hot_tokens[0] = 17;
  r.stats_more.hot_seen[0] = 8;
  r.stats_more.hot_tokens[1] = 3;
  r.stats_more.hot_seen[1] = 5;
  EXPECT_EQ(encoded_size(r, 6), 256u);
  for (const uint32_t v : {3u, 4u, 5u}) EXPECT_EQ(encoded_size(r, v), 120u) << v;
  std::vector<uint8_t> v6(256), v5(120);
  encode_response(r, v6.data(), 6);
  encode_response(r, v5.data(), 5);
  EXPECT_TRUE(std::equal(v5.begin() + 4, v5.end(), v6.begin() + 4));  // the same bytes but the size word
  EXPECT_EQ(peek<uint64_t>(v6, 120), 4u);                             // acceptance reports
  EXPECT_EQ(peek<uint64_t>(v6, 144), 12u);                            // Markov hits
  EXPECT_EQ(peek<uint32_t>(v6, 152), 2u);                             // hot tokens in use
  EXPECT_EQ(peek<int32_t>(v6, 160), 17);
  EXPECT_EQ(peek<uint64_t>(v6, 192), 8u);
  Response out;
  ASSERT_TRUE(decode_response(v6, out, 6).ok());
  EXPECT_EQ(out.stats_more.accepted_tokens, 9u);
  EXPECT_EQ(out.stats_more.hot_tokens[1], 3);
  EXPECT_EQ(out.stats_more.hot_seen[1], 5u);
  ASSERT_TRUE(decode_response(v5, out, 5).ok());
  EXPECT_EQ(out.stats_more.markov_lookups, 0u);
  EXPECT_THAT(decode_response(v5, out, 6).message, HasSubstr("too short for its StatsMore"));
  EXPECT_THAT(decode_response(v6, out, 5).message, HasSubstr("136 bytes past its payload"));
  // Figures that cannot be: more hits than look-ups, tokens accepted without a report, an unused hot slot
  // set.
  const auto refused = [&](const std::function<void(StatsMore&)>& edit) {
    Response bad = r;
    edit(bad.stats_more);
    Response o;
    return decode_response(encode(bad), o).message;
  };
  EXPECT_THAT(refused([](StatsMore& m) { m.markov_hits = 31; }), HasSubstr("31 Markov cache hits in 30"));
  EXPECT_THAT(refused([](StatsMore& m) { m.acceptance_reports = 0; }), HasSubstr("without a report"));
  EXPECT_THAT(refused([](StatsMore& m) { m.hot_seen[2] = 1; }), HasSubstr("slot 2 is unused but not zero"));
  EXPECT_THAT(refused([](StatsMore& m) { m.hot_uncached = 9; }), HasSubstr("9 hot tokens (at most 8)"));
}

TEST(CodecResponse, OkAnswersRoundTrip) {
  const Response attach = decoded_response(encode(test::ok_response(MessageType::attach, 1)));
  EXPECT_TRUE(attach.status.ok());
  EXPECT_EQ(attach.attach.session, 5u);
  EXPECT_EQ(attach.taps.noise_token, 49);
  EXPECT_EQ(attach.taps.layers, 3u);
  EXPECT_EQ(std::vector<int32_t>(attach.taps.layer_ids, attach.taps.layer_ids + 4),
            (std::vector<int32_t>{4, 6, 5, 0}));
  EXPECT_EQ(attach.attach.model.row_bytes, codec_model().row_bytes);
  EXPECT_EQ(attach.attach.model.max_model_len, codec_model().max_model_len);

  const Response step = decoded_response(encode(test::ok_response(MessageType::step, 2)));
  const DraftResult want = test::sample_draft(2, 3);
  EXPECT_EQ(step.draft.batch, 2);
  EXPECT_EQ(step.draft.k, 3);
  EXPECT_EQ(step.draft.ids, want.ids);
  EXPECT_EQ(step.draft.conf, want.conf);
  EXPECT_EQ(step.draft.conf_logit, want.conf_logit);
  EXPECT_EQ(step.draft.margin, want.margin);

  const Response stats = decoded_response(encode(test::ok_response(MessageType::stats, 3)));
  EXPECT_EQ(stats.stats.context_rows, 400u);
  EXPECT_EQ(stats.stats.step_us_p99, 900.25);
  const Response health = decoded_response(encode(test::ok_response(MessageType::health, 4)));
  EXPECT_EQ(health.health.state, 1u);
  EXPECT_EQ(health.health.steps, 10u);
  for (MessageType t : {MessageType::detach, MessageType::set_max_model_len}) {
    const std::vector<uint8_t> b = encode(test::ok_response(t, 5));
    EXPECT_EQ(b.size(), sizeof(MessageHeader) + sizeof(ResponseStatus));
    EXPECT_EQ(decoded_response(b).type, t);
  }
}

TEST(CodecResponse, AStepWithoutDraftsAnswersAnEmptyBatch) {
  Response r = test::ok_response(MessageType::step, 9);
  r.draft = DraftResult{};
  const std::vector<uint8_t> b = encode(r);
  EXPECT_EQ(b.size(), sizeof(MessageHeader) + sizeof(ResponseStatus) + sizeof(DraftResponse) +
                          sizeof(DistributionHead));
  EXPECT_EQ(decoded_response(b).draft.batch, 0);
}

TEST(CodecResponse, AnEmptyMarginIsSentAsZeros) {
  Response r = test::ok_response(MessageType::step, 9);
  r.draft.margin.clear();
  const Response out = decoded_response(encode(r));
  EXPECT_EQ(out.draft.margin, std::vector<float>(6, 0.0f));
  r.draft.conf.pop_back();
  EXPECT_THROW(encoded_size(r), Error);
}

TEST(CodecResponse, ErrorAnswersCarryTheirTextOnly) {
  for (const Response& in : test::sample_responses()) {
    if (in.status.ok()) continue;
    const std::vector<uint8_t> b = encode(in);
    EXPECT_EQ(b.size(),
              sizeof(MessageHeader) + sizeof(ResponseStatus) + (in.status.message.size() + 7) / 8 * 8);
    const Response out = decoded_response(b);
    EXPECT_EQ(out.type, in.type);
    EXPECT_EQ(out.id, in.id);
    EXPECT_EQ(out.status.status, in.status.status);
    EXPECT_EQ(out.status.message, in.status.message);
    EXPECT_EQ(out.draft.batch, 0);
  }
}

TEST(CodecResponse, LongTextIsCutAtACharacterBoundary) {
  std::string text(kMaxStatusMessageBytes - 1, 'x');
  text += "\xc3\xa9 and more";  // a two-byte character across the limit
  const Response out =
      decoded_response(encode(test::error_response(MessageType::step, 1, Status::internal, text)));
  EXPECT_EQ(out.status.message, std::string(kMaxStatusMessageBytes - 1, 'x'));
}

TEST(CodecResponse, RejectsMalformedAnswers) {
  const std::vector<uint8_t> good = encode(test::ok_response(MessageType::step, 2));
  std::vector<uint8_t> b = good;
  poke<uint32_t>(b, 16, 9);  // status
  EXPECT_THAT(response_error(b).message, HasSubstr("unknown status 9"));
  b = good;
  poke<uint32_t>(b, 20, 1u << 30);  // message bytes
  EXPECT_THAT(response_error(b).message, HasSubstr("at most 4096"));
  b = good;
  poke<uint32_t>(b, 20, 200);
  EXPECT_THAT(response_error(b).message, HasSubstr("does not fit"));
  b = good;
  poke<uint32_t>(b, 24, 70000);  // n
  EXPECT_THAT(response_error(b).message, HasSubstr("at most 65536"));
  b = good;
  poke<uint32_t>(b, 28, 4);  // k: more cells than the message holds
  EXPECT_THAT(response_error(b).message, HasSubstr("do not fit"));
  b = test::encode(test::ok_response(MessageType::step, 2), 6);
  poke<uint32_t>(b, 28, 2);  // fewer cells: bytes left over
  Response o;
  EXPECT_THAT(decode_response(b, o, 6).message, HasSubstr("past its payload"));
  b = good;
  poke<uint32_t>(b, 4, 42);
  EXPECT_THAT(response_error(b).message, HasSubstr("OK answer of unknown type 42"));
  b = good;
  poke<uint32_t>(b, 4, 0);
  EXPECT_THAT(response_error(b).message, HasSubstr("padding"));
  b = encode(test::ok_response(MessageType::health, 1));
  b.back() = 1;  // HealthResponse::pad
  EXPECT_THAT(response_error(b).message, HasSubstr("padding is not zero"));
  b = encode(test::error_response(MessageType::step, 1, Status::internal, "abc"));
  b.back() = 1;
  EXPECT_THAT(response_error(b).message, HasSubstr("padding is not zero"));
  EXPECT_THAT(response_error({}).message, HasSubstr("shorter than a message header"));
}

TEST(Codec, MessageTypeNames) {
  EXPECT_EQ(message_type_name(MessageType::set_max_model_len), "set_max_model_len");
  EXPECT_EQ(message_type_name(static_cast<MessageType>(77)), "unknown type 77");
}

}  // namespace
}  // namespace dspark::host
