// Attaches to a worker name nobody serves: the installed library and headers work together (built as C++17),
// and the answer is the documented one (UNAVAILABLE, with a reason).
#include <dspark/dspark_client.hpp>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const int32_t slots[2] = {0, 1};
  const dspark::Span<int32_t> view(slots);
  if (view.size() != 2 || dspark::to_bf16(1.0f) != 0x3f80) return 1;
  try {
    dspark::Client c(argv[1], 200);
  } catch (const dspark::ClientError& e) {
    const bool unavailable = std::strcmp(dspark_status_name(e.status()), "UNAVAILABLE") == 0;
    std::printf("%s: %s\n", dspark_status_name(e.status()), e.what());
    return unavailable ? 0 : 1;
  }
  std::printf("attached to a worker that should not exist\n");
  return 1;
}
