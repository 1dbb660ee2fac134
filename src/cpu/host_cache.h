// host_cache.h — a cache of host blocks of 64 KiB and more for the host-memory devices (cpu, and each sim:N), so
// that a training step, which frees and asks again for the same sizes every step, reuses memory the kernel has
// already mapped instead of taking a page fault on every 4 KiB of a fresh mmap (glibc maps blocks over 32 MiB anew
// each time; measured: ~8 % of a cnn step on 2 cores, and 3-4x the step on sim before it had a cache) or of heap
// that glibc gave back to the kernel when its top was freed (from 1 MiB down to 64 KiB: the small GPT's step -10 %
// on 1 thread, -20 % on 2; below 64 KiB it gained nothing more). A card's memory pool does the same. Not here:
// counting live bytes (host_memory.h), a sim device's capacity (sim_backend.cpp: it gives its cache back before
// it refuses an allocation, so its out-of-memory rule counts live bytes only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "host_memory.h"

namespace ferry::cpu {

// Large blocks rounded up to whole pages (bytes), so that sizes a little apart share cached blocks.
std::size_t cached_block_size(std::size_t bytes);
// A device's cache limit, bytes: a quarter of the machine's memory, at most 4 GiB; none under AddressSanitizer,
// which must see every block freed to catch a use after free.
std::size_t host_cache_limit();

class HostBlockCache {
 public:
  // Blocks of at least kMinBytes are cached, up to `limit` bytes in all (then the largest are freed first).
  static constexpr std::size_t kMinBytes = std::size_t{1} << 16;  // bytes
  explicit HostBlockCache(std::size_t limit = host_cache_limit()) : limit_(limit) {}
  ~HostBlockCache() { release_all(); }
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  // A cached block of exactly `bytes` (already rounded by the caller), or nullptr.
  void* take(std::size_t bytes);
  // Keeps `ptr` (of `bytes`) for a later take(); frees it at once when it is small or the cache is full.
  void give(void* ptr, std::size_t bytes) noexcept;
  // Frees every cached block (empty_cache(), and before an allocation that failed is retried).
  void release_all() noexcept;
  std::size_t cached_bytes() const;

 private:
  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> blocks_;  // bytes -> block
  std::size_t cached_ = 0, limit_;            // bytes
};

// A block for `bytes` (counted in `counter`): a cached one of its size, else a new one; when the host has no new
// one, the cache is given back and the allocation tried once more (what the cache holds may be just what is
// missing). Throws OutOfMemory with the numbers (host_memory.h) when that fails too.
void* allocate_cached(HostBlockCache& cache, std::size_t bytes, Device device, HostMemoryCounter& counter,
                      std::int64_t total);

}  // namespace ferry::cpu
