// cpu_step_bench.cpp — one training step (forward, cross-entropy, backward, SGD momentum 0.9) of the `mlp`,
// `cnn` and `fmnist` workloads (DESIGN.md) in ferry and in Debian's libtorch, in one process on the same number of
// threads; prints medians and the ferry / libtorch ratio. Also (--workload) float32 <-> 16-bit conversions, and
// single convolutions forward and backward. Not a correctness test (tests/ do that).
//
// Threads: OpenMP (ferry's loops, libtorch's ATen and oneDNN) and OpenBLAS (both libraries' GEMMs; libtorch
// may load its own copy through libblas.so.3) read their thread counts when loaded, so the program sets
// OMP_NUM_THREADS and OPENBLAS_NUM_THREADS and re-executes itself before doing anything else.
#include <omp.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/nn/activation.h"
#include "ferry/nn/batchnorm.h"
#include "ferry/nn/conv.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/pooling.h"
#include "ferry/nn/sequential.h"
#include "ferry/ops.h"
#include "ferry/optim.h"
#include "ferry/random.h"

extern "C" void openblas_set_num_threads(int);

namespace {

struct Settings {
  int threads = 2;
  int warmup = 3;
  int steps = 10;
  std::string workload = "all";  // mlp | cnn | fmnist | all | convert | conv
  std::int64_t mlp_batch = 512;
  std::int64_t cnn_batch = 256;
  std::int64_t fmnist_batch = 128;
  bool breakdown = false;  // ferry's forward / backward / step medians too
  std::string only;        // "ferry" or "libtorch": time one library alone (diagnosis; no ratio)
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Timing {
  double step_ms = 0, forward_ms = 0, backward_ms = 0, update_ms = 0;  // medians
  double first_loss = 0, last_loss = 0;
};

// Collects one library's per-step times and reports medians.
struct Recorder {
  std::vector<double> total, forward, backward, update, losses;
  void add(double forward_ms, double backward_ms, double update_ms, double total_ms, double loss) {
    forward.push_back(forward_ms);
    backward.push_back(backward_ms);
    update.push_back(update_ms);
    total.push_back(total_ms);
    losses.push_back(loss);
  }
  Timing result(int warmup) const {
    auto timed = [&](const std::vector<double>& v) { return median(std::vector<double>(v.begin() + warmup, v.end())); };
    if (total.empty()) return {};
    return {timed(total), timed(forward), timed(backward), timed(update), losses.front(), losses.back()};
  }
};

// --- ferry --------------------------------------------------------------------------------------

ferry::nn::Sequential ferry_mlp() {
  namespace nn = ferry::nn;
  return nn::Sequential(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(), nn::Linear(1024, 10));
}

// cnn: 3 input channels, 32x32, Linear 2048->10; fmnist: 1 input channel, 28x28, Linear 1152->10.
ferry::nn::Sequential ferry_cnn(std::int64_t in_channels = 3, std::int64_t features = 2048) {
  namespace nn = ferry::nn;
  nn::Sequential model;
  const std::int64_t channels[] = {in_channels, 32, 64, 128};
  for (int i = 0; i < 3; ++i) {
    model.push_back(nn::Conv2d(channels[i], channels[i + 1], 3, {.padding = 1}));
    model.push_back(nn::BatchNorm2d(channels[i + 1]));
    model.push_back(nn::ReLU());
    model.push_back(nn::MaxPool2d(2));
  }
  model.push_back(nn::Flatten());
  model.push_back(nn::Linear(features, 10));
  return model;
}

// A ferry model, its data (resident) and optimizer; step() runs and times one training step.
struct FerryRun {
  ferry::nn::Sequential model;
  ferry::Tensor x, target;
  ferry::optim::SGD optimizer;
  Recorder recorder;

