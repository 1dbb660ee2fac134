// eval_command.cpp — `ferry eval` (a checkpoint's test accuracy) and `ferry inspect` (what a
// safetensors file holds). A malformed file is one error line and a non-zero status.
#include <fmt/format.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "ferry/checkpoint.h"
#include "ferry/idx.h"
#include "ferry/trainer.h"

void register_eval_command(CLI::App& app) {
  static std::string checkpoint, device_text = "auto", data = ferry::kDefaultFashionMnistDir;
  static bool json = false;
  auto* cmd = app.add_subcommand("eval", "Test accuracy of a `ferry train` checkpoint on Fashion-MNIST's 10000 test images.\n"
                                         "Example: ferry eval --checkpoint fmnist.safetensors");
  cmd->add_option("--checkpoint", checkpoint, "A checkpoint written by ferry train --checkpoint")->required();
  cmd->add_option("--device", device_text, "auto | cpu | cuda[:N] | sim[:N]")->capture_default_str();
  cmd->add_option("--data", data, "Folder with the Fashion-MNIST idx .gz files")->capture_default_str();
  cmd->add_flag("--json", json, "Print one JSON object: {\"device\", \"model\", \"test_accuracy\"}");
  cmd->callback([] {
    const ferry::Device device = ferry::Device::parse(device_text);
    // The model the checkpoint's run trained (its "model" setting; fmnist when the file does not say).
    const auto settings = ferry::read_checkpoint_contents(checkpoint).settings;
    const auto named = settings.find("model");
    const std::string model_name = named == settings.end() ? "fmnist" : named->second;
    FERRY_CHECK(model_name == "fmnist" || model_name == "mlp", FormatError, "Checkpoint '",
                ferry::detail::printable(checkpoint), "': its setting 'model' is '", ferry::detail::printable(model_name),
                "', which ferry does not build (fmnist | mlp); the file is damaged or was not written by ferry train");
    auto model = ferry::make_model(model_name);
    ferry::load_checkpoint(checkpoint, *model, nullptr);
    model->to(device);
    ferry::DataLoader loader(ferry::load_fashion_mnist(data, false),
                             {.batch_size = 1000, .shuffle = false, .placement = ferry::Placement::Resident, .device = device});
    const double accuracy = ferry::evaluate_accuracy(*model, loader);
    if (json) {
      fmt::print("{}\n",
                 nlohmann::json{{"test_accuracy", accuracy}, {"device", device.str()}, {"model", model_name}}.dump());
    } else {
      fmt::print("test accuracy {:.2f} % ({} images, {} model, {})\n", 100 * accuracy, loader.size(), model_name,
                 device.str());
    }
  });
}

void register_inspect_command(CLI::App& app) {
  static std::string path;
  static bool json = false;
  auto* cmd = app.add_subcommand("inspect", "List the tensors (dtype, shape, bytes) and metadata of a safetensors file.\n"
                                            "Example: ferry inspect fmnist.safetensors");
  cmd->add_option("file", path, "A .safetensors file")->required();
  cmd->add_flag("--json", json, "Print one JSON object");
  cmd->callback([] {
    std::map<std::string, std::string> metadata;
    const ferry::nn::NamedTensors tensors = ferry::read_tensors(path, &metadata);
    std::int64_t total = 0;
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [name, t] : tensors) {
      total += static_cast<std::int64_t>(t.nbytes());
      list.push_back({{"name", name}, {"dtype", ferry::dtype_name(t.dtype())}, {"shape", t.shape()}, {"bytes", t.nbytes()}});
    }
    if (json) {
      fmt::print("{}\n", nlohmann::json{{"tensors", list}, {"metadata", metadata}, {"bytes", total}}.dump());
      return;
    }
    for (const auto& e : list)
      fmt::print("{:<40} {:<8} {:<20} {:>12} bytes\n", e["name"].get<std::string>(), e["dtype"].get<std::string>(),
                 e["shape"].dump(), e["bytes"].get<std::int64_t>());
    fmt::print("{} tensors, {} bytes\n", tensors.size(), total);
    for (const auto& [key, value] : metadata) fmt::print("  {} = {}\n", key, value);
  });
}
