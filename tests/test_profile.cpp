// test_profile.cpp — measured-rate profiles: JSON round trips, interpolation, merging, the active
// profile behind measured_link_rate() and the device-mismatch hint, and measuring sim:0 and cpu for real.
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <fstream>
#include <string>

#include "ferry/backend.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "ferry/profile.h"

namespace ferry {
namespace {

const Device kSim0{DeviceType::Sim, 0};
const Device kSim1{DeviceType::Sim, 1};
const Device kCuda0{DeviceType::CUDA, 0};

class SimLink {
 public:
  explicit SimLink(double bytes_per_second) : previous_(sim_link_bandwidth()) { set_sim_link_bandwidth(bytes_per_second); }
  ~SimLink() { set_sim_link_bandwidth(previous_); }

 private:
  double previous_;
};

// Leaves no active profile behind, whatever the test did.
class ActiveProfileGuard {
 public:
  ActiveProfileGuard() { clear_active_profile(); }
  ~ActiveProfileGuard() { clear_active_profile(); }
};

MeasuredRate two_points(double rate_small, double rate_large) {
  MeasuredRate r;
  r.points = {{1e3, 1e3 / rate_small, rate_small}, {1e6, 1e6 / rate_large, rate_large}};
  r.rate = rate_large;
  return r;
}

Profile sample_profile(double sim_setting) {
  Profile p;
  p.created = "2026-12-01T10:00:00Z";
  p.host = "test-host";
  DeviceProfile& sim = p.device(kSim0);
  sim.name = "ferry sim:0";
  sim.link_setting_bytes_per_second = sim_setting;
  sim.host_to_device_pageable = two_points(1e9, 2e9);
  sim.device_to_host_pageable = two_points(1e9, 3e9);
  sim.memory_copy = two_points(5e9, 6e9);
  DeviceProfile& cpu = p.device(kCPU);
  cpu.name = "host";
  cpu.gemm.points = {{256, 1e-3, 2.0 * 256 * 256 * 256 / 1e-3}};
  cpu.gemm.rate = cpu.gemm.points[0].rate;
  return p;
}

TEST(Profile, JsonRoundTrip) {
  const Profile p = sample_profile(16e9);
  const Profile q = profile_from_json(profile_to_json(p));
  EXPECT_EQ(q.created, p.created);
  EXPECT_EQ(q.host, "test-host");
  ASSERT_EQ(q.devices.size(), 2u);
  const DeviceProfile* sim = q.find(kSim0);
  ASSERT_NE(sim, nullptr);
  EXPECT_EQ(sim->name, "ferry sim:0");
  EXPECT_DOUBLE_EQ(sim->link_setting_bytes_per_second, 16e9);
  EXPECT_DOUBLE_EQ(sim->host_to_device_pageable.rate, 2e9);
  ASSERT_EQ(sim->host_to_device_pageable.points.size(), 2u);
  EXPECT_DOUBLE_EQ(sim->host_to_device_pageable.points[1].seconds, 1e6 / 2e9);
  EXPECT_DOUBLE_EQ(sim->device_to_host_pageable.rate, 3e9);
  EXPECT_FALSE(sim->host_to_device_pinned.measured());
  EXPECT_DOUBLE_EQ(sim->memory_copy.rate, 6e9);
  EXPECT_FALSE(sim->gemm.measured());
  const DeviceProfile* cpu = q.find(kCPU);
  ASSERT_NE(cpu, nullptr);
  EXPECT_DOUBLE_EQ(cpu->gemm.points[0].size, 256);
  EXPECT_DOUBLE_EQ(cpu->gemm.rate, p.find(kCPU)->gemm.rate);
  EXPECT_EQ(q.find(kSim1), nullptr);
}

TEST(Profile, FilesAndTheirErrors) {
  const std::string path = ::testing::TempDir() + "ferry_test_profile.json";
  save_profile(sample_profile(16e9), path);
  EXPECT_DOUBLE_EQ(load_profile(path).find(kSim0)->device_to_host_pageable.rate, 3e9);
  std::remove(path.c_str());
  EXPECT_THROW(load_profile(path), IoError);
  EXPECT_THROW(save_profile(Profile{}, "/nonexistent-dir/ferry/profile.json"), IoError);
  // A directory named as the profile: said so, not "not JSON (... unexpected end of input)".
  for (auto* use : {+[](const std::string& dir) { load_profile(dir); },
                    +[](const std::string& dir) { save_profile(Profile{}, dir); }}) {
    try {
      use(::testing::TempDir());
      ADD_FAILURE() << "a directory was taken for a profile";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("JSON"), std::string::npos) << e.what();
    }
  }