  FerryRun(ferry::nn::Sequential m, const ferry::Shape& input_shape)
      : model(std::move(m)), optimizer(model.parameters(), {.lr = 0.01, .momentum = 0.9}) {
    ferry::manual_seed(0);
    x = ferry::randn(input_shape);
    target = ferry::randint(0, 10, {input_shape[0]});
    model.train();
  }
  void step() {
    const auto start = Clock::now();
    optimizer.zero_grad();
    ferry::Tensor loss = ferry::nn::functional::cross_entropy(model(x), target);
    const double forward_ms = ms_since(start);
    const auto backward_start = Clock::now();
    loss.backward();
    const double backward_ms = ms_since(backward_start);
    const auto update_start = Clock::now();
    optimizer.step();
    const double update_ms = ms_since(update_start);
    const double total_ms = ms_since(start);
    recorder.add(forward_ms, backward_ms, update_ms, total_ms, loss.item<double>());  // item() after the clock
  }
};

// --- libtorch -----------------------------------------------------------------------------------

torch::nn::Sequential torch_mlp() {
  namespace tn = torch::nn;
  return tn::Sequential(tn::Linear(784, 1024), tn::ReLU(), tn::Linear(1024, 1024), tn::ReLU(), tn::Linear(1024, 10));
}

torch::nn::Sequential torch_cnn(std::int64_t in_channels = 3, std::int64_t features = 2048) {
  namespace tn = torch::nn;
  tn::Sequential model;
  const std::int64_t channels[] = {in_channels, 32, 64, 128};
  for (int i = 0; i < 3; ++i) {
    model->push_back(tn::Conv2d(tn::Conv2dOptions(channels[i], channels[i + 1], 3).padding(1)));
    model->push_back(tn::BatchNorm2d(channels[i + 1]));
    model->push_back(tn::ReLU());
    model->push_back(tn::MaxPool2d(2));
  }
  model->push_back(tn::Flatten());
  model->push_back(tn::Linear(features, 10));
  return model;
}

struct TorchRun {
  torch::nn::Sequential model;
  torch::Tensor x, target;
  torch::optim::SGD optimizer;
  Recorder recorder;

  TorchRun(torch::nn::Sequential m, const std::vector<std::int64_t>& input_shape)
      : model(std::move(m)), optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)) {
    torch::manual_seed(0);
    x = torch::randn(input_shape);
    target = torch::randint(0, 10, {input_shape[0]}, torch::kLong);
    model->train();
  }
  void step() {
    const auto start = Clock::now();
    optimizer.zero_grad();  // libtorch 1.13: zeroes (its C++ API has no set_to_none)
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), target);
    const double forward_ms = ms_since(start);
    const auto backward_start = Clock::now();
    loss.backward();
    const double backward_ms = ms_since(backward_start);
    const auto update_start = Clock::now();
    optimizer.step();
    const double update_ms = ms_since(update_start);
    const double total_ms = ms_since(start);
    recorder.add(forward_ms, backward_ms, update_ms, total_ms, loss.item<double>());
  }
};

// Alternates the two libraries step by step, so that both see the same machine (load that comes and goes
// on a shared machine lands on both), each going first every other time (whatever one leaves behind,
// threads still spinning, a cold cache, falls on both), and returns their medians.
// Between steps the program sleeps (untimed) so that the worker threads one library leaves spinning (OpenMP,
// OpenBLAS, libtorch's pthreadpool) have gone back to sleep before the other library's step starts.
std::pair<Timing, Timing> time_both(FerryRun& ferry_run, TorchRun& torch_run, const Settings& s) {
  auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); };
  for (int i = 0; i < s.warmup + s.steps; ++i) {
    if (!s.only.empty()) {
      if (s.only == "ferry") ferry_run.step();
      else torch_run.step();
      settle();
      continue;
    }
    if (i % 2 == 0) {
      torch_run.step();
      settle();
      ferry_run.step();
    } else {
      ferry_run.step();
      settle();
      torch_run.step();
    }
    settle();
  }
  if (s.only == "ferry") return {ferry_run.recorder.result(s.warmup), Timing{}};
  if (s.only == "libtorch") return {Timing{}, torch_run.recorder.result(s.warmup)};
  return {ferry_run.recorder.result(s.warmup), torch_run.recorder.result(s.warmup)};
}

