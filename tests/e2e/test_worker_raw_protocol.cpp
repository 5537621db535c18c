// Messages a library client would never send, written straight into a real worker's ring: a wrong protocol
// version and context rows of the wrong size are answered INVALID_ARGUMENT and change nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "client/dspark_client.hpp"
#include "lib/host/codec.hpp"
#include "tests/e2e/raw_host.hpp"
#include "tests/support/worker_process.hpp"

namespace dspark {
namespace {

RowVector some_rows(int n, int values) {
  std::mt19937 g(5);
  std::normal_distribution<float> normal;
  RowVector v(static_cast<size_t>(n * values));
  for (auto& x : v) x = float_to_bf16(normal(g));
  return v;
}

TEST(WorkerRawProtocol, WrongVersionAndRowSizeMismatchAreRefusedAndChangeNothing) {
  test::WorkerProcess worker(1, "/dspark-e2e-raw-" + std::to_string(::getpid()));
  { Client warmup(worker.ring(), 60000); }  // serving (and a clean detach) before the raw host attaches
  test::RawHost h(worker.ring());
  ASSERT_TRUE(h.attached()) << h.why();
  host::Request attach;
  attach.type = host::MessageType::attach;
  attach.id = 1;
  attach.attach = {10, ::getpid()};  // after a hello of this build's version
  h.send(attach);
  host::Response r = h.receive().value_or(host::Response{});
  EXPECT_EQ(r.id, 1u);
  EXPECT_EQ(r.status.status, Status::invalid_argument);
  EXPECT_EQ(r.status.message,
            "the client speaks protocol version 10; this worker serves protocol versions 3 to 7");

  attach.id = 2;
  attach.attach.version = host::kProtocolVersion;
  h.send(attach);
  ASSERT_TRUE(h.receive().value_or(host::Response{}).status.ok());

  // Context for slot 0 and a draft: the reference answer.
  const int values = static_cast<int>(h.model().row_bytes / 2);
  host::Request step;
  step.type = host::MessageType::step;
  step.id = 3;
  step.step.contexts = {{0, 0, 20}};
  step.step.rows = some_rows(20, values);
  step.step.drafts = {{0, 3, 20, -1, 0}};
  h.send(step);
  const host::Response before = h.receive().value_or(host::Response{});
  ASSERT_TRUE(before.status.ok()) << before.status.message;

  // A step whose context claims 2 rows but carries 1 row's bytes, with a draft and a reset of slot 0.
  host::Request bad = step;
  bad.id = 4;
  bad.step.resets = {0};
  bad.step.contexts = {{0, 20, 1}};
  bad.step.rows = some_rows(1, values);
  std::vector<uint8_t> bytes(host::encoded_size(bad, h.model()));
  host::encode_request(bad, h.model(), bytes.data());
  const size_t wire_at = sizeof(host::MessageHeader) + sizeof(host::StepRequest) + sizeof(int32_t);
  host::ContextWire wire;
  std::memcpy(&wire, bytes.data() + wire_at, sizeof(wire));
  ASSERT_EQ(wire.rows, 1);
  wire.rows = 2;
  std::memcpy(bytes.data() + wire_at, &wire, sizeof(wire));
  h.send_bytes(bytes);
  r = h.receive().value_or(host::Response{});
  EXPECT_EQ(r.id, 4u);
  EXPECT_EQ(r.status.status, Status::invalid_argument);
  EXPECT_FALSE(r.status.message.empty());

  // Nothing changed: the same draft gives the same answer (the reset was not applied either).
  host::Request again;
  again.type = host::MessageType::step;
  again.id = 5;
  again.step.drafts = step.step.drafts;
  h.send(again);
  const host::Response after = h.receive().value_or(host::Response{});
  ASSERT_TRUE(after.status.ok()) << after.status.message;
  EXPECT_EQ(after.draft.ids, before.draft.ids);
  EXPECT_EQ(after.draft.conf, before.draft.conf);
}

}  // namespace
}  // namespace dspark
