// train_command.cpp — `ferry train`. Until the trainer lands this runs a short demo of the core:
// a tensor made on the host, moved to the best device, computed on, and read back, with the ledger.
#include <fmt/format.h>

#include "commands.h"
#include "ferry/factories.h"
#include "ferry/ledger.h"
#include "ferry/ops.h"
#include "ferry/random.h"

void register_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train the fmnist CNN on Fashion-MNIST on the best device");
  static std::string device_text = "auto";
  cmd->add_option("--device", device_text, "auto | cpu | cuda[:N] | sim[:N]")->capture_default_str();
  cmd->callback([] {
    const ferry::Device device = ferry::Device::parse(device_text);
    fmt::print("ferry train: using {}\n", device.str());
    ferry::manual_seed(0);
    ferry::Tensor x = ferry::randn({1000, 1000});
    ferry::Tensor on_device = x.to(device);
    ferry::Tensor y = ferry::matmul(on_device, on_device);
    const double total = ferry::sum(y).item<double>();
    const auto t = ferry::Ledger::global().totals();
    fmt::print("demo: (1000x1000 float32 = {} bytes) @ itself on {}: sum = {:.3f}; ledger: {} transfers, {} syncs\n",
               x.nbytes(), device.str(), total, t.transfers, t.syncs);
  });
}
