// profile.cpp — measured rates: timing link copies, device memory and GEMM; the profile's JSON form;
// the process's active profile. Not here: the CLI's tables and options (tools/ferry/bench_command.cpp).
#include "ferry/profile.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ferry/backend.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "ferry/tensor.h"
#include "ferry/units.h"
#include "../core/internal.h"

namespace ferry {

// ---- rates ---------------------------------------------------------------------------------------

double MeasuredRate::seconds_for(double size) const {
  FERRY_CHECK(measured(), InvalidArgument, "This rate was not measured; run `ferry bench` with --save first");
  FERRY_CHECK(std::isfinite(size) && size >= 0, InvalidArgument, "Expected a size >= 0, got ", size);
  if (points.empty()) return size / rate;
  if (size <= points.front().size) return points.front().seconds;
  for (std::size_t i = 1; i < points.size(); ++i) {
    const RatePoint& low = points[i - 1];
    const RatePoint& high = points[i];
    if (size <= high.size) {
      const double share = (size - low.size) / (high.size - low.size);
      return low.seconds + share * (high.seconds - low.seconds);
    }
  }
  const RatePoint& last = points.back();
  return last.seconds + (size - last.size) / rate;
}

std::string_view link_path_name(LinkPath path) {
  switch (path) {
    case LinkPath::HostToDevicePageable: return "host_to_device_pageable";
    case LinkPath::HostToDevicePinned: return "host_to_device_pinned";
    case LinkPath::DeviceToHostPageable: return "device_to_host_pageable";
    case LinkPath::DeviceToHostPinned: return "device_to_host_pinned";
  }
  return "?";
}

std::string link_path_words(LinkPath path) {
  switch (path) {
    case LinkPath::HostToDevicePageable: return "host->device pageable";
    case LinkPath::HostToDevicePinned: return "host->device pinned";
    case LinkPath::DeviceToHostPageable: return "device->host pageable";
    case LinkPath::DeviceToHostPinned: return "device->host pinned";
  }
  return "?";
}

namespace {
constexpr LinkPath kLinkPaths[] = {LinkPath::HostToDevicePageable, LinkPath::HostToDevicePinned,
                                   LinkPath::DeviceToHostPageable, LinkPath::DeviceToHostPinned};
bool is_host_to_device(LinkPath path) {
  return path == LinkPath::HostToDevicePageable || path == LinkPath::HostToDevicePinned;
}
bool is_pinned(LinkPath path) { return path == LinkPath::HostToDevicePinned || path == LinkPath::DeviceToHostPinned; }
}  // namespace

MeasuredRate& DeviceProfile::link(LinkPath path) {
  switch (path) {
    case LinkPath::HostToDevicePageable: return host_to_device_pageable;
    case LinkPath::HostToDevicePinned: return host_to_device_pinned;
    case LinkPath::DeviceToHostPageable: return device_to_host_pageable;
    case LinkPath::DeviceToHostPinned: return device_to_host_pinned;
  }
  return host_to_device_pageable;
}
const MeasuredRate& DeviceProfile::link(LinkPath path) const {
  return const_cast<DeviceProfile*>(this)->link(path);
}

// ---- profiles ------------------------------------------------------------------------------------

const DeviceProfile* Profile::find(Device device) const {
  const std::string name = device.str();
  for (const DeviceProfile& d : devices) {
    if (d.device == name) return &d;
  }
  return nullptr;
}

DeviceProfile& Profile::device(Device device) {
  const std::string name = device.str();
  for (DeviceProfile& d : devices) {
    if (d.device == name) return d;
  }
  devices.push_back({});
  devices.back().device = name;
  return devices.back();
}

void Profile::merge(const Profile& newer) {
  if (!newer.created.empty()) created = newer.created;
  if (!newer.host.empty()) host = newer.host;
  for (const DeviceProfile& incoming : newer.devices) {
    DeviceProfile* mine = nullptr;
    for (DeviceProfile& d : devices) {
      if (d.device == incoming.device) mine = &d;
    }
    if (!mine) {
      devices.push_back(incoming);
      continue;
    }
    if (!incoming.name.empty()) mine->name = incoming.name;
    if (incoming.link_setting_bytes_per_second > 0) {
      // A new link setting makes the old link measurements meaningless.
      if (mine->link_setting_bytes_per_second != incoming.link_setting_bytes_per_second) {
        for (LinkPath path : kLinkPaths) mine->link(path) = {};
      }
      mine->link_setting_bytes_per_second = incoming.link_setting_bytes_per_second;
    }
    for (LinkPath path : kLinkPaths) {
      if (incoming.link(path).measured()) mine->link(path) = incoming.link(path);
    }
    if (incoming.memory_copy.measured()) mine->memory_copy = incoming.memory_copy;
    if (incoming.memory_add.measured()) mine->memory_add = incoming.memory_add;
    if (incoming.gemm.measured()) mine->gemm = incoming.gemm;
  }
}

// ---- JSON ----------------------------------------------------------------------------------------

namespace {

using Json = nlohmann::ordered_json;

Json rate_json(const MeasuredRate& rate, const char* rate_key, const char* size_key) {
  Json points = Json::array();
  for (const RatePoint& p : rate.points) points.push_back({{size_key, p.size}, {"seconds", p.seconds}, {rate_key, p.rate}});
  return Json{{rate_key, rate.rate}, {"points", points}};
}

// Reads `object[key]` as a number, or throws FormatError naming where.
double number_at(const Json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number()) {
    throw FormatError(fmt::format("ferry profile: expected a number at {}.{}", where, key));
  }
  const double value = it->get<double>();
  if (!std::isfinite(value) || value < 0) {
    throw FormatError(fmt::format("ferry profile: {}.{} must be a finite number >= 0, got {}", where, key, value));
  }
  return value;
}

MeasuredRate rate_from_json(const Json& j, const char* rate_key, const char* size_key, const std::string& where) {
  if (!j.is_object()) throw FormatError(fmt::format("ferry profile: expected an object at {}", where));
  MeasuredRate rate;
  rate.rate = number_at(j, rate_key, where);
  if (j.contains("points")) {
    const Json& points = j.at("points");
    if (!points.is_array()) throw FormatError(fmt::format("ferry profile: expected an array at {}.points", where));
    for (std::size_t i = 0; i < points.size(); ++i) {
      const std::string at = fmt::format("{}.points[{}]", where, i);
      if (!points[i].is_object()) throw FormatError(fmt::format("ferry profile: expected an object at {}", at));
      rate.points.push_back({number_at(points[i], size_key, at), number_at(points[i], "seconds", at),
                             number_at(points[i], rate_key, at)});
    }
    std::sort(rate.points.begin(), rate.points.end(),
              [](const RatePoint& a, const RatePoint& b) { return a.size < b.size; });
  }
  return rate;
}

std::string string_at(const Json& object, const char* key, const std::string& where, bool required) {
  const auto it = object.find(key);
  if (it == object.end()) {
    if (required) throw FormatError(fmt::format("ferry profile: missing {}.{}", where, key));
    return {};
  }
  if (!it->is_string()) throw FormatError(fmt::format("ferry profile: expected a string at {}.{}", where, key));
  return it->get<std::string>();
}

}  // namespace

