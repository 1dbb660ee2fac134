// sim_backend.cpp — the sim device: a discrete accelerator simulated in host memory. Each sim:N has
// its own allocations and capacity; every copy to or from it crosses a link of settable bandwidth
// (throttled on the host clock). It computes with the cpu kernels. Tests use it to exercise every
// device-management rule without a GPU; users use it to watch the cost model.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../core/registry.h"
#include "../cpu/host_kernels.h"
#include "../cpu/host_memory.h"
#include "ferry/error.h"
#include <algorithm>

namespace ferry {

namespace {
constexpr int kMaxSimDevices = 8;
constexpr std::int64_t kSimCapacity = std::int64_t{8} << 30;  // bytes of "device memory" per sim device

double parse_rate(const char* text) {  // "16GB/s", "500MB/s", "0" (unthrottled), or bytes/s
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  const std::string unit = end ? std::string(end) : "";
  if (unit == "GB/s") return value * 1e9;
  if (unit == "MB/s") return value * 1e6;
  if (unit == "GiB/s") return value * 1073741824.0;
  return value;
}

struct SimSettings {
  std::mutex mutex;
  double link_bytes_per_second = 16e9;
  int device_count = 2;
  SimSettings() {
    if (const char* link = std::getenv("FERRY_SIM_LINK")) link_bytes_per_second = parse_rate(link);
    if (const char* count = std::getenv("FERRY_SIM_DEVICES")) device_count = std::clamp(std::atoi(count), 0, kMaxSimDevices);
  }
};
SimSettings& settings() {
  static SimSettings s;
  return s;
}

// Hold the host until `bytes` would have crossed the link since `start`.
void wait_for_link(std::chrono::steady_clock::time_point start, std::size_t bytes) {
  const double rate = sim_link_bandwidth();
  if (rate <= 0) return;
  const auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(static_cast<double>(bytes) / rate));
  if (due - std::chrono::steady_clock::now() > std::chrono::microseconds(200)) std::this_thread::sleep_until(due);
  while (std::chrono::steady_clock::now() < due) {}
}
}  // namespace

void set_sim_link_bandwidth(double bytes_per_second) {
  FERRY_CHECK(bytes_per_second >= 0, InvalidArgument, "sim link bandwidth must be >= 0 bytes/s, got ",
              bytes_per_second);
  std::lock_guard lock(settings().mutex);
  settings().link_bytes_per_second = bytes_per_second;
}
double sim_link_bandwidth() {
  std::lock_guard lock(settings().mutex);
  return settings().link_bytes_per_second;
}
void set_sim_device_count(int count) {
  FERRY_CHECK(count >= 0 && count <= kMaxSimDevices, InvalidArgument, "sim device count must be in [0, ",
              kMaxSimDevices, "], got ", count);
  std::lock_guard lock(settings().mutex);
  settings().device_count = count;
}

namespace sim {

class SimBackend final : public cpu::HostKernels {
 public:
  DeviceType type() const override { return DeviceType::Sim; }
  int device_count() const override {
    std::lock_guard lock(settings().mutex);
    return settings().device_count;
  }
  DeviceProperties properties(int index) const override {
    DeviceProperties p = backend(DeviceType::CPU).properties(0);
    p.name = "ferry sim:" + std::to_string(index) + " (host-memory accelerator, computes with the cpu kernels)";
    p.memory_bytes = kSimCapacity;
    p.link_bytes_per_second = sim_link_bandwidth();
    p.link = "simulated";
    return p;
  }
  void* allocate(std::size_t bytes, int index) override {
    check_index(index);
    const MemoryStats s = counters_[index].stats(kSimCapacity, kSimCapacity - counters_[index].stats(0, 0).allocated);
    if (static_cast<std::int64_t>(bytes) > kSimCapacity - s.allocated) {
      throw OutOfMemory(detail::concat("Out of memory on sim:", index, ": tried to allocate ", bytes, " bytes; ",
                                       s.allocated, " bytes allocated, ", s.reserved, " reserved, ", s.free,
                                       " free of ", s.total, " bytes total"));
    }
    return cpu::host_allocate(bytes, Device(DeviceType::Sim, index), counters_[index], kSimCapacity);
  }
  void deallocate(void* ptr, std::size_t bytes, int index) noexcept override {
    std::free(ptr);
    counters_[index].remove(bytes);
  }
  MemoryStats memory_stats(int index) const override {
    check_index(index);
    const std::int64_t allocated = counters_[index].stats(0, 0).allocated;
    return counters_[index].stats(kSimCapacity, kSimCapacity - allocated);
  }
  void reset_peak_memory_stats(int index) override { counters_[index].reset_peak(); }
  Stream compute_stream(int index) override { return {Device(DeviceType::Sim, index), nullptr}; }
  Stream copy_stream(int index) override { return {Device(DeviceType::Sim, index), nullptr}; }
  void synchronize(const Stream&) override {}
  void synchronize_device(int) override {}
  void stream_wait(const Stream&, const Stream&) override {}
  void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes, const Stream&, bool,
            bool) override {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    if (dst_device != src_device) wait_for_link(start, bytes);
  }

 private:
  void check_index(int index) const {
    FERRY_CHECK(index >= 0 && index < device_count(), DeviceUnavailable, "sim:", index,
                " is not available; devices present: ", available_devices_text());
  }
  mutable cpu::HostMemoryCounter counters_[kMaxSimDevices];
};

std::unique_ptr<Backend> make_sim_backend() { return std::make_unique<SimBackend>(); }

}  // namespace sim
}  // namespace ferry
