// test_optim.cpp — SGD, Adam, AdamW, RMSprop and Adagrad against PyTorch fixtures step by step
// (tools/make_fixtures.py), on cpu and sim:0, and at edge values (inf, NaN, overflow) on every device; clip_grad_norm_;
// state on the parameter's device; state_dict save and exact restore; zero_grad.
// Not here: the training parity of a whole model (test_nn_parity.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <sstream>

#include "fixtures/fixture_reader.h"
#include "test_helpers.h"
#include "ferry/factories.h"
#include "ferry/graph.h"
#include "ferry/ledger.h"
#include "ferry/lr_scheduler.h"
#include "ferry/nn/clip_grad.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/linear.h"
#include "ferry/ops.h"
#include "ferry/optim.h"
#include "ferry/random.h"

using ferry::Device;
using ferry::DType;
using ferry::Tensor;
using ferry::testing::Fixture;
using ferry::testing::differences;
using ferry::testing::load_fixture;
namespace optim = ferry::optim;

namespace {
Device sim0() { return Device::parse("sim:0"); }

// The fixture's optimizer over `params`; `fused` picks SGD's and Adam's one-call step (their default) or the
// op-by-op one (RMSprop and Adagrad have only the latter).
std::unique_ptr<optim::Optimizer> make_optimizer(const Fixture& f, std::vector<Tensor> params, bool fused = true) {
  auto number = [&](const char* key, double fallback) { return f.metadata.count(key) ? f.number(key) : fallback; };
  auto flag = [&](const char* key) { return f.text(key, "False") == "True"; };
  const std::string kind = f.text("kind");
  if (kind == "sgd") {
    return std::make_unique<optim::SGD>(
        params, optim::SGDOptions{.lr = f.number("lr"), .momentum = number("momentum", 0), .dampening = number("dampening", 0),
                                  .weight_decay = number("weight_decay", 0), .nesterov = flag("nesterov"),
                                  .maximize = flag("maximize"), .fused = fused});
  }
  if (kind == "rmsprop") {
    return std::make_unique<optim::RMSprop>(
        params, optim::RMSpropOptions{.lr = f.number("lr"), .alpha = number("alpha", 0.99), .eps = number("eps", 1e-8),
                                      .weight_decay = number("weight_decay", 0), .momentum = number("momentum", 0),
                                      .centered = flag("centered"), .maximize = flag("maximize")});
  }
  if (kind == "adagrad") {
    return std::make_unique<optim::Adagrad>(
        params, optim::AdagradOptions{.lr = f.number("lr"), .lr_decay = number("lr_decay", 0),
                                      .weight_decay = number("weight_decay", 0),
                                      .initial_accumulator_value = number("initial_accumulator_value", 0),
                                      .eps = number("eps", 1e-10), .maximize = flag("maximize")});
  }
  optim::AdamOptions options{.lr = f.number("lr"), .beta1 = number("beta1", 0.9), .beta2 = number("beta2", 0.999),
                             .eps = number("eps", 1e-8), .weight_decay = number("weight_decay", 0),
                             .amsgrad = flag("amsgrad"), .maximize = flag("maximize"), .fused = fused};
  if (kind == "adamw") {  // AdamWOptions' own default weight decay (1e-2) where the fixture gives none
    optim::AdamWOptions adamw{.lr = options.lr, .beta1 = options.beta1, .beta2 = options.beta2, .eps = options.eps,
                              .amsgrad = options.amsgrad, .maximize = options.maximize, .fused = fused};
    if (f.metadata.count("weight_decay")) adamw.weight_decay = options.weight_decay;
    return std::make_unique<optim::AdamW>(params, adamw);
  }
  return std::make_unique<optim::Adam>(params, options);
}
}  // namespace

class OptimParity : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimParity, EveryStepMatchesPyTorchOnCpuAndSim) {
  const Fixture f = load_fixture(GetParam());
  std::vector<std::vector<std::vector<float>>> results;  // per device, per step
  std::vector<Device> devices = {ferry::kCPU, sim0()};
  if (ferry::is_available(ferry::DeviceType::CUDA)) devices.push_back(Device(ferry::DeviceType::CUDA, 0));
  for (const Device device : devices) {
    results.emplace_back();
    Tensor p = f["initial"].to(device).clone().requires_grad_(true);
    auto optimizer = make_optimizer(f, {p});
    const Tensor grads = f["grads"], expected = f["params"];
    for (std::int64_t step = 0; step < grads.size(0); ++step) {
      optimizer->zero_grad();
      p.set_grad(grads.select(0, step).contiguous().to(device));
      optimizer->step();
      EXPECT_CLOSE_TO_FIXTURE(p.detach(), expected.select(0, step).contiguous(), 1e-5,
                              GetParam() + " on " + device.str() + " step " + std::to_string(step));
      results.back().push_back(p.to_vector<float>());
    }
    // The state, under PyTorch's names, lives on the parameter's device (except the host step count).
    for (const auto& [name, value] : optimizer->state_dict()) {
      ASSERT_EQ(name.rfind("state.0.", 0), 0u) << name;
      const std::string key = "state." + name.substr(8);
      ASSERT_TRUE(f.has(key)) << GetParam() << ": ferry has state " << name << " that PyTorch lacks";
      if (name == "state.0.step") {
        EXPECT_EQ(value.item<double>(), f[key].to_vector<double>()[0]);
      } else {
        EXPECT_EQ(value.device(), device) << name;
        EXPECT_CLOSE_TO_FIXTURE(value, f[key], 1e-5, GetParam() + ": " + name);
      }
    }
    std::size_t torch_state = 0;
    for (const auto& [key, value] : f.tensors) torch_state += key.rfind("state.", 0) == 0;
    EXPECT_EQ(optimizer->state_dict().size(), torch_state) << GetParam();
  }
  EXPECT_EQ(results[0], results[1]) << GetParam() << ": sim:0 differs from cpu";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OptimParity,
                         ::testing::Values("sgd_plain", "sgd_momentum_dampening_wd", "sgd_nesterov_wd", "sgd_maximize",
                                           "adam", "adam_wd_amsgrad", "adamw", "rmsprop",
                                           "rmsprop_centered_momentum_wd", "rmsprop_maximize", "adagrad",
                                           "adagrad_decay_init_wd"));

namespace {
// The part of `f` under "<name>/": its tensors and settings, the prefix taken off their keys.
Fixture part(const Fixture& f, const std::string& name) {
  Fixture out;
  const std::string prefix = name + "/";
  for (const auto& [key, value] : f.tensors)
    if (key.rfind(prefix, 0) == 0) out.tensors[key.substr(prefix.size())] = value;
  for (const auto& [key, value] : f.metadata)
    if (key.rfind(prefix, 0) == 0) out.metadata[key.substr(prefix.size())] = value;
  return out;
}

// The cases of `f`: the names before "/<last>" of its keys ending so.
std::vector<std::string> cases_of(const Fixture& f, const std::string& last) {
  std::vector<std::string> names;
  for (const auto& [key, value] : f.tensors) {
    const std::size_t slash = key.rfind('/');
    if (slash != std::string::npos && key.substr(slash + 1) == last) names.push_back(key.substr(0, slash));
  }
  return names;
}
}  // namespace

