// ferry/profile.h — measured rates of this machine's devices (link each way pageable and pinned, memory
// bandwidth, fp32 GEMM FLOP/s): measuring them, JSON files, and the active profile hints and plans use.
// Not here: the sheet's formulas (ferry/cost_model.h); the command line (tools/ferry/bench_command.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/device.h"

namespace ferry {

// One measured size: the median time of one run and the rate it gives.
struct RatePoint {
  double size = 0;     // bytes moved (link, memory) or n of an n x n x n GEMM
  double seconds = 0;  // s, median of the timed runs
  double rate = 0;     // bytes/s (link; memory: bytes read + written) or FLOP/s (gemm: 2 n^3 / seconds)
};

// A measured series and the one rate the profile quotes for it: the largest size's rate for links and
// memory (where fixed per-copy costs no longer count), the best rate for GEMM.
struct MeasuredRate {
  double rate = 0;  // bytes/s or FLOP/s; 0 = not measured
  std::vector<RatePoint> points;  // by increasing size
  bool measured() const { return rate > 0; }
  // Time for `size` by the measured points: linear between the two neighbouring sizes; above the
  // largest, its time plus the rest at `rate`; below the smallest, the smallest's time (fixed costs of
  // a copy do not shrink with it). Without points, size / rate. Throws InvalidArgument when unmeasured.
  double seconds_for(double size) const;  // s
};

// The four ways across the host link.
enum class LinkPath : std::uint8_t { HostToDevicePageable, HostToDevicePinned, DeviceToHostPageable, DeviceToHostPinned };
std::string_view link_path_name(LinkPath path);  // "host_to_device_pageable", ... (the JSON keys)
// "host->device pageable", ... for people.
std::string link_path_words(LinkPath path);

struct DeviceProfile {
  std::string device;  // "cpu", "sim:0", "cuda:0"
  std::string name;    // what the backend calls it
  // sim only: the link setting when measured, bytes/s; a profile of a sim device measured at another
  // setting no longer describes it, and measured_link_rate() then ignores it.
  double link_setting_bytes_per_second = 0;
  MeasuredRate host_to_device_pageable, host_to_device_pinned;  // bytes/s
  MeasuredRate device_to_host_pageable, device_to_host_pinned;  // bytes/s
  MeasuredRate memory_copy;  // bytes/s, read + written (a copy of N bytes moves 2N)
  MeasuredRate memory_add;   // bytes/s, read + written (c = a + b over N bytes each moves 3N)
  MeasuredRate gemm;         // FLOP/s, float32

  MeasuredRate& link(LinkPath path);
  const MeasuredRate& link(LinkPath path) const;
};

struct Profile {
  std::string created;  // UTC, ISO 8601, when measured
  std::string host;     // host name
  std::vector<DeviceProfile> devices;

  const DeviceProfile* find(Device device) const;  // nullptr when absent
  DeviceProfile& device(Device device);            // finds, or adds an empty one
  // Each rate `newer` measured replaces this profile's; the rest stay (benches add up in one file).
  void merge(const Profile& newer);
};

// JSON: {"format": "ferry profile", "version": 1, "created", "host", "devices": [{"device", "name",
// "link_setting_bytes_per_second", "link": {"host_to_device_pageable": {"bytes_per_second", "points":
// [{"bytes", "seconds", "bytes_per_second"}]}, ...}, "memory": {"copy": {...}, "add": {...}},
// "gemm": {"flop_per_second", "points": [{"n", "seconds", "flop_per_second"}]}}]}. Unmeasured parts are left out.
std::string profile_to_json(const Profile& profile);
Profile profile_from_json(std::string_view text);  // throws FormatError naming what is wrong
// IoError names the path and why (strerror; "it is a directory" for a directory).
void save_profile(const Profile& profile, const std::string& path);  // throws IoError
Profile load_profile(const std::string& path);  // throws IoError (cannot read) or FormatError

// ---- the active profile ---------------------------------------------------------------------------
// One per process. Until set, the first query loads the file named by the environment variable
// FERRY_PROFILE, if any (a file that cannot be loaded is reported once on stderr and ignored).
void set_active_profile(Profile profile);
void clear_active_profile();  // and do not look at FERRY_PROFILE again
std::optional<Profile> active_profile();

// The measured rate of a plain (pageable) copy from `source` to `target`, bytes/s, from the active
// profile: host->device or device->host of the accelerator end (its pinned rate when only that was
// measured); between two accelerators of different types, the two legs through host memory combined
// (1 / (1/a + 1/b)). None without an active profile, without a measurement for that path, for a
// sim device measured at another link setting, for cpu->cpu, and between devices of one type.
// Never throws.
std::optional<double> measured_link_rate(Device source, Device target);

// ---- measuring ------------------------------------------------------------------------------------
struct MeasureOptions {
  std::vector<double> sizes;        // bytes (link, memory) or n (gemm); empty = the defaults below
  int repeats = 5;                  // timed runs per size after one untimed warm-up; the median is kept
  double max_seconds_per_size = 2;  // s: stop repeating a size after this long (at least one timed run)
  // measure_link only: time `x.to(device)`, a fresh destination each run (what a loop that moves every
  // batch pays, allocation and first-touch page faults included), instead of copies into a buffer
  // allocated once (the link itself, what `dst.copy_(src)` into a reused buffer pays).
  bool include_allocation = false;
  std::function<void(const std::string&)> progress;  // called with one line per finished size
};
std::vector<double> default_link_sizes();    // bytes: 4 KB, 16 KB, 64 KB, 256 KB, 1 MB, 4 MB, 16 MB, 64 MB, 256 MB
std::vector<double> default_memory_sizes();  // bytes: 4 MB, 16 MB, 64 MB, 256 MB
std::vector<double> default_gemm_sizes();    // n: 256, 512, 1024, 2048, 4096

// Whether copies from page-locked host memory exist on `device` (cuda only).
bool supports_pinned(Device device);

// Times copies of each size between a host buffer and a device buffer, both allocated once (uint8):
// the link's own rate. Pinned paths copy non_blocking from (or into) pinned host memory and then
// synchronise. With options.include_allocation, times `x.to(device)` / `x.to(kCPU)` instead.
// Every copy goes through the one door and is in the ledger.
// Throws InvalidArgument for cpu (it has no link) and NotSupported for pinned paths where
// supports_pinned() is false.
MeasuredRate measure_link(Device device, LinkPath path, const MeasureOptions& options = {});
// dst.copy_(src) on the device: rate = 2 x bytes / time (read + written).
MeasuredRate measure_memory_copy(Device device, const MeasureOptions& options = {});
// a.add_(b) on the device: rate = 3 x bytes / time (two reads, one write).
MeasuredRate measure_memory_add(Device device, const MeasureOptions& options = {});
// matmul of two n x n float32 matrices: rate = 2 n^3 / time.
MeasuredRate measure_gemm(Device device, const MeasureOptions& options = {});

// A profile holding only `device`'s name (and sim link setting), dated now: fill it with measure_*.
Profile new_profile(Device device);

}  // namespace ferry
