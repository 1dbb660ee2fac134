// bench_golden.cpp — `ferry bench golden --workload mlp|cnn`: the sheet's experiment run for real. One SGD step of
// the workload timed on the cpu and on a device with the data resident, with a pageable copy of the batch every
// step (and the sheet's serial loop: each copy after the previous step has finished), with pinned prefetch (cuda),
// and with item() every step; then the measured S and S_real beside the Golden Rule's prediction
// S / (1 + T_transfer / T_compute) from the measured parts, the overlap model T_cpu / max(T_compute, T_transfer),
// the rule with one sync bubble a step beside the serial loop, and the errors in percent; and the step's work
// (FLOPs, and a model of the bytes it moves) for the floors scripts/gpu-check prints.
// Not here: the formulas (ferry/cost_model.h), the other benches (bench_command.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "ferry/cost_model.h"
#include "ferry/ferry.h"
#include "ferry/nn/conv.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/sequential.h"
#include "ferry/optim.h"
#include "ferry/step_graph.h"
#include "ferry/trainer.h"
#include "ferry/trace.h"
#include "ferry/units.h"

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

struct GoldenOptions {
  std::string workload = "cnn";
  std::string device;     // "" = cuda:0, else sim:0
  std::int64_t batch = 0;  // 0 = the workload's (mlp 512, cnn 256)
  int steps = 10, warmup = 2;
  bool json = false;
  std::string trace;
};

// DESIGN.md's workloads: the model, one batch's input shape.
struct Workload {
  std::shared_ptr<ferry::nn::Sequential> model;
  ferry::Shape input;  // (B, ...)
};

Workload make_workload(const std::string& name, std::int64_t batch) {
  if (name == "mlp") return {ferry::make_mlp_model(), {batch > 0 ? batch : 512, 784}};
  if (name == "cnn") return {ferry::make_cnn_model(3, 32), {batch > 0 ? batch : 256, 3, 32, 32}};
  throw ferry::InvalidArgument(fmt::format("--workload must be mlp or cnn, got '{}'", name));
}

// The work of one SGD step of the workload at `batch`, from one walk of a sample through its layers on the cpu:
// what the step's floors on a device are made of, with the rates the device reaches (scripts/gpu-check).
struct StepWork {
  // FLOPs, two per multiply-add: every Conv2d and Linear forward, as many again for their weight gradients, and
  // again for the input gradients of each such layer after the first (the first layer's input needs none).
  double flops = 0;
  // Bytes moved through device memory, by a model of the least a plain (unfused) step does, fp32: the input batch
  // read once; every module's output (views aside) written and read once in forward, and its gradient written and
  // read once in backward (four passes); every parameter in eight (read in forward, read in backward for the input
  // gradient, its gradient written; the momentum update reads weight, gradient and momentum and writes weight and
  // momentum). Fusion saves passes below it; GEMM and convolution re-reads add above it.
  double bytes = 0;
};

StepWork step_work(const std::string& workload, std::int64_t batch) {
  const Workload w = make_workload(workload, 1);
  ferry::autograd::NoGradGuard no_grad;
  w.model->eval();
  ferry::Tensor x = ferry::zeros(w.input);
  double forward = 0, input_gradients = 0;  // FLOPs per sample
  double input = static_cast<double>(x.numel()), activations = 0, parameters = 0;  // elements per sample
  bool first = true;
  for (std::size_t i = 0; i < w.model->size(); ++i) {
    ferry::nn::Module& layer = (*w.model)[i];
    const ferry::Tensor y = layer(x);
    double flops = 0;
    if (const auto* conv = dynamic_cast<const ferry::nn::Conv2d*>(&layer)) {
      flops = 2.0 * static_cast<double>(y.numel()) * static_cast<double>(conv->weight.numel() / conv->weight.size(0));
    } else if (const auto* linear = dynamic_cast<const ferry::nn::Linear*>(&layer)) {
      flops = 2.0 * static_cast<double>(y.numel()) * static_cast<double>(linear->weight.size(1));
    }
    forward += flops;
    if (!first) input_gradients += flops;
    if (flops > 0) first = false;
    if (y.data_ptr() != x.data_ptr()) activations += static_cast<double>(y.numel());  // a view (Flatten) moves nothing
    x = y;
  }
  for (const ferry::Tensor& p : w.model->parameters()) parameters += static_cast<double>(p.numel());
  const double b = static_cast<double>(batch);
  return {.flops = b * (2 * forward + input_gradients), .bytes = 4.0 * (b * (input + 4 * activations) + 8 * parameters)};
}