// float32 <-> float16 / bfloat16 of a (4096, 4096) tensor (64 MiB of float32), ferry and libtorch alternating
// conversion by conversion; medians. Bandwidth counts the bytes read and written.
void time_conversions(const Settings& s) {
  const std::int64_t n = 4096;
  const ferry::Tensor fx = ferry::randn({n, n});
  const torch::Tensor tx = torch::randn({n, n});
  struct Case {
    const char* name;
    ferry::DType ferry_to;
    torch::ScalarType torch_to;
    bool widen;  // from the 16-bit tensor back to float32
  };
  const Case cases[] = {{"f32->f16", ferry::DType::Float16, torch::kHalf, false},
                        {"f16->f32", ferry::DType::Float16, torch::kHalf, true},
                        {"f32->bf16", ferry::DType::BFloat16, torch::kBFloat16, false},
                        {"bf16->f32", ferry::DType::BFloat16, torch::kBFloat16, true}};
  std::printf("%-10s %12s %12s %10s   (GB/s ferry / libtorch; bytes read + written)\n", "convert", "ferry ms",
              "libtorch ms", "ratio");
  for (const Case& c : cases) {
    const ferry::Tensor fsource = c.widen ? fx.to(c.ferry_to) : fx;
    const torch::Tensor tsource = c.widen ? tx.to(c.torch_to) : tx;
    const ferry::DType fto = c.widen ? ferry::DType::Float32 : c.ferry_to;
    const torch::ScalarType tto = c.widen ? torch::kFloat : c.torch_to;
    std::vector<double> f, t;
    for (int i = 0; i < s.warmup + s.steps; ++i) {
      const auto run_ferry = [&] {
        const auto start = Clock::now();
        const ferry::Tensor out = fsource.to(fto);
        if (i >= s.warmup) f.push_back(ms_since(start));
      };
      const auto run_torch = [&] {
        const auto start = Clock::now();
        const torch::Tensor out = tsource.to(tto);
        if (i >= s.warmup) t.push_back(ms_since(start));
      };
      if (i % 2 == 0) run_torch(), run_ferry();
      else run_ferry(), run_torch();
    }
    const double bytes = static_cast<double>(n * n) * (4 + 2);
    const double fm = median(f), tm = median(t);
    std::printf("%-10s %12.2f %12.2f %10.2f   (%.1f / %.1f)\n", c.name, fm, tm, fm / tm, bytes / fm / 1e6,
                bytes / tm / 1e6);
  }
}