// Every optimizer through five steps of gradients at the edge values (tools/make_fixtures.py's optim_edge_cases:
// an inf, -inf or NaN gradient at one step, gradients whose square overflows or underflows, parameters that are
// inf, NaN or near the largest; in float32, and in float64 at double's edges), each element of the parameter after
// every step and of the state after the last against PyTorch's, on every device, fused and op by op.
TEST(OptimParityEdgeValues, EveryOptimizerMatchesPyTorchAtInfinitiesNanAndOverflow) {
  const Fixture fixture = load_fixture("optim_edge_values");
  const std::vector<std::string> names = cases_of(fixture, "initial");  // each setting in float32 and float64
  ASSERT_EQ(names.size(), 24U);
  std::vector<Device> devices = ferry::testing::accelerators();
  devices.insert(devices.begin(), ferry::kCPU);
  for (const std::string& name : names) {
    const Fixture f = part(fixture, name);
    // Each element's scenario, for the messages: "p=1 g=[0.1 inf 0.1 0.1 0.1]".
    std::vector<std::string> labels;
    const std::vector<double> initial = ferry::testing::values(f["initial"]);
    const Tensor grads = f["grads"], expected = f["params"];
    for (std::size_t i = 0; i < initial.size(); ++i) {
      std::ostringstream label;
      label << "p=" << initial[i] << " g=[";
      for (std::int64_t s = 0; s < grads.size(0); ++s)
        label << (s ? " " : "") << ferry::testing::values(grads.select(0, s))[i];
      labels.push_back(label.str() + "]");
    }
    const std::string kind = f.text("kind");
    const bool has_fused = kind == "sgd" || kind == "adam" || kind == "adamw";
    for (const Device& device : devices) {
      for (const bool fused : has_fused ? std::vector<bool>{true, false} : std::vector<bool>{false}) {
        const std::string where = name + " on " + device.str() + (fused ? " (fused)" : " (op by op)");
        Tensor p = f["initial"].to(device).clone().requires_grad_(true);
        auto optimizer = make_optimizer(f, {p}, fused);
        for (std::int64_t step = 0; step < grads.size(0); ++step) {
          optimizer->zero_grad();
          p.set_grad(grads.select(0, step).contiguous().to(device));
          optimizer->step();
          const std::string diff = differences(p.detach(), expected.select(0, step).contiguous(), 1e-5, 0, labels);
          EXPECT_TRUE(diff.empty()) << where << ", the parameter after step " << step << diff;
        }
        for (const auto& [state_name, value] : optimizer->state_dict()) {
          if (state_name == "state.0.step") continue;
          const std::string key = "state." + state_name.substr(8);
          ASSERT_TRUE(f.has(key)) << where << ": ferry has state " << state_name << " that PyTorch lacks";
          const std::string diff = differences(value, f[key], 1e-5, 0, labels);
          EXPECT_TRUE(diff.empty()) << where << ", " << key << " after the last step" << diff;
        }
      }
    }
  }
}

// clip_grad_norm_ where a gradient holds inf, -inf, NaN, 1e30, 3e38 (its square overflows), subnormals or only
// zeros, for the 2-, 1-, inf- and 3-norm: the total and both clipped gradients against PyTorch's, every device.
TEST(ClipGrad, NormMatchesPyTorchAtInfinitiesNanAndOverflow) {
  namespace utils = ferry::nn::utils;
  const Fixture fixture = load_fixture("optim_edge_values");
  const std::vector<std::string> names = cases_of(fixture, "total");
  ASSERT_EQ(names.size(), 36U);
  std::vector<Device> devices = ferry::testing::accelerators();
  devices.insert(devices.begin(), ferry::kCPU);
  for (const Device& device : devices) {
    for (const std::string& name : names) {
      const Fixture f = part(fixture, name);
      const double norm_type = f.number("norm_type");  // 2, 1, inf or 3
      Tensor a = ferry::zeros({3}, {.device = device}), b = ferry::zeros({2, 2}, {.device = device});
      a.set_grad(f["grad0"].to(device).clone());
      b.set_grad(f["grad1"].to(device).clone());
      const Tensor total = utils::clip_grad_norm_({a, b}, f.number("max_norm"), norm_type);  // "inf": kInfinityNorm
      const std::string where = name + " on " + device.str();
      std::string diff = differences(total, f["total"], 1e-5, 0);
      EXPECT_TRUE(diff.empty()) << where << ", the total" << diff;
      diff = differences(a.grad(), f["clipped0"], 1e-5, 1e-45);
      EXPECT_TRUE(diff.empty()) << where << ", the first gradient" << diff;
      diff = differences(b.grad(), f["clipped1"], 1e-5, 1e-45);
      EXPECT_TRUE(diff.empty()) << where << ", the second gradient" << diff;
    }
  }
}

namespace {
// A small model and a fixed batch; returns the parameters after `steps` steps of `optimizer`.
void run_steps(ferry::nn::Linear& model, optim::Optimizer& optimizer, int steps, Device device) {
  ferry::manual_seed(21);
  const Tensor x = ferry::randn({8, model.in_features}).to(device);
  for (int i = 0; i < steps; ++i) {
    optimizer.zero_grad();
    ferry::sum(ferry::square(model(x))).backward();
    optimizer.step();
  }
}
}  // namespace

TEST(OptimState, SaveAndRestoreContinuesExactly) {
  for (const bool adam : {false, true}) {
    ferry::manual_seed(2);
    ferry::nn::Linear a(5, 3);
    ferry::nn::Linear b(5, 3);
    b.load_state_dict(a.state_dict());
    std::unique_ptr<optim::Optimizer> oa, ob;
    if (adam) {
      oa = std::make_unique<optim::Adam>(a.parameters(), optim::AdamOptions{.lr = 0.01, .amsgrad = true});
      ob = std::make_unique<optim::Adam>(b.parameters(), optim::AdamOptions{.lr = 0.01, .amsgrad = true});
    } else {
      oa = std::make_unique<optim::SGD>(a.parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .nesterov = true});
      ob = std::make_unique<optim::SGD>(b.parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .nesterov = true});
    }
    run_steps(a, *oa, 3, ferry::kCPU);
    // Checkpoint: copies of the model and optimizer state, restored into b (whose optimizer is fresh),
    // on another device.
    ferry::nn::NamedTensors model_state, optimizer_state;
    for (const auto& [name, t] : a.state_dict()) model_state.emplace_back(name, t.clone());
    for (const auto& [name, t] : oa->state_dict()) optimizer_state.emplace_back(name, t.clone());
    std::vector<std::string> names;
    for (const auto& [name, t] : optimizer_state) names.push_back(name);
    if (adam) {
      EXPECT_EQ(names, (std::vector<std::string>{"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq",
                                                 "state.0.max_exp_avg_sq", "state.1.step", "state.1.exp_avg",
                                                 "state.1.exp_avg_sq", "state.1.max_exp_avg_sq"}));
    } else {
      EXPECT_EQ(names, (std::vector<std::string>{"state.0.momentum_buffer", "state.1.momentum_buffer"}));
    }
    b.to(sim0());
    b.load_state_dict(model_state);
    ob->load_state_dict(optimizer_state);
    for (const auto& [name, t] : ob->state_dict()) {
      if (name.find("step") == std::string::npos) {
        EXPECT_EQ(t.device(), sim0()) << name;
      }
    }
    run_steps(a, *oa, 2, ferry::kCPU);
    run_steps(b, *ob, 2, sim0());
    EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>()) << (adam ? "adam" : "sgd");
    EXPECT_EQ(a.bias.to_vector<float>(), b.bias.to_vector<float>()) << (adam ? "adam" : "sgd");
  }
}