std::string profile_to_json(const Profile& profile) {
  Json devices = Json::array();
  for (const DeviceProfile& d : profile.devices) {
    Json device{{"device", d.device}, {"name", d.name}};
    if (d.link_setting_bytes_per_second > 0) device["link_setting_bytes_per_second"] = d.link_setting_bytes_per_second;
    Json link = Json::object();
    for (LinkPath path : kLinkPaths) {
      if (d.link(path).measured()) {
        link[std::string(link_path_name(path))] = rate_json(d.link(path), "bytes_per_second", "bytes");
      }
    }
    if (!link.empty()) device["link"] = link;
    Json memory = Json::object();
    if (d.memory_copy.measured()) memory["copy"] = rate_json(d.memory_copy, "bytes_per_second", "bytes");
    if (d.memory_add.measured()) memory["add"] = rate_json(d.memory_add, "bytes_per_second", "bytes");
    if (!memory.empty()) device["memory"] = memory;
    if (d.gemm.measured()) device["gemm"] = rate_json(d.gemm, "flop_per_second", "n");
    devices.push_back(device);
  }
  Json j{{"format", "ferry profile"}, {"version", 1}, {"created", profile.created}, {"host", profile.host},
         {"devices", devices}};
  return j.dump(2);
}

Profile profile_from_json(std::string_view text) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw FormatError(fmt::format("ferry profile: not JSON ({})", e.what()));
  }
  if (!j.is_object() || string_at(j, "format", "the top level", false) != "ferry profile") {
    throw FormatError("ferry profile: not a ferry profile (expected \"format\": \"ferry profile\")");
  }
  const double version = number_at(j, "version", "the top level");
  if (version != 1) throw FormatError(fmt::format("ferry profile: version {} is not supported (expected 1)", version));
  Profile profile;
  profile.created = string_at(j, "created", "the top level", false);
  profile.host = string_at(j, "host", "the top level", false);
  if (!j.contains("devices") || !j.at("devices").is_array()) {
    throw FormatError("ferry profile: expected an array at devices");
  }
  const Json& devices = j.at("devices");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const std::string where = fmt::format("devices[{}]", i);
    const Json& d = devices[i];
    if (!d.is_object()) throw FormatError(fmt::format("ferry profile: expected an object at {}", where));
    DeviceProfile device;
    device.device = string_at(d, "device", where, true);
    device.name = string_at(d, "name", where, false);
    if (d.contains("link_setting_bytes_per_second")) {
      device.link_setting_bytes_per_second = number_at(d, "link_setting_bytes_per_second", where);
    }
    if (d.contains("link")) {
      const Json& link = d.at("link");
      if (!link.is_object()) throw FormatError(fmt::format("ferry profile: expected an object at {}.link", where));
      for (LinkPath path : kLinkPaths) {
        const std::string key(link_path_name(path));
        if (link.contains(key)) {
          device.link(path) = rate_from_json(link.at(key), "bytes_per_second", "bytes", where + ".link." + key);
        }
      }
    }
    if (d.contains("memory")) {
      const Json& memory = d.at("memory");
      if (!memory.is_object()) throw FormatError(fmt::format("ferry profile: expected an object at {}.memory", where));
      if (memory.contains("copy")) {
        device.memory_copy = rate_from_json(memory.at("copy"), "bytes_per_second", "bytes", where + ".memory.copy");
      }
      if (memory.contains("add")) {
        device.memory_add = rate_from_json(memory.at("add"), "bytes_per_second", "bytes", where + ".memory.add");
      }
    }
    if (d.contains("gemm")) device.gemm = rate_from_json(d.at("gemm"), "flop_per_second", "n", where + ".gemm");
    profile.devices.push_back(std::move(device));
  }
  return profile;
}