  EXPECT_THROW(profile_from_json("not json"), FormatError);
  EXPECT_THROW(profile_from_json("{\"traceEvents\": []}"), FormatError);  // some other JSON
  EXPECT_THROW(profile_from_json(R"({"format": "ferry profile", "version": 2, "devices": []})"), FormatError);
  EXPECT_THROW(profile_from_json(R"({"format": "ferry profile", "version": 1})"), FormatError);
  EXPECT_THROW(profile_from_json(R"({"format": "ferry profile", "version": 1, "devices": [{"name": "x"}]})"),
               FormatError);
  try {
    profile_from_json(R"({"format": "ferry profile", "version": 1, "devices": [{"device": "sim:0",
                         "link": {"host_to_device_pageable": {"bytes_per_second": -5}}}]})");
    ADD_FAILURE() << "a negative rate was accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("devices[0].link.host_to_device_pageable.bytes_per_second"),
              std::string::npos)
        << e.what();
  }
}

TEST(Profile, SecondsForInterpolates) {
  const MeasuredRate r = two_points(1e8, 1e10);  // 1 kB in 10 us; 1 MB in 100 us
  EXPECT_DOUBLE_EQ(r.seconds_for(1e3), 1e-5);
  EXPECT_DOUBLE_EQ(r.seconds_for(1e6), 1e-4);
  EXPECT_DOUBLE_EQ(r.seconds_for(10), 1e-5);  // below the smallest size: its fixed cost
  EXPECT_NEAR(r.seconds_for(0.5 * (1e3 + 1e6)), 0.5 * (1e-5 + 1e-4), 1e-15);
  EXPECT_NEAR(r.seconds_for(2e6), 1e-4 + 1e6 / 1e10, 1e-15);  // beyond: the rest at the rate
  MeasuredRate only_rate;
  only_rate.rate = 16e9;
  EXPECT_DOUBLE_EQ(only_rate.seconds_for(4e6), 0.00025);  // Exercise 2.2
  EXPECT_THROW(MeasuredRate{}.seconds_for(1), InvalidArgument);
  EXPECT_THROW(r.seconds_for(-1), InvalidArgument);
}

TEST(Profile, MergeKeepsWhatTheNewRunDidNotMeasure) {
  Profile file = sample_profile(16e9);
  Profile run;
  DeviceProfile& sim = run.device(kSim0);
  sim.link_setting_bytes_per_second = 16e9;
  sim.host_to_device_pageable = two_points(4e9, 5e9);
  run.device(kSim1).gemm.rate = 1e9;
  file.merge(run);
  EXPECT_DOUBLE_EQ(file.find(kSim0)->host_to_device_pageable.rate, 5e9);  // replaced
  EXPECT_DOUBLE_EQ(file.find(kSim0)->device_to_host_pageable.rate, 3e9);  // kept
  EXPECT_DOUBLE_EQ(file.find(kSim0)->memory_copy.rate, 6e9);              // kept
  ASSERT_NE(file.find(kSim1), nullptr);                                    // added
  EXPECT_DOUBLE_EQ(file.find(kSim1)->gemm.rate, 1e9);

  Profile other_setting;
  other_setting.device(kSim0).link_setting_bytes_per_second = 1e9;
  other_setting.device(kSim0).host_to_device_pageable = two_points(0.5e9, 0.9e9);
  file.merge(other_setting);  // links measured at 16 GB/s no longer describe sim:0
  EXPECT_DOUBLE_EQ(file.find(kSim0)->host_to_device_pageable.rate, 0.9e9);
  EXPECT_FALSE(file.find(kSim0)->device_to_host_pageable.measured());
  EXPECT_DOUBLE_EQ(file.find(kSim0)->memory_copy.rate, 6e9);  // memory is not the link
}

TEST(Profile, MeasuredLinkRateUsesTheActiveProfile) {
  ActiveProfileGuard guard;
  SimLink link(16e9);
  EXPECT_FALSE(measured_link_rate(kCPU, kSim0).has_value());  // no profile yet

  Profile p = sample_profile(16e9);
  p.device(kCuda0).host_to_device_pageable.rate = 8e9;
  p.device(kCuda0).device_to_host_pageable.rate = 8e9;
  set_active_profile(p);
  ASSERT_TRUE(active_profile().has_value());
  EXPECT_DOUBLE_EQ(measured_link_rate(kCPU, kSim0).value_or(0), 2e9);  // host->device
  EXPECT_DOUBLE_EQ(measured_link_rate(kSim0, kCPU).value_or(0), 3e9);  // device->host
  EXPECT_FALSE(measured_link_rate(kCPU, kCPU).has_value());
  EXPECT_FALSE(measured_link_rate(kSim0, kSim1).has_value());  // same type: no host leg measured
  EXPECT_FALSE(measured_link_rate(kCPU, kSim1).has_value());   // not in the profile
  // sim:0 -> cuda:0 stages through host memory: device->host at 3 GB/s, then host->device at 8 GB/s.
  EXPECT_NEAR(measured_link_rate(kSim0, kCuda0).value_or(0), 1.0 / (1.0 / 3e9 + 1.0 / 8e9), 1.0);
  {
    SimLink other(1e9);  // the profile measured sim:0 at another link setting: it no longer applies
    EXPECT_FALSE(measured_link_rate(kCPU, kSim0).has_value());
  }
  clear_active_profile();
  EXPECT_FALSE(measured_link_rate(kCPU, kSim0).has_value());
}