// AdamW's state crosses between the host-counted step and the capturable one (its counts on the device) both ways
// and the run continues bit for bit; the capturable state follows the model to another device, its table and
// learning rate remade there.
TEST(OptimState, CapturableAdamStateCrossesToAndFromTheHostCount) {
  ferry::manual_seed(6);
  ferry::nn::Linear a(5, 3), b(5, 3), c(5, 3);
  b.to(sim0());
  const optim::AdamWOptions host_count{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true};
  optim::AdamWOptions on_device = host_count;
  on_device.capturable = true;
  optim::AdamW oa(a.parameters(), host_count), ob(b.parameters(), on_device);
  run_steps(a, oa, 3, ferry::kCPU);
  b.load_state_dict(a.state_dict());
  ob.load_state_dict(oa.state_dict());  // the host's counts (float32 cpu scalars) onto the device
  for (const auto& [name, t] : ob.state_dict()) {
    EXPECT_EQ(t.device(), sim0()) << name;
    if (name.find("step") != std::string::npos) EXPECT_EQ(t.item<double>(), 3.0) << name;
  }
  run_steps(a, oa, 2, ferry::kCPU);
  run_steps(b, ob, 2, sim0());
  EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>());
  EXPECT_EQ(a.bias.to_vector<float>(), b.bias.to_vector<float>());
  c.load_state_dict(b.state_dict());
  optim::AdamW oc(c.parameters(), host_count);
  oc.load_state_dict(ob.state_dict());  // and back: the device's counts become host numbers
  b.to(ferry::kCPU);
  EXPECT_THROW(run_steps(b, ob, 1, ferry::kCPU), ferry::DeviceMismatch);  // its state is still on sim
  ob.to_parameter_devices();
  run_steps(b, ob, 3, ferry::kCPU);
  run_steps(c, oc, 3, ferry::kCPU);
  run_steps(a, oa, 3, ferry::kCPU);
  EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>());
  EXPECT_EQ(a.weight.to_vector<float>(), c.weight.to_vector<float>());
  EXPECT_EQ(oc.state_dict()[0].second.item<double>(), 8.0);
  ob.options.capturable = false;
  EXPECT_THROW(ob.step(), ferry::InvalidArgument);  // fixed at construction
  // Refused when made: betas whose corrections reach 1 only after more steps than the table holds (2^20), and the
  // op-by-op step (the counts on the device need the fused one).
  EXPECT_THROW(optim::Adam(a.parameters(), {.beta2 = 0.99999, .capturable = true}), ferry::InvalidArgument);
  EXPECT_THROW(optim::Adam(a.parameters(), {.fused = false, .capturable = true}), ferry::InvalidArgument);
}

// RMSprop (centered, with momentum: every state tensor) and Adagrad (with lr_decay, which reads the step count):
// a restored run continues bit for bit on another device; bad options are refused with PyTorch's messages.
TEST(OptimState, RMSpropAndAdagradSaveRestoreAndRefusals) {
  for (const bool rmsprop : {true, false}) {
    ferry::manual_seed(3);
    ferry::nn::Linear a(5, 3);
    ferry::nn::Linear b(5, 3);
    b.load_state_dict(a.state_dict());
    auto make = [&](ferry::nn::Linear& model) -> std::unique_ptr<optim::Optimizer> {
      if (rmsprop) {
        return std::make_unique<optim::RMSprop>(
            model.parameters(), optim::RMSpropOptions{.lr = 0.01, .momentum = 0.5, .centered = true});
      }
      return std::make_unique<optim::Adagrad>(
          model.parameters(), optim::AdagradOptions{.lr = 0.1, .lr_decay = 0.1, .initial_accumulator_value = 0.5});
    };
    auto oa = make(a), ob = make(b);
    run_steps(a, *oa, 3, ferry::kCPU);
    ferry::nn::NamedTensors model_state, optimizer_state;
    for (const auto& [name, t] : a.state_dict()) model_state.emplace_back(name, t.clone());
    std::vector<std::string> names;
    for (const auto& [name, t] : oa->state_dict()) {
      optimizer_state.emplace_back(name, t.clone());
      if (name.rfind("state.0.", 0) == 0) names.push_back(name.substr(8));
    }
    if (rmsprop) {
      EXPECT_EQ(names, (std::vector<std::string>{"step", "square_avg", "grad_avg", "momentum_buffer"}));
    } else {
      EXPECT_EQ(names, (std::vector<std::string>{"step", "sum"}));
    }
    EXPECT_EQ(oa->state_dict()[0].second.item<double>(), 3.0);  // the step count, as PyTorch's
    b.to(sim0());
    b.load_state_dict(model_state);
    ob->load_state_dict(optimizer_state);
    run_steps(a, *oa, 2, ferry::kCPU);
    run_steps(b, *ob, 2, sim0());
    EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>()) << (rmsprop ? "rmsprop" : "adagrad");
    EXPECT_EQ(a.bias.to_vector<float>(), b.bias.to_vector<float>()) << (rmsprop ? "rmsprop" : "adagrad");
  }
  const Tensor p = ferry::zeros({2}).requires_grad_(true);
  EXPECT_THROW(optim::RMSprop({p}, {.lr = -1}), ferry::InvalidArgument);
  EXPECT_THROW(optim::RMSprop({p}, {.alpha = -0.1}), ferry::InvalidArgument);
  EXPECT_THROW(optim::RMSprop({p}, {.momentum = -0.5}), ferry::InvalidArgument);
  EXPECT_THROW(optim::Adagrad({p}, {.lr_decay = -1}), ferry::InvalidArgument);
  EXPECT_THROW(optim::Adagrad({p}, {.initial_accumulator_value = -1}), ferry::InvalidArgument);
  optim::RMSprop grouped({{.params = {p}, .lr = 0.5}}, {.lr = 0.01});
  EXPECT_EQ(grouped.learning_rate(), 0.5);
  grouped.set_learning_rate(0.25);
  EXPECT_EQ(grouped.group_learning_rate(0), 0.25);
}

TEST(OptimState, LoadRejectsUnknownNamesAndShapes) {
  ferry::nn::Linear model(2, 2);
  optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  EXPECT_THROW(sgd.load_state_dict({{"state.0.exp_avg", ferry::zeros({2, 2})}}), ferry::InvalidArgument);
  EXPECT_THROW(sgd.load_state_dict({{"state.5.momentum_buffer", ferry::zeros({2, 2})}}), ferry::InvalidArgument);
  EXPECT_THROW(sgd.load_state_dict({{"state.0.momentum_buffer", ferry::zeros({3})}}), ferry::ShapeMismatch);
  EXPECT_THROW(sgd.load_state_dict({{"momentum_buffer", ferry::zeros({2, 2})}}), ferry::InvalidArgument);
}

TEST(OptimState, StateFollowsTheParameterDevice) {
  ferry::nn::Linear model(4, 3);
  model.to(sim0());
  optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  run_steps(model, sgd, 1, sim0());
  for (const auto& [name, t] : sgd.state_dict()) EXPECT_EQ(t.device(), sim0()) << name;
  // The model moves back after the state exists: stepping is a device mismatch until the state follows.
  model.to(ferry::kCPU);
  sgd.zero_grad();
  ferry::sum(model(ferry::ones({2, 4}))).backward();
  EXPECT_THROW(sgd.step(), ferry::DeviceMismatch);
  EXPECT_EQ(sgd.to_parameter_devices(), (4u * 3u + 3u) * 4u);
  sgd.step();
  for (const auto& [name, t] : sgd.state_dict()) EXPECT_EQ(t.device(), ferry::kCPU) << name;
}