namespace {
// A directory where a profile file was named: opening it "succeeds" and reads as empty text (not JSON).
void check_not_directory(const std::string& path, const char* verb) {
  std::error_code error;
  FERRY_CHECK(!std::filesystem::is_directory(path, error), IoError, "Cannot ", verb, " the profile '", path,
              "': it is a directory; name a file in it, such as '",
              (std::filesystem::path(path) / "profile.json").string(), "'");
}
}  // namespace

void save_profile(const Profile& profile, const std::string& path) {
  check_not_directory(path, "write");
  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  FERRY_CHECK(out.good(), IoError, "Cannot open '", path, "' to write the profile: ",
              errno != 0 ? std::strerror(errno) : "unknown error");
  out << profile_to_json(profile) << '\n';
  out.close();
  FERRY_CHECK(!out.fail(), IoError, "Writing the profile to '", path, "' failed (disk full?)");
}

Profile load_profile(const std::string& path) {
  check_not_directory(path, "read");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  FERRY_CHECK(in.good(), IoError, "Cannot read the profile '", path, "': ",
              errno != 0 ? std::strerror(errno) : "unknown error", "; make one with `ferry bench link --save ", path,
              "`");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return profile_from_json(text.str());
  } catch (const FormatError& e) {
    throw FormatError(fmt::format("{}: {}", path, e.what()));
  }
}