TEST(Profile, DeviceMismatchHintQuotesTheMeasuredRate) {
  ActiveProfileGuard guard;
  SimLink link(16e9);
  const Tensor on_sim = ones({1000}, {.device = kSim0});
  const Tensor on_cpu = ones({1000});
  auto hint = [&] {
    try {
      add(on_sim, on_cpu);
    } catch (const DeviceMismatch& e) {
      return std::string(e.what());
    }
    return std::string("no DeviceMismatch");
  };
  EXPECT_NE(hint().find("at 16 GB/s"), std::string::npos) << hint();  // the sheet's / sim's figure
  set_active_profile(sample_profile(16e9));
  EXPECT_NE(hint().find("at 2 GB/s"), std::string::npos) << hint();  // measured host->device rate
  EXPECT_NE(hint().find("0.002 ms"), std::string::npos) << hint();   // 4000 bytes at 2 GB/s
}

TEST(Profile, MeasuresTheSimLink) {
  SimLink link(1e9);  // 4 MB takes 4 ms: far above any memcpy on the host
  MeasureOptions options;
  options.sizes = {4e6};
  options.repeats = 3;
  std::vector<std::string> progress;
  options.progress = [&progress](const std::string& line) { progress.push_back(line); };
  const MeasuredRate up = measure_link(kSim0, LinkPath::HostToDevicePageable, options);
  ASSERT_EQ(up.points.size(), 1u);
  EXPECT_DOUBLE_EQ(up.points[0].size, 4e6);
  EXPECT_GT(up.rate, 0.1e9);  // loose: a busy shared host can stretch any timing
  EXPECT_LE(up.rate, 1.05e9);  // the link's throttle is a hard floor on time
  EXPECT_DOUBLE_EQ(up.rate, up.points[0].rate);
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_NE(progress[0].find("host->device pageable"), std::string::npos) << progress[0];
  const MeasuredRate down = measure_link(kSim0, LinkPath::DeviceToHostPageable, options);
  EXPECT_GT(down.rate, 0.1e9);
  EXPECT_LE(down.rate, 1.05e9);
  options.include_allocation = true;
  EXPECT_LE(measure_link(kSim0, LinkPath::HostToDevicePageable, options).rate, 1.05e9);

  EXPECT_THROW(measure_link(kSim0, LinkPath::HostToDevicePinned, options), NotSupported);
  EXPECT_THROW(measure_link(kCPU, LinkPath::HostToDevicePageable, options), InvalidArgument);
  options.repeats = 0;
  EXPECT_THROW(measure_link(kSim0, LinkPath::HostToDevicePageable, options), InvalidArgument);
  options.repeats = 1;
  options.sizes = {0};
  EXPECT_THROW(measure_link(kSim0, LinkPath::HostToDevicePageable, options), InvalidArgument);
  EXPECT_FALSE(supports_pinned(kSim0));
  EXPECT_FALSE(supports_pinned(kCPU));
}

TEST(Profile, MeasuresMemoryAndGemm) {
  MeasureOptions options;
  options.sizes = {1e6, 4e6};
  options.repeats = 2;
  for (const Device device : {kCPU, kSim0}) {
    const MeasuredRate copy = measure_memory_copy(device, options);
    ASSERT_EQ(copy.points.size(), 2u);
    EXPECT_GT(copy.rate, 0);
    EXPECT_DOUBLE_EQ(copy.rate, copy.points.back().rate);  // the largest size's rate
    EXPECT_NEAR(copy.points[0].rate, 2 * 1e6 / copy.points[0].seconds, 1.0);  // read + written
    const MeasuredRate add = measure_memory_add(device, options);
    EXPECT_NEAR(add.points[1].rate, 3 * 4e6 / add.points[1].seconds, 1.0);
  }
  options.sizes = {32, 64};
  const MeasuredRate gemm = measure_gemm(kCPU, options);
  ASSERT_EQ(gemm.points.size(), 2u);
  EXPECT_NEAR(gemm.points[1].rate, 2.0 * 64 * 64 * 64 / gemm.points[1].seconds, 1.0);
  EXPECT_DOUBLE_EQ(gemm.rate, std::max(gemm.points[0].rate, gemm.points[1].rate));  // the best one

  const Profile p = new_profile(kSim0);
  EXPECT_FALSE(p.created.empty());
  ASSERT_EQ(p.devices.size(), 1u);
  EXPECT_EQ(p.devices[0].device, "sim:0");
  EXPECT_DOUBLE_EQ(p.devices[0].link_setting_bytes_per_second, sim_link_bandwidth());
}

}  // namespace
}  // namespace ferry