// One training step's parts on one device: the model there, its optimizer, the step; with `graph`, forward,
// loss, backward and the SGD update are captured after two eager steps and replayed (ferry/step_graph.h), as
// ferry train does (the learning rate then lives on the device).
class Stepper {
 public:
  Stepper(const std::string& workload, std::int64_t batch, ferry::Device device, bool graph = false) : device_(device) {
    ferry::manual_seed(0);
    Workload w = make_workload(workload, batch);
    model_ = w.model;
    model_->to(device);
    model_->train();
    optimizer_ = std::make_unique<ferry::optim::SGD>(
        model_->parameters(), ferry::optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .lr_on_device = graph});
    graph_ = std::make_unique<ferry::StepGraph>(
        model_->parameters(),
        [this](const ferry::Tensor& x, const ferry::Tensor& y) {
          ferry::Tensor loss = ferry::nn::cross_entropy((*model_)(x), y);
          loss.backward();
          optimizer_->step();
          return loss.detach();
        },
        ferry::StepGraphOptions{.enabled = graph});
  }
  // forward, cross-entropy, backward, SGD update; the loss stays on the device.
  ferry::Tensor step(const ferry::Tensor& x, const ferry::Tensor& y) { return graph_->run(x, y); }
  // The same for a batch that stays put (the resident rows): once the step is a graph, the batch is loaded
  // into the graph's inputs once and every later step replays on it, as a resident dataset gathered straight
  // into them (ferry train) or PyTorch's loop reusing one device tensor pays no copy either.
  ferry::Tensor step_resident(const ferry::Tensor& x, const ferry::Tensor& y) {
    const auto [images, labels] = graph_->inputs();
    if (!images.defined() || images.shape() != x.shape() || labels.shape() != y.shape()) return graph_->run(x, y);
    if (loaded_ != x.data_ptr()) {
      ferry::Tensor(images).copy_(x);
      ferry::Tensor(labels).copy_(y);
      loaded_ = x.data_ptr();
    }
    return graph_->run(images, labels);
  }
  ferry::Device device() const { return device_; }
  const ferry::StepGraph& graph() const { return *graph_; }

 private:
  ferry::Device device_;
  std::shared_ptr<ferry::nn::Sequential> model_;
  std::unique_ptr<ferry::optim::SGD> optimizer_;
  std::unique_ptr<ferry::StepGraph> graph_;
  const void* loaded_ = nullptr;  // the resident batch in the graph's inputs
};

// Seconds per step of `body(i)` over `steps` steps after `warmup`, with one device sync at the end of the
// timed block (a step on an asynchronous device is done when the device says so, not when the call returns).
double seconds_per_step(ferry::Device device, int warmup, int steps, const std::function<void(int)>& body) {
  for (int i = 0; i < warmup; ++i) body(i);
  ferry::synchronize(device, "bench golden: warm-up done");
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) body(warmup + i);
  ferry::synchronize(device, "bench golden: timed block done");
  return std::chrono::duration<double>(Clock::now() - start).count() / steps;
}

struct Row {
  std::string key, label;
  double seconds = 0;  // per step
};