// ---- the active profile --------------------------------------------------------------------------

namespace {
struct ActiveProfile {
  std::mutex mutex;
  std::optional<Profile> profile;
  bool environment_checked = false;  // FERRY_PROFILE was looked at (or set/clear made it moot)
};
ActiveProfile& active() {
  static ActiveProfile a;
  return a;
}
}  // namespace

void set_active_profile(Profile profile) {
  ActiveProfile& a = active();
  std::lock_guard lock(a.mutex);
  a.profile = std::move(profile);
  a.environment_checked = true;
}

void clear_active_profile() {
  ActiveProfile& a = active();
  std::lock_guard lock(a.mutex);
  a.profile.reset();
  a.environment_checked = true;
}

std::optional<Profile> active_profile() {
  ActiveProfile& a = active();
  std::lock_guard lock(a.mutex);
  if (!a.environment_checked) {
    a.environment_checked = true;
    if (const char* path = std::getenv("FERRY_PROFILE"); path && *path) {
      try {
        a.profile = load_profile(path);
      } catch (const Error& e) {
        std::fprintf(stderr, "ferry: warning: FERRY_PROFILE is ignored: %s\n", e.what());
      }
    }
  }
  return a.profile;
}

std::optional<double> measured_link_rate(Device source, Device target) {
  try {
    if (source == target || (source.is_cpu() && target.is_cpu())) return std::nullopt;
    if (!source.is_cpu() && !target.is_cpu() && source.type == target.type) return std::nullopt;
    const std::optional<Profile> profile = active_profile();
    if (!profile) return std::nullopt;
    // One leg across the host link: the accelerator's measured rate in that direction.
    auto leg = [&profile](Device accelerator, bool to_device) -> std::optional<double> {
      const DeviceProfile* d = profile->find(accelerator);
      if (!d) return std::nullopt;
      if (accelerator.type == DeviceType::Sim && d->link_setting_bytes_per_second > 0 &&
          d->link_setting_bytes_per_second != sim_link_bandwidth()) {
        return std::nullopt;  // measured at another link setting
      }
      const MeasuredRate& pageable = to_device ? d->host_to_device_pageable : d->device_to_host_pageable;
      const MeasuredRate& pinned = to_device ? d->host_to_device_pinned : d->device_to_host_pinned;
      if (pageable.measured()) return pageable.rate;
      if (pinned.measured()) return pinned.rate;
      return std::nullopt;
    };
    if (source.is_cpu()) return leg(target, true);
    if (target.is_cpu()) return leg(source, false);
    const std::optional<double> out = leg(source, false), in = leg(target, true);
    if (!out || !in) return std::nullopt;
    return 1.0 / (1.0 / *out + 1.0 / *in);
  } catch (...) {
    return std::nullopt;  // a hint must never turn into another error
  }
}

// ---- measuring -----------------------------------------------------------------------------------

std::vector<double> default_link_sizes() {
  return {4e3, 16e3, 64e3, 256e3, 1e6, 4e6, 16e6, 64e6, 256e6};
}
std::vector<double> default_memory_sizes() { return {4e6, 16e6, 64e6, 256e6}; }
std::vector<double> default_gemm_sizes() { return {256, 512, 1024, 2048, 4096}; }

bool supports_pinned(Device device) { return device.is_cuda(); }

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kBenchReason = "bench";
constexpr const char* kBenchLabel = "bench link";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void check_options(const MeasureOptions& options) {
  FERRY_CHECK(options.repeats >= 1, InvalidArgument, "repeats must be >= 1, got ", options.repeats);
  FERRY_CHECK(options.max_seconds_per_size > 0, InvalidArgument, "max_seconds_per_size must be > 0, got ",
              options.max_seconds_per_size);
}

std::int64_t whole_size(double size, const char* what) {
  FERRY_CHECK(std::isfinite(size) && size >= 1 && size <= 9.0e15, InvalidArgument, "Expected ", what,
              " >= 1, got ", size);
  return static_cast<std::int64_t>(std::llround(size));
}

