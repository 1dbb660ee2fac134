// test_core_device.cpp — Device as a value (invariant 1): parsing, naming, errors that list devices.
#include "test_helpers.h"

namespace ferry {
namespace {

TEST(CoreDevice, ParsesEveryForm) {
  EXPECT_EQ(Device::parse("cpu"), kCPU);
  EXPECT_EQ(Device::parse("sim"), Device(DeviceType::Sim, 0));
  EXPECT_EQ(Device::parse("sim:1"), Device(DeviceType::Sim, 1));
  EXPECT_EQ(Device::parse("sim:1").str(), "sim:1");
  EXPECT_EQ(kCPU.str(), "cpu");
  if (is_available(DeviceType::CUDA)) {
    EXPECT_EQ(Device::parse("cuda"), Device(DeviceType::CUDA, 0));
    EXPECT_EQ(Device::parse("cuda:0").str(), "cuda:0");
    EXPECT_EQ(Device::parse("auto"), Device(DeviceType::CUDA, 0));
  } else {
    EXPECT_EQ(Device::parse("auto"), kCPU);  // the best device present
  }
}

TEST(CoreDevice, BadStringsQuoteTheInputAndListDevices) {
  for (const char* bad : {"gpu", "cuda:-1", "cuda:x", "cuda:0:1", "", "cpu:1", "sim:", "CUDA", " cpu"}) {
    try {
      Device::parse(bad);
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(std::string("'") + bad + "'"), std::string::npos) << message;
      EXPECT_NE(message.find("Devices present: cpu"), std::string::npos) << message;
    }
  }
}

TEST(CoreDevice, AbsentDeviceIsDeviceUnavailable) {
  try {
    Device::parse("cuda:7");
    ADD_FAILURE() << "cuda:7 parsed";
  } catch (const DeviceUnavailable& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'cuda:7'"), std::string::npos) << message;
    EXPECT_NE(message.find("Devices present: cpu"), std::string::npos) << message;
  }
  EXPECT_THROW(Device::parse("sim:7"), DeviceUnavailable);
}

TEST(CoreDevice, CountsAndAvailability) {
  EXPECT_EQ(device_count(DeviceType::CPU), 1);
  EXPECT_TRUE(is_available(DeviceType::CPU));
  EXPECT_EQ(device_count(DeviceType::Sim), 2);
  const auto devices = available_devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices.front(), kCPU);
  EXPECT_EQ(is_available(DeviceType::CUDA), device_count(DeviceType::CUDA) > 0);
}

TEST(CoreDevice, IsAValue) {
  const Device a(DeviceType::Sim, 1);
  Device b = a;
  EXPECT_EQ(a, b);
  b.index = 0;
  EXPECT_FALSE(a == b);
  EXPECT_EQ(std::hash<Device>()(a), std::hash<Device>()(Device(DeviceType::Sim, 1)));
}

}  // namespace
}  // namespace ferry
