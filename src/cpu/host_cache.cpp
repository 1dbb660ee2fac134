// host_cache.cpp — the host-memory devices' cache of large host blocks (see host_cache.h).
#include "host_cache.h"

#include <algorithm>
#include <cstdlib>

#include "ferry/error.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_CLANG_ASAN 1
#endif
#endif
#ifndef FERRY_CLANG_ASAN
#define FERRY_CLANG_ASAN 0
#endif

namespace ferry::cpu {

std::size_t cached_block_size(std::size_t bytes) {
  constexpr std::size_t kPage = 4096;  // bytes
  return bytes >= HostBlockCache::kMinBytes ? (bytes + kPage - 1) / kPage * kPage : bytes;
}

std::size_t host_cache_limit() {
#if defined(__SANITIZE_ADDRESS__) || FERRY_CLANG_ASAN  // GCC defines the first, clang has the feature
  return 0;
#else
  return static_cast<std::size_t>(std::min<std::int64_t>(physical_memory_bytes() / 4, std::int64_t{4} << 30));
#endif
}

void* HostBlockCache::take(std::size_t bytes) {
  if (bytes < kMinBytes) return nullptr;
  std::lock_guard lock(mutex_);
  const auto it = blocks_.find(bytes);
  if (it == blocks_.end()) return nullptr;
  void* ptr = it->second;
  blocks_.erase(it);
  cached_ -= bytes;
  return ptr;
}

void HostBlockCache::give(void* ptr, std::size_t bytes) noexcept {
  if (bytes >= kMinBytes && bytes <= limit_) {
    std::lock_guard lock(mutex_);
    // Make room by freeing the largest blocks first: they are the likeliest to be one-off sizes.
    while (cached_ + bytes > limit_ && !blocks_.empty()) {
      const auto largest = std::prev(blocks_.end());
      cached_ -= largest->first;
      std::free(largest->second);
      blocks_.erase(largest);
    }
    try {
      blocks_.emplace(bytes, ptr);  // a map node: may throw bad_alloc, then the block is simply freed
      cached_ += bytes;
      return;
    } catch (...) {
    }
  }
  std::free(ptr);
}

void HostBlockCache::release_all() noexcept {
  std::lock_guard lock(mutex_);
  for (const auto& [bytes, ptr] : blocks_) std::free(ptr);
  blocks_.clear();
  cached_ = 0;
}

std::size_t HostBlockCache::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return cached_;
}

void* allocate_cached(HostBlockCache& cache, std::size_t bytes, Device device, HostMemoryCounter& counter,
                      std::int64_t total) {
  const std::size_t block = cached_block_size(bytes);
  if (void* cached = cache.take(block)) {
    counter.add(bytes);
    return cached;
  }
  try {
    return host_allocate(block, bytes, device, counter, total);
  } catch (const OutOfMemory&) {
    if (cache.cached_bytes() == 0) throw;
    cache.release_all();
    return host_allocate(block, bytes, device, counter, total);
  }
}

}  // namespace ferry::cpu