// Runs `run` once untimed, then up to options.repeats timed times; returns the median seconds.
// `run` returns the seconds of one run (so that set-up inside it can stay untimed).
template <typename Run>
double time_median(const MeasureOptions& options, Run&& run) {
  run();  // warm-up: first-touch pages, allocator caches, library start-up
  std::vector<double> seconds;
  const Clock::time_point start = Clock::now();
  while (static_cast<int>(seconds.size()) < options.repeats) {
    seconds.push_back(run());
    if (seconds_since(start) > options.max_seconds_per_size) break;
  }
  return median(seconds);
}

void report_progress(const MeasureOptions& options, const std::string& line) {
  if (options.progress) options.progress(line);
}

// Fills rate.rate from the points: the largest size's rate, or the best one.
void summarise(MeasuredRate& rate, bool best) {
  std::sort(rate.points.begin(), rate.points.end(), [](const RatePoint& a, const RatePoint& b) { return a.size < b.size; });
  rate.rate = 0;
  if (rate.points.empty()) return;
  if (!best) {
    rate.rate = rate.points.back().rate;
    return;
  }
  for (const RatePoint& p : rate.points) rate.rate = std::max(rate.rate, p.rate);
}

// A backend still choosing how to copy pageable memory (cuda's staging ring times its first large copies each way)
// is copied through until it has chosen, at most 64 copies: the median is then of the way it keeps, not of the
// ways it tries in turn. Nothing to do where the backend tunes nothing or `bytes` takes no part in its choice.
template <typename Copy>
void settle_pageable_path(Device device, bool to_device, std::int64_t bytes, Copy&& copy,
                          const MeasureOptions& options) {
  PageableCopyPath path = backend(device).pageable_copy_path(to_device);
  if (path.settled || static_cast<std::size_t>(bytes) < path.tuning_bytes) return;
  for (int i = 0; i < 64 && !path.settled; ++i) {
    copy();
    path = backend(device).pageable_copy_path(to_device);
  }
  report_progress(options, fmt::format("link {} {}: {}", device.str(), to_device ? "host->device" : "device->host",
                                       path.description));
}

}  // namespace

MeasuredRate measure_link(Device device, LinkPath path, const MeasureOptions& options) {
  check_options(options);
  FERRY_CHECK(!device.is_cpu(), InvalidArgument,
              "cpu has no host link to measure; name an accelerator (sim:0, cuda:0). Devices present: ",
              available_devices_text());
  backend(device).properties(device.index);  // throws DeviceUnavailable for an absent device
  const bool pinned = is_pinned(path);
  if (pinned && !supports_pinned(device)) {
    throw NotSupported(fmt::format("{} has no pinned host memory; pinned copies are measured on cuda devices only",
                                   device.str()));
  }
  MeasuredRate rate;
  const bool to_device = is_host_to_device(path);
  for (const double size : options.sizes.empty() ? default_link_sizes() : options.sizes) {
    const std::int64_t bytes = whole_size(size, "a copy size in bytes");
    Tensor host = zeros({bytes}, {.dtype = DType::UInt8, .pinned = pinned});
    Tensor on_device = zeros({bytes}, {.device = device, .dtype = DType::UInt8});
    // One copy, done when it returns; with include_allocation it returns the new tensor, freed after the clock stops.
    auto copy = [&]() -> Tensor {
      Tensor moved;
      if (options.include_allocation) {
        moved = to_device ? host.to(device, pinned) : on_device.to(kCPU, pinned);
      } else if (to_device) {
        detail::copy_between(on_device, host, pinned, kBenchLabel);
      } else {
        detail::copy_between(host, on_device, pinned, kBenchLabel);
      }
      if (pinned) synchronize(device, kBenchReason);
      return moved;
    };
    synchronize(device, kBenchReason);
    if (!pinned) settle_pageable_path(device, to_device, bytes, copy, options);
    const double seconds = time_median(options, [&] {
      const Clock::time_point start = Clock::now();
      const Tensor moved = copy();
      return seconds_since(start);
    });
    const double bytes_d = static_cast<double>(bytes);
    rate.points.push_back({bytes_d, seconds, bytes_d / seconds});
    report_progress(options, fmt::format("link {} {} {}: {} -> {}", device.str(), link_path_words(path),
                                         format_bytes(bytes_d), format_seconds(seconds),
                                         format_bandwidth(bytes_d / seconds)));
  }
  summarise(rate, false);
  return rate;
}

