// devices_command.cpp — `ferry devices`: every device present, with what the speedup formula needs,
// and the sheet's theoretical S of each accelerator against the host. Not here: measured rates (ferry bench).
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "ferry/backend.h"
#include "ferry/cost_model.h"
#include "ferry/device.h"

namespace {

// Exercise 2.3 on real devices: S = (f_acc x c_acc) / (f_host x c_host). None when a clock or a core
// count is unknown (some virtual machines report no clock).
std::optional<double> theoretical_speedup(const ferry::DeviceProperties& accelerator,
                                          const ferry::DeviceProperties& host) {
  if (accelerator.clock_hz <= 0 || accelerator.cores <= 0 || host.clock_hz <= 0 || host.cores <= 0) return std::nullopt;
  return ferry::cost::theoretical_speedup(accelerator.clock_hz, accelerator.cores, host.clock_hz, host.cores);
}

}  // namespace

void register_devices_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "List the devices present: cores, clock, memory, host link, and the "
                                            "theoretical speedup S of each accelerator against the host");
  cmd->footer("S = (clock x cores of the accelerator) / (clock x cores of the host), Exercise 2.3: an upper bound.\n"
              "sim devices compute with the host's cores, so their S is 1; what they show is the link.");
  static bool as_json = false;
  cmd->add_flag("--json", as_json, "Print one JSON object");
  cmd->callback([] {
    const ferry::DeviceProperties host = ferry::backend(ferry::kCPU).properties(0);
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const ferry::Device& d : ferry::available_devices()) {
      const ferry::DeviceProperties p = ferry::backend(d).properties(d.index);
      nlohmann::ordered_json entry{{"device", d.str()},
                                   {"name", p.name},
                                   {"cores", p.cores},
                                   {"clock_hz", p.clock_hz},
                                   {"multiprocessors", p.multiprocessors},
                                   {"memory_bytes", p.memory_bytes},
                                   {"memory_bytes_per_second", p.memory_bytes_per_second},
                                   {"link", p.link},
                                   {"link_bytes_per_second", p.link_bytes_per_second},
                                   {"libraries", p.libraries}};
      if (!d.is_cpu()) {
        const std::optional<double> speedup = theoretical_speedup(p, host);
        entry["speedup_theoretical"] = speedup ? nlohmann::ordered_json(*speedup) : nlohmann::ordered_json(nullptr);
      }
      list.push_back(entry);
    }
    // No cuda device: say why (no CUDA backend in this build, or the driver's answer), as `ferry train --device
    // auto` does, rather than leave the user to wonder where cuda:0 went.
    const std::string no_cuda = ferry::unavailable_reason(ferry::DeviceType::CUDA);
    if (as_json) {
      nlohmann::ordered_json object{{"devices", list}};
      if (!no_cuda.empty()) object["cuda_unavailable_reason"] = no_cuda;
      fmt::print("{}\n", object.dump());
      return;
    }
    for (const auto& d : list) {
      fmt::print("{:<8} {}\n", d["device"].get<std::string>(), d["name"].get<std::string>());
      fmt::print("         {} cores at {:.2f} GHz", d["cores"].get<int>(), d["clock_hz"].get<double>() / 1e9);
      if (d["multiprocessors"].get<int>() > 0) fmt::print(" ({} multiprocessors)", d["multiprocessors"].get<int>());
      fmt::print(", {:.1f} GB memory", d["memory_bytes"].get<double>() / 1e9);
      if (d["memory_bytes_per_second"].get<double>() > 0)
        fmt::print(" at {:.0f} GB/s", d["memory_bytes_per_second"].get<double>() / 1e9);
      if (d["link_bytes_per_second"].get<double>() > 0)
        fmt::print(", host link {} at {:.1f} GB/s", d["link"].get<std::string>(),
                   d["link_bytes_per_second"].get<double>() / 1e9);
      fmt::print("\n");
      if (!d["libraries"].get<std::string>().empty())
        fmt::print("         libraries: {}\n", d["libraries"].get<std::string>());
      if (d.contains("speedup_theoretical")) {
        if (d["speedup_theoretical"].is_null()) {
          fmt::print("         theoretical S against the host: unknown (a clock or core count is not reported)\n");
        } else {
          fmt::print("         theoretical S against the host: {:.4g}x  (clock x cores, Exercise 2.3; an upper bound)\n",
                     d["speedup_theoretical"].get<double>());
        }
      }
    }
    if (!no_cuda.empty()) fmt::print("{:<8} none: {}\n", "cuda", no_cuda);
  });
}
