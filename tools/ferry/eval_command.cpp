// eval_command.cpp — `ferry eval` (a checkpoint's test accuracy), `ferry inspect` (what a safetensors file holds)
// and `ferry convert` (a copy in another floating dtype). A malformed file is one error line and a non-zero status.
#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "ferry/checkpoint.h"
#include "ferry/dataset.h"
#include "ferry/idx.h"
#include "ferry/trainer.h"

void register_eval_command(CLI::App& app) {
  static std::string checkpoint, device_text = "auto", data = ferry::kDefaultFashionMnistDir, model_option;
  static bool json = false;
  static std::int64_t limit_test = -1;  // -1: every test image (load_fashion_mnist's "all"); else >= 1
  auto* cmd = app.add_subcommand("eval", "Test accuracy of a model on Fashion-MNIST's 10000 test images: a `ferry train`\n"
                                         "checkpoint, or a weights-only safetensors file (a PyTorch state_dict of the\n"
                                         "same model, saved with safetensors) with --model.\n"
                                         "Example: ferry eval --checkpoint fmnist.safetensors");
  cmd->add_option("--checkpoint", checkpoint, "A checkpoint written by ferry train --checkpoint, or weights only")
      ->required();
  cmd->add_option("--model", model_option,
                  "fmnist | mlp: the model a weights-only file holds (default fmnist); a ferry checkpoint names its own");
  cmd->add_option("--device", device_text, "auto | cpu | cuda[:N] | sim[:N]")->capture_default_str();
  cmd->add_option("--data", data, "Folder with the Fashion-MNIST idx files (.gz, or uncompressed)")->capture_default_str();
  cmd->add_option("--limit-test", limit_test, "Score only the first N test images (quick checks; as ferry train's)")
      ->check(whole_number_at_least(1));
  cmd->add_flag("--json", json,
                "Print one JSON object: {\"device\", \"model\", \"test_accuracy\", \"per_class\": [{\"class\",\n"
                "\"images\", \"accuracy\"}], \"confusion\": 10 rows (true class) of 10 counts (predicted class)}");
  cmd->callback([] {
    const ferry::Device device = ferry::Device::parse(device_text);
    std::map<std::string, std::string> metadata;
    const ferry::nn::NamedTensors tensors = ferry::read_tensors(checkpoint, &metadata);
    // A file `ferry train` wrote says so ("format") and names its model; any other safetensors file is read as a
    // state_dict under PyTorch's names (ferry's names are PyTorch's), for the model --model names.
    const bool from_ferry = metadata.count("format") > 0 || metadata.count("global_step") > 0;
    const auto named = metadata.find("model");
    const std::string saved_model = from_ferry && named != metadata.end() ? named->second : "";
    FERRY_CHECK(model_option.empty() || saved_model.empty() || model_option == saved_model, InvalidArgument,
                "--model ", model_option, ": checkpoint '", ferry::detail::printable(checkpoint), "' holds the ",
                ferry::detail::printable(saved_model), " model (leave --model out for a ferry checkpoint)");
    const std::string model_name = !saved_model.empty() ? saved_model : model_option.empty() ? "fmnist" : model_option;
    if (model_name != "fmnist" && model_name != "mlp") {
      if (!from_ferry) {
        throw ferry::InvalidArgument(ferry::detail::concat("--model ", ferry::detail::printable(model_name),
                                                           ": ferry builds fmnist | mlp"));
      }
      throw ferry::FormatError(ferry::detail::concat(
          "Checkpoint '", ferry::detail::printable(checkpoint), "': its setting 'model' is '",
          ferry::detail::printable(model_name),
          "', which ferry does not build (fmnist | mlp); the file is damaged or was not written by ferry train"));
    }
    auto model = ferry::make_model(model_name);
    if (from_ferry) {
      ferry::load_checkpoint(tensors, metadata, checkpoint, *model, nullptr);
    } else {
      try {
        model->load_state_dict(tensors, true);
      } catch (const ferry::nn::StateDictError& e) {
        throw ferry::nn::StateDictError(
            ferry::detail::concat("'", ferry::detail::printable(checkpoint), "' has no ferry metadata, so it was read ",
                                  "as the weights of the ", model_name, " model (--model), and they do not fit: ",
                                  e.what()),
            e.missing_keys(), e.unexpected_keys(), e.mismatched_keys());
      }
    }
    model->to(device);
    ferry::Dataset test_set = ferry::load_fashion_mnist(data, false, limit_test);
    ferry::DataLoader loader(std::move(test_set),
                             {.batch_size = 1000, .shuffle = false, .placement = ferry::Placement::Resident, .device = device});
    // One pass, one read: the confusion matrix (row = the true class, column = the guess), from which the rest.
    const ferry::Tensor confusion = ferry::confusion_matrix(*model, loader, 10);
    const std::vector<std::int64_t> cells = confusion.to_vector<std::int64_t>();
    const auto at = [&](std::size_t label, std::size_t guess) { return cells[label * 10 + guess]; };
    std::int64_t right = 0;
    std::vector<std::int64_t> per_class_total(10, 0);
    for (std::size_t label = 0; label < 10; ++label) {
      right += at(label, label);
      for (std::size_t guess = 0; guess < 10; ++guess) per_class_total[label] += at(label, guess);
    }
    const double accuracy = static_cast<double>(right) / static_cast<double>(loader.size());
    const auto class_accuracy = [&](std::size_t label) {
      return per_class_total[label] > 0 ? static_cast<double>(at(label, label)) / static_cast<double>(per_class_total[label])
                                        : NAN;
    };
    if (json) {
      nlohmann::json per_class = nlohmann::json::array(), matrix = nlohmann::json::array();
      for (std::size_t label = 0; label < 10; ++label) {
        per_class.push_back({{"class", ferry::kFashionMnistClasses[label]}, {"images", per_class_total[label]},
                             {"accuracy", class_accuracy(label)}});
        matrix.push_back(std::vector<std::int64_t>(cells.begin() + static_cast<std::ptrdiff_t>(label * 10),
                                                   cells.begin() + static_cast<std::ptrdiff_t>(label * 10 + 10)));
      }
      fmt::print("{}\n", nlohmann::json{{"test_accuracy", accuracy}, {"device", device.str()}, {"model", model_name},
                                        {"per_class", per_class}, {"confusion", matrix}}.dump());
      return;
    }
    fmt::print("test accuracy {:.2f} % ({} images, {} model{}, {})\n", 100 * accuracy, loader.size(), model_name,
               from_ferry ? "" : ", weights only", device.str());
    // Each class: its accuracy, and the class its mistakes go to most.
    fmt::print("\n{:<12} {:>8}  most often taken for\n", "class", "accuracy");
    for (std::size_t label = 0; label < 10; ++label) {
      std::size_t worst = label;
      for (std::size_t guess = 0; guess < 10; ++guess)
        if (guess != label && (worst == label || at(label, guess) > at(label, worst))) worst = guess;
      const std::int64_t wrong = per_class_total[label] - at(label, label);
      fmt::print("{:<12} {:>7.1f} %  {}\n", ferry::kFashionMnistClasses[label], 100 * class_accuracy(label),
                 wrong == 0 ? std::string("-")
                            : fmt::format("{} ({} of {} images)", ferry::kFashionMnistClasses[worst], at(label, worst),
                                          per_class_total[label]));
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

void register_convert_command(CLI::App& app) {
  static std::string path, output, dtype_text;
  static bool json = false;
  auto* cmd = app.add_subcommand(
      "convert",
      "Write a copy of a safetensors file with its floating tensors in another dtype: bfloat16 or float16 halve a\n"
      "float32 file (for a release, for `ferry eval`, or for PyTorch), float32 widens one back exactly. Names,\n"
      "integer and bool tensors, and the metadata are kept. A converted training checkpoint still evaluates; resume\n"
      "from the float32 original (the optimizer's state would be rounded too).\n"
      "Example: ferry convert fmnist.safetensors --dtype bfloat16 --output fmnist.bf16.safetensors");
  cmd->add_option("file", path, "A .safetensors file")->required();
  cmd->add_option("--dtype", dtype_text, "float32 | float64 | float16 (half) | bfloat16 (bf16)")->required();
  cmd->add_option("--output", output, "The file to write (atomically: it may be FILE itself)")->required();
  cmd->add_flag("--json", json, "Print one JSON object: tensors, converted, dtype, bytes_before, bytes_after");
  cmd->callback([] {
    const ferry::DType dtype = ferry::parse_dtype(dtype_text);
    FERRY_CHECK(ferry::is_floating(dtype), InvalidArgument, "--dtype: convert writes floating tensors, and ",
                ferry::dtype_name(dtype), " is not floating (float32, float64, float16, bfloat16)");
    check_writable(output, "--output");
    std::map<std::string, std::string> metadata;
    const ferry::nn::NamedTensors tensors = ferry::read_tensors(path, &metadata);
    ferry::nn::NamedTensors converted;
    std::int64_t count = 0, before = 0, after = 0;
    for (const auto& [name, t] : tensors) {
      const bool change = ferry::is_floating(t.dtype()) && t.dtype() != dtype;
      converted.emplace_back(name, change ? t.to(dtype) : t);
      count += change ? 1 : 0;
      before += static_cast<std::int64_t>(t.nbytes());
      after += static_cast<std::int64_t>(converted.back().second.nbytes());
    }
    ferry::write_tensors(output, converted, metadata);
    if (json) {
      fmt::print("{}\n", nlohmann::json{{"tensors", tensors.size()}, {"converted", count},
                                        {"dtype", ferry::dtype_name(dtype)}, {"bytes_before", before},
                                        {"bytes_after", after}}.dump());
      return;
    }
    fmt::print("{} -> {}: {} of {} tensors to {}, {} -> {} bytes of tensor data\n", path, output, count,
               tensors.size(), ferry::dtype_name(dtype), before, after);
  });
}
