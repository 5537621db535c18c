// The row memory pool (lib/core/row_memory.hpp): heap blocks before a provider is installed, the provider's
// blocks after, freed blocks reused by size class, and RowVector on top of it. One test: the provider is
// installed once per process.
#include "lib/core/row_memory.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "lib/api/step_plan.hpp"

namespace dspark {
namespace {

int provided = 0, released = 0;

void* counting_allocate(size_t bytes) {
  ++provided;
  return std::aligned_alloc(64, bytes);
}

void counting_release(void* p) {
  ++released;
  std::free(p);
}

void* other_allocate(size_t) {
  return nullptr;
}

bool aligned64(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 64 == 0;
}

TEST(RowMemory, HeapUntilAProviderThenItsBlocksReusedBySizeClass) {
  // Before any provider: heap blocks, written whole.
  void* heap = allocate_row_memory(1000);
  EXPECT_TRUE(aligned64(heap));
  EXPECT_FALSE(row_memory_from_provider(heap));
  static_cast<char*>(heap)[999] = 1;
  // Freed, a heap block comes back for its class (no new block and its page faults each step).
  release_row_memory(heap);
  void* again = allocate_row_memory(2000);
  EXPECT_EQ(again, heap);
  EXPECT_FALSE(row_memory_from_provider(again));
  heap = again;
  void* kept_heap = allocate_row_memory(1000);  // freed before the install: let go by it
  release_row_memory(kept_heap);

  EXPECT_FALSE(install_row_memory_provider({}));  // incomplete: refused
  ASSERT_TRUE(install_row_memory_provider({counting_allocate, counting_release}));
  EXPECT_TRUE(install_row_memory_provider({counting_allocate, counting_release}));  // the same one
  EXPECT_FALSE(install_row_memory_provider({other_allocate, counting_release}));    // the first one stays

  // A heap block allocated before goes back to the heap, not to the provider.
  release_row_memory(heap);
  EXPECT_EQ(released, 0);

  // The heap blocks kept are not handed out once the provider is installed.
  void* small = allocate_row_memory(1000);
  EXPECT_TRUE(row_memory_from_provider(small));
  EXPECT_EQ(provided, 1);
  provided = 0;

  // 100 000 bytes + the 64-byte header fit the 128 KiB class: one provider block.
  void* a = allocate_row_memory(100000);
  EXPECT_EQ(provided, 1);
  EXPECT_TRUE(row_memory_from_provider(a));
  EXPECT_TRUE(aligned64(a));
  // Freed, it is kept and comes back for any size of its class, without the provider.
  release_row_memory(a);
  EXPECT_EQ(released, 0);
  void* b = allocate_row_memory(70000);
  EXPECT_EQ(b, a);
  EXPECT_EQ(provided, 1);
  // Another class is a new block.
  void* c = allocate_row_memory(200000);
  EXPECT_NE(c, a);
  EXPECT_EQ(provided, 2);
  release_row_memory(b);
  release_row_memory(c);

  // At most 8 freed blocks are kept per class: the ninth goes back to the provider.
  std::vector<void*> blocks;
  for (int i = 0; i < 9; ++i) blocks.push_back(allocate_row_memory(3000));
  EXPECT_EQ(provided, 2 + 9);
  for (void* p : blocks) release_row_memory(p);
  EXPECT_EQ(released, 1);

  // A plan's rows come from the provider now, and keep what was written.
  RowVector rows(50000);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<bf16_t>(i);
  EXPECT_TRUE(row_memory_from_provider(rows.data()));
  const RowVector copy = rows;
  EXPECT_EQ(copy, rows);
  EXPECT_TRUE(row_memory_from_provider(copy.data()));
  release_row_memory(small);
  release_row_memory(nullptr);  // a no-op
}

}  // namespace
}  // namespace dspark
