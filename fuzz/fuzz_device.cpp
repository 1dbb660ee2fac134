// fuzz/fuzz_device.cpp — libFuzzer target: Device::parse over arbitrary text (what --device receives).
// Not here: the devices themselves. Properties: only InvalidArgument or DeviceUnavailable escape, with a
// one-line message; what parses names a present device and reads back from its str().
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ferry/device.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ferry::Device device;
  try {
    device = ferry::Device::parse(text);
  } catch (const ferry::InvalidArgument& error) {
    ferry::fuzz::check_error_message(error);
    return 0;
  } catch (const ferry::DeviceUnavailable& error) {
    ferry::fuzz::check_error_message(error);
    return 0;
  } catch (const ferry::Error& error) {
    ferry::fuzz::finding("Device::parse threw a ferry::Error other than InvalidArgument/DeviceUnavailable",
                         error.what());
  }
  ferry::fuzz::check(device.index >= 0 && device.index < ferry::device_count(device.type),
                     "Device::parse returned a device that is not present", device.str());
  ferry::fuzz::check(ferry::Device::parse(device.str()) == device, "Device::parse(d.str()) != d", device.str());
  return 0;
}
