// Seeded fuzzing of the decoders: valid messages of every kind, mutated (bytes, fields, huge counts,
// truncation, extension, misaligned sizes). Decoding must never crash nor read past the message (it ends at
// an inaccessible page), and it may succeed only when encoding the result gives back the input bytes;
// otherwise it answers INVALID_ARGUMENT with a reason.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <span>

#include "codec_test_util.hpp"
#include "tests/support/byte_mutate.hpp"

namespace dspark::host {
namespace {

constexpr int kIterations = 150000;  // per direction

// Bytes placed to end exactly where an inaccessible page begins: a read past the end faults.
class GuardedBytes {
 public:
  explicit GuardedBytes(size_t max_bytes) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    usable_ = (max_bytes + page_ - 1) / page_ * page_;
    void* p = mmap(nullptr, usable_ + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<uint8_t*>(p);
    EXPECT_EQ(mprotect(base_ + usable_, page_, PROT_NONE), 0);
  }
  ~GuardedBytes() { munmap(base_, usable_ + page_); }
  GuardedBytes(const GuardedBytes&) = delete;
  GuardedBytes& operator=(const GuardedBytes&) = delete;

  std::span<const uint8_t> place(const std::vector<uint8_t>& v) {
    uint8_t* start = base_ + usable_ - v.size();
    if (!v.empty()) std::memcpy(start, v.data(), v.size());
    return {start, v.size()};
  }

 private:
  size_t page_ = 0, usable_ = 0;
  uint8_t* base_ = nullptr;
};

struct Tally {
  int accepted = 0, rejected = 0;
};

template <typename Decode, typename Encode>
void fuzz(const std::vector<std::vector<uint8_t>>& seeds, uint64_t seed, Decode decode, Encode encode,
          Tally& t) {
  std::mt19937_64 rng(seed);
  GuardedBytes guard(64 * 1024);
  for (int i = 0; i < kIterations; ++i) {
    std::vector<uint8_t> b = seeds[rng() % seeds.size()];
    dspark::test::mutate_bytes(b, rng);
    const std::span<const uint8_t> placed = guard.place(b);
    StatusOr st;
    std::vector<uint8_t> again;
    try {
      st = decode(placed);
      if (st.ok()) again = encode();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << i << ": threw " << e.what();
    }
    if (st.ok()) {
      ++t.accepted;
      ASSERT_EQ(again, b) << "iteration " << i << ": accepted, but does not re-encode to its bytes";
    } else {
      ++t.rejected;
      ASSERT_EQ(st.status, Status::invalid_argument) << "iteration " << i;
      ASSERT_FALSE(st.message.empty()) << "iteration " << i;
    }
  }
}

TEST(CodecFuzz, MutatedRequests) {
  const ModelDescription m = test::codec_model();
  std::vector<std::vector<uint8_t>> seeds;
  for (const Request& r : test::sample_requests()) seeds.push_back(test::encode(r, m));
  Request out;
  Tally t;
  fuzz(
      seeds, 1234, [&](std::span<const uint8_t> b) { return decode_request(b, m, out); },
      [&] { return test::encode(out, m); }, t);
  RecordProperty("accepted", t.accepted);
  EXPECT_GT(t.accepted, kIterations / 50);  // payload mutations that leave a valid message
  EXPECT_GT(t.rejected, kIterations / 2);
}

TEST(CodecFuzz, MutatedResponses) {
  std::vector<std::vector<uint8_t>> seeds;
  for (const Response& r : test::sample_responses()) seeds.push_back(test::encode(r));
  Response out;
  Tally t;
  fuzz(
      seeds, 5678, [&](std::span<const uint8_t> b) { return decode_response(b, out); },
      [&] { return test::encode(out); }, t);
  RecordProperty("accepted", t.accepted);
  EXPECT_GT(t.accepted, kIterations / 50);
  EXPECT_GT(t.rejected, kIterations / 2);
}

}  // namespace
}  // namespace dspark::host