namespace {
// Times one kind of in-device memory traffic; `traffic` is the bytes read + written per byte of size.
template <typename Setup>
MeasuredRate measure_memory(Device device, const MeasureOptions& options, const char* name, double traffic,
                            Setup&& setup) {
  check_options(options);
  backend(device).properties(device.index);
  MeasuredRate rate;
  for (const double size : options.sizes.empty() ? default_memory_sizes() : options.sizes) {
    const std::int64_t bytes = whole_size(size, "a buffer size in bytes");
    const std::int64_t elements = std::max<std::int64_t>(1, bytes / 4);  // float32
    auto run = setup(elements);
    synchronize(device, kBenchReason);
    const double seconds = time_median(options, [&] {
      const Clock::time_point start = Clock::now();
      run();
      synchronize(device, kBenchReason);
      return seconds_since(start);
    });
    const double moved = traffic * static_cast<double>(elements) * 4.0;  // bytes
    rate.points.push_back({static_cast<double>(elements) * 4.0, seconds, moved / seconds});
    report_progress(options, fmt::format("memory {} {} {}: {} -> {}", device.str(), name,
                                         format_bytes(static_cast<double>(elements) * 4.0), format_seconds(seconds),
                                         format_bandwidth(moved / seconds)));
  }
  summarise(rate, false);
  return rate;
}
}  // namespace

MeasuredRate measure_memory_copy(Device device, const MeasureOptions& options) {
  return measure_memory(device, options, "copy", 2.0, [device](std::int64_t elements) {
    Tensor source = ones({elements}, {.device = device});
    Tensor target = zeros({elements}, {.device = device});
    return [source, target]() mutable { target.copy_(source); };
  });
}

MeasuredRate measure_memory_add(Device device, const MeasureOptions& options) {
  return measure_memory(device, options, "add", 3.0, [device](std::int64_t elements) {
    Tensor a = ones({elements}, {.device = device});
    Tensor b = zeros({elements}, {.device = device});  // a stays 1: no overflow, same work every run
    return [a, b]() mutable { a.add_(b); };
  });
}

MeasuredRate measure_gemm(Device device, const MeasureOptions& options) {
  check_options(options);
  backend(device).properties(device.index);
  MeasuredRate rate;
  for (const double size : options.sizes.empty() ? default_gemm_sizes() : options.sizes) {
    const std::int64_t n = whole_size(size, "a matrix size n");
    Tensor a = randn({n, n}, {.device = device});
    Tensor b = randn({n, n}, {.device = device});
    synchronize(device, kBenchReason);
    const double seconds = time_median(options, [&] {
      const Clock::time_point start = Clock::now();
      Tensor c = matmul(a, b);
      synchronize(device, kBenchReason);
      return seconds_since(start);
    });
    const double nd = static_cast<double>(n);
    const double flop = 2.0 * nd * nd * nd;
    rate.points.push_back({nd, seconds, flop / seconds});
    report_progress(options, fmt::format("gemm {} float32 {}x{}x{}: {} -> {} GFLOP/s", device.str(), n, n, n,
                                         format_seconds(seconds), format_number(flop / seconds / 1e9, 4)));
  }
  summarise(rate, true);
  return rate;
}

Profile new_profile(Device device) {
  Profile profile;
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &utc);
  profile.created = stamp;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) profile.host = host;
  DeviceProfile& d = profile.device(device);
  const DeviceProperties properties = backend(device).properties(device.index);
  d.name = properties.name;
  if (device.type == DeviceType::Sim) d.link_setting_bytes_per_second = sim_link_bandwidth();
  return profile;
}

}  // namespace ferry
