// host_cache.h — a cache of host blocks of 64 KiB and more for the cpu device, so that a training step, which
// frees and asks again for the same sizes every step, reuses memory the kernel has already mapped instead of
// taking a page fault on every 4 KiB of a fresh mmap (glibc maps blocks over 32 MiB anew each time; measured: ~8 %
// of a cnn step on 2 cores) or of heap that glibc gave back to the kernel when its top was freed (from 1 MiB down
// to 64 KiB: the small GPT's step -10 % on 1 thread, -20 % on 2; below 64 KiB it gained nothing more). Not here: counting live bytes (host_memory.h), the sim device (it keeps plain
// allocations so that its capacity and OOM rules stay exact).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace ferry::cpu {

class HostBlockCache {
 public:
  // Blocks of at least kMinBytes are cached, up to `limit` bytes in all (then the oldest-sized are freed).
  static constexpr std::size_t kMinBytes = std::size_t{1} << 16;  // bytes
  explicit HostBlockCache(std::size_t limit) : limit_(limit) {}
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

}  // namespace ferry::cpu
