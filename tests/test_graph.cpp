// test_graph.cpp — captured graphs (ferry/graph.h) and the captured training step (ferry/step_graph.h).
// sim records the calls of a capture the way CUDA does, so the rules are checked here without a GPU; the
// cuda cases run where a GPU is present.
#include "ferry/graph.h"

#include <functional>
#include <utility>

#include "../src/core/ready_event.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/rnn.h"
#include "ferry/optim.h"
#include "ferry/step_graph.h"
#include "ferry/trainer.h"
#include "test_helpers.h"

namespace ferry {
namespace {

const Device kSim0{DeviceType::Sim, 0};

// sim computes BatchNorm (and, without oneDNN, large convolutions) with fused host loops when it runs eagerly;
// inside a capture it takes the backend's calls (as cuda always does). Bit-for-bit comparisons use those in both
// arms.
struct BackendKernelsOnly {
  BackendKernelsOnly() { nn::functional::set_fused_host_kernels(false); }
  ~BackendKernelsOnly() { nn::functional::set_fused_host_kernels(true); }
};

// On sim here, and on cuda where a GPU is present.
TEST(Graph, ReplaysTheCapturedWorkOnNewInputValues) {
  for (const Device device : testing::accelerators()) {
    SCOPED_TRACE(device.str());
    Tensor x = from_vector<float>({1, 2, 3, 4}, {4}).to(device);
    Tensor y;
    Graph graph(device);
    graph.capture([&] { y = add(mul(x, 2.0), 1.0); });
    ASSERT_TRUE(graph.captured());
    EXPECT_GE(graph.operations(), 2);  // two kernels, and the memory they wrote
    if (device.type == DeviceType::CUDA) {  // CUDA lists its nodes by type; the sim backend does not say
      EXPECT_EQ(graph.composition(), "2 kernels, 2 allocations, 1 free");  // mul's output is freed inside
    }
    graph.replay();
    EXPECT_EQ(y.cpu().to_vector<float>(), (std::vector<float>{3, 5, 7, 9}));
    void* const address = y.data_ptr();
    x.copy_(from_vector<float>({10, 20, 30, 40}, {4}).to(device));  // new input values, same tensor
    graph.replay();
    EXPECT_EQ(y.data_ptr(), address);  // the output keeps its address
    EXPECT_EQ(y.cpu().to_vector<float>(), (std::vector<float>{21, 41, 61, 81}));
    EXPECT_EQ(graph.replays(), 2);
  }
}

// An LSTM or GRU layer's forward and backward captured on sim and cuda: the backend's recurrent cell is one
// recorded call each way per step, and the replay gives the eager step's values, on new input values too (on sim
// its bits; on cuda to 1e-5, leaving cuBLAS free to pick another kernel inside a capture). With the library layers
// off the capture records the composed step's elementwise ops instead, many more of them.
TEST(Graph, ARecurrentLayerRecordsItsFusedCellsAndReplaysTheEagerBits) {
  for (const Device device : testing::accelerators()) {
    for (const bool lstm : {true, false}) {
      SCOPED_TRACE(device.str() + (lstm ? " LSTM" : " GRU"));
      manual_seed(5);
      const TensorOptions on{.device = device};
      const nn::RNNOptions options{.batch_first = true};
      std::shared_ptr<nn::RNNBase> layer;
      if (lstm) layer = std::make_shared<nn::LSTM>(4, 8, options, on);
      else layer = std::make_shared<nn::GRU>(4, 8, options, on);
      const Tensor x = randn({3, 6, 4}).to(device).requires_grad_(true);
      const Tensor probe = randn({3, 6, 8}).to(device);
      auto step = [&] {  // the output, and the gradients of sum(output * probe), into tensors that stay put
        const Tensor out = layer->forward(x);
        sum(mul(out, probe)).backward();
        return out.detach();
      };
      std::vector<Tensor> with_grads = layer->parameters();
      with_grads.push_back(x);
      auto read = [&](const Tensor& out) {
        std::vector<std::vector<float>> all{out.cpu().to_vector<float>()};
        for (const Tensor& t : with_grads) all.push_back(t.grad().cpu().to_vector<float>());
        return all;
      };
      auto clear = [&] {
        for (const Tensor& t : with_grads) t.grad().zero_();
      };
      auto expect_same = [&](const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                             const char* what) {
        if (device.type == DeviceType::Sim) {
          EXPECT_EQ(got, want) << what;
          return;
        }
        ASSERT_EQ(got.size(), want.size()) << what;
        for (std::size_t k = 0; k < got.size(); ++k) {
          ASSERT_EQ(got[k].size(), want[k].size()) << what;
          for (std::size_t i = 0; i < got[k].size(); ++i) {
            EXPECT_NEAR(got[k][i], want[k][i], 1e-5 * (1 + std::abs(want[k][i]))) << what << ", result " << k;
          }
        }
      };
      const auto eager = read(step());
      clear();

      Tensor out;
      Graph graph(device);
      graph.capture([&] { out = step(); });
      ASSERT_TRUE(graph.captured());
      graph.replay();
      expect_same(read(out), eager, "the replayed layer differs from the eager one");
      x.detach().mul_(-0.5);  // new input values: the replay computes with them
      clear();
      graph.replay();
      const auto replayed = read(out);
      clear();
      expect_same(replayed, read(step()), "the replay on new input values differs from an eager step on them");

      nn::functional::set_library_layers(false);
      Tensor composed_out;
      Graph composed(device);
      composed.capture([&] { composed_out = step(); });
      nn::functional::set_library_layers(true);
      ASSERT_TRUE(composed.captured());
      EXPECT_LT(graph.operations() * 3 / 2, composed.operations())
          << "fused " << graph.operations() << " operations (" << graph.composition() << "), composed "
          << composed.operations() << " (" << composed.composition() << ")";
    }
  }
}

// softmax along the last dim is one kernel forward and one backward (Backend::softmax_forward), where the same
// rows as dim 0 take the composed op's several: counted in a capture, with the same values.
TEST(Graph, SoftmaxAlongTheLastDimIsOneKernelEachWay) {
  for (const Device device : testing::accelerators()) {
    SCOPED_TRACE(device.str());
    manual_seed(3);
    const Tensor x = randn({32, 64}, {.device = device}).requires_grad_(true);
    const Tensor xt = x.detach().t().contiguous().requires_grad_(true);
    const Tensor g = randn({32, 64}, {.device = device});
    const auto counted = [&](const std::function<Tensor()>& forward) {
      Tensor out;
      Graph graph(device);
      graph.capture([&] {
        out = forward();
        out.backward(g);
      });
      graph.replay();
      return std::pair{graph.operations(), graph.composition()};
    };
    const auto [fused, fused_words] = counted([&] { return softmax(x, -1); });
    const auto [composed, composed_words] = counted([&] { return softmax(xt, 0).t(); });
    EXPECT_LT(fused * 3, composed) << "last dim: " << fused << " operations (" << fused_words << "); dim 0: "
                                   << composed << " (" << composed_words << ")";
    EXPECT_TRUE(testing::all_close(x.grad().cpu(), xt.grad().t().cpu(), 1e-5, 1e-6));
  }
}

// LayerNorm and GELU are one backend call forward and one backward (Backend::layer_norm_forward, gelu_forward; on
// cuda the LayerNorm's backward is three kernels: the input's gradient, then the weight's and bias' column sums in
// two steps), where with the library layers off they are composed of many: counted in a capture, with the same
// values.
TEST(Graph, LayerNormAndGeluAreOneCallEachWay) {
  for (const Device device : testing::accelerators()) {
    SCOPED_TRACE(device.str());
    manual_seed(3);
    const Tensor x = randn({32, 64}, {.device = device}).requires_grad_(true);
    const Tensor w = randn({64}, {.device = device}).requires_grad_(true);
    const Tensor b = randn({64}, {.device = device}).requires_grad_(true);
    const Tensor g = randn({32, 64}, {.device = device});
    nn::functional::layer_norm(x, {64}, w, b, 1e-5).backward(g);  // the gradients exist: each capture adds to them
    const auto counted = [&](bool library, const std::function<Tensor()>& forward) {
      nn::functional::set_library_layers(library);
      for (const Tensor& t : {x, w, b}) t.grad().zero_();
      Tensor out;
      Graph graph(device);
      graph.capture([&] {
        out = forward();
        out.backward(g);
      });
      nn::functional::set_library_layers(true);
      graph.replay();
      std::vector<std::vector<float>> values{out.cpu().to_vector<float>()};
      for (const Tensor& t : {x, w, b}) values.push_back(t.grad().cpu().to_vector<float>());
      return std::tuple{graph.operations(), graph.composition(), values};
    };
    for (const bool gelu : {false, true}) {
      SCOPED_TRACE(gelu ? "gelu" : "layer_norm");
      const auto forward = [&] {
        return gelu ? nn::functional::gelu(x) : nn::functional::layer_norm(x, {64}, w, b, 1e-5);
      };
      const auto [fused, fused_words, fused_values] = counted(true, forward);
      const auto [composed, composed_words, composed_values] = counted(false, forward);
      EXPECT_LT(fused * 2, composed) << "kernels: " << fused << " operations (" << fused_words << "); composed: "
                                     << composed << " (" << composed_words << ")";
      ASSERT_EQ(fused_values.size(), composed_values.size());
      for (std::size_t k = 0; k < fused_values.size(); ++k) {
        EXPECT_TRUE(testing::all_close(from_vector<float>(fused_values[k]), from_vector<float>(composed_values[k]),
                                       1e-5, 1e-5))
            << "result " << k;
      }
    }
  }
}

TEST(Graph, WhatCannotBeCapturedIsAnErrorAndTheDeviceStaysUsable) {
  for (const Device device : testing::accelerators()) {
    SCOPED_TRACE(device.str());
    Tensor x = ones({8}, {.device = device});
    auto expect_capture_error = [&](const std::function<void()>& body, const std::string& words) {
      Graph graph(device);
      try {
        graph.capture(body);
        ADD_FAILURE() << "captured, but should have failed with: " << words;
      } catch (const GraphCaptureError& e) {
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
      EXPECT_FALSE(graph.captured());
      EXPECT_FALSE(capturing_device().has_value());
    };
    expect_capture_error([&] { (void)sum(x).item<float>(); }, "to cpu (item())");
    expect_capture_error([&] { (void)x.cpu(); }, "cpu()");
    expect_capture_error([&] { synchronize(device, "test"); }, "host sync");
    expect_capture_error([&] { (void)randn({4}, {.device = device}); }, "random numbers");
    expect_capture_error([&] { (void)from_vector<float>({1}, {1}).to(device); }, "copy from cpu to " + device.str());
    if (device.type == DeviceType::Sim) {  // freeing memory made before the capture: CUDA refuses it, sim says so
      Tensor before = ones({16}, {.device = device});
      expect_capture_error([&] { before = add(before, 1.0); }, "allocated before the capture");
    }
    // The device still computes, eagerly and in a new capture.
    EXPECT_FLOAT_EQ(sum(x).item<float>(), 8.0F);
    Tensor z;
    Graph again(device);
    again.capture([&] { z = mul(x, 3.0); });
    again.replay();
    EXPECT_FLOAT_EQ(sum(z).item<float>(), 24.0F);
  }
}

TEST(Graph, CpuCannotCaptureAndCapturesDoNotNest) {
  EXPECT_FALSE(graph_capture_supported(kCPU));
  EXPECT_THROW(Graph{kCPU}, NotSupported);
  EXPECT_TRUE(graph_capture_supported(kSim0));
  Graph outer(kSim0);
  Graph inner(kSim0);
  EXPECT_THROW(outer.capture([&] { inner.capture([] {}); }), GraphCaptureError);
  EXPECT_THROW(outer.replay(), InvalidArgument);  // never captured
}

// The fmnist cnn's step as a StepGraph (enabled with `graphs`): forward, cross-entropy, backward, and `update`'s
// step when one is given.
std::shared_ptr<StepGraph> cnn_step(const std::shared_ptr<nn::Module>& model,
                                    const std::shared_ptr<optim::Optimizer>& update, bool graphs) {
  return std::make_shared<StepGraph>(
      model->parameters(),
      [model, update](const Tensor& x, const Tensor& y) {
        Tensor loss = nn::cross_entropy((*model)(x), y);
        loss.backward();
        if (update) update->step();
        return loss.detach();
      },
      StepGraphOptions{.enabled = graphs});
}

// Seven batches for the cnn on `device`, the fifth of another shape (3 images, not 4): it runs eagerly.
std::vector<std::pair<Tensor, Tensor>> cnn_batches(Device device) {
  manual_seed(4);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (std::int64_t n : {4, 4, 4, 4, 3, 4, 4}) {
    batches.emplace_back(randn({n, 1, 28, 28}).to(device), randint(0, 10, {n}).to(device));
  }
  return batches;
}

// The captured step equals the eager one bit for bit: same kernels, same order. `device` is sim here, cuda on a
// GPU machine; a batch of another shape in between runs eagerly and the graph resumes after it. The eager arm
// updates outside its step with the learning rate on the host; the graph arm updates outside the graph, or,
// with `update_inside`, inside it with the learning rate on the device, changed before every step.
void expect_step_graph_matches_eager(Device device, double tolerance, bool update_inside) {
  BackendKernelsOnly same_kernels;
  auto make = [&](bool graphs) {
    manual_seed(3);
    auto model = make_fmnist_model({.device = device});
    const bool inside = graphs && update_inside;
    auto optimizer = std::make_shared<optim::SGD>(
        model->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4, .lr_on_device = inside});
    return std::tuple{model, optimizer, cnn_step(model, inside ? optimizer : nullptr, graphs)};
  };
  auto [eager_model, eager_opt, eager_step] = make(false);
  auto [graph_model, graph_opt, graph_step] = make(true);
  const auto batches = cnn_batches(device);
  double lr = 0.05;
  for (const auto& [x, y] : batches) {
    lr *= 0.7;  // a schedule: a replay that repeated the captured learning rate would drift from the eager arm
    eager_opt->set_learning_rate(lr);
    graph_opt->set_learning_rate(lr);
    const float a = eager_step->run(x, y).item<float>();
    eager_opt->step();
    const float b = graph_step->run(x, y).item<float>();
    if (!update_inside) graph_opt->step();
    if (tolerance == 0) EXPECT_EQ(a, b);
    else EXPECT_NEAR(a, b, tolerance * std::abs(a));
  }
  EXPECT_TRUE(graph_step->captured()) << graph_step->describe();
  EXPECT_EQ(graph_step->replays(), 4);      // steps 3, 4, 6, 7 (1 and 2 warm up, 5 has 3 images)
  EXPECT_EQ(graph_step->eager_steps(), 3);
  EXPECT_EQ(eager_step->replays(), 0);
  const auto a = eager_model->state_dict(), b = graph_model->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(testing::all_close(b[i].second, a[i].second, tolerance, tolerance)) << a[i].first;
  const auto sa = eager_opt->state_dict(), sb = graph_opt->state_dict();  // the momentum buffers
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i)
    EXPECT_TRUE(testing::all_close(sb[i].second, sa[i].second, tolerance, tolerance)) << sa[i].first;
}

TEST(StepGraph, ReplayedStepsEqualEagerStepsBitForBitOnSim) { expect_step_graph_matches_eager(kSim0, 0, false); }

// AdamW with capturable updates inside the captured step, its step counts and both groups' learning rates on the
// device: the replays follow a schedule and equal the host-counted AdamW stepping eagerly, bit for bit (with a
// batch of another shape, run eagerly, in between). Two groups: decay on the matrices at one rate, none on the
// biases and BatchNorm at twice the rate.
void expect_adamw_step_graph_matches_eager(Device device) {
  BackendKernelsOnly same_kernels;
  auto make = [&](bool graphs) {
    manual_seed(3);
    auto model = make_fmnist_model({.device = device});
    std::vector<optim::ParamGroup> groups(2);
    for (const Tensor& p : model->parameters()) groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
    groups[1].weight_decay = 0.0;
    auto optimizer = std::make_shared<optim::AdamW>(
        groups, optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.05, .capturable = graphs});
    return std::tuple{model, optimizer, cnn_step(model, optimizer, graphs)};
  };
  auto [eager_model, eager_opt, eager_step] = make(false);
  auto [graph_model, graph_opt, graph_step] = make(true);
  const auto batches = cnn_batches(device);
  double lr = 2e-3;
  for (const auto& [x, y] : batches) {
    lr *= 0.7;
    for (auto* optimizer : {eager_opt.get(), graph_opt.get()}) {
      optimizer->set_group_learning_rate(0, lr);
      optimizer->set_group_learning_rate(1, 2 * lr);
    }
    const float a = eager_step->run(x, y).item<float>();
    const float b = graph_step->run(x, y).item<float>();
    EXPECT_EQ(a, b);
  }
  EXPECT_TRUE(graph_step->captured()) << graph_step->describe();
  EXPECT_EQ(graph_step->replays(), 4);
  const auto a = eager_model->state_dict(), b = graph_model->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(testing::values(a[i].second.cpu()), testing::values(b[i].second.cpu())) << a[i].first;
  }
  const auto sa = eager_opt->state_dict(), sb = graph_opt->state_dict();  // counts, moments
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_EQ(testing::values(sa[i].second.cpu()), testing::values(sb[i].second.cpu())) << sa[i].first;
  }
  EXPECT_EQ(sb[0].second.item<double>(), 7.0);  // every step counted, replays too
}

