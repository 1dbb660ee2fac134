// tools/ferry/plan_command.cpp — `ferry plan ...`: the exercise sheet's cost questions answered from the command line.
// Not here: the arithmetic (ferry/cost_model.h), unit parsing (ferry/units.h), measuring a real device (ferry bench).

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "commands.h"
#include "ferry/backend.h"
#include "ferry/cost_model.h"
#include "ferry/device.h"
#include "ferry/dtype.h"
#include "ferry/error.h"
#include "ferry/profile.h"
#include "ferry/units.h"

namespace {

using Json = nlohmann::ordered_json;  // keys print in the order they were set

// ---- output helpers ------------------------------------------------------------------------------

// A double for JSON, cut to 12 significant digits so that floating-point noise does not show
// (25.009999999999998 -> 25.01), and written as an integer when whole (250, not 250.0).
Json json_number(double value) {
  if (!std::isfinite(value)) return value;  // nlohmann writes null; the cost model never returns these
  const std::string text = fmt::format("{:.12g}", value);
  double cleaned = value;
  std::from_chars(text.data(), text.data() + text.size(), cleaned);
  if (cleaned == std::floor(cleaned) && std::fabs(cleaned) < 9.0e15) return static_cast<std::int64_t>(cleaned);
  return cleaned;
}

// Either the JSON object on one line or the human explanation; never both.
void print(bool as_json, const Json& object, const std::string& explanation) {
  if (as_json) {
    std::cout << object.dump() << '\n';
  } else {
    std::cout << explanation;
  }
}

// 4000000 -> "4,000,000", 59163174502.4 (55.1 GiB/s) -> "59,163,174,502.4": the exact value with thousands
// separators, at most 3 decimals. Below 1 (0.125 bytes) or beyond 9e15, plain digits.
std::string grouped(double value) {
  if (!std::isfinite(value) || value < 0 || value >= 9.0e15 || (value < 1 && value != 0)) {
    return ferry::format_number(value, 6);
  }
  const double rounded = std::round(value * 1000.0) / 1000.0;
  const double whole = std::floor(rounded);
  std::string text = ferry::format_thousands(static_cast<std::int64_t>(whole));
  std::string fraction = fmt::format("{:.3f}", rounded - whole);  // "0.400"
  while (fraction.back() == '0') fraction.pop_back();
  if (fraction.back() != '.') text += fraction.substr(1);  // ".4"
  return text;
}

// {1000, 1000} -> "1000 x 1000"; the scalar shape {} -> "()".
std::string shape_words(const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return "()";
  std::string words;
  for (std::size_t i = 0; i < shape.size(); ++i) words += (i == 0 ? "" : " x ") + std::to_string(shape[i]);
  return words;
}

std::string plural(std::int64_t count, const char* singular, const char* many) {
  return fmt::format("{} {}", ferry::format_thousands(count), count == 1 ? singular : many);
}

// Each subcommand takes --json; its options live in a struct shared with its callback.
CLI::App* add_plan_subcommand(CLI::App& plan, const char* name, const char* description, const char* footer,
                              bool& as_json) {
  CLI::App* command = plan.add_subcommand(name, description);
  command->footer(footer);
  command->add_flag("--json", as_json, "Print exactly one JSON object instead of the explanation");
  return command;
}

// ---- ferry plan bytes (Exercise 2.1) -------------------------------------------------------------

struct TensorSize {
  std::vector<std::int64_t> shape;
  ferry::DType dtype;
  std::int64_t elements;
  std::int64_t bytes;
};

TensorSize tensor_size(const std::string& shape_text, const std::string& dtype_text) {
  TensorSize size{ferry::parse_shape(shape_text), ferry::parse_dtype(dtype_text), 0, 0};
  size.elements = ferry::cost::tensor_elements(size.shape);
  size.bytes = ferry::cost::tensor_bytes(size.shape, size.dtype);
  return size;
}

// "1000 x 1000 float32 = 1,000,000 elements x 4 bytes = 4,000,000 bytes = 4 MB"
std::string explain_tensor_size(const TensorSize& size) {
  return fmt::format("{} {} = {} x {} = {} = {}\n", shape_words(size.shape), ferry::dtype_name(size.dtype),
                     plural(size.elements, "element", "elements"),
                     plural(static_cast<std::int64_t>(ferry::element_size(size.dtype)), "byte", "bytes"),
                     plural(size.bytes, "byte", "bytes"), ferry::format_bytes(static_cast<double>(size.bytes)));
}

void add_bytes_command(CLI::App& plan) {
  struct Options {
    std::string shape, dtype = "float32";
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = add_plan_subcommand(
      plan, "bytes",
      "Exercise 2.1: how many bytes a dense tensor occupies (elements x bytes per element; 1 MB = 10^6 bytes).",
      "Example (Exercise 2.1):\n"
      "  ferry plan bytes --shape 1000x1000 --dtype float32\n"
      "  1000 x 1000 float32 = 1,000,000 elements x 4 bytes = 4,000,000 bytes = 4 MB",
      options->json);
  command->add_option("--shape", options->shape, "Tensor shape: 1000x1000, 4,4 or (2, 3, 4); () is a scalar")
      ->required()
      ->type_name("SHAPE");
  command->add_option("--dtype", options->dtype,
                      "Element type: float32, float64, float16, bfloat16, int32, int64, uint8, bool")
      ->capture_default_str()
      ->type_name("DTYPE");
  command->callback([options] {
    const TensorSize size = tensor_size(options->shape, options->dtype);
    Json object;
    object["bytes"] = size.bytes;
    object["elements"] = size.elements;
    object["shape"] = size.shape;
    object["dtype"] = std::string(ferry::dtype_name(size.dtype));
    print(options->json, object, explain_tensor_size(size));
  });
}

// ---- ferry plan transfer (Exercise 2.2) ----------------------------------------------------------

// `ferry plan --profile FILE <subcommand>`: a profile from `ferry bench --save`, for measured link rates.
std::string& plan_profile_path() {
  static std::string path;
  return path;
}

// --direction and --pinned as a path across the link; throws for a direction it does not know.
ferry::LinkPath link_path_of(const std::string& direction, bool pinned) {
  if (direction == "host->device" || direction == "h2d") {
    return pinned ? ferry::LinkPath::HostToDevicePinned : ferry::LinkPath::HostToDevicePageable;
  }
  if (direction == "device->host" || direction == "d2h") {
    return pinned ? ferry::LinkPath::DeviceToHostPinned : ferry::LinkPath::DeviceToHostPageable;
  }
  throw ferry::InvalidArgument(
      fmt::format("Unknown --direction '{}'; expected host->device (h2d) or device->host (d2h)", direction));
}

// Whether `name` (a profile's device, "sim:0") is a device with pinned host memory (cuda).
bool has_pinned_memory(const std::string& name) {
  try {
    return ferry::supports_pinned(ferry::Device::parse(name));
  } catch (const ferry::Error&) {
    return false;  // a name this build does not know
  }
}

// Why `device` of the profile at `path` has no rate for `link_path`, and what would measure it: another device
// of the profile that has it, else a bench that can measure it (pinned copies exist on cuda devices only).
std::string unmeasured_link_message(const ferry::Profile& profile, const ferry::DeviceProfile& device,
                                    ferry::LinkPath link_path, const std::string& path) {
  const std::string words = ferry::link_path_words(link_path);
  std::vector<std::string> others;
  for (const ferry::DeviceProfile& d : profile.devices) {
    if (&d != &device && d.link(link_path).measured()) others.push_back(d.device);
  }
  std::string message = fmt::format("The profile {} has no {} rate for {}", path, words, device.device);
  if (!others.empty()) {
    return message + fmt::format("; {} has one: add --device {}", fmt::join(others, ", "), others[0]);
  }
  const bool pinned =
      link_path == ferry::LinkPath::HostToDevicePinned || link_path == ferry::LinkPath::DeviceToHostPinned;
  if (pinned && !has_pinned_memory(device.device)) {
    return message + fmt::format(" ({} has no pinned host memory); measure pinned copies on a cuda device: "
                                 "`ferry bench link --device cuda:0 --save {}`",
                                 device.device, path);
  }
  return message + fmt::format("; measure it with `ferry bench link --device {} --save {}`", device.device, path);
}

// The link a `--profile` transfer crosses: the profile's measured time for those bytes on that path.
struct MeasuredLink {
  double seconds = 0;           // s, by the profile's measured points (ferry::MeasuredRate::seconds_for)
  double bytes_per_second = 0;  // bytes / seconds
  std::string words;            // "sim:0 host->device pageable as measured (profile p.json, updated ...)"
};

MeasuredLink measured_link(const std::string& path, const std::string& device_text, ferry::LinkPath link_path,
                           double bytes) {
  const ferry::Profile profile = ferry::load_profile(path);
  const ferry::DeviceProfile* device = nullptr;
  if (device_text.empty()) {
    for (const ferry::DeviceProfile& d : profile.devices) {
      if (d.device != "cpu" && !device) device = &d;
    }
    if (!device) throw ferry::InvalidArgument(fmt::format("The profile {} measured no accelerator's link", path));
  } else {
    for (const ferry::DeviceProfile& d : profile.devices) {
      if (d.device == device_text) device = &d;
    }
    if (!device) {
      std::vector<std::string> names;
      for (const ferry::DeviceProfile& d : profile.devices) names.push_back(d.device);
      throw ferry::InvalidArgument(fmt::format("The profile {} has no device '{}'; it has: {}", path, device_text,
                                               fmt::join(names, ", ")));
    }
  }
  const ferry::MeasuredRate& rate = device->link(link_path);
  if (!rate.measured()) throw ferry::InvalidArgument(unmeasured_link_message(profile, *device, link_path, path));
  MeasuredLink link;
  link.seconds = rate.seconds_for(bytes);
  link.bytes_per_second = link.seconds > 0 ? bytes / link.seconds : rate.rate;
  link.words = fmt::format("{} {} as measured (profile {}{})", device->device, ferry::link_path_words(link_path), path,
                           profile.created.empty() ? "" : ", updated " + profile.created);
  return link;
}

void add_transfer_command(CLI::App& plan) {
  struct Options {
    std::string bytes, shape, dtype = "float32", link;
    std::string profile, device, direction = "host->device";
    bool pinned = false;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = add_plan_subcommand(
      plan, "transfer",
      "Exercise 2.2: how long a copy across the host-device link takes (time = data / rate).",
      "Examples (Exercise 2.2; 1 GB = 10^9 bytes):\n"
      "  ferry plan transfer --bytes 4MB --link 16GB/s\n"
      "  ferry plan transfer --shape 1000x1000 --dtype float32 --link 16GB/s\n"
      "  4 MB / 16 GB/s = 4,000,000 bytes / 16,000,000,000 bytes/s = 0.00025 s = 0.25 ms\n"
      "With measured rates (ferry bench link --device sim:0 --save profile.json):\n"
      "  ferry plan transfer --bytes 4MB --profile profile.json --device sim:0",
      options->json);
  CLI::Option* bytes_option = command->add_option("--bytes", options->bytes, "Data to copy: 4MB, 1.5GiB, 4000000")
                           ->type_name("SIZE");
  CLI::Option* shape_option = command->add_option("--shape", options->shape, "Or a tensor's shape (with --dtype)")
                           ->type_name("SHAPE");
  command->add_option("--dtype", options->dtype, "Element type of --shape")
      ->capture_default_str()
      ->type_name("DTYPE")
      ->needs(shape_option);
  bytes_option->excludes(shape_option);
  CLI::Option* link_option =
      command->add_option("--link", options->link, "Link bandwidth: 16GB/s (PCIe), 900GB/s (VRAM), 55.1GiB/s")
          ->type_name("RATE");
  CLI::Option* profile_option =
      command->add_option("--profile", options->profile,
                          "Or the measured link of a profile from `ferry bench link --save FILE`")
          ->type_name("FILE");
  link_option->excludes(profile_option);
  // Options that choose one of a profile's measured links: refused where no profile is read (--link gives the rate).
  const std::vector<CLI::Option*> profile_only = {
      command->add_option("--device", options->device, "With --profile: the device whose link (default: the first)")
          ->type_name("DEVICE"),
      command->add_option("--direction", options->direction, "With --profile: host->device (h2d) or device->host (d2h)")
          ->capture_default_str()
          ->type_name("DIR"),
      command->add_flag("--pinned", options->pinned, "With --profile: the pinned-memory rate (cuda)")};
  command->callback([options, profile_only] {
    const ferry::LinkPath link_path = link_path_of(options->direction, options->pinned);
    std::string explanation;
    double bytes = 0;  // bytes
    if (!options->shape.empty()) {
      const TensorSize size = tensor_size(options->shape, options->dtype);
      bytes = static_cast<double>(size.bytes);
      explanation += explain_tensor_size(size);
    } else if (!options->bytes.empty()) {
      bytes = ferry::parse_bytes(options->bytes);
    } else {
      throw ferry::InvalidArgument("ferry plan transfer needs --bytes (like 4MB) or --shape (like 1000x1000)");
    }
    const std::string profile_path = !options->profile.empty() ? options->profile : plan_profile_path();
    if (options->link.empty() && profile_path.empty()) {
      throw ferry::InvalidArgument("ferry plan transfer needs --link (like 16GB/s) or --profile (from ferry bench --save)");
    }
    for (const CLI::Option* option : profile_only) {
      if (option->count() > 0 && !options->link.empty()) {
        throw ferry::InvalidArgument(fmt::format(
            "{} chooses a measured link and needs --profile FILE instead of --link (--link {} already gives the rate)",
            option->get_name(), options->link));
      }
    }
    Json object;
    if (!options->link.empty()) {
      const double bytes_per_second = ferry::parse_bandwidth(options->link);
      const double seconds = ferry::cost::transfer_seconds(bytes, bytes_per_second);
      explanation += fmt::format("{} / {} = {} bytes / {} bytes/s = {} s = {}\n", ferry::format_bytes(bytes),
                                 ferry::format_bandwidth(bytes_per_second), grouped(bytes), grouped(bytes_per_second),
                                 ferry::format_number(seconds, 6), ferry::format_seconds(seconds));
      object["seconds"] = json_number(seconds);
      object["bytes"] = json_number(bytes);
      object["bytes_per_second"] = json_number(bytes_per_second);
    } else {
      const MeasuredLink link = measured_link(profile_path, options->device, link_path, bytes);
      const double sheet_seconds = ferry::cost::transfer_seconds(bytes, 16e9);
      explanation += fmt::format(
          "{} over {}: {}, an effective {}\n"
          "The sheet's 16 GB/s would say {}.\n",
          ferry::format_bytes(bytes), link.words, ferry::format_seconds(link.seconds),
          ferry::format_bandwidth(link.bytes_per_second), ferry::format_seconds(sheet_seconds));
      object["seconds"] = json_number(link.seconds);
      object["bytes"] = json_number(bytes);
      object["bytes_per_second"] = json_number(link.bytes_per_second);
      object["seconds_at_16GB_per_s"] = json_number(sheet_seconds);
      object["profile"] = profile_path;
    }
    print(options->json, object, explanation);
  });
}

// ---- ferry plan speedup (Exercise 2.3) -----------------------------------------------------------

// What the speedup formula needs. Each value comes from its flag, else from a device query
// (`--gpu cuda:0` for the accelerator, `--cpu` for the host); a flag wins over the device's value.
struct SpeedupInputs {
  double gpu_hz = 0;            // Hz
  std::int64_t gpu_cores = 0;
  double cpu_hz = 0;            // Hz
  std::int64_t cpu_cores = 0;
  std::string gpu_name, cpu_name;  // the devices queried, "" when every value came from flags
};

struct SpeedupOptions {
  std::string gpu_clock, gpu_cores, cpu_clock, cpu_cores;
  std::string gpu_device;  // --gpu cuda:0
  bool cpu_device = false; // --cpu
  bool json = false;
};

SpeedupInputs speedup_inputs(const SpeedupOptions& options) {
  SpeedupInputs inputs;
  if (!options.gpu_device.empty()) {
    const ferry::Device device = ferry::Device::parse(options.gpu_device);
    const ferry::DeviceProperties p = ferry::backend(device).properties(device.index);
    inputs.gpu_hz = p.clock_hz;
    inputs.gpu_cores = p.cores;
    inputs.gpu_name = fmt::format("{} ({})", device.str(), p.name);
  }
  if (options.cpu_device) {
    const ferry::DeviceProperties p = ferry::backend(ferry::kCPU).properties(0);
    inputs.cpu_hz = p.clock_hz;
    inputs.cpu_cores = p.cores;
    inputs.cpu_name = fmt::format("cpu ({})", p.name);
  }
  if (!options.gpu_clock.empty()) inputs.gpu_hz = ferry::parse_hertz(options.gpu_clock);
  if (!options.gpu_cores.empty()) inputs.gpu_cores = ferry::parse_whole_count(options.gpu_cores);
  if (!options.cpu_clock.empty()) inputs.cpu_hz = ferry::parse_hertz(options.cpu_clock);
  if (!options.cpu_cores.empty()) inputs.cpu_cores = ferry::parse_whole_count(options.cpu_cores);
  // What is still unknown: never given, or the device did not report it.
  std::vector<std::string> missing;
  auto need = [&missing](bool known, const std::string& queried, const char* flag) {
    if (known) return;
    missing.push_back(queried.empty() ? std::string(flag) : fmt::format("{} ({} does not report it)", flag, queried));
  };
  need(inputs.gpu_hz > 0 || !options.gpu_clock.empty(), inputs.gpu_name, "--gpu-clock (like 1.5GHz)");
  need(inputs.gpu_cores > 0 || !options.gpu_cores.empty(), inputs.gpu_name, "--gpu-cores (like 8000)");
  need(inputs.cpu_hz > 0 || !options.cpu_clock.empty(), inputs.cpu_name, "--cpu-clock (like 3GHz)");
  need(inputs.cpu_cores > 0 || !options.cpu_cores.empty(), inputs.cpu_name, "--cpu-cores (like 16)");
  if (!missing.empty()) {
    throw ferry::InvalidArgument(fmt::format("ferry plan speedup needs {} (or --gpu DEVICE / --cpu to read them from "
                                             "the devices)",
                                             fmt::join(missing, ", ")));
  }
  return inputs;
}

void add_speedup_command(CLI::App& plan) {
  auto options = std::make_shared<SpeedupOptions>();
  CLI::App* command = add_plan_subcommand(
      plan, "speedup",
      "Exercise 2.3: the theoretical speedup S ~ (f_gpu x c_gpu) / (f_cpu x c_cpu), clock times cores "
      "(four flags, or --gpu DEVICE and --cpu to read them from this machine's devices).",
      "Example (Exercise 2.3):\n"
      "  ferry plan speedup --gpu-clock 1.5GHz --gpu-cores 8000 --cpu-clock 3GHz --cpu-cores 16\n"
      "  S = (1.5 GHz x 8000) / (3 GHz x 16) = 12000 / 48 = 250x\n"
      "From the real devices:\n"
      "  ferry plan speedup --gpu cuda:0 --cpu\n"
      "An upper bound: see `ferry plan golden` for what transfers leave of it.",
      options->json);
  command->add_option("--gpu-clock", options->gpu_clock, "GPU clock: 1.5GHz, 1500MHz")->type_name("FREQ");
  command->add_option("--gpu-cores", options->gpu_cores, "GPU cores: 8000, 16K")->type_name("COUNT");
  command->add_option("--cpu-clock", options->cpu_clock, "CPU clock: 3GHz")->type_name("FREQ");
  command->add_option("--cpu-cores", options->cpu_cores, "CPU cores: 16")->type_name("COUNT");
  command->add_option("--gpu", options->gpu_device,
                      "Read the accelerator's clock and cores from this device: cuda:0 (or sim:0)")
      ->type_name("DEVICE");
  command->add_flag("--cpu", options->cpu_device, "Read the host's clock and cores (hardware threads)");
  command->callback([options] {
    const SpeedupInputs in = speedup_inputs(*options);
    const double speedup = ferry::cost::theoretical_speedup(in.gpu_hz, in.gpu_cores, in.cpu_hz, in.cpu_cores);
    const double gpu_ghz_cores = in.gpu_hz * static_cast<double>(in.gpu_cores) / 1e9;
    const double cpu_ghz_cores = in.cpu_hz * static_cast<double>(in.cpu_cores) / 1e9;
    const std::string explanation = fmt::format(
        "S = (f_gpu x c_gpu) / (f_cpu x c_cpu) = ({} x {}) / ({} x {}) = {} / {} = {}x  (GHz x cores; the GHz cancel)\n"
        "An upper bound: every core busy every cycle, no memory or transfer cost; "
        "`ferry plan golden` shows what transfers leave of it.\n",
        ferry::format_hertz(in.gpu_hz, 6), ferry::format_thousands(in.gpu_cores), ferry::format_hertz(in.cpu_hz, 6),
        ferry::format_thousands(in.cpu_cores), ferry::format_number(gpu_ghz_cores), ferry::format_number(cpu_ghz_cores),
        ferry::format_number(speedup));
    std::string sources;
    if (!in.gpu_name.empty()) sources += fmt::format("GPU side: {}\n", in.gpu_name);
    if (!in.cpu_name.empty()) sources += fmt::format("CPU side: {}\n", in.cpu_name);
    Json object;
    object["speedup"] = json_number(speedup);
    object["gpu_hz"] = json_number(in.gpu_hz);
    object["gpu_cores"] = in.gpu_cores;
    object["cpu_hz"] = json_number(in.cpu_hz);
    object["cpu_cores"] = in.cpu_cores;
    if (!in.gpu_name.empty()) object["gpu_device"] = in.gpu_name;
    if (!in.cpu_name.empty()) object["cpu_device"] = in.cpu_name;
    print(options->json, object, sources + explanation);
  });
}

// ---- ferry plan golden (Exercises 3.1, 3.2) ------------------------------------------------------

// --speedup: a positive number, "250", "31.25" or "250x" (as `ferry plan speedup` prints it).
double parse_speedup(const std::string& text) {
  std::string_view number = text;
  auto trim = [&number] {
    while (!number.empty() && number.front() == ' ') number.remove_prefix(1);
    while (!number.empty() && number.back() == ' ') number.remove_suffix(1);
  };
  trim();
  if (!number.empty() && number.back() == 'x') number.remove_suffix(1);
  trim();
  double speedup = 0;
  const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), speedup);
  if (number.empty() || error != std::errc{} || end != number.data() + number.size() || !std::isfinite(speedup) ||
      speedup <= 0) {
    throw ferry::InvalidArgument(
        fmt::format("--speedup must be a positive number like 250 (the theoretical speedup S), got '{}'", text));
  }
  return speedup;
}

void add_golden_command(CLI::App& plan) {
  struct Options {
    std::string speedup, compute, transfer;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = add_plan_subcommand(
      plan, "golden",
      "Exercises 3.1 and 3.2: the Golden Rule S_real = S / (1 + T_transfer / T_compute).",
      "Examples:\n"
      "  ferry plan golden --speedup 250 --compute 0.1s --transfer 0.7s   (Exercise 3.1)\n"
      "  S_real = 250 / (1 + 7) = 31.25x\n"
      "  ferry plan golden --speedup 250 --compute 0.1s --transfer 0      (Exercise 3.2)\n"
      "  S_real = 250x (keeping the data on the GPU: 8x the 31.25x of Exercise 3.1)",
      options->json);
  command->add_option("--speedup", options->speedup, "Theoretical speedup S (from `ferry plan speedup`): 250")
      ->required()
      ->type_name("S");
  command->add_option("--compute", options->compute, "GPU compute per step, T_compute: 0.1s, 20ms")
      ->required()
      ->type_name("TIME");
  command->add_option("--transfer", options->transfer, "Transfer per step, T_transfer: 0.7s, 5ms, 0")
      ->required()
      ->type_name("TIME");
  command->callback([options] {
    const double speedup = parse_speedup(options->speedup);
    const double compute_s = ferry::parse_seconds(options->compute);
    const double transfer_s = ferry::parse_seconds(options->transfer);
    const ferry::cost::GoldenRule rule = ferry::cost::golden_rule(speedup, compute_s, transfer_s);
    const ferry::cost::GoldenRule resident = ferry::cost::golden_rule(speedup, compute_s, 0.0);
    const double ratio = transfer_s / compute_s;
    const double gain = resident.speedup_real / rule.speedup_real;  // > 0: efficiency is never 0 for finite inputs
    std::string explanation = fmt::format(
        "T_transfer / T_compute = {} / {} = {}\n"
        "S_real = S / (1 + T_transfer / T_compute) = {} / (1 + {}) = {}x\n"
        "Efficiency 1 / (1 + {}) = {}: transfers cost {}% of the theoretical speedup.\n",
        ferry::format_seconds(transfer_s, 6), ferry::format_seconds(compute_s, 6), ferry::format_number(ratio),
        ferry::format_number(speedup), ferry::format_number(ratio), ferry::format_number(rule.speedup_real),
        ferry::format_number(ratio), ferry::format_number(rule.efficiency),
        ferry::format_number(100.0 * (1.0 - rule.efficiency), 4));
    if (transfer_s > 0) {
      explanation += fmt::format("Keeping the data on the GPU (T_transfer = 0, Exercise 3.2): S_real = {}x, {}x better.\n",
                                 ferry::format_number(resident.speedup_real), ferry::format_number(gain));
    }
    Json object;
    object["speedup_real"] = json_number(rule.speedup_real);
    object["efficiency"] = json_number(rule.efficiency);
    object["transfer_to_compute"] = json_number(ratio);
    object["speedup_if_resident"] = json_number(resident.speedup_real);
    object["gain_if_resident"] = json_number(gain);
    print(options->json, object, explanation);
  });
}

// ---- ferry plan allreduce (Exercise 4.1) ---------------------------------------------------------

void add_allreduce_command(CLI::App& plan) {
  struct Options {
    std::string params, dtype = "float32", gpus, link;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = add_plan_subcommand(
      plan, "allreduce",
      "Exercise 4.1: bytes the gradient all-reduce moves per iteration of data-parallel training.",
      "Example (Exercise 4.1):\n"
      "  ferry plan allreduce --params 25M --dtype float32 --gpus 4\n"
      "  2 x 25,000,000 x 4 bytes = 200 MB per iteration (the sheet's estimate);\n"
      "  a ring all-reduce sends 2(N-1)/N x P x 4 bytes = 150 MB from each GPU.\n"
      "Add --link 16GB/s to turn the bytes into time.",
      options->json);
  command->add_option("--params", options->params, "Parameter count P: 25M, 25000000, 7B")
      ->required()
      ->type_name("COUNT");
  command->add_option("--dtype", options->dtype, "Gradient element type")->capture_default_str()->type_name("DTYPE");
  command->add_option("--gpus", options->gpus, "Number of GPUs N")->required()->type_name("N");
  command->add_option("--link", options->link, "Optional link bandwidth between GPUs: 16GB/s, 900GB/s")
      ->type_name("RATE");
  command->callback([options] {
    const std::int64_t params = ferry::parse_whole_count(options->params);
    const ferry::DType dtype = ferry::parse_dtype(options->dtype);
    const std::int64_t gpus = ferry::parse_whole_count(options->gpus);
    const ferry::cost::AllReduceBytes moved = ferry::cost::allreduce_bytes(params, dtype, gpus);
    const auto size = static_cast<std::int64_t>(ferry::element_size(dtype));
    std::string explanation = fmt::format(
        "Sheet's estimate: 2 x P x sizeof({}) = 2 x {} x {} = {} bytes = {} per iteration\n"
        "Ring all-reduce: each of the N = {} GPUs sends 2(N-1)/N x P x {} = 2 x {}/{} x {} x {} = {} bytes = {} "
        "per iteration, and receives as much\n",
        ferry::dtype_name(dtype), ferry::format_thousands(params), plural(size, "byte", "bytes"),
        ferry::format_thousands(moved.bytes), ferry::format_bytes(static_cast<double>(moved.bytes)), gpus,
        plural(size, "byte", "bytes"), gpus - 1, gpus, ferry::format_thousands(params), size,
        grouped(moved.bytes_ring_per_gpu), ferry::format_bytes(moved.bytes_ring_per_gpu));
    Json object;
    object["bytes"] = moved.bytes;
    object["bytes_ring_per_gpu"] = json_number(moved.bytes_ring_per_gpu);
    if (!options->link.empty()) {
      const double bytes_per_second = ferry::parse_bandwidth(options->link);
      const double seconds = ferry::cost::transfer_seconds(static_cast<double>(moved.bytes), bytes_per_second);
      const double seconds_ring = ferry::cost::transfer_seconds(moved.bytes_ring_per_gpu, bytes_per_second);
      explanation += fmt::format("At {}: {} per iteration by the estimate, {} for the ring\n",
                                 ferry::format_bandwidth(bytes_per_second), ferry::format_seconds(seconds),
                                 ferry::format_seconds(seconds_ring));
      object["seconds"] = json_number(seconds);
      object["seconds_ring"] = json_number(seconds_ring);
    }
    print(options->json, object, explanation);
  });
}

// ---- ferry plan batch (Exercises 4.2, 5.2) -------------------------------------------------------

void add_batch_command(CLI::App& plan) {
  struct Options {
    std::string batch, gpus;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = add_plan_subcommand(
      plan, "batch",
      "Exercises 4.2 and 5.2: split a global batch B evenly across N GPUs (B / N each; N must divide B).",
      "Examples:\n"
      "  ferry plan batch --batch 256 --gpus 4    (Exercise 4.2: 64 per GPU)\n"
      "  ferry plan batch --batch 512 --gpus 4    (Exercise 5.2: 128 per GPU)\n"
      "  ferry plan batch --batch 250 --gpus 4    fails, naming the nearest valid sizes 248 and 252",
      options->json);
  command->add_option("--batch", options->batch, "Global batch size B: 256")->required()->type_name("B");
  command->add_option("--gpus", options->gpus, "Number of GPUs N: 4")->required()->type_name("N");
  command->callback([options] {
    const std::int64_t batch = ferry::parse_whole_count(options->batch);
    const std::int64_t gpus = ferry::parse_whole_count(options->gpus);
    const std::int64_t per_gpu = ferry::cost::per_gpu_batch(batch, gpus);
    const std::string explanation = fmt::format(
        "Per-GPU batch = B / N = {} / {} = {} samples\n"
        "Each GPU computes the gradient of its {} samples; the {} gradients are averaged, (1/{}) x their sum, "
        "and every GPU applies the same update, so the replicas stay identical.\n",
        batch, gpus, per_gpu, per_gpu, gpus, gpus);
    Json object;
    object["per_gpu"] = per_gpu;
    print(options->json, object, explanation);
  });
}

// ---- ferry plan loop (Exercise 5.1) --------------------------------------------------------------

void add_loop_command(CLI::App& plan) {
  struct Options {
    std::string transfer, compute, log, steps, log_every;
    bool json = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = add_plan_subcommand(
      plan, "loop",
      "Exercise 5.1: wall-clock time of a training loop, and what a host sync (loss.item()) every step wastes.",
      "Example (Exercise 5.1):\n"
      "  ferry plan loop --transfer 5ms --compute 20ms --log 1ms --steps 1000 --log-every 100\n"
      "  (a) every step: 26 s  (b) every 100th step: 25.01 s  (c) waste: 3.81%",
      options->json);
  command->add_option("--transfer", options->transfer, "Host-to-device copy per step: 5ms")
      ->required()
      ->type_name("TIME");
  command->add_option("--compute", options->compute, "Forward + backward per step: 20ms")
      ->required()
      ->type_name("TIME");
  command->add_option("--log", options->log, "One logging sync (loss.item()): 1ms")->required()->type_name("TIME");
  command->add_option("--steps", options->steps, "Number of steps: 1000")->required()->type_name("COUNT");
  command->add_option("--log-every", options->log_every, "Log every n-th step instead: 100")
      ->required()
      ->type_name("COUNT");
  command->callback([options] {
    const double transfer_s = ferry::parse_seconds(options->transfer);
    const double compute_s = ferry::parse_seconds(options->compute);
    const double log_s = ferry::parse_seconds(options->log);
    const std::int64_t steps = ferry::parse_whole_count(options->steps);
    const std::int64_t log_every = ferry::parse_whole_count(options->log_every);
    const ferry::cost::LoopTime loop = ferry::cost::loop_time(transfer_s, compute_s, log_s, steps, log_every);
    const double per_step_s = transfer_s + compute_s;
    const double wasted_s = loop.total_s_log_every_step - loop.total_s;
    const double waste_rounded = std::round(loop.waste_fraction * 1e4) / 1e4;
    auto seconds = [](double value) { return ferry::format_seconds(value, 6); };
    const std::string explanation = fmt::format(
        "Per step: T_transfer + T_compute = {} + {} = {}\n"
        "(a) Logging every step: ({} + {}) x {} = {}\n"
        "(b) Logging every {} step: {} x {} + {} x {} = {}\n"
        "(c) Logging every step wastes ({} - {}) / {} = {} ({}%) of the run\n",
        seconds(transfer_s), seconds(compute_s), seconds(per_step_s), seconds(per_step_s), seconds(log_s),
        plural(steps, "step", "steps"), seconds(loop.total_s_log_every_step),
        ferry::format_ordinal(log_every), seconds(per_step_s),
        plural(steps, "step", "steps"), seconds(log_s), plural(loop.logs, "log", "logs"), seconds(loop.total_s),
        seconds(loop.total_s_log_every_step), seconds(loop.total_s), seconds(loop.total_s_log_every_step),
        ferry::format_number(waste_rounded, 4), ferry::format_number(100.0 * waste_rounded, 4));
    Json object;
    object["total_s"] = json_number(loop.total_s);
    object["total_s_log_every_step"] = json_number(loop.total_s_log_every_step);
    object["waste_fraction"] = json_number(waste_rounded);
    object["waste_fraction_unrounded"] = loop.waste_fraction;
    object["wasted_s"] = json_number(wasted_s);
    object["logs"] = loop.logs;
    print(options->json, object, explanation);
  });
}

}  // namespace

void register_plan_command(CLI::App& app) {
  CLI::App* plan = app.add_subcommand(
      "plan", "Answer the exercise sheet's cost questions: bytes, link time, speedup, the Golden Rule, "
              "all-reduce bytes, batch splitting, logging cost.");
  plan->require_subcommand(1);
  plan->footer(
      "Units as the sheet writes them: 4MB (1 MB = 10^6 bytes), 1.5GiB, 16GB/s, 5ms, 0.1s, 1.5GHz, 25M.\n"
      "Every subcommand explains its arithmetic, or prints one JSON object with --json.\n"
      "Run `ferry plan <subcommand> --help` for the exercise it answers and an example.");
  // Read as soon as it is parsed, whatever the subcommand: a profile that was asked for but cannot be read (missing,
  // a directory, not a profile) fails as `plan transfer --profile` does, instead of being ignored.
  plan->add_option("--profile", plan_profile_path(),
                   "Measured rates from `ferry bench ... --save FILE`, used for transfer times")
      ->type_name("FILE")
      ->each([](const std::string& path) { ferry::load_profile(path); });
  add_bytes_command(*plan);
  add_transfer_command(*plan);
  add_speedup_command(*plan);
  add_golden_command(*plan);
  add_allreduce_command(*plan);
  add_batch_command(*plan);
  add_loop_command(*plan);
}
