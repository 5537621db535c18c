#include "lib/core/row_memory.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

namespace dspark {
namespace {

// Each block starts with this header (64 bytes, so that the rows after it stay 64-byte aligned).
struct alignas(64) BlockHeader {
  uint32_t size_class = 0;  // the block holds 2^size_class bytes, header included
  bool from_provider = false;
};

constexpr uint32_t kMinClass = 12;   // 4 KiB
constexpr uint32_t kClasses = 48;    // up to 2^47 bytes
constexpr size_t kKeptPerClass = 8;  // freed provider blocks kept per size class

struct Pool {
  std::mutex mu;
  RowMemoryProvider provider;
  std::array<std::vector<BlockHeader*>, kClasses> kept;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: rows may be freed during static destruction
  return *p;
}

uint32_t size_class_of(size_t bytes) {
  if (bytes > (size_t{1} << (kClasses - 1)) - sizeof(BlockHeader)) throw std::bad_alloc();
  const size_t whole = bytes + sizeof(BlockHeader);
  return std::max<uint32_t>(kMinClass, static_cast<uint32_t>(std::bit_width(whole - 1)));
}

BlockHeader* header_of(const void* p) {
  return static_cast<BlockHeader*>(const_cast<void*>(p)) - 1;
}

}  // namespace

bool install_row_memory_provider(const RowMemoryProvider& p) {
  if (!p.allocate || !p.release) return false;
  Pool& pl = pool();
  std::vector<BlockHeader*> heap_blocks;
  {
    const std::lock_guard lock(pl.mu);
    if (pl.provider.allocate) return pl.provider.allocate == p.allocate && pl.provider.release == p.release;
    pl.provider = p;
    for (std::vector<BlockHeader*>& kept : pl.kept) {
      heap_blocks.insert(heap_blocks.end(), kept.begin(), kept.end());
      kept.clear();
    }
  }
  for (BlockHeader* h : heap_blocks) std::free(h);
  return true;
}

void* allocate_row_memory(size_t bytes) {
  const uint32_t c = size_class_of(bytes);
  const size_t whole = size_t{1} << c;
  Pool& pl = pool();
  RowMemoryProvider provider;
  {
    const std::lock_guard lock(pl.mu);
    std::vector<BlockHeader*>& kept = pl.kept[c];
    if (!kept.empty()) {
      BlockHeader* h = kept.back();
      kept.pop_back();
      return h + 1;
    }
    provider = pl.provider;
  }
  void* raw = provider.allocate ? provider.allocate(whole) : nullptr;
  const bool from_provider = raw != nullptr;
  if (!raw) raw = std::aligned_alloc(alignof(BlockHeader), whole);
  if (!raw) throw std::bad_alloc();
  BlockHeader* h = new (raw) BlockHeader{c, from_provider};
  return h + 1;
}

void release_row_memory(void* p) noexcept {
  if (!p) return;
  BlockHeader* h = header_of(p);
  Pool& pl = pool();
  RowMemoryProvider provider;
  {
    const std::lock_guard lock(pl.mu);
    provider = pl.provider;
    // Kept where the next allocation of its class looks: a heap block only while no provider is installed.
    std::vector<BlockHeader*>& kept = pl.kept[h->size_class];
    if (h->from_provider == (provider.allocate != nullptr) && kept.size() < kKeptPerClass) {
      try {
        kept.push_back(h);
        return;
      } catch (...) {
        // no room to keep it: released below
      }
    }
  }
  if (h->from_provider)
    provider.release(h);
  else
    std::free(h);
}

bool row_memory_from_provider(const void* p) noexcept {
  return p && header_of(p)->from_provider;
}

}  // namespace dspark
