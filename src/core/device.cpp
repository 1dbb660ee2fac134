// device.cpp — parsing and naming devices, and asking the backends which ones are present.
#include "ferry/device.h"

#include <charconv>

#include "ferry/backend.h"
#include "ferry/error.h"
#include "registry.h"

namespace ferry {

std::string_view device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
    case DeviceType::Sim: return "sim";
  }
  return "?";
}

std::string Device::str() const {
  if (type == DeviceType::CPU) return "cpu";
  return std::string(device_type_name(type)) + ":" + std::to_string(index);
}

int device_count(DeviceType type) {
  if (type == DeviceType::CPU) return 1;
  try {
    return backend(type).device_count();
  } catch (const DeviceUnavailable&) {
    return 0;  // this build has no backend for the type
  }
}

bool is_available(DeviceType type) { return device_count(type) > 0; }

std::string unavailable_reason(DeviceType type) {
  if (device_count(type) > 0) return "";
  try {
    (void)backend(type);
  } catch (const DeviceUnavailable& e) {
    return e.what();  // no backend for the type in this build
  }
  if (type == DeviceType::Sim) return "FERRY_SIM_DEVICES is 0";
#ifdef FERRY_HAVE_CUDA
  const std::string reason = cuda::unavailable_reason();
#else  // linked with a cuda backend all the same (the tests' emulated GPU), or none
  const std::string reason = cuda::unavailable_reason ? cuda::unavailable_reason() : "";
#endif
  return reason.empty() ? "the cuda backend found no device" : reason;
}

std::vector<Device> available_devices() {
  std::vector<Device> devices{kCPU};
  for (DeviceType type : {DeviceType::CUDA, DeviceType::Sim}) {
    for (int i = 0; i < device_count(type); ++i) devices.emplace_back(type, i);
  }
  return devices;
}

std::string available_devices_text() {
  std::string text;
  for (const Device& d : available_devices()) {
    if (!text.empty()) text += ", ";
    text += d.str();
  }
  return text;
}

using detail::printable;

Device Device::parse(std::string_view text) {
  auto malformed = [&]() {
    return InvalidArgument(detail::concat(
        "Invalid device string '", printable(text),
        "': expected 'cpu', 'cuda', 'cuda:N', 'sim', 'sim:N' or 'auto'. Devices present: ",
        available_devices_text()));
  };
  if (text == "auto") return is_available(DeviceType::CUDA) ? Device(DeviceType::CUDA, 0) : kCPU;

  std::string_view type_text = text;
  std::string_view index_text;
  bool has_index = false;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    type_text = text.substr(0, colon);
    index_text = text.substr(colon + 1);
    has_index = true;
  }
  DeviceType type;
  if (type_text == "cpu") type = DeviceType::CPU;
  else if (type_text == "cuda") type = DeviceType::CUDA;
  else if (type_text == "sim") type = DeviceType::Sim;
  else throw malformed();

  int index = 0;
  if (has_index) {
    if (index_text.empty()) throw malformed();
    for (char c : index_text) if (c < '0' || c > '9') throw malformed();  // rejects '-1', 'x', '0:1'
    auto [end, error] = std::from_chars(index_text.data(), index_text.data() + index_text.size(), index);
    if (error != std::errc() || end != index_text.data() + index_text.size()) throw malformed();
  }
  if (type == DeviceType::CPU) {
    if (index != 0) throw malformed();
    return kCPU;
  }
  const int count = device_count(type);
  if (index >= count) {
    throw DeviceUnavailable(detail::concat(
        "Device '", printable(text), "' is not available: this machine has ",
        count == 0 ? std::string("no ") + std::string(device_type_name(type)) + " devices (" + unavailable_reason(type) + ")"
                   : detail::concat(count, " ", device_type_name(type), " device", count == 1 ? "" : "s",
                                    " (", device_type_name(type), ":0..", count - 1, ")"),
        ". Devices present: ", available_devices_text()));
  }
  return Device(type, index);
}

}  // namespace ferry