TEST(StepGraph, CapturableAdamWReplaysTheEagerStepsBitForBitOnSim) { expect_adamw_step_graph_matches_eager(kSim0); }

// Module::to() there and back keeps the parameters' tensors but replaces their memory: the graph, whose kernels
// point at the old memory, is dropped, the step runs eagerly and is captured again, and every step's loss and the
// final weights stay the eager arm's, bit for bit.
TEST(StepGraph, AModelMovedAfterTheCaptureIsCapturedAgain) {
  BackendKernelsOnly same_kernels;
  const Device sim1 = Device::parse("sim:1");
  auto make = [&](bool graphs) {
    manual_seed(3);
    auto model = make_fmnist_model({.device = kSim0});
    auto optimizer = std::make_shared<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    auto step = std::make_shared<StepGraph>(
        model->parameters(),
        [model](const Tensor& x, const Tensor& y) {
          Tensor loss = nn::cross_entropy((*model)(x), y);
          loss.backward();
          return loss.detach();
        },
        StepGraphOptions{.enabled = graphs});
    return std::tuple{model, optimizer, step};
  };
  auto [eager_model, eager_opt, eager_step] = make(false);
  auto [graph_model, graph_opt, graph_step] = make(true);
  manual_seed(4);
  const Tensor x = randn({8, 1, 28, 28}).to(kSim0), y = randint(0, 10, {8}).to(kSim0);
  for (int i = 0; i < 10; ++i) {
    if (i == 4) {  // after two replays: there and back, optimizer state with them
      for (auto* model : {eager_model.get(), graph_model.get()}) {
        model->to(sim1);
        model->to(kSim0);
      }
      eager_opt->to_parameter_devices();
      graph_opt->to_parameter_devices();
    }
    const float a = eager_step->run(x, y).item<float>();
    eager_opt->step();
    const float b = graph_step->run(x, y).item<float>();
    graph_opt->step();
    EXPECT_EQ(a, b) << "step " << i;
  }
  EXPECT_TRUE(graph_step->captured()) << graph_step->describe();
  EXPECT_EQ(graph_step->replays(), 4) << graph_step->describe();  // steps 6 to 9 on the new graph (4, 5 warm up)
  EXPECT_NE(graph_step->describe().find("captured again 1 time(s) after the parameters moved"), std::string::npos)
      << graph_step->describe();
  const auto a = eager_model->state_dict(), b = graph_model->state_dict();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(testing::all_close(b[i].second, a[i].second, 0, 0)) << a[i].first;
}