// One convolution's forward and both gradients (input, weight; bias too), sum(out).backward() on random data, in
// three ways one after another, call by call: ferry on oneDNN, ferry on im2col + OpenBLAS (FERRY_ONEDNN=0's path),
// and libtorch. Medians; the ratio is ferry's oneDNN path against libtorch. The shapes: fmnist's second layer, and
// the transposed and 1-d convolutions of a decoder and of a sequence model (batch 32).
void time_convolutions(const Settings& s) {
  enum class Kind { Conv2d, ConvTranspose2d, Conv1d, ConvTranspose1d };
  struct Case {
    const char* name;
    Kind kind;
    std::vector<std::int64_t> input, weight;  // (N, C, [H,] W); conv (O, C, k..), transposed (C, O, k..)
    std::int64_t stride, padding;
  };
  const std::int64_t fb = s.fmnist_batch;
  const Case cases[] = {
      {"conv2d      (fmnist layer 2) -> 64x14x14", Kind::Conv2d, {fb, 32, 14, 14}, {64, 32, 3, 3}, 1, 1},
      {"conv_transpose2d 64x14x14 k4 s2 -> 32x28x28", Kind::ConvTranspose2d, {32, 64, 14, 14}, {64, 32, 4, 4}, 2, 1},
      {"conv_transpose2d 128x7x7 k4 s2 -> 64x14x14", Kind::ConvTranspose2d, {32, 128, 7, 7}, {128, 64, 4, 4}, 2, 1},
      {"conv1d 64x256 k5 p2 -> 64x256", Kind::Conv1d, {32, 64, 256}, {64, 64, 5}, 1, 2},
      {"conv1d 128x128 k3 s2 -> 128x64", Kind::Conv1d, {32, 128, 128}, {128, 128, 3}, 2, 1},
      {"conv_transpose1d 64x128 k4 s2 -> 64x256", Kind::ConvTranspose1d, {32, 64, 128}, {64, 64, 4}, 2, 1},
  };
  namespace F = ferry::nn::functional;
  std::printf("%-45s %10s %10s %12s %8s   (forward + backward, batch first in each shape)\n", "convolution",
              "oneDNN ms", "im2col ms", "libtorch ms", "ratio");
  for (const Case& c : cases) {
    const bool transposed = c.kind == Kind::ConvTranspose2d || c.kind == Kind::ConvTranspose1d;
    const std::int64_t out_channels = transposed ? c.weight[1] : c.weight[0];
    ferry::manual_seed(0);
    const ferry::Tensor fx = ferry::randn(ferry::Shape(c.input)).requires_grad_(true);
    const ferry::Tensor fw = (ferry::randn(ferry::Shape(c.weight)) * 0.05).detach().requires_grad_(true);
    const ferry::Tensor fb_ = ferry::zeros({out_channels}).requires_grad_(true);
    torch::manual_seed(0);
    const torch::Tensor tx = torch::randn(c.input).requires_grad_(true);
    const torch::Tensor tw = (torch::randn(c.weight) * 0.05).detach().requires_grad_(true);
    const torch::Tensor tb = torch::zeros({out_channels}).requires_grad_(true);
    const auto ferry_conv = [&] {
      switch (c.kind) {
        case Kind::Conv2d: return F::conv2d(fx, fw, fb_, c.stride, c.padding);
        case Kind::ConvTranspose2d: return F::conv_transpose2d(fx, fw, fb_, c.stride, c.padding);
        case Kind::Conv1d: return F::conv1d(fx, fw, fb_, c.stride, c.padding);
        case Kind::ConvTranspose1d: return F::conv_transpose1d(fx, fw, fb_, c.stride, c.padding);
      }
      return ferry::Tensor();
    };
    const auto torch_conv = [&] {
      switch (c.kind) {
        case Kind::Conv2d: return torch::conv2d(tx, tw, tb, c.stride, c.padding);
        case Kind::ConvTranspose2d: return torch::conv_transpose2d(tx, tw, tb, c.stride, c.padding);
        case Kind::Conv1d: return torch::conv1d(tx, tw, tb, c.stride, c.padding);
        case Kind::ConvTranspose1d: return torch::conv_transpose1d(tx, tw, tb, c.stride, c.padding);
      }
      return torch::Tensor();
    };
    std::vector<double> onednn, im2col, libtorch;
    const bool onednn_was = F::onednn();
    for (int i = 0; i < s.warmup + s.steps; ++i) {
      for (const bool use_onednn : {true, false}) {
        F::set_onednn(use_onednn);
        for (const ferry::Tensor& t : {fx, fw, fb_}) t.set_grad(ferry::Tensor());
        const auto start = Clock::now();
        ferry::sum(ferry_conv()).backward();
        if (i >= s.warmup) (use_onednn ? onednn : im2col).push_back(ms_since(start));
      }
    }
    F::set_onednn(onednn_was);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // ferry's OpenMP threads go to sleep first
    for (int i = 0; i < s.warmup + s.steps; ++i) {
      for (const torch::Tensor& t : {tx, tw, tb}) t.mutable_grad() = torch::Tensor();
      const auto start = Clock::now();
      torch_conv().sum().backward();
      if (i >= s.warmup) libtorch.push_back(ms_since(start));
    }
    const double on = median(onednn), off = median(im2col), t = median(libtorch);
    std::printf("%-45s %10.2f %10.2f %12.2f %8.2f\n", c.name, on, off, t, on / t);
    std::fflush(stdout);
  }
}