// A step that finds a device mismatch throws before it changes anything: the parameters before the bad one are not
// updated and Adam's step counts do not move, so stepping again after to_parameter_devices() is one clean step.
TEST(OptimState, AStepThatThrowsUpdatesNothing) {
  for (const bool adam : {false, true}) {
    ferry::nn::Linear first(2, 2), second(2, 2);
    std::vector<Tensor> params = first.parameters();
    for (const Tensor& p : second.parameters()) params.push_back(p);
    std::unique_ptr<optim::Optimizer> optimizer;
    if (adam) optimizer = std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = 0.1});
    else optimizer = std::make_unique<optim::SGD>(params, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    auto backward = [&] {
      optimizer->zero_grad();
      ferry::sum(first(ferry::ones({1, 2}))).backward();
      ferry::sum(second(ferry::ones({1, 2}, {.device = second.weight.device()}))).backward();
    };
    backward();
    optimizer->step();
    second.to(sim0());  // its state stays on the cpu
    backward();
    const std::vector<float> before = first.weight.to_vector<float>();
    const auto state_before = optimizer->state_dict();
    try {
      optimizer->step();
      ADD_FAILURE() << "a step with state on another device did not throw";
    } catch (const ferry::DeviceMismatch& e) {
      EXPECT_NE(std::string(e.what()).find("to_parameter_devices()"), std::string::npos) << e.what();
    }
    EXPECT_EQ(first.weight.to_vector<float>(), before) << (adam ? "Adam" : "SGD") << " updated a parameter and threw";
    const auto state_after = optimizer->state_dict();
    ASSERT_EQ(state_after.size(), state_before.size());
    for (std::size_t i = 0; i < state_after.size(); ++i) {
      EXPECT_EQ(state_after[i].second.cpu().to_vector<double>(), state_before[i].second.cpu().to_vector<double>())
          << state_after[i].first;
    }
    optimizer->to_parameter_devices();
    optimizer->step();
  }
  EXPECT_THROW(optim::SGD(std::vector<Tensor>{}, {.lr = 0.1}), ferry::InvalidArgument);  // "empty parameter list"
}

// AdamW's options keep PyTorch's default weight decay (1e-2) when written with designated initialisers.
TEST(OptimState, AdamWKeepsItsDefaultWeightDecay) {
  Tensor p = ferry::ones({2}).requires_grad_(true);
  optim::AdamW adamw({p}, {.lr = 0.1});
  EXPECT_EQ(adamw.options.weight_decay, 1e-2);
  EXPECT_EQ(optim::AdamW({p}).options.weight_decay, 1e-2);
}

TEST(OptimState, ZeroGradAndSkippedParameters) {
  Tensor used = ferry::ones({3}).requires_grad_(true);
  Tensor unused = ferry::ones({3}).requires_grad_(true);
  optim::Adam adam({used, unused}, {.lr = 0.1});
  ferry::sum(ferry::mul(used, 2.0)).backward();
  adam.step();
  EXPECT_NE(used.to_vector<float>()[0], 1.0f);
  EXPECT_EQ(unused.to_vector<float>(), std::vector<float>(3, 1.0f));  // no gradient: untouched, no state
  EXPECT_EQ(adam.state_dict().size(), 3u);
  adam.zero_grad(false);
  EXPECT_EQ(used.grad().to_vector<float>(), std::vector<float>(3, 0.0f));
  adam.zero_grad();
  EXPECT_FALSE(used.grad().defined());
  EXPECT_THROW(optim::SGD({used}, {.lr = 0.1, .nesterov = true}), ferry::InvalidArgument);
  EXPECT_THROW(optim::Adam({used}, {.beta1 = 1.0}), ferry::InvalidArgument);
  EXPECT_THROW(optim::SGD({ferry::sum(ferry::mul(used, 2.0))}, {.lr = 0.1}), ferry::InvalidArgument);  // non-leaf
}

// The fused SGD step (one backend call for every parameter) against the op-by-op step, bit for bit, on
// every device: each option, lr changing per step, a parameter without a gradient, one whose gradient
// (and so its momentum buffer) starts later, an empty one, and float64.
TEST(OptimSGD, FusedStepEqualsTheOpByOpStepBitForBit) {
  std::vector<Device> devices = {Device::parse("cpu")};
  for (const Device& d : ferry::testing::accelerators()) devices.push_back(d);
  const std::vector<optim::SGDOptions> settings = {
      {.lr = 0.1},
      {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4},
      {.lr = 0.02, .momentum = 0.8, .dampening = 0.25, .weight_decay = 1e-2, .maximize = true},
      {.lr = 0.03, .momentum = 0.9, .weight_decay = 1, .nesterov = true},
  };
  for (const Device& device : devices) {
    for (const ferry::DType dtype : {ferry::DType::Float32, ferry::DType::Float64}) {
      for (std::size_t k = 0; k < settings.size(); ++k) {
        std::vector<Tensor> result[2];
        for (const bool fused : {true, false}) {
          ferry::manual_seed(91);
          const ferry::TensorOptions like{.device = device, .dtype = dtype};
          std::vector<Tensor> params = {ferry::randn({33, 17}, like), ferry::randn({70001}, like),
                                        ferry::randn({5}, like), ferry::randn({0, 4}, like), ferry::randn({3}, like)};
          optim::SGDOptions options = settings[k];
          options.fused = fused;
          optim::SGD sgd(params, options);
          for (int step = 0; step < 4; ++step) {
            sgd.set_learning_rate(settings[k].lr * (1.0 - 0.2 * step));
            for (std::size_t i = 0; i < params.size(); ++i) {
              if (i == 4) continue;                 // never has a gradient
              if (i == 2 && step < 2) continue;     // its gradient (and buffer) start at step 2
              params[i].set_grad(ferry::add(ferry::mul(params[i], 0.3), ferry::randn(params[i].shape(), like)));
            }
            sgd.step();
          }
          for (const Tensor& p : params) result[fused ? 0 : 1].push_back(p.cpu());
          for (const auto& entry : sgd.state_dict()) result[fused ? 0 : 1].push_back(entry.second.cpu());  // buffers
        }
        ASSERT_EQ(result[0].size(), result[1].size());
        for (std::size_t i = 0; i < result[0].size(); ++i) {
          const auto a = ferry::testing::values(result[0][i]), b = ferry::testing::values(result[1][i]);
          EXPECT_EQ(a, b) << "parameter or buffer " << i << " on " << device.str() << " " << ferry::dtype_name(dtype)
                          << ", settings " << k;
        }
      }
    }
  }
}

// clip_grad_norm_ against torch 1.13 (torch.nn.utils.clip_grad_norm_ on the same gradients, max_norm 1.5): the total
// norm returned and every clipped gradient, for norm types 2, inf, 3 and 1; a parameter without a gradient is
// skipped. On every device (sim:0, and cuda:0 where there is one) it reads nothing back: the scale is applied on the
// device whether or not it clips.
// The fused Adam / AdamW step (one backend call per group and step count) equals the op-by-op one bit for bit:
// parameters, moments and step counts, float32 and float64, on every device. Parameter 2's gradient starts late,
// so its step count differs from the others' (a call of its own); two groups with their own lr and decay. So does
// the capturable step (step counts and learning rates on the device, bias corrections from its table), whose state
// has the same names and values ("step" a float64 scalar on the device there).
TEST(OptimAdam, FusedStepEqualsTheOpByOpStepBitForBit) {
  std::vector<Device> devices = {Device::parse("cpu")};
  for (const Device& d : ferry::testing::accelerators()) devices.push_back(d);
  struct Setting {
    bool adamw;
    optim::AdamOptions options;
  };
  const std::vector<Setting> settings = {
      {false, {.lr = 0.01}},
      {false, {.lr = 0.02, .beta1 = 0.8, .weight_decay = 1e-2, .amsgrad = true}},
      {true, {.lr = 0.01, .weight_decay = 0.1}},
      {true, {.lr = 0.03, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.5, .amsgrad = true, .maximize = true}},
  };
  for (const Device& device : devices) {
    for (const ferry::DType dtype : {ferry::DType::Float32, ferry::DType::Float64}) {
      for (std::size_t k = 0; k < settings.size(); ++k) {
        std::vector<Tensor> result[3];
        std::vector<std::string> names[3];
        for (const int arm : {0, 1, 2}) {  // fused, op by op, capturable
          const bool fused = arm != 1;
          ferry::manual_seed(93);
          const ferry::TensorOptions like{.device = device, .dtype = dtype};
          std::vector<Tensor> params = {ferry::randn({33, 17}, like), ferry::randn({70001}, like),
                                        ferry::randn({5}, like), ferry::randn({0, 4}, like), ferry::randn({3}, like)};
          optim::AdamOptions options = settings[k].options;
          options.fused = fused;
          options.capturable = arm == 2;
          std::vector<optim::ParamGroup> groups{{.params = {params[0], params[1], params[4]}},
                                                {.params = {params[2], params[3]}, .lr = 0.005, .weight_decay = 0.0}};
          std::unique_ptr<optim::Optimizer> adam;
          if (settings[k].adamw) {
            adam = std::make_unique<optim::AdamW>(
                groups, optim::AdamWOptions{.lr = options.lr, .beta1 = options.beta1, .beta2 = options.beta2,
                                            .eps = options.eps, .weight_decay = options.weight_decay,
                                            .amsgrad = options.amsgrad, .maximize = options.maximize, .fused = fused,
                                            .capturable = options.capturable});
          } else {
            adam = std::make_unique<optim::Adam>(groups, options);
          }
          for (int step = 0; step < 4; ++step) {
            adam->set_group_learning_rate(0, options.lr * (1.0 - 0.2 * step));
            for (std::size_t i = 0; i < params.size(); ++i) {
              if (i == 4) continue;              // never has a gradient
              if (i == 2 && step < 2) continue;  // its gradient (and moments) start at step 2
              params[i].set_grad(ferry::add(ferry::mul(params[i], 0.3), ferry::randn(params[i].shape(), like)));
            }
            adam->step();
          }
          for (const Tensor& p : params) result[arm].push_back(p.cpu());
          for (const auto& entry : adam->state_dict()) {
            result[arm].push_back(entry.second.cpu());
            names[arm].push_back(entry.first);
          }
        }
        for (const int arm : {1, 2}) {
          EXPECT_EQ(names[0], names[arm]) << "arm " << arm;
          ASSERT_EQ(result[0].size(), result[arm].size());
          for (std::size_t i = 0; i < result[0].size(); ++i) {
            const auto a = ferry::testing::values(result[0][i]), b = ferry::testing::values(result[arm][i]);
            EXPECT_EQ(a, b) << "parameter or state " << i << " on " << device.str() << " "
                            << ferry::dtype_name(dtype) << ", settings " << k << ", arm " << arm;
          }
        }
      }
    }
  }
}