// A batch written into the graph's own inputs (index_select_out, as DataLoader::next_into does) is replayed on
// without another copy, with the eager step's result.
TEST(StepGraph, ABatchWrittenIntoTheInputsIsNotCopiedAgain) {
  manual_seed(6);
  const Tensor data = randn({32, 5}).to(kSim0), targets = randint(0, 3, {32}).to(kSim0);
  const Tensor weight = mul(randn({3, 5}), 0.1).to(kSim0).requires_grad_();
  StepGraph step({weight}, [&](const Tensor& x, const Tensor& y) {
    Tensor loss = nn::cross_entropy(matmul(x, weight.t()), y);
    loss.backward();
    return loss.detach();
  });
  const Tensor first = arange(0, 8, 1, {.dtype = DType::Int64}).to(kSim0);
  EXPECT_FALSE(step.inputs().first.defined());
  for (int i = 0; i < 3; ++i) step.run(index_select(data, 0, first), index_select(targets, 0, first));  // capture
  ASSERT_TRUE(step.captured()) << step.describe();
  auto [images, labels] = step.inputs();
  ASSERT_EQ(images.shape(), (Shape{8, 5}));
  const Tensor rows = arange(8, 16, 1, {.dtype = DType::Int64}).to(kSim0);
  index_select_out(images, data, 0, rows);
  index_select_out(labels, targets, 0, rows);
  const std::uint64_t version = images.impl()->version, label_version = labels.impl()->version;
  const float replayed = step.run(images, labels).item<float>();
  EXPECT_EQ(images.impl()->version, version);  // no copy into it
  EXPECT_EQ(labels.impl()->version, label_version);
  EXPECT_EQ(step.replays(), 2);
  const float eager = nn::cross_entropy(matmul(index_select(data, 0, rows), weight.detach().t()),
                                        index_select(targets, 0, rows)).item<float>();
  EXPECT_EQ(replayed, eager);
  // Another batch is copied in as before.
  const float copied = step.run(index_select(data, 0, first), index_select(targets, 0, first)).item<float>();
  EXPECT_GT(images.impl()->version, version);
  EXPECT_EQ(copied, nn::cross_entropy(matmul(index_select(data, 0, first), weight.detach().t()),
                                      index_select(targets, 0, first)).item<float>());
  // index_select_out checks what it writes into.
  Tensor wrong = empty({7, 5}, {.device = kSim0});
  EXPECT_THROW(index_select_out(wrong, data, 0, rows), ShapeMismatch);
  EXPECT_THROW(index_select_out(images, weight, 0, arange(0, 3, 1, {.dtype = DType::Int64}).to(kSim0)),
               InvalidArgument);  // needs a gradient
}

