// host_memory.h — allocation and byte counting shared by the host-memory devices (cpu, sim).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "ferry/backend.h"

namespace ferry::cpu {

std::int64_t physical_memory_bytes();
std::int64_t available_memory_bytes();

// Byte counting shared by host-memory devices.
class HostMemoryCounter {
 public:
  void add(std::size_t bytes) {
    const std::int64_t now = allocated_.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {}
    allocations_.fetch_add(1);
  }
  void remove(std::size_t bytes) { allocated_.fetch_sub(static_cast<std::int64_t>(bytes)); }
  MemoryStats stats(std::int64_t total, std::int64_t free) const {
    MemoryStats s;
    s.allocated = s.reserved = allocated_.load();
    s.peak = peak_.load();
    s.total = total;
    s.free = free;
    s.allocations = allocations_.load();
    return s;
  }
  void reset_peak() { peak_.store(allocated_.load()); }

 private:
  std::atomic<std::int64_t> allocated_{0}, peak_{0}, allocations_{0};
};

// 64-byte aligned; throws OutOfMemory with the numbers when the host cannot give `bytes`.
void* host_allocate(std::size_t bytes, Device device, HostMemoryCounter& counter, std::int64_t total);
// The same for a block of `block` >= `bytes` bytes of which `bytes` are counted as allocated.
void* host_allocate(std::size_t block, std::size_t bytes, Device device, HostMemoryCounter& counter, std::int64_t total);

}  // namespace ferry::cpu