TEST(ClipGrad, NormMatchesPyTorchAndReadsNothingBack) {
  namespace utils = ferry::nn::utils;
  struct Case {
    double norm_type, total;
    std::vector<float> first, second;
  };
  const std::vector<Case> cases = {
      {2.0, 8.143248558044434, {0.1842016577720642f, -0.3684033155441284f, 0.5526049733161926f, 0.7368066310882568f},
       {0.0921008288860321f, -0.04605041444301605f, 1.1052099466323853f}},
      {utils::kInfinityNorm, 6.0, {0.2499999701976776f, -0.4999999403953552f, 0.7499998807907104f, 0.9999998807907104f},
       {0.1249999850988388f, -0.0624999925494194f, 1.499999761581421f}},
      {3.0, 6.812295436859131, {0.22019007802009583f, -0.44038015604019165f, 0.6605702638626099f, 0.8807603120803833f},
       {0.11009503901004791f, -0.055047519505023956f, 1.3211405277252197f}},
      {1.0, 16.75, {0.08955223113298416f, -0.17910446226596832f, 0.2686567008495331f, 0.35820892453193665f},
       {0.04477611556649208f, -0.02238805778324604f, 0.5373134016990662f}},
  };
  std::vector<Device> devices = ferry::testing::accelerators();
  devices.insert(devices.begin(), ferry::kCPU);
  for (const Device device : devices) {
    for (const Case& c : cases) {
      Tensor a = ferry::zeros({2, 2}, {.device = device}), b = ferry::zeros({3}, {.device = device});
      Tensor unused = ferry::zeros({2}, {.device = device});
      a.set_grad(ferry::from_vector<float>({1, -2, 3, 4}, {2, 2}).to(device));
      b.set_grad(ferry::from_vector<float>({0.5f, -0.25f, 6}, {3}).to(device));
      ferry::Ledger::global().clear();
      const Tensor total = utils::clip_grad_norm_({a, unused, b}, 1.5, c.norm_type);
      EXPECT_EQ(ferry::Ledger::global().totals().syncs, 0) << "norm_type " << c.norm_type;
      EXPECT_EQ(total.device(), device);
      EXPECT_NEAR(total.item<double>(), c.total, 1e-5 * c.total) << "norm_type " << c.norm_type;
      EXPECT_TRUE(ferry::testing::all_close(a.grad(), ferry::from_vector(c.first, {2, 2}).to(device)))
          << "norm_type " << c.norm_type << " on " << device.str();
      EXPECT_TRUE(ferry::testing::all_close(b.grad(), ferry::from_vector(c.second, {3}).to(device)))
          << "norm_type " << c.norm_type << " on " << device.str();
      EXPECT_FALSE(unused.grad().defined());
    }
  }
}

// The norms and the scale as one backend call each (Backend::multi_norm, multi_scale) against one norm and one
// scale per gradient (library layers off), on every device: 60 gradients (more than a cuda launch's table of 48),
// one of 10000 elements (more than a cuda block's chunk of 4096), one empty; float32 and float64; the 2-, 1- and
// inf-norm, clipping and not; mixed dtypes take the per-gradient path. On sim and cuda a capture of the fused
// form records a handful of operations where the per-gradient form records hundreds.
TEST(ClipGrad, TheNormsAndTheScaleAreOneCallEachOverAllTheGradients) {
  namespace utils = ferry::nn::utils;
  std::vector<Device> devices = ferry::testing::accelerators();
  devices.insert(devices.begin(), ferry::kCPU);
  for (const Device device : devices) {
    for (const DType dtype : {DType::Float32, DType::Float64}) {
      for (const double norm_type : {2.0, 1.0, utils::kInfinityNorm}) {
        for (const double max_norm : {1.0, 1e6}) {
          SCOPED_TRACE(device.str() + " " + std::string(ferry::dtype_name(dtype)) + " norm " +
                       std::to_string(norm_type) + " max_norm " + std::to_string(max_norm));
          auto run = [&](bool library) {
            ferry::nn::functional::set_library_layers(library);
            ferry::manual_seed(8);
            std::vector<Tensor> params;
            for (int i = 0; i < 60; ++i) {
              const bool empty = i == 11 && !std::isinf(norm_type);  // the inf-norm of an empty gradient: below
              const std::int64_t n = i == 7 ? 10000 : empty ? 0 : 1 + (i * 37) % 300;
              Tensor p = ferry::zeros({n}, {.device = device, .dtype = dtype});
              p.set_grad(ferry::randn({n}, {.dtype = dtype}).to(device));
              params.push_back(p);
            }
            const Tensor total = utils::clip_grad_norm_(params, max_norm, norm_type);
            ferry::nn::functional::set_library_layers(true);
            std::vector<std::vector<double>> out{ferry::testing::values(total.cpu())};
            for (const Tensor& p : params) out.push_back(ferry::testing::values(p.grad().cpu()));
            return out;
          };
          const auto fused = run(true), composed = run(false);
          ASSERT_EQ(fused.size(), composed.size());
          for (std::size_t k = 0; k < fused.size(); ++k) {
            ASSERT_EQ(fused[k].size(), composed[k].size());
            for (std::size_t i = 0; i < fused[k].size(); ++i) {
              EXPECT_NEAR(fused[k][i], composed[k][i], 1e-6 * (1 + std::abs(composed[k][i])))
                  << (k == 0 ? "the total" : "gradient " + std::to_string(k - 1)) << ", element " << i;
            }
          }
        }
      }
    }
    // The inf-norm of an empty gradient is an error either way, as PyTorch's.
    for (const bool library : {true, false}) {
      ferry::nn::functional::set_library_layers(library);
      Tensor p = ferry::zeros({2}, {.device = device}), none = ferry::zeros({0}, {.device = device});
      p.set_grad(ferry::ones({2}, {.device = device}));
      none.set_grad(ferry::zeros({0}, {.device = device}));
      EXPECT_THROW(utils::clip_grad_norm_({p, none}, 1.0, utils::kInfinityNorm), ferry::Error) << device.str();
      ferry::nn::functional::set_library_layers(true);
    }
    // Gradients of two dtypes: the per-gradient path, as before.
    Tensor a = ferry::zeros({2}, {.device = device});
    Tensor b = ferry::zeros({2}, {.device = device, .dtype = DType::Float64});
    a.set_grad(ferry::from_vector<float>({3, 0}, {2}).to(device));
    b.set_grad(ferry::from_vector<double>({0, 4}, {2}).to(device));
    EXPECT_NEAR(utils::clip_grad_norm_({a, b}, 1.0).item<double>(), 5.0, 1e-6) << device.str();
    EXPECT_NEAR(a.grad().cpu().to_vector<float>()[0], 0.6, 1e-6) << device.str();
  }
  for (const Device device : ferry::testing::accelerators()) {
    std::vector<Tensor> params;
    for (int i = 0; i < 30; ++i) {
      Tensor p = ferry::zeros({64}, {.device = device});
      p.set_grad(ferry::randn({64}).to(device));
      params.push_back(p);
    }
    const auto recorded = [&](bool library) {
      ferry::nn::functional::set_library_layers(library);
      ferry::Graph graph(device);
      graph.capture([&] { (void)utils::clip_grad_norm_(params, 1.0); });
      ferry::nn::functional::set_library_layers(true);
      return std::pair{graph.operations(), graph.composition()};
    };
    const auto [fused, fused_words] = recorded(true);
    const auto [composed, composed_words] = recorded(false);
    EXPECT_LT(fused * 10, composed) << device.str() << ": one call each " << fused << " operations (" << fused_words
                                    << "); per gradient " << composed << " (" << composed_words << ")";
  }
}

