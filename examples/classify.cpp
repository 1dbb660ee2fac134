// classify — run a trained model from a ferry checkpoint on Fashion-MNIST test images, without Python.
//
// The checkpoint names its architecture in its settings ("model": fmnist or mlp; both `ferry train` and
// train_mlp write it), so this builds that model, loads the weights, and prints what it sees in the first
// images of the test set (its two likeliest classes for each, with topk), then its accuracy over all of them.
//
//   classify FILE.safetensors [--device auto|cpu|cuda:N|sim] [--show N] [--data DIR]
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <string>
#include <string_view>

#include "ferry/checkpoint.h"
#include "ferry/dataloader.h"
#include "ferry/dataset.h"
#include "example_cli.h"
#include "ferry/ferry.h"
#include "ferry/idx.h"
#include "ferry/trainer.h"

namespace {

const auto& kClasses = ferry::kFashionMnistClasses;

struct Options {
  std::string checkpoint;
  std::string device = "auto";
  std::int64_t show = 10;
  std::string data = ferry::kDefaultFashionMnistDir;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "usage: classify FILE.safetensors [--device auto|cpu|cuda:N|sim] [--show N] [--data DIR]\n";
      std::exit(0);
    }
    if (!arg.starts_with("--")) {
      if (!options.checkpoint.empty()) throw ferry::InvalidArgument("one checkpoint only (see --help)");
      options.checkpoint = arg;
      continue;
    }
    if (i + 1 == argc) throw ferry::InvalidArgument(std::string(arg) + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (arg == "--device") options.device = value;
    else if (arg == "--data") options.data = value;
    else if (arg == "--show") {
      std::size_t used = 0;
      try {
        options.show = std::stoll(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || options.show < 0 || options.show > 10000)
        throw ferry::InvalidArgument("--show wants a whole number from 0 to 10000, not '" + value + "'");
    } else {
      throw ferry::InvalidArgument("unknown option " + std::string(arg) + " (see --help)");
    }
  }
  if (options.checkpoint.empty()) throw ferry::InvalidArgument("which checkpoint? (see --help)");
  return options;
}

int run(const Options& options) {
  using namespace ferry;
  const Device device = Device::parse(options.device);

  // Which model wrote the file, then that model with its weights (strict: every tensor, every shape).
  const CheckpointContents contents = read_checkpoint_contents(options.checkpoint);
  const auto named = contents.settings.find("model");
  const std::string model_name = named == contents.settings.end() ? "fmnist" : named->second;
  auto model = make_model(model_name, {.device = device});
  load_checkpoint(options.checkpoint, *model, /*optimizer=*/nullptr);
  model->eval();  // BatchNorm uses its running statistics
  autograd::NoGradGuard no_grad;

  const Dataset test_set = load_fashion_mnist(options.data, /*train=*/false);
  if (options.show > 0) {
    const Dataset first = take(test_set, options.show);
    // One crossing in (the images), two out (the two likeliest classes of each and their probabilities, read
    // as host tensors).
    const auto [confidence, guesses] = topk(softmax((*model)(first.images.to(device)), 1), 2, 1);  // (N, 2), (N, 2)
    const Tensor predicted = guesses.cpu(), probability = confidence.cpu();
    const auto percent = [&](std::int64_t i, std::int64_t k) {
      const double p = probability.select(0, i).select(0, k).item<double>();
      return std::to_string(std::lround(100 * p)) + " %";
    };
    for (std::int64_t i = 0; i < first.size(); ++i) {
      const auto guess = predicted.select(0, i).select(0, 0).item<std::int64_t>();
      const auto runner_up = predicted.select(0, i).select(0, 1).item<std::int64_t>();
      const auto truth = first.labels.select(0, i).item<std::int64_t>();
      std::cout << "  image " << std::setw(4) << i << ": " << std::setw(11) << kClasses[guess] << " ("
                << percent(i, 0) << "; next " << kClasses[runner_up] << ", " << percent(i, 1) << ")"
                << (guess == truth ? "" : std::string("   (it is a ") + kClasses[truth] + ")") << "\n";
    }
  }
  DataLoader loader(test_set, {.batch_size = 1000, .shuffle = false, .device = device});
  std::cout << model_name << " from " << options.checkpoint << " on " << device.str() << ": test accuracy "
            << evaluate_accuracy(*model, loader) << " (" << test_set.size() << " images)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return example::guarded_main("classify", [&] { return run(parse(argc, argv)); });
}