void run_golden(const GoldenOptions& o) {
  FERRY_CHECK(o.steps >= 1 && o.warmup >= 0, InvalidArgument, "--steps must be >= 1 and --warmup >= 0, got ",
              o.steps, " and ", o.warmup);
  const ferry::Device device = !o.device.empty() ? ferry::Device::parse(o.device)
                               : ferry::is_available(ferry::DeviceType::CUDA) ? ferry::Device(ferry::DeviceType::CUDA, 0)
                                                                              : ferry::Device::parse("sim:0");
  FERRY_CHECK(!device.is_cpu(), InvalidArgument,
              "bench golden compares the cpu with an accelerator: --device must be cuda[:N] or sim[:N], got ",
              device.str());
  const bool cuda = device.type == ferry::DeviceType::CUDA;
  const Workload shape = make_workload(o.workload, o.batch);
  ferry::manual_seed(1);
  const ferry::Tensor x_host = ferry::randn(shape.input);                   // pageable host memory
  const ferry::Tensor y_host = ferry::randint(0, 10, {shape.input[0]});
  const double batch_bytes = static_cast<double>(x_host.nbytes() + y_host.nbytes());  // bytes per step
  std::vector<Row> rows;
  auto progress = [&](const std::string& what) {
    if (!o.json) std::fprintf(stderr, "ferry bench golden: %s\n", what.c_str());
  };

  // 1. The cpu step, the sheet's T_cpu, is timed last (below): its BLAS and OpenMP threads spin on the cores
  // for a while after their work, and the eager device step right after them is a host-bound loop that shares
  // those cores (first H200 run: the eager mlp step took 0.416 ms right after the cpu rows, 0.275 ms later on).
  Stepper dev(o.workload, o.batch, device);
  const ferry::Tensor x_dev = x_host.to(device), y_dev = y_host.to(device);
  // 2. Resident: T_compute, and the step's peak device memory (model, gradients, optimizer state, batch,
  // activations: what torch.cuda.max_memory_allocated reports for the same loop).
  progress("device step, data resident");
  ferry::backend(device).reset_peak_memory_stats(device.index);
  rows.push_back({"resident", "device step, data resident", seconds_per_step(device, o.warmup, o.steps, [&](int) {
                    dev.step(x_dev, y_dev);
                  })});
  const std::int64_t peak_bytes = ferry::backend(device).memory_stats(device.index).peak;
  // 3. The copy alone: T_transfer (pageable, as a naive loop does it).
  progress("the batch's copy alone");
  rows.push_back({"copy", "copy of one batch host->device (pageable)", seconds_per_step(device, o.warmup, o.steps, [&](int) {
                    (void)x_host.to(device);
                    (void)y_host.to(device);
                  })});
  // 4. The naive loop: copy every step, then compute.
  progress("device step, pageable copy every step");
  rows.push_back({"per_step_copy", "device step + pageable copy every step",
                  seconds_per_step(device, o.warmup, o.steps, [&](int) { dev.step(x_host.to(device), y_host.to(device)); })});
  // 4b. The sheet's loop exactly: the copy starts when the previous step has finished. ferry's own loop above
  // may do better: a copy into a fresh tensor does not wait for queued compute (devices-and-moves.md), so on
  // cuda it runs while the previous step computes.
  progress("device step, pageable copy after the previous step finished (serial)");
  rows.push_back({"per_step_copy_serial", "device step + pageable copy, previous step done (serial)",
                  seconds_per_step(device, o.warmup, o.steps, [&](int) {
                    ferry::synchronize(device, "bench golden: the sheet's serial loop");
                    dev.step(x_host.to(device), y_host.to(device));
                  })});
  // 5. Pinned prefetch (cuda): the next batch's copy on the copy stream while this step computes.
  if (cuda) {
    progress("device step, pinned prefetch");
    const ferry::Tensor x_pinned = x_host.pin_memory(), y_pinned = y_host.pin_memory();
    rows.push_back({"copy_pinned", "copy of one batch host->device (pinned)", seconds_per_step(device, o.warmup, o.steps, [&](int) {
                      (void)x_pinned.to(device, true);
                      (void)y_pinned.to(device, true);
                    })});
    ferry::Tensor x_next = x_pinned.to(device, true), y_next = y_pinned.to(device, true);
    rows.push_back({"prefetch", "device step, pinned prefetch of the next batch",
                    seconds_per_step(device, o.warmup, o.steps, [&](int) {
                      const ferry::Tensor x = x_next, y = y_next;
                      x_next = x_pinned.to(device, true);
                      y_next = y_pinned.to(device, true);
                      dev.step(x, y);
                    })});
  }
  // 6. Logging: item() every step (a host sync each) against every 100th.
  progress("device step, loss.item() every step");
  rows.push_back({"item_every_step", "device step, data resident, loss.item() every step",
                  seconds_per_step(device, o.warmup, o.steps, [&](int) { (void)dev.step(x_dev, y_dev).item<double>(); })});
  progress("device step, loss.item() every 100th step");
  rows.push_back({"item_every_100", "device step, data resident, loss.item() every 100th step",
                  seconds_per_step(device, o.warmup, o.steps, [&](int i) {
                    ferry::Tensor loss = dev.step(x_dev, y_dev);
                    if (i % 100 == 0) (void)loss.item<double>();
                  })});
  // A loss's item() waits for the loss alone (its ready event): the backward pass queued after it runs on while the
  // host reads. A sync of the whole device every step is the bubble the sheet's serial loop pays, measured alone.
  progress("device step, synchronize() every step");
  rows.push_back({"sync_every_step", "device step, data resident, synchronize() every step",
                  seconds_per_step(device, o.warmup, o.steps, [&](int) {
                    dev.step(x_dev, y_dev);
                    ferry::synchronize(device, "bench golden: a sync every step");
                  })});

  // 7. The step captured as a graph (cuda: one launch for forward, loss and backward), resident, then with
  // item() every step: what issue 9 compares with PyTorch's eager step.
  std::int64_t graph_peak_bytes = 0;
  std::string graph_line;
  if (ferry::graph_capture_supported(device)) {
    // Its peak counts what this stepper holds and the batch, as the eager loop's does, not the eager model.
    // The libraries' workspaces stay in it (the eager peak and PyTorch's count theirs too).
    const ferry::MemoryStats held = ferry::backend(device).memory_stats(device.index);
    const std::int64_t others =
        held.allocated - held.library - static_cast<std::int64_t>(x_dev.nbytes() + y_dev.nbytes());
    Stepper graphed(o.workload, o.batch, device, true);
    progress("device step, data resident, captured as a graph");
    ferry::backend(device).reset_peak_memory_stats(device.index);
    rows.push_back({"resident_graph", "device step, data resident, step graph replayed",
                    seconds_per_step(device, std::max(o.warmup, 3), o.steps, [&](int) { graphed.step_resident(x_dev, y_dev); })});
    graph_peak_bytes = ferry::backend(device).memory_stats(device.index).peak - others;
    progress("device step, step graph, loss.item() every step");
    rows.push_back({"item_every_step_graph", "device step, step graph, loss.item() every step",
                    seconds_per_step(device, o.warmup, o.steps, [&](int) { (void)graphed.step_resident(x_dev, y_dev).item<double>(); })});
    graph_line = graphed.graph().describe();
  }
  progress("cpu step");
  {
    Stepper cpu(o.workload, o.batch, ferry::kCPU);
    rows.insert(rows.begin(), Row{"cpu", "cpu step, data in host memory",
                                  seconds_per_step(ferry::kCPU, o.warmup, o.steps, [&](int) { cpu.step(x_host, y_host); })});
  }

  auto find = [&](const std::string& key) {
    for (const Row& r : rows)
      if (r.key == key) return r.seconds;
    return 0.0;
  };
  const double t_cpu = find("cpu"), t_compute = find("resident"), t_transfer = find("copy");
  const double t_naive = find("per_step_copy");
  const double s = t_cpu / t_compute;                 // measured speedup, data resident
  const double s_real = t_cpu / t_naive;              // measured, copy every step
  const double s_real_golden = ferry::cost::golden_rule(s, t_compute, t_transfer).speedup_real;  // from the parts
  const double error = 100 * (s_real_golden - s_real) / s_real;
  const double s_real_serial = t_cpu / find("per_step_copy_serial");  // the loop the Golden Rule describes
  const double error_serial = 100 * (s_real_golden - s_real_serial) / s_real_serial;
  const double s_real_overlap = t_cpu / std::max(t_compute, t_transfer);  // the copy hidden behind compute
  const double error_overlap = 100 * (s_real_overlap - s_real) / s_real;
  const double item_cost = find("item_every_step") - find("item_every_100");
  // The sheet's serial loop waits for the device before each copy, so the device then idles while the host
  // launches the step: one sync bubble a step, what a synchronize() every step costs (docs/cost-model.md, "the
  // pipeline bubble"). The Golden Rule extended with it: T_step = T_compute + T_transfer + T_bubble.
  const double sync_cost = find("sync_every_step") - find("item_every_100");
  const double t_bubble = std::max(0.0, sync_cost);
  const double s_real_extended = t_cpu / (t_compute + t_transfer + t_bubble);
  const double error_extended = 100 * (s_real_extended - s_real_serial) / s_real_serial;

  const StepWork work = step_work(o.workload, shape.input[0]);
  Json object{{"bench", "golden"},
              {"workload", o.workload},
              {"device", device.str()},
              {"batch", shape.input[0]},
              {"bytes_per_step", batch_bytes},
              {"steps", o.steps},
              {"seconds_per_step", Json::object()},
              {"speedup", s},
              {"s_real_measured", s_real},
              {"s_real_golden_rule", s_real_golden},
              {"golden_rule_error_percent", error},
              {"s_real_measured_serial", s_real_serial},
              {"golden_rule_error_serial_percent", error_serial},
              {"s_real_overlap_model", s_real_overlap},
              {"overlap_model_error_percent", error_overlap},
              {"s_real_extended_model", s_real_extended},
              {"extended_model_error_serial_percent", error_extended},
              {"item_cost_s", item_cost},
              {"sync_cost_s", sync_cost},
              {"peak_device_bytes", peak_bytes},
              {"flops_per_step", work.flops},
              {"bytes_moved_model_per_step", work.bytes}};
  if (!graph_line.empty()) {
    object["graph"] = graph_line;
    object["peak_device_bytes_graph"] = graph_peak_bytes;
  }
  for (const Row& r : rows) object["seconds_per_step"][r.key] = r.seconds;
  std::string text = fmt::format("ferry bench golden: {} workload, batch {}, cpu against {}; {} timed steps each\n",
                                 o.workload, shape.input[0], device.str(), o.steps);
  text += fmt::format("{:<58} {:>12}\n", "per step", "time");
  for (const Row& r : rows) text += fmt::format("{:<58} {:>12}\n", r.label, ferry::format_seconds(r.seconds));
  text += fmt::format("batch: {} per step; link as measured: {}\n", ferry::format_bytes(batch_bytes),
                      ferry::format_bandwidth(batch_bytes / t_transfer));
  text += fmt::format("S (measured, resident)                  = T_cpu / T_compute = {:.3g}\n", s);
  text += fmt::format("S_real (measured, copy every step)      = T_cpu / T_step    = {:.3g}\n", s_real);
  text += fmt::format("S_real (Golden Rule, from the parts)    = S / (1 + T_transfer / T_compute) = {:.3g}  ({:+.1f} %)\n",
                      s_real_golden, error);
  text += fmt::format("S_real (measured, serial loop)          = {:.3g}: the Golden Rule is {:+.1f} % off the loop it describes\n",
                      s_real_serial, error_serial);
  text += fmt::format("S_real (Golden Rule + one sync bubble)  = T_cpu / (T_compute + T_transfer + T_bubble) = {:.3g}  "
                      "({:+.1f} % off the serial loop; T_bubble = what a synchronize() every step costs)\n",
                      s_real_extended, error_extended);
  text += fmt::format("S_real (overlap model)                  = T_cpu / max(T_compute, T_transfer) = {:.3g}  ({:+.1f} % off "
                      "ferry's loop, whose copy need not wait for queued compute)\n",
                      s_real_overlap, error_overlap);
  if (cuda) {
    const double overlap = std::max(t_compute, find("copy_pinned"));
    const double t_prefetch = find("prefetch");
    object["prefetch_predicted_s"] = overlap;
    text += fmt::format("prefetch: measured {} per step; overlap model max(T_compute, T_pinned copy) = {} ({:+.1f} %)\n",
                        ferry::format_seconds(t_prefetch), ferry::format_seconds(overlap),
                        100 * (overlap - t_prefetch) / t_prefetch);
  }
  text += fmt::format("loss.item() every step costs {} per step ({:.1f} % of a resident step); synchronize() every step "
                      "{} ({:.1f} %)\n",
                      ferry::format_seconds(item_cost), 100 * item_cost / t_compute, ferry::format_seconds(sync_cost),
                      100 * sync_cost / t_compute);
  text += fmt::format("work per step: {:.3g} GFLOP (forward, weight and input gradients of the convolutions and linear "
                      "layers; 2 per multiply-add); memory traffic about {} (every module's output written and read "
                      "once each way, parameters in 8 passes)\n",
                      work.flops / 1e9, ferry::format_bytes(work.bytes));
  text += fmt::format("peak {} memory of the resident loop: {}\n", device.str(),
                      ferry::format_bytes(static_cast<double>(peak_bytes)));
  if (!graph_line.empty()) {
    const double t_graph = find("resident_graph");
    text += fmt::format("step graph: {}\n  resident step {} ({:.2f} x the eager step); loss.item() every step adds {:.1f} %; "
                        "peak memory {}\n",
                        graph_line, ferry::format_seconds(t_graph), t_graph / t_compute,
                        100 * (find("item_every_step_graph") / t_graph - 1),
                        ferry::format_bytes(static_cast<double>(graph_peak_bytes)));
  }
  if (device.type == ferry::DeviceType::Sim) {
    text += "sim computes with the cpu's kernels (S ~ 1) and waits out its link (FERRY_SIM_LINK): the copies and the\n"
            "Golden Rule are real, the speedup is not; on a cuda machine both are.\n";
    if (!graph_line.empty()) {
      text += "A sim graph replays the calls of the eager step (oneDNN's convolutions, the fused BatchNorm + ReLU +\n"
              "pooling) from a list instead of the layers' code; on cuda the graph launches the eager step's kernels.\n";
    }
  }
  if (!o.trace.empty()) {
    ferry::write_chrome_trace(o.trace);
    object["trace"] = o.trace;
    text += fmt::format("trace written to {} (open it in ui.perfetto.dev)\n", o.trace);
  }
  fmt::print("{}", o.json ? object.dump() + "\n" : text);
}

}  // namespace

