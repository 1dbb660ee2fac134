// cuda_layer_bench.cpp — where an eager training step's GPU time goes, stage by stage: CUDA events on the compute
// stream after each stage of the forward pass (a module, or a module with the ReLU and 2x2 pooling after it, fused
// as nn::Sequential fuses them), in gradient hooks on each stage's output during backward (a hook fires once the
// gradient reaching that output is complete, so the time between two hooks is the backward of the stage between
// them), around the loss and around the SGD update. Medians over the timed steps; prints one JSON object.
//   cuda_layer_bench [--workload mlp|cnn] [--steps N]      (mlp: batch 512; cnn: batch 256, as ferry bench golden)
// Eager times include the gaps where the GPU waits for the host to launch the next kernel: a launch-bound step
// (mlp) shows them spread over its stages; the captured graph (ferry bench golden) removes them.
// Not here: the whole step's time beside PyTorch's (scripts/gpu-check), the cpu (it has no events).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../src/cuda/cuda_backend.h"
#include "ferry/ferry.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/sequential.h"
#include "ferry/optim.h"
#include "ferry/trainer.h"

namespace {

using ferry::Tensor;

const ferry::Device kCuda{ferry::DeviceType::CUDA, 0};

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "cuda_layer_bench: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// One call of the forward pass: children [first, first + count) of the Sequential, as its forward() runs them
// (nn::Sequential::stage_length).
struct Stage {
  std::size_t first = 0, count = 1;
  std::string name;  // "3 BatchNorm2d+ReLU+MaxPool2d"
};

std::vector<Stage> stages_of(const ferry::nn::Sequential& model) {
  std::vector<Stage> stages;
  for (std::size_t i = 0; i < model.size(); i += stages.back().count) {
    Stage s{.first = i, .count = model.stage_length(i), .name = std::to_string(i) + " " + model[i].type_name()};
    for (std::size_t k = 1; k < s.count; ++k) s.name += "+" + model[i + k].type_name();
    stages.push_back(s);
  }
  return stages;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string workload = "cnn";
  int steps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--workload" && i + 1 < argc) workload = argv[++i];
    else if (arg == "--steps" && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: cuda_layer_bench [--workload mlp|cnn] [--steps N]\n");
      return 2;
    }
  }
  try {
    if (ferry::device_count(ferry::DeviceType::CUDA) == 0) {
      std::fprintf(stderr, "cuda_layer_bench: no CUDA device (%s)\n", ferry::cuda::unavailable_reason().c_str());
      return 2;
    }
    if (workload != "mlp" && workload != "cnn") {
      std::fprintf(stderr, "cuda_layer_bench: --workload mlp or cnn, got '%s'\n", workload.c_str());
      return 2;
    }
    ferry::Ledger::global().set_enabled(false);
    ferry::manual_seed(0);
    const bool mlp = workload == "mlp";
    auto model = mlp ? ferry::make_mlp_model() : ferry::make_cnn_model(3, 32);
    model->to(kCuda);
    model->train();
    ferry::optim::SGD optimizer(model->parameters(), ferry::optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
    const std::vector<std::int64_t> shape = mlp ? std::vector<std::int64_t>{512, 784} : std::vector<std::int64_t>{256, 3, 32, 32};
    const Tensor x = ferry::randn(shape).to(kCuda), y = ferry::randint(0, 10, {shape[0]}).to(kCuda);
    const std::vector<Stage> stages = stages_of(*model);
    const std::size_t n = stages.size();
    auto* stream = static_cast<cudaStream_t>(ferry::backend(kCuda).compute_stream(0).handle);

    // Events: start, after each stage's forward (n), after the loss, backward start, each stage output's gradient
    // ready (n), backward end, after the update.
    std::vector<cudaEvent_t> forward(n), ready(n);
    cudaEvent_t start, loss_done, backward_start, backward_end, update_done;
    for (cudaEvent_t* e : {&start, &loss_done, &backward_start, &backward_end, &update_done}) check(cudaEventCreate(e), "cudaEventCreate");
    for (std::size_t i = 0; i < n; ++i) {
      check(cudaEventCreate(&forward[i]), "cudaEventCreate");
      check(cudaEventCreate(&ready[i]), "cudaEventCreate");
    }
    std::vector<std::vector<double>> forward_ms(n), backward_ms(n);
    std::vector<double> loss_forward_ms, loss_backward_ms, update_ms, step_ms;
    auto ms = [](cudaEvent_t a, cudaEvent_t b) {
      float t = 0;
      check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
      return static_cast<double>(t);
    };
    const int warmup = 3;  // the first step picks cuDNN's algorithms
    for (int step = 0; step < warmup + steps; ++step) {
      optimizer.zero_grad();
      check(cudaEventRecord(start, stream), "cudaEventRecord");
      Tensor h = x;
      std::vector<Tensor> outputs;
      for (std::size_t i = 0; i < n; ++i) {
        h = model->forward_stage(stages[i].first, h);
        check(cudaEventRecord(forward[i], stream), "cudaEventRecord");
        outputs.push_back(h);
      }
      for (std::size_t i = 0; i < n; ++i) {
        if (outputs[i].requires_grad()) {
          outputs[i].register_hook([&, i](const Tensor&) { check(cudaEventRecord(ready[i], stream), "cudaEventRecord"); });
        }
      }
      Tensor loss = ferry::nn::cross_entropy(h, y);
      check(cudaEventRecord(loss_done, stream), "cudaEventRecord");
      check(cudaEventRecord(backward_start, stream), "cudaEventRecord");
      loss.backward();
      check(cudaEventRecord(backward_end, stream), "cudaEventRecord");
      optimizer.step();
      check(cudaEventRecord(update_done, stream), "cudaEventRecord");
      check(cudaEventSynchronize(update_done), "cudaEventSynchronize");
      if (step < warmup) continue;
      // Stage i's backward runs from its output's gradient being ready to its input's, the output of the stage
      // before it. Stages whose output has no gradient (a Flatten of the batch) have no backward; the first stage
      // with one runs until backward ends (the batch needs no gradient).
      cudaEvent_t input_ready = backward_end;
      for (std::size_t i = 0; i < n; ++i) {
        forward_ms[i].push_back(ms(i == 0 ? start : forward[i - 1], forward[i]));
        if (!outputs[i].requires_grad()) continue;
        backward_ms[i].push_back(ms(ready[i], input_ready));
        input_ready = ready[i];
      }
      loss_forward_ms.push_back(ms(forward[n - 1], loss_done));
      loss_backward_ms.push_back(ms(backward_start, ready[n - 1]));
      update_ms.push_back(ms(backward_end, update_done));
      step_ms.push_back(ms(start, update_done));
    }
    nlohmann::json rows = nlohmann::json::array();
    double forward_total = 0, backward_total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double f = median(forward_ms[i]), b = median(backward_ms[i]);
      forward_total += f;
      backward_total += b;
      rows.push_back({{"stage", stages[i].name}, {"forward_ms", f}, {"backward_ms", b}});
    }
    const nlohmann::json result = {
        {"bench", "layers"}, {"workload", workload}, {"batch", shape[0]}, {"device", "cuda:0"}, {"steps", steps},
        {"stages", rows}, {"loss_forward_ms", median(loss_forward_ms)}, {"loss_backward_ms", median(loss_backward_ms)},
        {"update_ms", median(update_ms)}, {"forward_ms", forward_total}, {"backward_ms", backward_total},
        {"step_ms", median(step_ms)}};
    std::printf("%s\n", result.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_layer_bench: %s\n", e.what());
    return 1;
  }
}
