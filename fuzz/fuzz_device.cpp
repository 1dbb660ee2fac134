// fuzz/fuzz_device.cpp — libFuzzer target: Device::parse over any text (what --device receives); only InvalidArgument or
// DeviceUnavailable may escape, in one line, and what parses is a present device that reads back from its str(). Not here: devices.
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