TEST(StepGraph, AnUpdateInsideTheGraphFollowsTheLearningRateBitForBitOnSim) {
  expect_step_graph_matches_eager(kSim0, 0, true);
}

TEST(StepGraph, ReplayedStepsEqualEagerStepsOnCuda) {
  if (!is_available(DeviceType::CUDA)) GTEST_SKIP() << "no CUDA device: " << available_devices_text();
  // cuDNN's backward algorithms may add with atomics, in another order on every call: close, not equal.
  expect_step_graph_matches_eager(Device(DeviceType::CUDA, 0), 1e-4, false);
  expect_step_graph_matches_eager(Device(DeviceType::CUDA, 0), 1e-4, true);
  // With deterministic algorithms (ferry/determinism.h) the replayed step is the eager one, bit for bit.
  const DeterministicAlgorithmsGuard deterministic(true);
  expect_step_graph_matches_eager(Device(DeviceType::CUDA, 0), 0, true);
  expect_adamw_step_graph_matches_eager(Device(DeviceType::CUDA, 0));
}

// item() of a loss on cuda waits for the loss's ready event (src/core/ready_event.h), recorded after the loss's
// kernels in an eager step and as an event record node of the graph in a replayed one, not for the backward pass
// and update queued after it. Each read must still be the loss of its own step: the same value as a read of the
// same bytes after everything (a copy of them, which has no mark).
TEST(StepGraph, ALossReadBeforeTheRestOfItsStepIsTheLossOfThatStep) {
  if (!is_available(DeviceType::CUDA)) GTEST_SKIP() << "no CUDA device: " << available_devices_text();
  const Device cuda(DeviceType::CUDA, 0);
  manual_seed(3);
  auto model = make_fmnist_model({.device = cuda});
  optim::SGD optimizer(model->parameters(), {.lr = 0.05, .momentum = 0.9, .lr_on_device = true});
  StepGraph step(model->parameters(), [&](const Tensor& x, const Tensor& y) {
    Tensor loss = nn::cross_entropy((*model)(x), y);
    loss.backward();
    optimizer.step();
    return loss.detach();
  });
  manual_seed(4);
  const Tensor x = randn({16, 1, 28, 28}).to(cuda), y = randint(0, 10, {16}).to(cuda);
  std::vector<double> losses;
  for (int i = 0; i < 6; ++i) {  // two eager steps, the capture and its replay, three more replays
    const Tensor loss = step.run(x, y);
    EXPECT_NE(detail::ready_event_for_read(loss), nullptr) << "step " << i << ": the loss has no ready event";
    const double early = loss.item<double>();
    EXPECT_EQ(early, mul(loss, 1.0).item<double>()) << "step " << i;
    losses.push_back(early);
  }
  EXPECT_EQ(step.replays(), 4);
  EXPECT_NE(step.describe().find("1 event record"), std::string::npos) << step.describe();
  EXPECT_LT(losses.back(), losses.front());  // the same batch six times: each read saw a newer step
  // A loss written in place after it was marked is read after that write.
  Tensor loss = nn::cross_entropy((*model)(x), y).detach();
  const double before = loss.item<double>();
  loss.mul_(3.0);
  EXPECT_EQ(detail::ready_event_for_read(loss), nullptr);
  EXPECT_NEAR(loss.item<double>(), 3 * before, 1e-6 * std::abs(before));
}

