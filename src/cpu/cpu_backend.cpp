// cpu_backend.cpp — the cpu device: aligned host allocations with byte counts (large blocks kept in a cache
// for reuse), empty streams (work runs at once), memcpy copies. Its kernels are HostKernels.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "../core/registry.h"
#include "host_cache.h"
#include "host_kernels.h"
#include "host_memory.h"
#include "onednn_info.h"
#include "openblas_info.h"
#include "parallel_cost.h"
#include "ferry/error.h"

namespace ferry::cpu {

namespace {
constexpr std::size_t kAlignment = 64;  // bytes: one cache line, a full AVX-512 vector

}  // namespace

std::int64_t physical_memory_bytes() {
  // Read once: sysconf(_SC_PHYS_PAGES) is a sysinfo() system call, and allocate() passes this on every block.
  static const std::int64_t bytes = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  return bytes;
}
std::int64_t available_memory_bytes() {
  return static_cast<std::int64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

namespace {
double cpu_clock_hz() {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return std::stod(line.substr(colon + 1)) * 1e6;
    }
  }
  return 0;
}
std::string cpu_model_name() {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "host cpu";
}
}  // namespace

void* host_allocate(std::size_t bytes, Device device, HostMemoryCounter& counter, std::int64_t total) {
  return host_allocate(bytes, bytes, device, counter, total);
}

void* host_allocate(std::size_t block, std::size_t bytes, Device device, HostMemoryCounter& counter, std::int64_t total) {
  const std::size_t rounded = (block + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) {
    const MemoryStats s = counter.stats(total, available_memory_bytes());
    throw OutOfMemory(detail::concat("Out of memory on ", device.str(), ": tried to allocate ", bytes, " bytes; ",
                                     s.allocated, " bytes allocated, ", s.free, " bytes free of ", s.total,
                                     " bytes total"));
  }
  counter.add(bytes);
  return p;
}

class CpuBackend final : public HostKernels {
 public:
  DeviceType type() const override { return DeviceType::CPU; }
  int device_count() const override { return 1; }
  DeviceProperties properties(int) const override {
    DeviceProperties p;
    p.name = cpu_model_name();
    p.cores = static_cast<int>(std::thread::hardware_concurrency());
    p.clock_hz = cpu_clock_hz();
    p.memory_bytes = physical_memory_bytes();
    const std::string onednn = onednn_description();
    p.libraries = openblas_description() + (onednn.empty() ? "" : "; convolutions on " + onednn);
    const std::string threads = describe_parallel_work_scale();
    if (!threads.empty()) p.libraries += "; " + threads;
    return p;
  }
  void* allocate(std::size_t bytes, int) override {
    return allocate_cached(cache_, bytes, kCPU, counter_, physical_memory_bytes());
  }
  void deallocate(void* ptr, std::size_t bytes, int) noexcept override {
    cache_.give(ptr, cached_block_size(bytes));
    counter_.remove(bytes);
  }
  void empty_cache(int) override { cache_.release_all(); }
  MemoryStats memory_stats(int) const override {
    MemoryStats s = counter_.stats(physical_memory_bytes(), available_memory_bytes());
    s.reserved += static_cast<std::int64_t>(cache_.cached_bytes());
    return s;
  }
  void reset_peak_memory_stats(int) override { counter_.reset_peak(); }
  Stream compute_stream(int) override { return {kCPU, nullptr}; }
  Stream copy_stream(int) override { return {kCPU, nullptr}; }
  void synchronize(const Stream&) override {}
  void synchronize_device(int) override {}
  void stream_wait(const Stream&, const Stream&) override {}
  void copy(void* dst, Device, const void* src, Device, std::size_t bytes, const Stream&, bool, bool) override {
    std::memcpy(dst, src, bytes);
  }

 private:
  HostMemoryCounter counter_;
  HostBlockCache cache_;
};

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace ferry::cpu