// Below max_norm the gradients keep their bits (scaled by exactly 1); no gradient at all gives a total of 0; a
// non-finite total is an Error with error_if_nonfinite (the gradients untouched); bad arguments are refused.
TEST(ClipGrad, EdgesAndRefusals) {
  namespace utils = ferry::nn::utils;
  Tensor p = ferry::zeros({3});
  p.set_grad(ferry::from_vector<float>({0.1f, -0.2f, 0.3f}, {3}));
  const Tensor before = p.grad().clone();
  EXPECT_NEAR(utils::clip_grad_norm_({p}, 1.0).item<double>(), 0.37416574358940125, 1e-7);
  EXPECT_TRUE(ferry::testing::all_close(p.grad(), before, 0, 0));
  EXPECT_EQ(utils::clip_grad_norm_({ferry::zeros({2})}, 1.0).item<double>(), 0.0);

  p.set_grad(ferry::from_vector<float>({1, INFINITY, 2}, {3}));
  try {
    utils::clip_grad_norm_({p}, 1.0, 2.0, true);
    ADD_FAILURE() << "an infinite norm was clipped";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the total 2-norm of the gradients of 1 parameter is inf"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(p.grad().to_vector<float>()[2], 2.0f);
  EXPECT_THROW(utils::clip_grad_norm_({p}, -1.0), ferry::InvalidArgument);
  EXPECT_THROW(utils::clip_grad_norm_({p}, NAN), ferry::InvalidArgument);
  EXPECT_THROW(utils::clip_grad_norm_({p}, 1.0, 0.0), ferry::InvalidArgument);
  Tensor q = ferry::zeros({1}, {.device = sim0()});
  q.set_grad(ferry::ones({1}, {.device = sim0()}));
  EXPECT_THROW(utils::clip_grad_norm_({p, q}, 1.0), ferry::InvalidArgument);  // two devices

  // clip_grad_value_ against torch 1.13: [0.1, -5, 2] clamped to [-1, 1].
  p.set_grad(ferry::from_vector<float>({0.1f, -5, 2}, {3}));
  utils::clip_grad_value_({p}, 1.0);
  EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{0.1f, -1, 1}));
  EXPECT_THROW(utils::clip_grad_value_({p}, -0.5), ferry::InvalidArgument);
}

// Every schedule against torch 1.13's rates (torch.optim.lr_scheduler on an SGD with lr 0.1, the rate read before
// the first step() and after each of 12), compared bit for bit: the same chainable formulas in double.
TEST(LRScheduler, EveryScheduleGivesPyTorchsRatesBitForBit) {
  using Rates = std::vector<double>;
  using Make = std::function<std::shared_ptr<optim::LRScheduler>(optim::SGD&)>;
  const auto rates = [](const Make& make) {
    Tensor p = ferry::zeros({1});
    optim::SGD sgd({p}, {.lr = 0.1});
    const std::shared_ptr<optim::LRScheduler> scheduler = make(sgd);
    Rates out{sgd.learning_rate()};
    for (int i = 0; i < 12; ++i) {
      scheduler->step();
      out.push_back(sgd.learning_rate());
      EXPECT_EQ(scheduler->last_lr(), sgd.learning_rate());
    }
    return out;
  };
  EXPECT_EQ(rates([&](optim::SGD& o) { return std::make_shared<optim::StepLR>(o, 3, 0.5); }),
            (Rates{0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125, 0.0125, 0.0125, 0.00625}));
  EXPECT_EQ(rates([&](optim::SGD& o) {
              return std::make_shared<optim::MultiStepLR>(o, std::vector<std::int64_t>{2, 5, 5, 9}, 0.1);
            }),
            (Rates{0.1, 0.1, 0.010000000000000002, 0.010000000000000002, 0.010000000000000002,
                   0.00010000000000000005, 0.00010000000000000005, 0.00010000000000000005, 0.00010000000000000005,
                   1.0000000000000006e-05, 1.0000000000000006e-05, 1.0000000000000006e-05, 1.0000000000000006e-05}));
  EXPECT_EQ(rates([&](optim::SGD& o) { return std::make_shared<optim::ExponentialLR>(o, 0.9); }),
            (Rates{0.1, 0.09000000000000001, 0.08100000000000002, 0.07290000000000002, 0.06561000000000002,
                   0.05904900000000002, 0.05314410000000002, 0.04782969000000002, 0.043046721000000024,
                   0.03874204890000002, 0.03486784401000002, 0.03138105960900001, 0.028242953648100012}));
  EXPECT_EQ(rates([&](optim::SGD& o) { return std::make_shared<optim::CosineAnnealingLR>(o, 5, 0.001); }),
            (Rates{0.1, 0.0905463412215599, 0.06579634122155989, 0.035203658778440096, 0.010453658778440105, 0.001,
                   0.010453658778440102, 0.03520365877844012, 0.06579634122155993, 0.09054634122155995,
                   0.10000000000000005, 0.09054634122155998, 0.06579634122155995}));
  EXPECT_EQ(rates([&](optim::SGD& o) { return std::make_shared<optim::LinearLR>(o, 0.25, 1.0, 4); }),
            (Rates{0.025, 0.043750000000000004, 0.06250000000000001, 0.08125000000000002, 0.10000000000000002,
                   0.10000000000000002, 0.10000000000000002, 0.10000000000000002, 0.10000000000000002,
                   0.10000000000000002, 0.10000000000000002, 0.10000000000000002, 0.10000000000000002}));
  EXPECT_EQ(rates([&](optim::SGD& o) {
              return std::make_shared<optim::LambdaLR>(o, [](std::int64_t e) { return 1.0 / static_cast<double>(e + 1); });
            }),
            (Rates{0.1, 0.05, 0.03333333333333333, 0.025, 0.020000000000000004, 0.016666666666666666,
                   0.014285714285714285, 0.0125, 0.011111111111111112, 0.010000000000000002, 0.009090909090909092,
                   0.008333333333333333, 0.007692307692307693}));
  // A warmup, then cosine: the cosine starts from the optimizer's initial rate, restarted at the milestone.
  EXPECT_EQ(rates([&](optim::SGD& o) {
              auto warmup = std::make_shared<optim::LinearLR>(o, 0.1, 1.0, 3);
              auto cosine = std::make_shared<optim::CosineAnnealingLR>(o, 6, 0.0);
              return std::make_shared<optim::SequentialLR>(
                  o, std::vector<std::shared_ptr<optim::LRScheduler>>{warmup, cosine}, std::vector<std::int64_t>{3});
            }),
            (Rates{0.010000000000000002, 0.04, 0.07, 0.1, 0.09330127018922195, 0.07500000000000001, 0.05,
                   0.025000000000000012, 0.006698729810778065, 0.0, 0.006698729810778065, 0.025, 0.05000000000000004}));
}