// An update inside a capture must not bake host numbers into the graph: each way it could is refused.
TEST(StepGraph, AnUpdateThatWouldReplayHostNumbersIsRefusedInsideACapture) {
  Tensor w = ones({4}, {.device = kSim0, .requires_grad = true});
  auto expect_refused = [&](const std::function<void()>& update, const std::string& words) {
    w.set_grad(Tensor());  // a gradient made inside a capture that failed holds nothing computed
    try {
      Graph graph(kSim0);
      graph.capture([&] {
        sum(mul(w, w)).backward();
        update();
      });
      ADD_FAILURE() << "captured: " << words;
    } catch (const GraphCaptureError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    w.set_grad(Tensor());
  };
  optim::SGD host_lr({w}, {.lr = 0.1});
  expect_refused([&] { host_lr.step(); }, "lr_on_device");
  optim::SGD device_lr({w}, {.lr = 0.1, .momentum = 0.9, .lr_on_device = true});
  expect_refused([&] { device_lr.step(); }, "momentum buffers");  // no eager step yet
  sum(mul(w, w)).backward();
  device_lr.step();  // eager: the buffers and the learning rate's scalar are made
  expect_refused([&] { device_lr.set_learning_rate(0.2); }, "learning rate");
  optim::Adam adam({w});
  expect_refused([&] { adam.step(); }, "capturable");
  optim::Adam capturable({w}, {.lr = 0.1, .capturable = true});
  expect_refused([&] { capturable.step(); }, "creating its state");  // no eager step yet
  sum(mul(w, w)).backward();
  capturable.step();  // eager: the moments and the step count are made
  w.set_grad(Tensor());
  expect_refused([&] { capturable.set_learning_rate(0.2); }, "learning rate");
  // The same SGD captures once its buffers exist, and each replay reads the learning rate set before it.
  const Tensor before = w.detach().clone();
  Graph graph(kSim0);
  graph.capture([&] {
    sum(mul(w, w)).backward();  // grad = 2w
    device_lr.step();
  });
  for (const double lr : {0.0, 0.25}) {
    const Tensor start = w.detach().clone();
    const Tensor buffer = device_lr.state_dict().at(0).second.clone();
    device_lr.set_learning_rate(lr);
    graph.replay();
    // buf = 0.9 buf + 2w; w -= lr buf
    const Tensor expected_buffer = add(mul(buffer, 0.9), mul(start, 2.0));
    EXPECT_TRUE(testing::all_close(w.detach(), sub(start, mul(expected_buffer, lr)), 1e-6, 1e-6)) << "lr " << lr;
  }
  EXPECT_FALSE(testing::all_close(w.detach(), before, 1e-3, 1e-3));
}

TEST(StepGraph, AStepThatCannotBeCapturedRunsEagerlyAndSaysWhy) {
  Tensor w = ones({4}, {.device = kSim0, .requires_grad = true});
  StepGraph step({w}, [&](const Tensor& x, const Tensor&) {
    Tensor loss = sum(mul(x, w));
    (void)loss.item<float>();  // a host sync: not capturable
    loss.backward();
    return loss.detach();
  });
  const Tensor x = ones({4}, {.device = kSim0}), y = zeros({4}, {.device = kSim0});
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(step.run(x, y).item<float>(), 4.0F);
  EXPECT_FALSE(step.captured());
  EXPECT_EQ(step.eager_steps(), 4);
  EXPECT_NE(step.describe().find("item()"), std::string::npos) << step.describe();
  EXPECT_FLOAT_EQ(sum(w.grad()).item<float>(), 4.0F);
}

}  // namespace
}  // namespace ferry
