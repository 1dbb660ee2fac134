// bench_command.cpp — `ferry bench link|memory|gemm` (and registers golden, allreduce): the sheet's rates measured for real on this
// machine's devices, printed as tables or JSON, and kept in a profile (--save) for `ferry plan --profile`.
// Not here: the timing loops (ferry/profile.h measure_*), the formulas (ferry/cost_model.h).
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "ferry/backend.h"
#include "ferry/cost_model.h"
#include "ferry/device.h"
#include "ferry/error.h"
#include "ferry/profile.h"
#include "ferry/trace.h"
#include "ferry/units.h"

namespace {

using Json = nlohmann::ordered_json;

// Options the rate benches (link, memory, gemm) take; a new one adds its own options next to these with
// add_common_options() and reuses run_context() and finish().
struct CommonOptions {
  std::string device;               // "" = the bench's default device
  std::vector<std::string> sizes;   // as typed: "4KB", "1MB" (link, memory) or "256" (gemm)
  int repeats = 5;                  // timed runs per size; the median is reported
  double max_seconds_per_size = 2;  // s
  bool json = false;
  std::string save;                 // profile file to create or update
  std::string trace;                // Chrome trace of the bench's crossings
  bool progress = false, quiet = false;
};

void add_common_options(CLI::App* command, CommonOptions& options, const char* sizes_help) {
  command->add_option("--device", options.device, "Device to measure: cpu, sim[:N], cuda[:N], auto")->type_name("DEVICE");
  command->add_option("--sizes", options.sizes, sizes_help)->delimiter(',')->type_name("LIST");
  command->add_option("--repeats", options.repeats, "Timed runs per size (after one warm-up); medians are reported")
      ->capture_default_str()
      ->check(whole_number_at_least(1));
  command->add_option("--max-seconds", options.max_seconds_per_size,
                      "Stop repeating a size after this many seconds (at least one timed run)")
      ->capture_default_str()
      ->check(number_above_zero());
  command->add_flag("--json", options.json, "Print one JSON object instead of the table");
  command->add_option("--save", options.save,
                      "Keep the measured rates in this profile file (created, or updated in place)")
      ->type_name("PROFILE.json");
  command->add_option("--trace", options.trace, "Write the bench's crossings and syncs as Chrome trace JSON")
      ->type_name("FILE");
  command->add_flag("--progress", options.progress, "Report each size on stderr as it finishes (default: on a terminal)");
  command->add_flag("--quiet", options.quiet, "No progress on stderr");
}

// --save PATH, checked before anything is measured (exit 2); a file that is there must be a profile (it is merged
// into, not replaced), also before measuring.
void check_save_path(const std::string& save) {
  check_writable(save, "--save");
  std::error_code error;
  if (!save.empty() && std::filesystem::exists(save, error)) ferry::load_profile(save);
}

// What a bench run needs besides its own options: the device, the sizes, the measure options.
struct RunContext {
  ferry::Device device;
  ferry::MeasureOptions measure;
};

// The device: --device, or the bench's default (`accelerator_only`: cuda:0, else sim:0; otherwise auto).
RunContext run_context(const CommonOptions& options, bool accelerator_only, bool sizes_are_bytes) {
  RunContext context;
  if (!options.device.empty()) {
    context.device = ferry::Device::parse(options.device);
  } else if (accelerator_only) {
    context.device = ferry::is_available(ferry::DeviceType::CUDA) ? ferry::Device(ferry::DeviceType::CUDA, 0)
                                                                   : ferry::Device::parse("sim:0");
  } else {
    context.device = ferry::Device::parse("auto");
  }
  check_save_path(options.save);
  if (options.repeats < 1) throw ferry::InvalidArgument(fmt::format("--repeats must be >= 1, got {}", options.repeats));
  if (!(options.max_seconds_per_size > 0)) {
    throw ferry::InvalidArgument(fmt::format("--max-seconds must be > 0, got {}", options.max_seconds_per_size));
  }
  context.measure.repeats = options.repeats;
  context.measure.max_seconds_per_size = options.max_seconds_per_size;
  for (const std::string& text : options.sizes) {
    const double size = sizes_are_bytes ? ferry::parse_bytes(text) : static_cast<double>(ferry::parse_whole_count(text));
    if (size < 1) {
      throw ferry::InvalidArgument(fmt::format("--sizes: '{}' is below the smallest size ({})", text,
                                               sizes_are_bytes ? "1 byte" : "n = 1"));
    }
    if (sizes_are_bytes && size > 64e9) {
      throw ferry::InvalidArgument(fmt::format("--sizes: '{}' is more than 64 GB", text));
    }
    context.measure.sizes.push_back(size);
  }
  const bool show = !options.quiet && (options.progress || isatty(STDERR_FILENO));
  if (show) {
    context.measure.progress = [](const std::string& line) { std::fprintf(stderr, "ferry bench: %s\n", line.c_str()); };
  }
  return context;
}

Json points_json(const ferry::MeasuredRate& rate, const char* size_key, const char* rate_key) {
  Json points = Json::array();
  for (const ferry::RatePoint& p : rate.points) {
    points.push_back({{size_key, p.size}, {"seconds", p.seconds}, {rate_key, p.rate}});
  }
  return points;
}

// Saves the profile (merged into the file when it exists) and the trace; adds their paths to `object`.
void finish(const CommonOptions& options, const ferry::Profile& measured, Json& object, std::string& text) {
  if (!options.save.empty()) {
    ferry::Profile profile;
    if (std::filesystem::exists(options.save)) profile = ferry::load_profile(options.save);  // refuses a non-profile
    profile.merge(measured);
    ferry::save_profile(profile, options.save);
    object["profile"] = options.save;
    text += fmt::format("rates saved to {} (use: ferry plan --profile {} transfer --bytes 4MB)\n", options.save,
                        options.save);
  }
  if (!options.trace.empty()) {
    ferry::write_chrome_trace(options.trace);
    object["trace"] = options.trace;
    text += fmt::format("trace of the crossings written to {} (open it in ui.perfetto.dev)\n", options.trace);
  }
  if (options.json) {
    fmt::print("{}\n", object.dump());
  } else {
    fmt::print("{}", text);
  }
}

std::string device_line(ferry::Device device) {
  const ferry::DeviceProperties p = ferry::backend(device).properties(device.index);
  std::string line = fmt::format("{} ({})", device.str(), p.name);
  if (device.type == ferry::DeviceType::Sim) {
    const double rate = ferry::sim_link_bandwidth();
    line += rate > 0 ? fmt::format(", sim link set to {}", ferry::format_bandwidth(rate)) : ", sim link unthrottled";
  }
  return line;
}

// ---- ferry bench link ------------------------------------------------------------------------------

void add_link_bench(CLI::App& bench) {
  struct Options {
    CommonOptions common;
    bool pageable_only = false;
    bool with_allocation = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* command = bench.add_subcommand(
      "link", "Host->device and device->host copies across the link, pageable and pinned (cuda), 4 KB to 256 MB");
  command->footer(
      "Times copies of each size between buffers allocated once (the link itself), medians; --with-allocation\n"
      "times x.to(device) and x.to(cpu) with a fresh destination each run (what a loop that moves every batch pays).\n"
      "Pinned memory is measured only where the device has it (cuda). Exercise 2.2 says 4 MB / 16 GB/s = 0.25 ms.\n"
      "On cuda, pageable copies of 4 MiB or more go through a ring of pinned buffers filled by host threads; the\n"
      "report says which way the ring kept and, after copies of 64 MiB or more, where its threads' time went:\n"
      "mostly copying means the host's memory is the limit, mostly waiting for the link means the link is\n"
      "(docs/devices-and-moves.md).\n"
      "Example: ferry bench link --device sim:0 --sizes 4KB,1MB,64MB --save profile.json");
  add_common_options(command, options->common, "Copy sizes, comma-separated: 4KB,1MB,256MB (default 4 KB..256 MB)");
  command->add_flag("--pageable-only", options->pageable_only, "Skip the pinned-memory paths");
  command->add_flag("--with-allocation", options->with_allocation,
                    "Time x.to(device) with a fresh destination tensor each run (the allocator's cost included: a "
                    "block from the device's cache, or fresh pages) instead of copies into buffers allocated once");
  command->callback([options] {
    RunContext context = run_context(options->common, true, true);
    context.measure.include_allocation = options->with_allocation;
    const ferry::Device device = context.device;
    if (device.is_cpu()) {
      throw ferry::InvalidArgument(fmt::format("cpu has no host link to measure; name an accelerator ({})",
                                               ferry::available_devices_text()));
    }
    ferry::Profile profile = ferry::new_profile(device);
    ferry::DeviceProfile& measured = profile.device(device);
    std::vector<ferry::LinkPath> paths = {ferry::LinkPath::HostToDevicePageable, ferry::LinkPath::DeviceToHostPageable};
    Json skipped = Json::array();
    if (ferry::supports_pinned(device) && !options->pageable_only) {
      paths.push_back(ferry::LinkPath::HostToDevicePinned);
      paths.push_back(ferry::LinkPath::DeviceToHostPinned);
    } else {
      const std::string why = options->pageable_only ? "--pageable-only"
                                                     : device.str() + " has no pinned host memory (cuda only)";
      skipped.push_back({{"path", "host_to_device_pinned"}, {"reason", why}});
      skipped.push_back({{"path", "device_to_host_pinned"}, {"reason", why}});
    }
    for (ferry::LinkPath path : paths) measured.link(path) = ferry::measure_link(device, path, context.measure);

    Json object{{"bench", "link"}, {"device", device.str()}, {"name", measured.name}, {"repeats", options->common.repeats}};
    if (device.type == ferry::DeviceType::Sim) object["link_setting_bytes_per_second"] = ferry::sim_link_bandwidth();
    Json results = Json::array();
    for (ferry::LinkPath path : paths) {
      const ferry::MeasuredRate& rate = measured.link(path);
      results.push_back({{"path", std::string(ferry::link_path_name(path))},
                         {"bytes_per_second", rate.rate},
                         {"points", points_json(rate, "bytes", "bytes_per_second")}});
    }
    object["paths"] = results;
    object["skipped"] = skipped;

    // The table: one row per size, one column pair (time, rate) per path.
    object["with_allocation"] = options->with_allocation;
    std::string text = fmt::format("ferry bench link: {}; {}; medians of up to {} runs\n", device_line(device),
                                   options->with_allocation ? "x.to(device), fresh destination each run"
                                                            : "copies between buffers allocated once",
                                   options->common.repeats);
    text += fmt::format("{:>10}", "size");
    for (ferry::LinkPath path : paths) text += fmt::format("  {:>26}", ferry::link_path_words(path));
    text += "\n";
    const std::size_t rows = measured.link(paths.front()).points.size();
    for (std::size_t row = 0; row < rows; ++row) {
      text += fmt::format("{:>10}", ferry::format_bytes(measured.link(paths.front()).points[row].size));
      for (ferry::LinkPath path : paths) {
        const ferry::RatePoint& p = measured.link(path).points[row];
        text += fmt::format("  {:>12} {:>13}", ferry::format_seconds(p.seconds), ferry::format_bandwidth(p.rate));
      }
      text += "\n";
    }
    text += "at the largest size:";
    for (ferry::LinkPath path : paths) {
      text += fmt::format(" {} {};", ferry::link_path_words(path), ferry::format_bandwidth(measured.link(path).rate));
    }
    text.back() = '\n';
    // Exercise 2.2 beside the measurement: the sheet's time for the measured size nearest 4 MB.
    const ferry::MeasuredRate& upload = measured.link(ferry::LinkPath::HostToDevicePageable);
    const ferry::RatePoint* nearest = nullptr;
    for (const ferry::RatePoint& p : upload.points) {
      if (!nearest || std::abs(std::log(p.size / 4e6)) < std::abs(std::log(nearest->size / 4e6))) nearest = &p;
    }
    if (nearest) {
      const double sheet = ferry::cost::transfer_seconds(nearest->size, 16e9);
      text += fmt::format("Exercise 2.2's model, {} / 16 GB/s = {}; measured host->device: {} ({:+.0f} %)\n",
                          ferry::format_bytes(nearest->size), ferry::format_seconds(sheet),
                          ferry::format_seconds(nearest->seconds), 100.0 * (nearest->seconds / sheet - 1.0));
      object["exercise_2_2"] = {{"bytes", nearest->size}, {"seconds_model_16GB_per_s", sheet},
                                {"seconds_measured", nearest->seconds}};
    }
    if (!skipped.empty()) text += fmt::format("pinned: not measured ({})\n", skipped[0]["reason"].get<std::string>());
    // How the pageable copies went, where the backend says (cuda: its staging ring, and the way the ring chose).
    Json pageable = Json::object();
    for (const bool to_device : {true, false}) {
      const ferry::PageableCopyPath path = ferry::backend(device).pageable_copy_path(to_device);
      if (path.description.empty()) continue;
      Json& entry = pageable[to_device ? "host_to_device" : "device_to_host"];
      entry = {{"settled", path.settled}, {"description", path.description}};
      text += fmt::format("pageable {}: {}\n", to_device ? "host->device" : "device->host", path.description);
      if (path.timed_copies == 0) continue;
      // Where the staging threads' time went: mostly waiting says the link is the limit, mostly copying the host's memory.
      entry["staging_threads"] = {{"copies", path.timed_copies}, {"copying_share", path.copying_share},
                                  {"waiting_share", path.waiting_share},
                                  {"copying_bytes_per_second", path.copying_rate}};
      text += fmt::format("  its threads, over {} {} of {} MiB or more: copying {:.0f} % of the time ({} together), "
                          "waiting for the link {:.0f} %, the rest {:.0f} %\n",
                          path.timed_copies, path.timed_copies == 1 ? "copy" : "copies", path.tuning_bytes >> 20,
                          100 * path.copying_share, ferry::format_bandwidth(path.copying_rate),
                          100 * path.waiting_share, 100 * std::max(0.0, 1 - path.copying_share - path.waiting_share));
    }
    if (!pageable.empty()) object["pageable_copy_path"] = pageable;
    finish(options->common, profile, object, text);
  });
}

// ---- ferry bench memory ----------------------------------------------------------------------------

void add_memory_bench(CLI::App& bench) {
  auto options = std::make_shared<CommonOptions>();
  CLI::App* command =
      bench.add_subcommand("memory", "Device memory bandwidth: copy and add within one device (bytes read + written)");
  command->footer(
      "copy: dst.copy_(src), 2 x N bytes per run; add: a.add_(b), 3 x N bytes per run (two reads, one write).\n"
      "Example: ferry bench memory --device cpu --sizes 16MB,256MB");
  add_common_options(command, *options, "Buffer sizes, comma-separated: 4MB,64MB,256MB (default 4 MB..256 MB)");
  command->callback([options] {
    const RunContext context = run_context(*options, false, true);
    const ferry::Device device = context.device;
    ferry::Profile profile = ferry::new_profile(device);
    ferry::DeviceProfile& measured = profile.device(device);
    measured.memory_copy = ferry::measure_memory_copy(device, context.measure);
    measured.memory_add = ferry::measure_memory_add(device, context.measure);

    Json object{{"bench", "memory"}, {"device", device.str()}, {"name", measured.name},
                {"repeats", options->repeats}};
    object["copy"] = {{"bytes_per_second", measured.memory_copy.rate},
                      {"points", points_json(measured.memory_copy, "bytes", "bytes_per_second")}};
    object["add"] = {{"bytes_per_second", measured.memory_add.rate},
                     {"points", points_json(measured.memory_add, "bytes", "bytes_per_second")}};

    std::string text = fmt::format("ferry bench memory: {}; medians of up to {} runs; bytes read + written\n",
                                   device_line(device), options->repeats);
    text += fmt::format("{:>10}  {:>26}  {:>26}\n", "size", "copy (2 x size)", "add (3 x size)");
    for (std::size_t row = 0; row < measured.memory_copy.points.size(); ++row) {
      const ferry::RatePoint& copy = measured.memory_copy.points[row];
      const ferry::RatePoint& add = measured.memory_add.points[row];
      text += fmt::format("{:>10}  {:>12} {:>13}  {:>12} {:>13}\n", ferry::format_bytes(copy.size),
                          ferry::format_seconds(copy.seconds), ferry::format_bandwidth(copy.rate),
                          ferry::format_seconds(add.seconds), ferry::format_bandwidth(add.rate));
    }
    text += fmt::format("at the largest size: copy {}, add {}\n", ferry::format_bandwidth(measured.memory_copy.rate),
                        ferry::format_bandwidth(measured.memory_add.rate));
    finish(*options, profile, object, text);
  });
}

// ---- ferry bench gemm ------------------------------------------------------------------------------

void add_gemm_bench(CLI::App& bench) {
  auto options = std::make_shared<CommonOptions>();
  CLI::App* command = bench.add_subcommand("gemm", "float32 GEMM FLOP/s: n x n times n x n, n = 256..4096");
  command->footer("FLOP/s = 2 n^3 / time, medians. TF32 is off: these are float32 numbers.\n"
                  "Example: ferry bench gemm --device cpu --sizes 256,1024");
  add_common_options(command, *options, "Matrix sizes n, comma-separated: 256,1024,4096 (default 256..4096)");
  command->callback([options] {
    const RunContext context = run_context(*options, false, false);
    const ferry::Device device = context.device;
    ferry::Profile profile = ferry::new_profile(device);
    ferry::DeviceProfile& measured = profile.device(device);
    measured.gemm = ferry::measure_gemm(device, context.measure);

    Json object{{"bench", "gemm"}, {"device", device.str()}, {"name", measured.name}, {"dtype", "float32"},
                {"repeats", options->repeats}, {"flop_per_second", measured.gemm.rate},
                {"points", points_json(measured.gemm, "n", "flop_per_second")}};
    std::string text = fmt::format("ferry bench gemm: {}; float32, medians of up to {} runs\n", device_line(device),
                                   options->repeats);
    text += fmt::format("{:>8}  {:>12}  {:>14}\n", "n", "time", "GFLOP/s");
    for (const ferry::RatePoint& p : measured.gemm.points) {
      text += fmt::format("{:>8}  {:>12}  {:>14}\n", static_cast<std::int64_t>(p.size), ferry::format_seconds(p.seconds),
                          ferry::format_number(p.rate / 1e9, 4));
    }
    text += fmt::format("best: {} GFLOP/s\n", ferry::format_number(measured.gemm.rate / 1e9, 4));
    finish(*options, profile, object, text);
  });
}

}  // namespace

void register_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure this machine's devices: link copies, memory bandwidth, GEMM FLOP/s (--save keeps a profile), the Golden Rule");
  bench->require_subcommand(1);
  bench->footer(
      "Every bench prints a table, or one JSON object with --json; link, memory and gemm take --save PROFILE.json,\n"
      "which keeps the rates for\n"
      "`ferry plan --profile PROFILE.json transfer ...` and for the device-mismatch hint (FERRY_PROFILE=PROFILE.json).");
  add_link_bench(*bench);
  add_memory_bench(*bench);
  add_gemm_bench(*bench);
  register_bench_allreduce(*bench);  // `ferry bench allreduce` under mpirun (bench_allreduce.cpp)
  register_bench_golden(*bench);     // `ferry bench golden --workload mlp|cnn` (bench_golden.cpp)
}
