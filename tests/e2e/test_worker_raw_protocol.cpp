// Messages a library client would never send, written straight into a real worker's ring: a wrong protocol
// version and context rows of the wrong size are answered INVALID_ARGUMENT and change nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "client/dspark_client.hpp"
#include "lib/host/codec.hpp"
#include "lib/host/segment.hpp"
#include "tests/support/worker_process.hpp"

namespace dspark {
namespace {

// A minimal host speaking the protocol by hand (claim, write one message, read one answer).
class RawHost {
 public:
  explicit RawHost(const std::string& name) : seg_(host::Segment::open(name)) {
    host::SegmentHeader& h = seg_.header();
    h.host_heartbeat_ns.store(host::monotonic_ns());
    int32_t expected = 0;
    claimed_ = h.host_pid.compare_exchange_strong(expected, ::getpid());
  }
  ~RawHost() {
    if (!claimed_) return;
    host::Request d;
    d.type = host::MessageType::detach;
    send(d);
  }
  bool claimed() const { return claimed_; }
  const host::ModelDescription& model() const { return seg_.header().model; }

  void send(const host::Request& r) {
    seg_.header().host_heartbeat_ns.store(host::monotonic_ns());
    std::vector<uint8_t> bytes(host::encoded_size(r, model()));
    host::encode_request(r, model(), bytes.data());
    send_bytes(bytes);
  }
  void send_bytes(const std::vector<uint8_t>& bytes) {
    host::RingWriter w(seg_.requests());
    uint8_t* dst = w.reserve(static_cast<uint32_t>(bytes.size()), std::chrono::seconds(5));
    ASSERT_NE(dst, nullptr);
    std::memcpy(dst, bytes.data(), bytes.size());
    w.publish();
  }
  host::Response receive() {
    host::Response out;
    for (int i = 0; i < 100; ++i) {
      seg_.header().host_heartbeat_ns.store(host::monotonic_ns());
      if (!reader_.wait(std::chrono::milliseconds(100))) continue;
      bool corrupt = false;
      const host::MessageHeader* m = reader_.peek(corrupt);
      if (!m) continue;
      std::vector<uint8_t> copy(reader_.peeked_bytes());
      std::memcpy(copy.data(), m, copy.size());
      reader_.consume();
      EXPECT_TRUE(host::decode_response(copy, out).ok());
      return out;
    }
    ADD_FAILURE() << "no answer";
    return out;
  }

 private:
  host::Segment seg_;
  host::RingReader reader_{seg_.responses()};
  bool claimed_ = false;
};

std::vector<bf16_t> some_rows(int n, int values) {
  std::mt19937 g(5);
  std::normal_distribution<float> normal;
  std::vector<bf16_t> v(static_cast<size_t>(n * values));
  for (auto& x : v) x = float_to_bf16(normal(g));
  return v;
}

TEST(WorkerRawProtocol, WrongVersionAndRowSizeMismatchAreRefusedAndChangeNothing) {
  test::WorkerProcess worker(1, "/dspark-e2e-raw-" + std::to_string(::getpid()));
  {
    Client warmup(worker.ring(), 60000);
  }  // serving (and a clean detach) before the raw host claims the segment
  RawHost h(worker.ring());
  for (int i = 0; i < 50 && !h.claimed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(h.claimed());
  host::Request attach;
  attach.type = host::MessageType::attach;
  attach.id = 1;
  attach.attach = {host::kProtocolVersion + 7, ::getpid()};
  h.send(attach);
  host::Response r = h.receive();
  EXPECT_EQ(r.id, 1u);
  EXPECT_EQ(r.status.status, Status::invalid_argument);
  EXPECT_NE(r.status.message.find("protocol version"), std::string::npos) << r.status.message;

  attach.id = 2;
  attach.attach.version = host::kProtocolVersion;
  h.send(attach);
  ASSERT_TRUE(h.receive().status.ok());

  // Context for slot 0 and a draft: the reference answer.
  const int values = static_cast<int>(h.model().row_bytes / 2);
  host::Request step;
  step.type = host::MessageType::step;
  step.id = 3;
  step.step.contexts = {{0, 0, 20}};
  step.step.rows = some_rows(20, values);
  step.step.drafts = {{0, 3, 20, -1, 0}};
  h.send(step);
  const host::Response before = h.receive();
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
  r = h.receive();
  EXPECT_EQ(r.id, 4u);
  EXPECT_EQ(r.status.status, Status::invalid_argument);
  EXPECT_FALSE(r.status.message.empty());

  // Nothing changed: the same draft gives the same answer (the reset was not applied either).
  host::Request again;
  again.type = host::MessageType::step;
  again.id = 5;
  again.step.drafts = step.step.drafts;
  h.send(again);
  const host::Response after = h.receive();
  ASSERT_TRUE(after.status.ok()) << after.status.message;
  EXPECT_EQ(after.draft.ids, before.draft.ids);
  EXPECT_EQ(after.draft.conf, before.draft.conf);
}

}  // namespace
}  // namespace dspark