// ReduceLROnPlateau against torch 1.13 (mode min, factor 0.5, patience 2, cooldown 1, min_lr 0.02), and refusals.
TEST(LRScheduler, ReduceOnPlateauCountsAsPyTorchAndRefusesBadArguments) {
  Tensor p = ferry::zeros({1});
  optim::SGD sgd({p}, {.lr = 0.1});
  optim::ReduceLROnPlateau plateau(sgd, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.02});
  const std::vector<double> losses = {1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6};
  std::vector<double> seen;
  for (const double loss : losses) {
    plateau.step(loss);
    seen.push_back(sgd.learning_rate());
  }
  EXPECT_EQ(seen, (std::vector<double>{0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025,
                                       0.02, 0.02}));
  EXPECT_EQ(plateau.best(), 0.5);
  EXPECT_THROW(optim::ReduceLROnPlateau(sgd, {.factor = 1.0}), ferry::InvalidArgument);
  EXPECT_THROW(optim::StepLR(sgd, 0), ferry::InvalidArgument);
  EXPECT_THROW(optim::CosineAnnealingLR(sgd, 0), ferry::InvalidArgument);
  EXPECT_THROW(optim::LinearLR(sgd, 1.5), ferry::InvalidArgument);
  optim::SGD other({ferry::zeros({1})}, {.lr = 0.1});
  auto foreign = std::make_shared<optim::StepLR>(other, 2);
  EXPECT_THROW(optim::SequentialLR(sgd, {std::make_shared<optim::StepLR>(sgd, 2), foreign}, {3}), ferry::InvalidArgument);
  EXPECT_THROW(optim::SequentialLR(sgd, {std::make_shared<optim::StepLR>(sgd, 2)}, {3}), ferry::InvalidArgument);
}

// --- parameter groups -------------------------------------------------------------------------------------------

// Two groups with their own lr and weight decay update each parameter exactly as two optimizers, one per group,
// with those settings: SGD fused and op by op, Adam, AdamW, on every device (cpu, sim, cuda where present).
TEST(OptimGroups, TwoGroupsStepAsTwoOptimizersBitForBit) {
  using Make = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;
  const std::vector<std::pair<std::string, Make>> kinds{
      {"sgd fused", [](auto g) { return std::make_unique<optim::SGD>(std::move(g), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}); }},
      {"sgd op by op", [](auto g) { return std::make_unique<optim::SGD>(std::move(g), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .fused = false}); }},
      {"adam", [](auto g) { return std::make_unique<optim::Adam>(std::move(g), optim::AdamOptions{.lr = 0.1, .weight_decay = 0.01}); }},
      {"adamw", [](auto g) { return std::make_unique<optim::AdamW>(std::move(g), optim::AdamWOptions{.lr = 0.1}); }},
  };
  for (const Device device : ferry::available_devices()) {
    if (device.index != 0) continue;
    for (const auto& [kind, make] : kinds) {
      ferry::manual_seed(7);
      const Tensor a0 = ferry::randn({3, 4}, {.device = device}), b0 = ferry::randn({5}, {.device = device});
      Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();  // grouped
      Tensor a1 = a0.clone().requires_grad_(), b1 = b0.clone().requires_grad_();  // one optimizer each
      const auto grouped = make({{.params = {a}}, {.params = {b}, .lr = 0.02, .weight_decay = 0.0}});
      const auto alone_a = make({{.params = {a1}}});
      auto alone_b = make({{.params = {b1}, .lr = 0.02, .weight_decay = 0.0}});
      EXPECT_EQ(grouped->group_count(), 2u);
      EXPECT_EQ(grouped->group_learning_rate(1), 0.02);
      EXPECT_EQ(grouped->group_weight_decay(1), 0.0);
      EXPECT_EQ(alone_b->learning_rate(), 0.02) << "one group's own lr becomes the option";
      for (int step = 0; step < 3; ++step) {
        const Tensor ga = ferry::randn({3, 4}, {.device = device}), gb = ferry::randn({5}, {.device = device});
        a.set_grad(ga.clone()); a1.set_grad(ga.clone());
        b.set_grad(gb.clone()); b1.set_grad(gb.clone());
        grouped->step(); alone_a->step(); alone_b->step();
      }
      EXPECT_EQ(a.to_vector<float>(), a1.to_vector<float>()) << kind << " on " << device.str();
      EXPECT_EQ(b.to_vector<float>(), b1.to_vector<float>()) << kind << " on " << device.str();
      // the state is numbered across the groups, as PyTorch's
      std::vector<std::string> names;
      for (const auto& [name, value] : grouped->state_dict()) names.push_back(name.substr(0, 8));
      EXPECT_EQ(names.front(), "state.0.") << kind;
      EXPECT_EQ(names.back(), "state.1.") << kind;
    }
  }
}

TEST(OptimGroups, SetLearningRateReachesEveryGroupAndRefusals) {
  Tensor a = ferry::zeros({2}).requires_grad_(), b = ferry::zeros({3}).requires_grad_();
  optim::SGD sgd({{.params = {a}}, {.params = {b}, .lr = 0.5}}, {.lr = 0.1});
  EXPECT_EQ(sgd.learning_rate(), 0.1);
  EXPECT_EQ(sgd.group_learning_rate(1), 0.5);
  ASSERT_EQ(sgd.group_parameters(1).size(), 1u);
  EXPECT_TRUE(sgd.group_parameters(1)[0].is_same(b));
  EXPECT_EQ(sgd.parameters().size(), 2u);
  sgd.set_group_learning_rate(0, 0.2);
  EXPECT_EQ(sgd.group_learning_rate(0), 0.2);
  EXPECT_EQ(sgd.group_learning_rate(1), 0.5);
  sgd.set_learning_rate(0.3);  // every group, as `for g in param_groups: g["lr"] = 0.3`
  EXPECT_EQ(sgd.group_learning_rate(0), 0.3);
  EXPECT_EQ(sgd.group_learning_rate(1), 0.3);
  EXPECT_THROW(sgd.group_learning_rate(2), ferry::InvalidArgument);
  EXPECT_THROW(sgd.set_group_learning_rate(2, 0.1), ferry::InvalidArgument);
  EXPECT_THROW(optim::SGD(std::vector<optim::ParamGroup>{}, {.lr = 0.1}), ferry::InvalidArgument);
  EXPECT_THROW(optim::SGD({{.params = {a}}, {.params = {}}}, {.lr = 0.1}), ferry::InvalidArgument);
  EXPECT_THROW(optim::Adam({{.params = {a}}, {.params = {b}, .lr = -1.0}}), ferry::InvalidArgument);
  EXPECT_THROW(optim::SGD({{.params = {a, b}}, {.params = {b}}}, {.lr = 0.1}), ferry::InvalidArgument);
  try {
    optim::SGD({{.params = {a}}, {.params = {b}}}, {.lr = 0.1, .lr_on_device = true});
    ADD_FAILURE() << "lr_on_device with two groups was accepted";
  } catch (const ferry::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("2 parameter groups"), std::string::npos) << e.what();
  }
}

