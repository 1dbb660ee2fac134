// pinned.cpp — page-locked host memory for pinned tensors (pin_memory(), the targets of non_blocking
// device->host moves). cudaHostAlloc is slow (it maps and locks pages), so freed blocks are cached by
// size and handed out again once every copy stream has passed the point where the block was freed:
// a DMA enqueued before the free may still be reading or writing it. Not here: the staging ring of
// pageable copies (copy.cpp), which owns its own pinned buffers.
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "check.h"
#include "device_state.h"
#include "ferry/error.h"
#include "kernels.h"

namespace ferry::cuda {

namespace {

struct PinnedBlock {
  std::size_t size = 0;              // bytes, a power of two
  std::vector<cudaEvent_t> events;   // per device: recorded on its copy stream when the block was freed
};

struct PinnedCache {
  std::mutex mutex;
  std::unordered_map<void*, PinnedBlock> blocks;  // every block, by address
  std::multimap<std::size_t, void*> free_blocks;  // cached blocks, by size
};

PinnedCache& cache() {
  static auto* c = new PinnedCache();  // never destroyed: blocks may be freed during static destruction
  return *c;
}

std::size_t bucket_size(std::size_t bytes) {  // power of two, at least 4 KiB
  std::size_t size = 4096;
  while (size < bytes) size *= 2;
  return size;
}

// True once every copy stream has passed the block's free.
bool block_ready(const PinnedBlock& block) {
  for (cudaEvent_t event : block.events) {
    if (!event) continue;
    // Only cudaSuccess says the copies are done. Any other answer (not ready, or an error such as a query
    // inside a capture) keeps the block out of use, and is cleared so that no later check reports it.
    if (cudaEventQuery(event) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
  }
  return true;
}

void destroy_block(void* ptr, PinnedBlock& block) noexcept {
  for (cudaEvent_t event : block.events) {
    if (event) cudaEventDestroy(event);
  }
  if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
}

// Frees every cached block whose copies are done; called with the mutex held.
void release_ready_blocks(PinnedCache& c) noexcept {
  for (auto it = c.free_blocks.begin(); it != c.free_blocks.end();) {
    auto block = c.blocks.find(it->second);
    if (block == c.blocks.end() || !block_ready(block->second)) {
      ++it;
      continue;
    }
    destroy_block(block->first, block->second);
    c.blocks.erase(block);
    it = c.free_blocks.erase(it);
  }
}

}  // namespace

void* pinned_allocate(std::size_t bytes) {
  PinnedCache& c = cache();
  const std::size_t size = bucket_size(bytes);
  {
    std::lock_guard lock(c.mutex);
    auto [first, last] = c.free_blocks.equal_range(size);
    for (auto it = first; it != last; ++it) {
      if (block_ready(c.blocks.at(it->second))) {
        void* ptr = it->second;
        c.free_blocks.erase(it);
        return ptr;
      }
    }
  }
  void* ptr = nullptr;
  cudaError_t status = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
  if (status == cudaErrorMemoryAllocation) {  // give the cache back to the system and try again
    cudaGetLastError();
    {
      std::lock_guard lock(c.mutex);
      release_ready_blocks(c);
    }
    status = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemory(detail::concat("Out of pinned host memory: tried to allocate ", bytes, " bytes (a block of ",
                                     size, " bytes) with cudaHostAlloc; pinned memory is limited by the host's RAM "
                                     "and its locked-memory limit (ulimit -l)"));
  }
  if (status != cudaSuccess) throw_cuda_error(status, "cudaHostAlloc", __FILE__, __LINE__);
  std::lock_guard lock(c.mutex);
  c.blocks[ptr].size = size;
  return ptr;
}

void pinned_deallocate(void* ptr) noexcept {
  if (!ptr) return;
  PinnedCache& c = cache();
  std::lock_guard lock(c.mutex);
  auto found = c.blocks.find(ptr);
  if (found == c.blocks.end()) {  // not ours: nothing to cache
    if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
    return;
  }
  PinnedBlock& block = found->second;
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) {
    cudaGetLastError();
    previous = -1;
  }
  for (int d = 0; d < kMaxDevices; ++d) {
    DeviceState* state = device_state_if_created(d);
    if (!state) continue;
    if (block.events.size() <= static_cast<std::size_t>(d)) block.events.resize(static_cast<std::size_t>(d) + 1, nullptr);
    cudaEvent_t& event = block.events[static_cast<std::size_t>(d)];
    bool recorded = cudaSetDevice(d) == cudaSuccess;
    if (recorded && !event) recorded = cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess;
    if (recorded) recorded = cudaEventRecord(event, state->copy_stream) == cudaSuccess;
    if (!recorded) {  // cannot mark the stream: wait for it instead
      cudaGetLastError();
      cudaStreamSynchronize(state->copy_stream);
      cudaGetLastError();
      if (event) cudaEventDestroy(event);
      event = nullptr;
    }
  }
  if (previous >= 0) cudaSetDevice(previous);
  c.free_blocks.emplace(block.size, ptr);
}

void pinned_release_cached() {
  PinnedCache& c = cache();
  std::lock_guard lock(c.mutex);
  release_ready_blocks(c);
}

}  // namespace ferry::cuda
