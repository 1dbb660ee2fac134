// train_mlp — a training loop of your own on ferry's library, outside ferry's tree (examples/CMakeLists.txt).
//
// It trains DESIGN.md's `mlp` (784 -> 1024 -> 1024 -> 10) on Fashion-MNIST with the sheet's lessons written
// out: the dataset resident on the device (Exercise 3.2), the loss summed on the device and read back only
// at log steps (Exercise 5.1), and a per-step budget that makes a stray copy or sync an error instead of a
// silent slowdown. It writes a checkpoint that `ferry eval`, `classify` and PyTorch all load.
//
//   train_mlp [--device auto|cpu|cuda:N|sim] [--epochs N] [--train-images N] [--data DIR] [--out FILE]
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>

#include "ferry/checkpoint.h"
#include "ferry/dataloader.h"
#include "ferry/dataset.h"
#include "example_cli.h"
#include "ferry/ferry.h"
#include "ferry/idx.h"
#include "ferry/nn/loss.h"
#include "ferry/optim.h"
#include "ferry/phase.h"
#include "ferry/report.h"
#include "ferry/trainer.h"

namespace {

struct Options {
  std::string device = "auto";
  std::int64_t epochs = 1;
  std::int64_t train_images = 60000;  // all of them
  std::string data = ferry::kDefaultFashionMnistDir;
  std::string out = "mlp.safetensors";
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "usage: train_mlp [--device auto|cpu|cuda:N|sim] [--epochs N] [--train-images N] [--data DIR]"
                   " [--out FILE]\n";
      std::exit(0);
    }
    if (i + 1 == argc) throw ferry::InvalidArgument(std::string(arg) + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (arg == "--device") options.device = value;
    else if (arg == "--epochs") options.epochs = example::whole(arg, value, 1);
    else if (arg == "--train-images") options.train_images = example::whole(arg, value, 1);
    else if (arg == "--data") options.data = value;
    else if (arg == "--out") options.out = value;
    else throw ferry::InvalidArgument("unknown option " + std::string(arg) + " (see --help)");
  }
  return options;
}

int run(const Options& options) {
  using namespace ferry;
  const Device device = Device::parse(options.device);
  manual_seed(0);

  const Dataset train_set = load_fashion_mnist(options.data, /*train=*/true, options.train_images);
  const Dataset test_set = load_fashion_mnist(options.data, /*train=*/false);

  auto model = make_mlp_model({.device = device});  // parameters drawn on the device: no copy
  optim::SGD sgd(model->parameters(), {.lr = 0.05, .momentum = 0.9});

  // Resident: the whole training set crosses the link once, here, instead of one batch every step.
  DataLoader loader(train_set, {.batch_size = 128, .shuffle = true, .seed = 0, .placement = Placement::Resident,
                                .device = device});
  std::cout << "train_mlp: " << train_set.size() << " images on " << device.str() << ", "
            << loader.resident_bytes() << " bytes resident, " << loader.batches_per_epoch() << " steps per epoch\n";

  // Inside a step: no host->device bytes at all (the data is resident), and at most one host sync (the log
  // step's read-back). Anything more throws SyncPolicyViolation naming what crossed or synchronised.
  Ledger::global().set_budget({.max_syncs = 1, .max_host_to_device_bytes = 0});

  constexpr std::int64_t kLogEvery = 100;
  std::int64_t step = 0;
  for (std::int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    model->train();
    loader.start_epoch(epoch);  // the epoch's order crosses once, outside the steps
    Tensor loss_sum;            // on the device: summed without a sync
    std::int64_t summed = 0;
    for (std::int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
      Step scope(step);  // the ledger's records and the report's per-step account, the budget's scope
      Batch batch;
      loader.next(batch);  // inside the step: a per-step copy here would break the budget
      {
        Phase compute(PhaseKind::Compute, device);  // host time; on cuda the kernels run on behind it
        sgd.zero_grad();
        Tensor loss = nn::functional::cross_entropy((*model)(batch.images), batch.labels);
        loss.backward();
        sgd.step();
        loss_sum = loss_sum.defined() ? add(loss_sum, loss.detach()) : loss.detach();
        ++summed;
      }
      if (++step % kLogEvery == 0) {  // the only sync of the loop: one number, every 100th step
        Phase sync(PhaseKind::Sync, device, "log");
        std::cout << "  step " << step << "  loss " << loss_sum.item<double>() / static_cast<double>(summed)
                  << "\n";
        loss_sum = Tensor();
        summed = 0;
      }
    }
    Ledger::global().set_budget({});  // evaluation reads back its count: outside the budget
    DataLoader test_loader(test_set, {.batch_size = 1000, .shuffle = false, .device = device});
    std::cout << "epoch " << epoch + 1 << ": test accuracy " << evaluate_accuracy(*model, test_loader) << "\n";
    Ledger::global().set_budget({.max_syncs = 1, .max_host_to_device_bytes = 0});
  }
  Ledger::global().set_budget({});

  // "model" names the architecture, so `ferry eval --checkpoint FILE` and classify build the right one.
  save_checkpoint(options.out, *model, &sgd,
                  {.progress = {.epoch = options.epochs, .batch_in_epoch = 0, .global_step = step},
                   .generator = generator_state(),
                   .settings = {{"model", "mlp"}, {"lr", "0.05"}, {"momentum", "0.9"}, {"batch", "128"}}});
  std::cout << "wrote " << options.out << "\n\n" << report_text(make_report({.warmup_steps = 2})) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return example::guarded_main("train_mlp", [&] { return run(parse(argc, argv)); });
}
