// host_cache.cpp — the cpu device's cache of large host blocks (see host_cache.h).
#include "host_cache.h"

#include <cstdlib>

namespace ferry::cpu {

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

}  // namespace ferry::cpu