void usage() {
  std::puts(
      "cpu_step_bench [--threads N] [--warmup N] [--steps N] [--workload mlp|cnn|fmnist|all|convert|conv]\n"
      "               [--mlp-batch N] [--cnn-batch N] [--fmnist-batch N] [--breakdown] [--only ferry|libtorch]\n"
      "Times one SGD training step of DESIGN.md's mlp, cnn and fmnist workloads in ferry and libtorch (cpu),\n"
      "on random data of the workload's shape (ferry train times the real fmnist epoch). --workload convert times\n"
      "float32 <-> float16 / bfloat16 conversions of a 64 MiB tensor instead; --workload conv one convolution's\n"
      "forward and backward (conv2d, conv_transpose2d, conv1d, conv_transpose1d) in ferry on oneDNN, in ferry on\n"
      "im2col + OpenBLAS, and in libtorch (--only does not apply to these two).");
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cpu_step_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--threads") s.threads = std::stoi(next());
    else if (arg == "--warmup") s.warmup = std::stoi(next());
    else if (arg == "--steps") s.steps = std::stoi(next());
    else if (arg == "--workload") s.workload = next();
    else if (arg == "--mlp-batch") s.mlp_batch = std::stoll(next());
    else if (arg == "--cnn-batch") s.cnn_batch = std::stoll(next());
    else if (arg == "--fmnist-batch") s.fmnist_batch = std::stoll(next());
    else if (arg == "--breakdown") s.breakdown = true;
    else if (arg == "--only") s.only = next();
    else if (arg == "--help" || arg == "-h") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "cpu_step_bench: unknown argument %s\n", arg.c_str());
      usage();
      return 2;
    }
  }
  if (s.threads < 1 || s.steps < 1 || s.warmup < 0) {
    std::fprintf(stderr, "cpu_step_bench: expected --threads >= 1, --steps >= 1, --warmup >= 0\n");
    return 2;
  }

  // Thread counts are read when the libraries load: set them, then start again with them in place.
  const std::string threads = std::to_string(s.threads);
  if (!std::getenv("FERRY_BENCH_REEXEC")) {
    setenv("FERRY_BENCH_REEXEC", "1", 1);
    setenv("OMP_NUM_THREADS", threads.c_str(), 1);
    setenv("OPENBLAS_NUM_THREADS", threads.c_str(), 1);
    execv("/proc/self/exe", argv);
    std::perror("cpu_step_bench: re-exec failed; continuing with the thread settings as they are");
  }
  omp_set_num_threads(s.threads);
  openblas_set_num_threads(s.threads);
  torch::set_num_threads(s.threads);
  torch::set_num_interop_threads(1);

  std::printf("cpu_step_bench: %d thread(s) each (OpenMP %d, libtorch %d), %d warmup + %d timed steps, medians,\n"
              "the two libraries alternating step by step\n",
              s.threads, omp_get_max_threads(), torch::get_num_threads(), s.warmup, s.steps);
  if (s.workload == "convert") {
    time_conversions(s);
    return 0;
  }
  if (s.workload == "conv") {
    try {
      time_convolutions(s);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cpu_step_bench: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  std::printf("%-8s %6s %12s %12s %10s   %s\n", "workload", "batch", "ferry ms", "libtorch ms", "ratio", "losses (first -> last)");
  struct Row {
    std::string name;
    std::int64_t batch;
    Timing ferry, torch;
  };
  std::vector<Row> rows;
  auto report = [&](const Row& r) {
    std::printf("%-8s %6lld %12.1f %12.1f %10.2f   ferry %.3f -> %.3f, libtorch %.3f -> %.3f\n", r.name.c_str(),
                static_cast<long long>(r.batch), r.ferry.step_ms, r.torch.step_ms, r.ferry.step_ms / r.torch.step_ms,
                r.ferry.first_loss, r.ferry.last_loss, r.torch.first_loss, r.torch.last_loss);
    if (s.breakdown) {
      std::printf("%-8s %6s  forward %.1f / %.1f, backward %.1f / %.1f, step %.1f / %.1f (ferry / libtorch ms)\n", "", "",
                  r.ferry.forward_ms, r.torch.forward_ms, r.ferry.backward_ms, r.torch.backward_ms, r.ferry.update_ms,
                  r.torch.update_ms);
    }
    std::fflush(stdout);
  };
  try {
    if (s.workload == "mlp" || s.workload == "all") {
      Row r{"mlp", s.mlp_batch, {}, {}};
      FerryRun ferry_run(ferry_mlp(), {s.mlp_batch, 784});
      TorchRun torch_run(torch_mlp(), {s.mlp_batch, 784});
      std::tie(r.ferry, r.torch) = time_both(ferry_run, torch_run, s);
      report(r);
    }
    if (s.workload == "cnn" || s.workload == "all") {
      Row r{"cnn", s.cnn_batch, {}, {}};
      FerryRun ferry_run(ferry_cnn(), {s.cnn_batch, 3, 32, 32});
      TorchRun torch_run(torch_cnn(), {s.cnn_batch, 3, 32, 32});
      std::tie(r.ferry, r.torch) = time_both(ferry_run, torch_run, s);
      report(r);
    }
    if (s.workload == "fmnist" || s.workload == "all") {
      Row r{"fmnist", s.fmnist_batch, {}, {}};
      FerryRun ferry_run(ferry_cnn(1, 1152), {s.fmnist_batch, 1, 28, 28});
      TorchRun torch_run(torch_cnn(1, 1152), {s.fmnist_batch, 1, 28, 28});
      std::tie(r.ferry, r.torch) = time_both(ferry_run, torch_run, s);
      report(r);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu_step_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
