// train_command.cpp — `ferry train`: the fmnist CNN on Fashion-MNIST on the best device, with the
// ledger's account of where the time went. `ferry eval` and `ferry inspect` read its checkpoints.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "ferry/checkpoint.h"
#include "ferry/cost_model.h"
#include "ferry/idx.h"
#include "ferry/ledger.h"
#include "ferry/random.h"
#include "ferry/trainer.h"
#include "plot.h"

namespace {

struct TrainArgs {
  std::string device = "auto";
  std::string placement = "resident";
  std::string data = ferry::kDefaultFashionMnistDir;
  std::string plot_path;
  std::string trace_path;
  std::int64_t limit_train = -1, limit_test = -1;
  bool json = false;
  bool quiet = false;
  ferry::TrainOptions options;
};

void print_report(const ferry::TrainResult& r, std::FILE* out) {
  const double total = r.t_transfer_s + r.t_compute_s + r.t_sync_s;
  auto pct = [&](double t) { return total > 0 ? 100.0 * t / total : 0.0; };
  fmt::print(out, "\nWhere the time went on {} ({} steps, {} host syncs, {} bytes host->device, {} bytes device->host):\n",
             r.device.str(), r.steps, r.syncs, r.bytes_host_to_device, r.bytes_device_to_host);
  fmt::print(out, "  transfer  {:8.2f} s  {:5.1f} %   (getting each batch onto the device)\n", r.t_transfer_s,
             pct(r.t_transfer_s));
  fmt::print(out, "  compute   {:8.2f} s  {:5.1f} %   (forward, backward, optimizer step)\n", r.t_compute_s,
             pct(r.t_compute_s));
  fmt::print(out, "  sync      {:8.2f} s  {:5.1f} %   (reading values back to the host)\n", r.t_sync_s, pct(r.t_sync_s));
  if (r.t_compute_s > 0 && !r.device.is_cpu()) {
    const double efficiency = ferry::cost::golden_rule(1.0, r.t_compute_s, std::max(r.t_transfer_s, 1e-12)).efficiency;
    fmt::print(out, "  Golden Rule: S_real = S / (1 + T_transfer / T_compute) = S x {:.3f}\n", efficiency);
    if (pct(r.t_transfer_s) > 10)
      fmt::print(out, "  advice: copies take {:.0f} % of the time: keep the dataset resident (--placement resident) "
                      "or prefetch from pinned memory\n", pct(r.t_transfer_s));
  }
}

}  // namespace

void register_train_command(CLI::App& app) {
  static TrainArgs a;
  auto* cmd = app.add_subcommand(
      "train",
      "Train the fmnist CNN (3 x [Conv3x3, BatchNorm, ReLU, MaxPool], Linear 1152->10) on Fashion-MNIST.\n"
      "The data goes to the device once (--placement resident, the sheet's Exercise 3.2), the loss is read\n"
      "back only every --log-every steps (Exercise 5.1), and at the end the ledger says where the time went.\n"
      "Example: ferry train --device auto --epochs 5 --checkpoint fmnist.safetensors");
  auto& o = a.options;
  cmd->add_option("--device", a.device, "auto | cpu | cuda[:N] | sim[:N]")->capture_default_str();
  cmd->add_option("--epochs", o.epochs, "Passes over the 60000 training images")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--batch", o.batch_size, "Images per step")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--lr", o.lr, "Peak learning rate (SGD)")->capture_default_str();
  cmd->add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "L2 weight decay")->capture_default_str();
  cmd->add_option("--schedule", o.schedule, "Learning rate schedule: cosine | constant")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed for initialisation and shuffling")->capture_default_str();
  cmd->add_option("--log-every", o.log_every, "Steps between loss read-backs (each one is a host sync)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--placement", a.placement, "resident | prefetch | per-step")->capture_default_str();
  cmd->add_option("--max-steps", o.max_steps, "Stop after this many steps in all (and checkpoint)");
  cmd->add_option("--checkpoint", o.checkpoint_path, "Write a safetensors checkpoint at each epoch end");
  cmd->add_option("--resume", o.resume_path, "Continue from a checkpoint, bit for bit");
  cmd->add_option("--metrics", o.metrics_path, "Append JSON lines per log step and per epoch");
  cmd->add_option("--plot", a.plot_path, "Write an SVG of the loss curve and accuracy per epoch");
  cmd->add_option("--trace", a.trace_path, "Write the ledger as Chrome trace-event JSON (Perfetto)");
  cmd->add_option("--data", a.data, "Folder with the Fashion-MNIST idx .gz files")->capture_default_str();
  cmd->add_option("--limit-train", a.limit_train, "Use only the first N training images (quick runs)");
  cmd->add_option("--limit-test", a.limit_test, "Use only the first N test images");
  cmd->add_flag("--json", a.json, "Print one JSON object at the end (and nothing else on stdout)");
  cmd->callback([] {
    auto& o = a.options;
    o.device = ferry::Device::parse(a.device);
    o.placement = ferry::parse_placement(a.placement);
    ferry::manual_seed(o.seed);
    ferry::Dataset train_set = ferry::load_fashion_mnist(a.data, true);
    ferry::Dataset test_set = ferry::load_fashion_mnist(a.data, false);
    if (a.limit_train > 0) train_set = ferry::take(train_set, a.limit_train);
    if (a.limit_test > 0) test_set = ferry::take(test_set, a.limit_test);
    auto model = ferry::make_fmnist_model();
    std::ostringstream sink;
    std::ostream& log = a.json ? static_cast<std::ostream&>(sink) : std::cout;
    const ferry::TrainResult r = ferry::train(*model, train_set, test_set, o, log);
    if (!a.plot_path.empty()) write_training_plot(a.plot_path, r);
    if (!a.trace_path.empty()) write_trace_file(a.trace_path);
    if (a.json) {
      nlohmann::json epochs = nlohmann::json::array();
      for (const auto& e : r.history)
        epochs.push_back({{"epoch", e.epoch}, {"train_loss", e.train_loss}, {"train_accuracy", e.train_accuracy},
                          {"test_accuracy", e.test_accuracy}, {"seconds", e.seconds}});
      fmt::print("{}\n", nlohmann::json{{"device", r.device.str()}, {"epochs", r.epochs}, {"steps", r.steps},
                                        {"test_accuracy", r.test_accuracy}, {"seconds_per_epoch", r.seconds_per_epoch},
                                        {"t_transfer_s", r.t_transfer_s}, {"t_compute_s", r.t_compute_s},
                                        {"t_sync_s", r.t_sync_s}, {"syncs", r.syncs},
                                        {"bytes_host_to_device", r.bytes_host_to_device},
                                        {"bytes_device_to_host", r.bytes_device_to_host},
                                        {"placement", a.placement}, {"history", epochs}}
                             .dump());
    } else {
      fmt::print("\nfinal test accuracy {:.2f} %, {:.1f} s per epoch on {}\n", 100 * r.test_accuracy,
                 r.seconds_per_epoch, r.device.str());
      print_report(r, stdout);
    }
  });
}