void register_bench_golden(CLI::App& bench) {
  auto options = std::make_shared<GoldenOptions>();
  CLI::App* command = bench.add_subcommand(
      "golden", "The Golden Rule measured: a training step on the cpu and on a device, resident, copied, prefetched");
  command->footer(
      "Times one SGD step of the workload on the cpu (T_cpu) and on the device with the data resident (T_compute),\n"
      "the batch's copy alone (T_transfer), the naive loop that copies every step, pinned prefetch (cuda), and\n"
      "loss.item() every step; prints measured S and S_real beside S / (1 + T_transfer / T_compute).\n"
      "Example: ferry bench golden --workload cnn --device cuda:0 --steps 20");
  command->add_option("--workload", options->workload, "mlp (784-1024-1024-10, batch 512) | cnn (3x32x32, batch 256)")
      ->capture_default_str();
  command->add_option("--device", options->device, "The accelerator: cuda[:N] or sim[:N] (default cuda:0, else sim:0)");
  // Checked as they are read: a --batch of 0 or -5 once ran the workload's own batch without a word.
  command->add_option("--batch", options->batch, "Batch size (default: the workload's)")->check(whole_number_at_least(1));
  command->add_option("--steps", options->steps, "Timed steps per measurement")
      ->capture_default_str()
      ->check(whole_number_at_least(1));
  command->add_option("--warmup", options->warmup, "Untimed steps before each measurement")
      ->capture_default_str()
      ->check(whole_number_at_least(0));
  command->add_flag("--json", options->json, "Print one JSON object instead of the table");
  command->add_option("--trace", options->trace, "Write the crossings and syncs as Chrome trace JSON")->type_name("FILE");
  command->callback([options] { run_golden(*options); });
}
