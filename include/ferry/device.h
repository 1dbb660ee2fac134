// ferry/device.h — a device is a value: where numbers live (DESIGN.md invariant 1).
// Not here: allocation and copies (ferry/backend.h), what a crossing costs (ferry/ledger.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// cpu  — host RAM, computed by OpenBLAS + OpenMP.
// cuda — an NVIDIA GPU's own memory (VRAM), reached across PCIe.
// sim  — a simulated discrete accelerator: its own allocations in host RAM, computed by the cpu
//        kernels, reached only by explicit copies across a link of configurable bandwidth. It lets a
//        machine without a GPU exercise (and a user watch) every device-management rule.
enum class DeviceType : std::int8_t { CPU = 0, CUDA = 1, Sim = 2 };
inline constexpr int kDeviceTypeCount = 3;

std::string_view device_type_name(DeviceType type);  // "cpu", "cuda", "sim"

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // which device of its type; always 0 for cpu

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}

  // "cpu", "cuda", "cuda:N", "sim", "sim:N", "auto" (the best device present: cuda:0, else cpu).
  // Throws InvalidArgument for malformed text and DeviceUnavailable for an absent device; both
  // quote the input and list the devices present.
  static Device parse(std::string_view text);

  std::string str() const;  // "cpu", "cuda:0", "sim:1"
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_host_memory() const { return type == DeviceType::CPU; }  // readable by the host directly

  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

inline constexpr Device kCPU{DeviceType::CPU, 0};

int device_count(DeviceType type);    // 0 when the type is absent; cpu is always 1
bool is_available(DeviceType type);   // device_count(type) > 0
// Why device_count(type) is 0, in words: "This build of ferry has no CUDA backend (...)", or the driver's answer
// ("cudaGetDeviceCount: cudaErrorNoDevice (no CUDA-capable device is detected)"). Empty when devices are present.
std::string unavailable_reason(DeviceType type);
std::vector<Device> available_devices();  // every device present, cpu first
std::string available_devices_text();     // "cpu, sim:0, sim:1" for error messages

}  // namespace ferry

template <>
struct std::hash<ferry::Device> {
  std::size_t operator()(ferry::Device d) const noexcept {
    return std::hash<int>()(static_cast<int>(d.type) * 1024 + d.index);
  }
};