// Each group follows the schedule from its own base rate: torch 1.13's rates for groups at lr 0.1 and 0.02.
TEST(OptimGroups, SchedulesMoveEachGroupFromItsOwnRateAsPyTorch) {
  using Rates = std::vector<std::vector<double>>;
  using Make = std::function<std::shared_ptr<optim::LRScheduler>(optim::SGD&)>;
  const auto rates = [](const Make& make) {
    optim::SGD sgd({{.params = {ferry::zeros({1})}}, {.params = {ferry::zeros({1})}, .lr = 0.02}}, {.lr = 0.1});
    const std::shared_ptr<optim::LRScheduler> scheduler = make(sgd);
    Rates out{{sgd.group_learning_rate(0), sgd.group_learning_rate(1)}};
    for (int i = 0; i < 8; ++i) {
      scheduler->step();
      out.push_back({sgd.group_learning_rate(0), sgd.group_learning_rate(1)});
      EXPECT_EQ(scheduler->last_lrs(), out.back());
    }
    return out;
  };
  EXPECT_EQ(rates([](optim::SGD& o) { return std::make_shared<optim::CosineAnnealingLR>(o, 5, 0.001); }),
            (Rates{{0.1, 0.02}, {0.0905463412215599, 0.018185661446562}, {0.06579634122155989, 0.013435661446562},
                   {0.035203658778440096, 0.007564338553437999}, {0.010453658778440105, 0.002814338553438},
                   {0.001, 0.001}, {0.010453658778440102, 0.002814338553437999},
                   {0.03520365877844012, 0.007564338553438001}, {0.06579634122155993, 0.013435661446562004}}));
  EXPECT_EQ(rates([](optim::SGD& o) {
              auto warmup = std::make_shared<optim::LinearLR>(o, 0.1, 1.0, 3);
              auto cosine = std::make_shared<optim::CosineAnnealingLR>(o, 6, 0.0);
              return std::make_shared<optim::SequentialLR>(
                  o, std::vector<std::shared_ptr<optim::LRScheduler>>{warmup, cosine}, std::vector<std::int64_t>{3});
            }),
            (Rates{{0.010000000000000002, 0.002}, {0.04, 0.007999999999999998}, {0.07, 0.013999999999999997},
                   {0.1, 0.02}, {0.09330127018922195, 0.01866025403784439}, {0.07500000000000001, 0.015000000000000001},
                   {0.05, 0.01}, {0.025000000000000012, 0.005000000000000003},
                   {0.006698729810778065, 0.001339745962155613}}));
  optim::SGD sgd({{.params = {ferry::zeros({1})}}, {.params = {ferry::zeros({1})}, .lr = 0.02}}, {.lr = 0.1});
  optim::ReduceLROnPlateau plateau(sgd, {.factor = 0.5, .patience = 0, .min_lr = 0.015});
  Rates seen;
  for (int i = 0; i < 4; ++i) {
    plateau.step(1.0);
    seen.push_back({sgd.group_learning_rate(0), sgd.group_learning_rate(1)});
  }
  EXPECT_EQ(seen, (Rates{{0.1, 0.02}, {0.05, 0.015}, {0.025, 0.015}, {0.015, 0.015}}));
}

// A scheduler made again on a fresh optimizer and given the state_dict() of one stopped after 5 steps gives the
// unbroken run's rates bit for bit, for every schedule, with two parameter groups; ReduceLROnPlateau too.
TEST(LRScheduler, StateDictResumesEveryScheduleBitForBit) {
  using Make = std::function<std::shared_ptr<optim::LRScheduler>(optim::SGD&)>;
  const std::vector<std::pair<std::string, Make>> kinds{
      {"step", [](optim::SGD& o) { return std::make_shared<optim::StepLR>(o, 3, 0.5); }},
      {"multistep", [](optim::SGD& o) { return std::make_shared<optim::MultiStepLR>(o, std::vector<std::int64_t>{2, 7}); }},
      {"exponential", [](optim::SGD& o) { return std::make_shared<optim::ExponentialLR>(o, 0.9); }},
      {"cosine", [](optim::SGD& o) { return std::make_shared<optim::CosineAnnealingLR>(o, 5, 0.001); }},
      {"linear", [](optim::SGD& o) { return std::make_shared<optim::LinearLR>(o, 0.25, 1.0, 8); }},
      {"lambda", [](optim::SGD& o) {
         return std::make_shared<optim::LambdaLR>(o, [](std::int64_t e) { return 1.0 / static_cast<double>(e + 1); });
       }},
      {"sequential", [](optim::SGD& o) {
         auto warmup = std::make_shared<optim::LinearLR>(o, 0.1, 1.0, 3);
         auto cosine = std::make_shared<optim::CosineAnnealingLR>(o, 6, 0.0);
         return std::make_shared<optim::SequentialLR>(o, std::vector<std::shared_ptr<optim::LRScheduler>>{warmup, cosine},
                                                      std::vector<std::int64_t>{3});
       }},
  };
  const auto make_sgd = [] {
    return std::make_unique<optim::SGD>(
        std::vector<optim::ParamGroup>{{.params = {ferry::zeros({1})}}, {.params = {ferry::zeros({1})}, .lr = 0.02}},
        optim::SGDOptions{.lr = 0.1});
  };
  for (const auto& [kind, make] : kinds) {
    auto straight_sgd = make_sgd();
    auto straight = make(*straight_sgd);
    auto first_sgd = make_sgd();
    auto first = make(*first_sgd);
    for (int i = 0; i < 5; ++i) straight->step(), first->step();
    const optim::SchedulerState saved = first->state_dict();
    EXPECT_EQ(saved.at("last_epoch"), 5) << kind;
    auto resumed_sgd = make_sgd();  // rates back at the constructor's
    auto resumed = make(*resumed_sgd);
    resumed->load_state_dict(saved);
    EXPECT_EQ(resumed_sgd->group_learning_rate(1), straight_sgd->group_learning_rate(1)) << kind;
    for (int i = 5; i < 12; ++i) {
      straight->step(), resumed->step();
      EXPECT_EQ(resumed->last_lrs(), straight->last_lrs()) << kind << " step " << i;
      EXPECT_EQ(resumed_sgd->group_learning_rate(0), straight_sgd->group_learning_rate(0)) << kind << " step " << i;
    }
    EXPECT_EQ(resumed->last_epoch(), 12) << kind;
  }
  // Refusals change nothing.
  auto sgd = make_sgd();
  optim::StepLR step(*sgd, 3);
  optim::SchedulerState partial = step.state_dict();
  partial.erase("last_lr.1");
  EXPECT_THROW(step.load_state_dict(partial), ferry::InvalidArgument);
  optim::SGD one({ferry::zeros({1})}, {.lr = 0.1});
  optim::StepLR single(one, 3);
  EXPECT_THROW(single.load_state_dict(step.state_dict()), ferry::InvalidArgument);  // two groups into one
  EXPECT_EQ(step.last_epoch(), 0);

  const std::vector<double> losses = {1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6};
  auto plateau_sgd = make_sgd(), resumed_sgd = make_sgd();
  optim::ReduceLROnPlateau plateau(*plateau_sgd, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.005});
  optim::ReduceLROnPlateau resumed(*resumed_sgd, {.factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.005});
  for (std::size_t i = 0; i < losses.size(); ++i) {
    plateau.step(losses[i]);
    if (i == 7) resumed.load_state_dict(plateau.state_dict());
    if (i > 7) resumed.step(losses[i]);
  }
  EXPECT_EQ(resumed.state_dict(), plateau.state_dict());
  EXPECT_EQ(resumed_sgd->group_learning_rate(1), plateau_sgd->group_learning_rate(1));
  EXPECT_LT(plateau_sgd->group_learning_rate(1), 0.02);  // it did cut
}
