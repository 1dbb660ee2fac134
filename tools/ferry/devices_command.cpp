// devices_command.cpp — `ferry devices`: every device present, with what the speedup formula needs.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "ferry/backend.h"
#include "ferry/device.h"

void register_devices_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("devices", "List the devices present: cores, clock, memory, host link");
  static bool as_json = false;
  cmd->add_flag("--json", as_json, "Print one JSON object");
  cmd->callback([] {
    nlohmann::json list = nlohmann::json::array();
    for (const ferry::Device& d : ferry::available_devices()) {
      const ferry::DeviceProperties p = ferry::backend(d).properties(d.index);
      list.push_back({{"device", d.str()},
                      {"name", p.name},
                      {"cores", p.cores},
                      {"clock_hz", p.clock_hz},
                      {"multiprocessors", p.multiprocessors},
                      {"memory_bytes", p.memory_bytes},
                      {"link", p.link},
                      {"link_bytes_per_second", p.link_bytes_per_second}});
    }
    if (as_json) {
      fmt::print("{}\n", nlohmann::json{{"devices", list}}.dump());
      return;
    }
    for (const auto& d : list) {
      fmt::print("{:<8} {}\n", d["device"].get<std::string>(), d["name"].get<std::string>());
      fmt::print("         {} cores at {:.2f} GHz, {:.1f} GB memory", d["cores"].get<int>(),
                 d["clock_hz"].get<double>() / 1e9, d["memory_bytes"].get<double>() / 1e9);
      if (d["link_bytes_per_second"].get<double>() > 0)
        fmt::print(", host link {} at {:.1f} GB/s", d["link"].get<std::string>(),
                   d["link_bytes_per_second"].get<double>() / 1e9);
      fmt::print("\n");
    }
  });
}
