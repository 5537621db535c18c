// Host memory for context rows (RowVector, lib/api/step_plan.hpp). A backend that uploads rows by DMA
// installs a provider of page-locked memory (the CUDA backend: cudaHostAlloc), so that the rows a host
// message was decoded into reach the device with no further host copy. Freed blocks are kept for reuse by
// size class: a page-locked allocation costs far more than the step that would use it, and a fresh heap
// block its page faults.
#pragma once

#include <cstddef>

namespace dspark {

struct RowMemoryProvider {
  void* (*allocate)(size_t bytes) = nullptr;  // nullptr when it cannot
  void (*release)(void* p) = nullptr;
};

// From here on, row memory comes from `p` (when it can; else from the heap). The first provider stays: a
// later call with another one is ignored (false). Blocks keep the origin they were allocated with.
bool install_row_memory_provider(const RowMemoryProvider& p);
// At least `bytes` bytes, 64-byte aligned; throws std::bad_alloc.
void* allocate_row_memory(size_t bytes);
void release_row_memory(void* p) noexcept;
// Whether `p` (allocate_row_memory's pointer) came from the installed provider.
bool row_memory_from_provider(const void* p) noexcept;

}  // namespace dspark
