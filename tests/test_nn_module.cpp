// test_nn_module.cpp — nn::Module bookkeeping: PyTorch state_dict names and order, strict loading and its
// errors, moving a whole model to sim:0 (DESIGN.md invariant 7), train/eval, zero_grad, initialisation,
// printing. Not here: the maths (test_nn_gradcheck.cpp, test_nn_parity.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ledger.h"
#include "ferry/nn/activation.h"
#include "ferry/nn/batchnorm.h"
#include "ferry/nn/fold.h"
#include "ferry/nn/conv.h"
#include "ferry/nn/distance.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/groupnorm.h"
#include "ferry/nn/init.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/module_list.h"
#include "ferry/nn/pixel_shuffle.h"
#include "ferry/nn/pooling.h"
#include "ferry/nn/rnn.h"
#include "ferry/nn/sequential.h"
#include "ferry/nn/transformer.h"
#include "ferry/ops.h"
#include "ferry/optim.h"
#include "ferry/random.h"
#include "test_helpers.h"

using ferry::Device;
using ferry::DType;
using ferry::Tensor;
namespace nn = ferry::nn;

namespace {
nn::Sequential make_cnn(std::int64_t in_channels = 3, std::int64_t features = 2048) {
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

std::vector<std::string> names_of(const nn::NamedTensors& tensors) {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  return names;
}

Device sim0() { return Device::parse("sim:0"); }
}  // namespace

TEST(NNModule, StateDictHasPyTorchNamesInOrder) {
  nn::Sequential model(nn::Conv2d(3, 4, 3), nn::BatchNorm2d(4), nn::ReLU(), nn::Flatten(), nn::Linear(4, 2));
  const std::vector<std::string> expected = {"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                             "1.running_var", "1.num_batches_tracked", "4.weight", "4.bias"};
  const nn::NamedTensors state = model.state_dict();
  EXPECT_EQ(names_of(state), expected);
  const Tensor& tracked = *nn::find_tensor(state, "1.num_batches_tracked");
  EXPECT_EQ(tracked.dtype(), DType::Int64);
  EXPECT_EQ(tracked.dim(), 0);
  EXPECT_EQ(names_of(model.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"}));
  EXPECT_EQ(names_of(model.named_buffers()),
            (std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"}));
  EXPECT_EQ(model.parameters().size(), 6u);
  EXPECT_EQ(model.parameter_count(), 4 * 3 * 9 + 4 + 4 + 4 + 2 * 4 + 2);
  // state_dict values alias the live tensors, detached.
  auto& conv = model.at<nn::Conv2d>(0);
  EXPECT_EQ(state[0].second.data_ptr(), conv.weight.data_ptr());
  EXPECT_FALSE(state[0].second.requires_grad());
  EXPECT_THROW(model.at<nn::Linear>(0), ferry::InvalidArgument);
}

TEST(NNModule, CnnStateDictMatchesThePyTorchSequential) {
  nn::Sequential model = make_cnn();
  const std::vector<std::string> names = names_of(model.state_dict());
  ASSERT_EQ(names.size(), 23u);
  EXPECT_EQ(names.front(), "0.weight");
  EXPECT_EQ(names[6], "1.num_batches_tracked");
  EXPECT_EQ(names.back(), "13.bias");
  const std::string printed = model.str();
  EXPECT_EQ(printed.substr(0, printed.find("\n  (2)")),
            "Sequential(\n  (0): Conv2d(3, 32, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
            "  (1): BatchNorm2d(32, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)");
  EXPECT_NE(printed.find("(3): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"),
            std::string::npos) << printed;
  EXPECT_NE(printed.find("(13): Linear(in_features=2048, out_features=10, bias=True)\n)"), std::string::npos) << printed;
}

TEST(NNModule, LoadStateDictCopiesAndReportsEveryProblem) {
  nn::Sequential source(nn::Linear(3, 2), nn::BatchNorm1d(2));
  nn::Sequential target(nn::Linear(3, 2), nn::BatchNorm1d(2));
  target.load_state_dict(source.state_dict());
  auto& a = source.at<nn::Linear>(0);
  auto& b = target.at<nn::Linear>(0);
  EXPECT_EQ(a.weight.to_vector<float>(), b.weight.to_vector<float>());
  EXPECT_NE(a.weight.data_ptr(), b.weight.data_ptr());  // copied, not aliased

  nn::NamedTensors broken = source.state_dict();
  broken.erase(broken.begin());                                    // drop 0.weight
  broken.emplace_back("2.weight", ferry::zeros({2}));              // unknown
  broken[0].second = ferry::zeros({5});                            // 0.bias with a wrong shape
  try {
    target.load_state_dict(broken);
    FAIL() << "expected StateDictError";
  } catch (const nn::StateDictError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("Missing key(s) in state_dict: \"0.weight\""), std::string::npos) << message;
    EXPECT_NE(message.find("Unexpected key(s) in state_dict: \"2.weight\""), std::string::npos) << message;
    EXPECT_NE(message.find("size mismatch for 0.bias: copying a param with shape [5] from checkpoint, the shape in "
                           "current model is [2]"),
              std::string::npos)
        << message;
    EXPECT_EQ(e.missing_keys(), std::vector<std::string>{"0.weight"});
    EXPECT_EQ(e.unexpected_keys(), std::vector<std::string>{"2.weight"});
    EXPECT_EQ(e.mismatched_keys(), std::vector<std::string>{"0.bias"});
  }
  // Not strict: missing and unexpected keys are fine, shapes are still checked.
  nn::NamedTensors partial = {{"0.bias", ferry::full({2}, 7.0)}, {"extra", ferry::zeros({1})}};
  target.load_state_dict(partial, false);
  EXPECT_EQ(b.bias.to_vector<float>(), (std::vector<float>{7, 7}));
  EXPECT_THROW(target.load_state_dict({{"0.bias", ferry::zeros({3})}}, false), nn::StateDictError);
  // A float64 checkpoint loads into float32 tensors (converted), int64 counters stay int64.
  nn::NamedTensors doubles = source.state_dict();
  for (auto& [name, t] : doubles) if (ferry::is_floating(t.dtype())) t = t.to(DType::Float64);
  target.load_state_dict(doubles);
  EXPECT_EQ(b.weight.dtype(), DType::Float32);
}

namespace {
// DESIGN.md invariant 7 on one accelerator: after model.to(device) nothing is left on cpu, the bytes moved
// are the sum of nbytes, handles keep their identity, and eval-mode outputs equal cpu's (bit for bit on
// sim, which computes with the cpu kernels; to float32 rounding on cuda).
void check_whole_model_moves(Device device) {
  ferry::manual_seed(3);
  nn::Sequential model = make_cnn();
  // Give BatchNorm non-trivial running statistics, and the parameters gradients, before the move.
  const Tensor x = ferry::randn({4, 3, 32, 32});
  model.train();
  ferry::nn::functional::cross_entropy(model(x), ferry::from_vector<std::int64_t>({1, 2, 3, 4})).backward();

  std::size_t expected_bytes = 0;
  for (const Tensor& t : model.parameters()) expected_bytes += t.nbytes() + t.grad().nbytes();
  for (const Tensor& t : model.buffers()) expected_bytes += t.nbytes();
  const std::vector<Tensor> handles = model.parameters();  // held across the move
  ferry::optim::SGD optimizer(model.parameters(), {.lr = 0.1, .momentum = 0.9});  // made before the move

  model.eval();
  const std::vector<float> cpu_logits = model(x).to_vector<float>();

  const std::size_t moved = model.to(device);
  EXPECT_EQ(moved, expected_bytes);
  for (const auto& [name, t] : model.state_dict()) EXPECT_EQ(t.device(), device) << name << " left on " << t.device().str();
  for (const auto& [name, t] : model.named_parameters()) EXPECT_EQ(t.grad().device(), device) << name << ".grad";
  EXPECT_EQ(model.device(), device);
  for (const Tensor& h : handles) EXPECT_EQ(h.device(), device);  // identity kept: old handles see the move
  EXPECT_TRUE(model.at<nn::Conv2d>(0).weight.is_same(handles[0]));
  EXPECT_TRUE(handles[0].requires_grad() && handles[0].is_leaf());

  const std::vector<float> device_logits = model(x.to(device)).to_vector<float>();
  if (device.type == ferry::DeviceType::Sim) {
    EXPECT_EQ(cpu_logits, device_logits) << "eval-mode outputs differ between cpu and " << device.str();
  } else {
    ASSERT_EQ(cpu_logits.size(), device_logits.size());
    for (std::size_t i = 0; i < cpu_logits.size(); ++i) {
      EXPECT_NEAR(device_logits[i], cpu_logits[i], 1e-4 * (1 + std::abs(cpu_logits[i]))) << device.str() << " " << i;
    }
  }

  EXPECT_EQ(model.to(device), 0u);  // already there: nothing moves
  optimizer.step();                 // the optimizer made before the move updates the moved tensors
  EXPECT_EQ(handles[0].device(), device);
  EXPECT_EQ(model.to(ferry::kCPU), expected_bytes);
  EXPECT_EQ(model.device(), ferry::kCPU);
}
}  // namespace

TEST(NNModule, ToSimMovesEveryParameterAndBufferInPlace) { check_whole_model_moves(sim0()); }

TEST(NNModule, ToCudaMovesEveryParameterAndBufferInPlace) {
  if (!ferry::is_available(ferry::DeviceType::CUDA)) GTEST_SKIP() << "no cuda device";
  check_whole_model_moves(Device(ferry::DeviceType::CUDA, 0));
}

TEST(NNModule, InputOnAnotherDeviceIsADeviceMismatch) {
  nn::Linear layer(4, 2);
  layer.to(sim0());
  try {
    layer(ferry::ones({3, 4}));
    FAIL() << "expected DeviceMismatch";
  } catch (const ferry::DeviceMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("(in linear)"), std::string::npos) << e.what();
  }
}

TEST(NNModule, TrainEvalReachEveryChildAndChangeBatchNorm) {
  nn::Sequential model(nn::BatchNorm1d(3), nn::Dropout(0.5));
  EXPECT_TRUE(model.is_training());
  EXPECT_TRUE(model[0].is_training());
  const Tensor x = ferry::randn({8, 3});
  auto& bn = model.at<nn::BatchNorm1d>(0);
  model(x);
  EXPECT_EQ(bn.num_batches_tracked.item<std::int64_t>(), 1);
  model.eval();
  EXPECT_FALSE(model[1].is_training());
  const Tensor before = bn.running_mean.clone();
  const Tensor y = model(x);
  EXPECT_EQ(bn.num_batches_tracked.item<std::int64_t>(), 1);  // eval: no update
  EXPECT_EQ(bn.running_mean.to_vector<float>(), before.to_vector<float>());
  // eval = (x - running_mean) / sqrt(running_var + eps) * weight + bias, dropout the identity
  const Tensor expected = ferry::div(ferry::sub(x, bn.running_mean), ferry::sqrt(ferry::add(bn.running_var, 1e-5)));
  const auto got = y.to_vector<float>(), want = expected.to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5);
}

TEST(NNModule, ZeroGradSetsToNoneOrZeros) {
  nn::Linear layer(3, 2);
  ferry::sum(layer(ferry::ones({4, 3}))).backward();
  ASSERT_TRUE(layer.weight.grad().defined());
  layer.zero_grad(false);
  EXPECT_EQ(layer.weight.grad().to_vector<float>(), std::vector<float>(6, 0.0f));
  layer.zero_grad();
  EXPECT_FALSE(layer.weight.grad().defined());
  EXPECT_FALSE(layer.bias.grad().defined());
}

TEST(NNModule, InitialisationFollowsPyTorchAndIsTheSameOnEveryDevice) {
  ferry::manual_seed(11);
  nn::Linear on_cpu(50, 20);
  ferry::manual_seed(11);
  nn::Linear on_sim(50, 20, true, {.device = sim0()});
  EXPECT_EQ(on_sim.weight.device(), sim0());
  EXPECT_EQ(on_cpu.weight.to_vector<float>(), on_sim.weight.to_vector<float>());
  EXPECT_EQ(on_cpu.bias.to_vector<float>(), on_sim.bias.to_vector<float>());
  const double bound = 1 / std::sqrt(50.0);
  double largest = 0;
  for (float v : on_cpu.weight.to_vector<float>()) largest = std::max(largest, std::abs(double(v)));
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.9 * bound);  // 1000 draws fill the interval
  nn::Conv2d conv(3, 8, 3);
  const double conv_bound = 1 / std::sqrt(27.0);
  for (float v : conv.weight.to_vector<float>()) EXPECT_LE(std::abs(v), conv_bound);
  for (float v : conv.bias.to_vector<float>()) EXPECT_LE(std::abs(v), conv_bound);
  nn::BatchNorm2d bn(4);
  EXPECT_EQ(bn.weight.to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(bn.bias.to_vector<float>(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(bn.running_var.to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(ferry::nn::init::fan_in_and_fan_out(conv.weight), (std::pair<std::int64_t, std::int64_t>{27, 72}));
  EXPECT_NEAR(ferry::nn::init::calculate_gain("leaky_relu", std::sqrt(5.0)), std::sqrt(1.0 / 3.0), 1e-12);
  EXPECT_EQ(ferry::nn::init::calculate_gain("selu"), 0.75);  // PyTorch's values
  EXPECT_EQ(ferry::nn::init::calculate_gain("conv_transpose2d"), 1.0);
  EXPECT_THROW(ferry::nn::init::calculate_gain("swish"), ferry::InvalidArgument);
  // xavier_normal_: N(0, 2 / (fan_in + fan_out)); 200 x 300 draws give the std to about 0.3 %.
  Tensor w = ferry::empty({200, 300});
  ferry::nn::init::xavier_normal_(w, 2.0);
  const double std_wanted = 2.0 * std::sqrt(2.0 / 500.0);
  EXPECT_NEAR(std::sqrt(ferry::var(w).item<double>()), std_wanted, 0.02 * std_wanted);
}

TEST(NNModule, ToDtypeConvertsFloatingTensorsOnly) {
  nn::Sequential model(nn::Linear(3, 2), nn::BatchNorm1d(2));
  const Tensor weight = model.at<nn::Linear>(0).weight;
  model.to(DType::Float64);
  EXPECT_EQ(weight.dtype(), DType::Float64);
  EXPECT_EQ(model.at<nn::BatchNorm1d>(1).running_mean.dtype(), DType::Float64);
  EXPECT_EQ(model.at<nn::BatchNorm1d>(1).num_batches_tracked.dtype(), DType::Int64);
  EXPECT_EQ(model(ferry::ones({4, 3}, {.dtype = DType::Float64})).dtype(), DType::Float64);
}

TEST(NNModule, DropoutDropsTheSameElementsOnEveryDevice) {
  nn::Dropout dropout(0.25);
  const Tensor x = ferry::ones({1000});
  ferry::manual_seed(5);
  const std::vector<float> on_cpu = dropout(x).to_vector<float>();
  ferry::manual_seed(5);
  const std::vector<float> on_sim = dropout(x.to(sim0())).to_vector<float>();
  EXPECT_EQ(on_cpu, on_sim);
  int kept = 0;
  for (float v : on_cpu) {
    EXPECT_TRUE(v == 0.0f || std::abs(v - 1 / 0.75f) < 1e-6) << v;
    kept += v != 0.0f;
  }
  EXPECT_NEAR(kept, 750, 60);
  dropout.eval();
  EXPECT_TRUE(dropout(x).is_same(x));
  EXPECT_THROW(nn::Dropout(1.5), ferry::InvalidArgument);
}

// Channel dropout: whole (sample, channel) planes are zeroed or scaled by 1/(1-p), the same planes on every device
// for a seed; eval() is the identity; the shapes each accepts.
TEST(NNModule, Dropout2dDropsWholeChannels) {
  nn::Dropout2d dropout(0.25);
  EXPECT_EQ(dropout.str(), "Dropout2d(p=0.25, inplace=False)");
  const Tensor x = ferry::ones({50, 20, 3, 4});
  ferry::manual_seed(7);
  const std::vector<float> on_cpu = dropout(x).to_vector<float>();
  ferry::manual_seed(7);
  EXPECT_EQ(dropout(x.to(sim0())).to_vector<float>(), on_cpu);
  int kept = 0;
  for (std::size_t plane = 0; plane < 50 * 20; ++plane) {
    const float first = on_cpu[plane * 12];
    EXPECT_TRUE(first == 0.0f || std::abs(first - 1 / 0.75f) < 1e-6) << first;
    for (std::size_t i = 1; i < 12; ++i) ASSERT_EQ(on_cpu[plane * 12 + i], first) << "plane " << plane;
    kept += first != 0.0f;
  }
  EXPECT_NEAR(kept, 750, 60);
  dropout.eval();
  EXPECT_TRUE(dropout(x).is_same(x));
  EXPECT_THROW(dropout.train()(ferry::ones({20, 3, 4})), ferry::ShapeMismatch);  // 3-d: dropout1d or unsqueeze(0)
  EXPECT_THROW(nn::Dropout2d(-0.1), ferry::InvalidArgument);

  nn::Dropout1d dropout1d(0.5);
  const std::vector<float> unbatched = dropout1d(ferry::ones({30, 5})).to_vector<float>();  // (C, L)
  for (std::size_t c = 0; c < 30; ++c) {
    for (std::size_t i = 1; i < 5; ++i) ASSERT_EQ(unbatched[c * 5 + i], unbatched[c * 5]) << "channel " << c;
  }
  EXPECT_EQ(dropout1d(ferry::ones({2, 30, 5})).shape(), (ferry::Shape{2, 30, 5}));
  EXPECT_THROW(dropout1d(ferry::ones({2, 30, 5, 1})), ferry::ShapeMismatch);
}

// PixelShuffle's index rule on a small input, the round trip through PixelUnshuffle, the two-input layers' refusal
// of one input, and the shape checks.
TEST(NNModule, PixelShuffleAndTwoInputLayers) {
  nn::PixelShuffle shuffle(2);
  EXPECT_EQ(shuffle.str(), "PixelShuffle(upscale_factor=2)");
  const Tensor x = ferry::arange(8, {.dtype = DType::Float32}).reshape({1, 4, 1, 2});
  // out[0, 0, i, 2 w + j] = x[0, 2 i + j, 0, w]: rows (x0 x1 x0' x1') with channel c at (i, j) = (c / 2, c % 2)
  EXPECT_EQ(shuffle(x).to_vector<float>(), (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
  nn::PixelUnshuffle unshuffle(2);
  const Tensor y = ferry::randn({2, 3, 12, 6, 4});
  EXPECT_EQ(unshuffle(y).shape(), (ferry::Shape{2, 3, 48, 3, 2}));
  EXPECT_EQ(shuffle(unshuffle(y)).to_vector<float>(), y.to_vector<float>());
  EXPECT_THROW(shuffle(ferry::randn({1, 3, 2, 2})), ferry::ShapeMismatch);    // 3 channels, not a multiple of 4
  EXPECT_THROW(unshuffle(ferry::randn({1, 3, 3, 2})), ferry::ShapeMismatch);  // height 3
  EXPECT_THROW(nn::PixelShuffle(0), ferry::InvalidArgument);

  nn::CosineSimilarity cosine(1);
  EXPECT_THROW(cosine(ferry::randn({2, 3})), ferry::InvalidArgument);
  const Tensor a = ferry::randn({4, 3});
  const std::vector<float> same = cosine.forward(a, ferry::mul(a, 2.0)).to_vector<float>();
  for (float v : same) EXPECT_NEAR(v, 1.0f, 1e-6);
  EXPECT_NEAR(nn::functional::cosine_similarity(ferry::zeros({1, 3}), a.narrow(0, 0, 1)).item<float>(), 0.0f, 0);
  EXPECT_THROW(nn::PairwiseDistance()(a), ferry::InvalidArgument);
  EXPECT_THROW(nn::functional::vector_norm(a, 0.0, 1), ferry::InvalidArgument);
  EXPECT_THROW(nn::functional::vector_norm(a, 2.0, 2), ferry::InvalidArgument);
  EXPECT_THROW(nn::functional::kl_div(a, ferry::randn({3, 4})), ferry::ShapeMismatch);
  EXPECT_THROW(nn::functional::cosine_embedding_loss(a, a, ferry::ones({3})), ferry::ShapeMismatch);
  EXPECT_THROW(nn::functional::triplet_margin_loss(a, a, ferry::randn({4, 2})), ferry::ShapeMismatch);
}

TEST(NNModule, LayersCheckTheirInputs) {
  nn::Conv2d conv(3, 4, 3);
  EXPECT_THROW(conv(ferry::ones({2, 5, 8, 8})), ferry::ShapeMismatch);
  EXPECT_THROW(conv(ferry::ones({2, 3, 2, 2})), ferry::ShapeMismatch);
  EXPECT_THROW(nn::Conv2d(3, 4, 3, {.groups = 2}), ferry::InvalidArgument);  // 3 channels in 2 groups
  EXPECT_THROW(nn::Conv2d(4, 3, 3, {.groups = 2}), ferry::InvalidArgument);
  nn::Conv2d depthwise(4, 8, 3, {.padding = 1, .groups = 4});
  EXPECT_EQ(depthwise.weight.shape(), (ferry::Shape{8, 1, 3, 3}));
  EXPECT_EQ(depthwise.extra_repr(), "4, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), groups=4");
  EXPECT_EQ(depthwise(ferry::ones({2, 4, 5, 5})).shape(), (ferry::Shape{2, 8, 5, 5}));
  EXPECT_THROW(nn::functional::conv2d(ferry::ones({1, 4, 5, 5}), depthwise.weight, Tensor(), 1, 0, 1, 2),
               ferry::ShapeMismatch);  // groups=2 wants weight (8, 2, 3, 3)
  nn::BatchNorm2d bn(3);
  EXPECT_THROW(bn(ferry::ones({2, 3, 4})), ferry::ShapeMismatch);
  EXPECT_THROW(bn(ferry::ones({1, 3, 1, 1})), ferry::InvalidArgument);  // one value per channel in training
  nn::Linear linear(4, 2);
  EXPECT_THROW(linear(ferry::ones({3, 5})), ferry::ShapeMismatch);
  EXPECT_THROW(linear(ferry::ones({3, 4}, {.dtype = DType::Float64})), ferry::DTypeMismatch);
  EXPECT_THROW(nn::MaxPool2d(2, 2, 2)(ferry::ones({1, 1, 4, 4})), ferry::InvalidArgument);
  EXPECT_THROW(ferry::nn::functional::cross_entropy(ferry::ones({3, 4}), ferry::from_vector<std::int64_t>({0, 4, 1})),
               ferry::InvalidArgument);
}

// Empty batches and empty features, as PyTorch: Conv2d's weight gradient is zeros (not whatever the memory held),
// Linear(0, out) gives the bias, BatchNorm returns an empty output and keeps its running statistics.
TEST(NNModule, EmptyBatchesAndFeaturesFollowPyTorch) {
  for (const Device device : {ferry::kCPU, Device::parse("sim:0")}) {
    const std::string where = device.str();
    {  // dirty the allocator's cached blocks first
      nn::Conv2d warm(3, 2, 3, {}, {.device = device});
      ferry::sum(warm(ferry::ones({2, 3, 5, 5}, {.device = device}))).backward();
    }
    nn::Conv2d conv(3, 2, 3, {}, {.device = device});
    ferry::sum(conv(ferry::zeros({0, 3, 5, 5}, {.device = device}))).backward();
    EXPECT_EQ(conv.weight.grad().to_vector<float>(), std::vector<float>(2 * 3 * 3 * 3, 0.0F)) << where;
    EXPECT_EQ(conv.bias.grad().to_vector<float>(), std::vector<float>(2, 0.0F)) << where;

    nn::Linear empty_in(0, 2, true, {.device = device});
    const Tensor out = empty_in(ferry::zeros({3, 0}, {.device = device}));
    EXPECT_EQ(out.shape(), (ferry::Shape{3, 2})) << where;
    const std::vector<float> bias = empty_in.bias.to_vector<float>();
    EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{bias[0], bias[1], bias[0], bias[1], bias[0], bias[1]}))
        << where;

    nn::BatchNorm2d bn(4, {}, {.device = device});
    Tensor x = ferry::zeros({0, 4, 2, 2}, {.device = device}).requires_grad_(true);
    const Tensor y = bn(x);
    EXPECT_EQ(y.shape(), x.shape()) << where;
    EXPECT_EQ(bn.running_mean.to_vector<float>(), std::vector<float>(4, 0.0F)) << where;
    EXPECT_EQ(bn.running_var.to_vector<float>(), std::vector<float>(4, 1.0F)) << where;
    EXPECT_EQ(bn.num_batches_tracked.item<std::int64_t>(), 1) << where;
    ferry::sum(y).backward();
    EXPECT_EQ(bn.weight.grad().to_vector<float>(), std::vector<float>(4, 0.0F)) << where;
  }
}

// Softmax, log_softmax and logsumexp over a dim of size 0, and GroupNorm on an empty batch, as torch 1.13: empty
// results and gradients, logsumexp -inf, GroupNorm's weight and bias gradients zeros (each threw before).
TEST(NNModule, EmptySlicesAndEmptyGroupNormBatchesFollowPyTorch) {
  std::vector<Device> devices = ferry::testing::accelerators();
  devices.insert(devices.begin(), ferry::kCPU);
  for (const Device& device : devices) {
    const std::string where = device.str();
    for (const bool log : {false, true}) {
      Tensor x = ferry::zeros({3, 0}, {.device = device}).requires_grad_(true);
      const Tensor y = log ? ferry::log_softmax(x, 1) : ferry::softmax(x, -1);
      EXPECT_EQ(y.shape(), x.shape()) << where;
      ferry::sum(y).backward();
      EXPECT_EQ(x.grad().shape(), x.shape()) << where;
    }
    Tensor x = ferry::zeros({2, 0, 3}, {.device = device}).requires_grad_(true);
    const Tensor lse = ferry::logsumexp(x, 1);
    EXPECT_EQ(lse.shape(), (ferry::Shape{2, 3})) << where;
    EXPECT_EQ(lse.to_vector<float>(), std::vector<float>(6, -INFINITY)) << where;
    ferry::sum(lse).backward();
    EXPECT_EQ(x.grad().shape(), x.shape()) << where;

    nn::GroupNorm gn(2, 4, 1e-5, true, {.device = device});
    Tensor batch = ferry::zeros({0, 4, 3}, {.device = device}).requires_grad_(true);
    const Tensor out = gn(batch);
    EXPECT_EQ(out.shape(), batch.shape()) << where;
    ferry::sum(out).backward();
    EXPECT_EQ(gn.weight.grad().to_vector<float>(), std::vector<float>(4, 0.0F)) << where;
    EXPECT_EQ(gn.bias.grad().to_vector<float>(), std::vector<float>(4, 0.0F)) << where;
  }
}

// A layer registered twice (shared weights) is listed once by parameters(), so an optimizer updates it once, as
// A model holding its blocks in a ModuleList: PyTorch's names ("blocks.1.0.weight"), the children in order and
// typed, moves and modes reach them, and calling the list itself is an error that says what to do.
TEST(NNModule, ModuleListHoldsBlocksUnderPyTorchNames) {
  struct Model : nn::Module {
    Model() {
      blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
      for (int i = 0; i < 3; ++i) blocks->push_back(nn::Sequential(nn::Linear(4, 4), nn::ReLU(), nn::Dropout(0.5)));
      head = register_module("head", std::make_shared<nn::Linear>(4, 2));
    }
    Tensor forward(const Tensor& x) override {
      Tensor y = x;
      for (const auto& block : blocks->children()) y = (*block)(y);
      return (*head)(y);
    }
    std::string type_name() const override { return "Model"; }
    std::shared_ptr<nn::ModuleList> blocks;
    std::shared_ptr<nn::Linear> head;
  } model;
  std::vector<std::string> names;
  for (const auto& [name, t] : model.state_dict()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"blocks.0.0.weight", "blocks.0.0.bias", "blocks.1.0.weight",
                                             "blocks.1.0.bias", "blocks.2.0.weight", "blocks.2.0.bias", "head.weight",
                                             "head.bias"}));
  ASSERT_EQ(model.blocks->size(), 3u);
  EXPECT_FALSE(model.blocks->empty());
  EXPECT_EQ(&model.blocks->at<nn::Sequential>(1), &(*model.blocks)[1]);
  EXPECT_EQ(model.blocks->at<nn::Sequential>(2).at<nn::Linear>(0).weight.shape(), (ferry::Shape{4, 4}));
  EXPECT_THROW(model.blocks->at<nn::Linear>(0), ferry::InvalidArgument);
  EXPECT_THROW((*model.blocks)[3], ferry::InvalidArgument);
  EXPECT_EQ(model.parameters().size(), 8u);
  EXPECT_EQ(model.forward(ferry::ones({5, 4})).shape(), (ferry::Shape{5, 2}));

  model.eval();  // reaches the Dropout inside the list
  EXPECT_FALSE(model.blocks->at<nn::Sequential>(0).at<nn::Dropout>(2).is_training());
  model.to(sim0());
  EXPECT_EQ(model.blocks->at<nn::Sequential>(2).at<nn::Linear>(0).weight.device(), sim0());

  try {
    (*model.blocks)(ferry::ones({5, 4}, {.device = sim0()}));
    ADD_FAILURE() << "calling a ModuleList was accepted";
  } catch (const ferry::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ModuleList has no forward: it holds 3 modules"), std::string::npos)
        << e.what();
  }
  // Every module by its path, the root first; apply() reaches each, children before parents.
  std::vector<std::string> paths;
  for (const auto& [path, m] : model.named_modules()) paths.push_back(path + ":" + m->type_name());
  EXPECT_EQ(paths, (std::vector<std::string>{":Model", "blocks:ModuleList", "blocks.0:Sequential", "blocks.0.0:Linear",
                                             "blocks.0.1:ReLU", "blocks.0.2:Dropout", "blocks.1:Sequential",
                                             "blocks.1.0:Linear", "blocks.1.1:ReLU", "blocks.1.2:Dropout",
                                             "blocks.2:Sequential", "blocks.2.0:Linear", "blocks.2.1:ReLU",
                                             "blocks.2.2:Dropout", "head:Linear"}));
  std::vector<std::string> order;
  model.apply([&](nn::Module& m) {
    order.push_back(m.type_name());
    if (auto* linear = dynamic_cast<nn::Linear*>(&m)) linear->bias.detach().fill_(0.25);  // a custom init
  });
  EXPECT_EQ(order.size(), paths.size());
  EXPECT_EQ(order.front(), "Linear");
  EXPECT_EQ(order.back(), "Model");
  EXPECT_EQ(model.head->bias.cpu().to_vector<float>(), (std::vector<float>{0.25f, 0.25f}));
  // Pushed by value, the module comes back typed.
  nn::ModuleList list;
  const auto linear = list.push_back(nn::Linear(2, 3));
  EXPECT_EQ(linear->weight.shape(), (ferry::Shape{3, 2}));
  EXPECT_EQ(list.str().find("ModuleList("), 0u) << list.str();
}

// PyTorch's remove_duplicate; state_dict() keeps both names.
TEST(NNModule, ASharedLayerIsOneSetOfParameters) {
  auto shared = std::make_shared<nn::Linear>(2, 2);
  nn::Sequential model;
  model.push_back(shared);
  model.push_back(shared);
  std::vector<std::string> names;
  for (const auto& [name, t] : model.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias"}));
  ASSERT_EQ(model.named_modules().size(), 2u);  // the Sequential and its one Linear, under its first name
  EXPECT_EQ(model.named_modules()[1].first, "0");
  int applied = 0;
  model.apply([&](nn::Module&) { ++applied; });
  EXPECT_EQ(applied, 2);
  EXPECT_EQ(model.parameter_count(), 6);
  EXPECT_EQ(model.state_dict().size(), 4u);
  const float before = shared->weight.to_vector<float>()[0];
  ferry::optim::SGD sgd(model.parameters(), {.lr = 0.1});
  shared->weight.set_grad(ferry::ones({2, 2}));
  sgd.step();
  EXPECT_FLOAT_EQ(shared->weight.to_vector<float>()[0], before - 0.1F);
}

// The softmax family's edges, as PyTorch: rows of all -inf, +inf, integer inputs, 0-d tensors.
TEST(NNModule, SoftmaxEdgesFollowPyTorch) {
  const float inf = INFINITY;
  const Tensor x = ferry::from_vector<float>({-inf, -inf, 1, inf}, {2, 2});
  const std::vector<float> soft = ferry::softmax(x, 1).to_vector<float>();
  EXPECT_TRUE(std::isnan(soft[0]) && std::isnan(soft[1]));  // torch.softmax([-inf, -inf]) = [nan, nan]
  EXPECT_TRUE(std::isnan(soft[2]) && std::isnan(soft[3]));  // torch.softmax([1, inf]) = [nan, nan] (inf - inf)
  const std::vector<float> lse = ferry::logsumexp(x, 1).to_vector<float>();
  EXPECT_EQ(lse[0], -inf);  // torch.logsumexp([-inf, -inf]) = -inf
  EXPECT_EQ(lse[1], inf);
  EXPECT_EQ(ferry::softmax(ferry::from_vector<float>({1000, 1000}), 0).to_vector<float>(),
            (std::vector<float>{0.5F, 0.5F}));
  EXPECT_THROW(ferry::softmax(ferry::from_vector<std::int64_t>({1, 2}), 0), ferry::DTypeMismatch);
  EXPECT_THROW(ferry::log_softmax(ferry::scalar_tensor(1.0), 0), ferry::ShapeMismatch);
  EXPECT_THROW(ferry::softmax(ferry::ones({2, 3}), 2), ferry::InvalidArgument);
  nn::Sequential model(nn::Linear(3, 4), nn::Softmax(1));
  const Tensor rows = ferry::sum(model(ferry::ones({2, 3})), {1});
  for (const float total : rows.to_vector<float>()) EXPECT_NEAR(total, 1.0F, 1e-6F);
  EXPECT_EQ(nn::LogSoftmax(-1).extra_repr(), "dim=-1");
}

// AdaptiveAvgPool2d's three paths give torch's values on a small input; Identity hands its input back.
TEST(NNModule, AdaptiveAvgPoolAndIdentity) {
  const Tensor x = ferry::add(ferry::arange(12, {.dtype = ferry::DType::Float32}), 1.0).reshape({1, 1, 3, 4});
  // torch.nn.AdaptiveAvgPool2d((2, 3))(x): rows {0,1},{1,2}; columns {0,1},{1,2},{2,3}
  EXPECT_EQ(nn::AdaptiveAvgPool2d({2, 3})(x).to_vector<float>(),
            (std::vector<float>{3.5F, 4.5F, 5.5F, 7.5F, 8.5F, 9.5F}));
  EXPECT_EQ(nn::AdaptiveAvgPool2d(1)(x).to_vector<float>(), (std::vector<float>{6.5F}));
  EXPECT_EQ(nn::AdaptiveAvgPool2d({3, 2})(x).to_vector<float>(),
            (std::vector<float>{1.5F, 3.5F, 5.5F, 7.5F, 9.5F, 11.5F}));
  EXPECT_EQ(nn::AdaptiveAvgPool2d({2, 3})(x.select(0, 0)).shape(), (ferry::Shape{1, 2, 3}));
  EXPECT_EQ(nn::AdaptiveAvgPool2d({2, 3}).str(), "AdaptiveAvgPool2d(output_size=(2, 3))");
  EXPECT_EQ(nn::AdaptiveAvgPool2d(1).str(), "AdaptiveAvgPool2d(output_size=1)");
  EXPECT_THROW(nn::AdaptiveAvgPool2d(0)(x), ferry::InvalidArgument);
  EXPECT_THROW(nn::AdaptiveAvgPool2d(1)(x.flatten()), ferry::ShapeMismatch);
  EXPECT_THROW(nn::AdaptiveAvgPool2d(1)(ferry::arange(4).reshape({1, 1, 2, 2})), ferry::DTypeMismatch);
  // torch.nn.AdaptiveMaxPool2d over the same windows
  EXPECT_EQ(nn::AdaptiveMaxPool2d({2, 3})(x).to_vector<float>(), (std::vector<float>{6, 7, 8, 10, 11, 12}));
  EXPECT_EQ(nn::AdaptiveMaxPool2d({3, 2})(x).to_vector<float>(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(nn::AdaptiveMaxPool2d({2, 3}).str(), "AdaptiveMaxPool2d(output_size=(2, 3))");
  EXPECT_EQ(nn::AdaptiveMaxPool2d(1)(x.select(0, 0)).to_vector<float>(), (std::vector<float>{12}));
  EXPECT_THROW(nn::AdaptiveMaxPool2d(0)(x), ferry::InvalidArgument);
  EXPECT_THROW(nn::AdaptiveMaxPool2d(1)(ferry::arange(4).reshape({1, 1, 2, 2})), ferry::DTypeMismatch);
  nn::Identity identity;
  EXPECT_EQ(identity(x).storage(), x.storage());
  EXPECT_EQ(identity.str(), "Identity()");
}

// Conv1d and Upsample (nearest and bilinear): PyTorch's reprs (torch 1.13), values, shapes, and their refusals.
TEST(NNModule, Conv1dAndUpsampleFollowPyTorch) {
  nn::Conv1d conv(4, 6, 3, {.padding = 1, .groups = 2});
  EXPECT_EQ(conv.str(), "Conv1d(4, 6, kernel_size=(3,), stride=(1,), padding=(1,), groups=2)");
  EXPECT_EQ(nn::Conv1d(2, 3, 5, {.bias = false}).str(), "Conv1d(2, 3, kernel_size=(5,), stride=(1,), bias=False)");
  EXPECT_EQ(conv.weight.shape(), (ferry::Shape{6, 2, 3}));
  EXPECT_EQ(conv.named_parameters().size(), 2u);
  EXPECT_EQ(conv(ferry::ones({2, 4, 9})).shape(), (ferry::Shape{2, 6, 9}));
  EXPECT_EQ(conv(ferry::ones({4, 9})).shape(), (ferry::Shape{6, 9}));  // unbatched, as torch
  EXPECT_THROW(conv(ferry::ones({2, 3, 9})), ferry::ShapeMismatch);
  EXPECT_THROW(nn::Conv1d(3, 6, 3, {.groups = 2}), ferry::InvalidArgument);

  nn::Upsample up({2, 3});
  EXPECT_EQ(up.str(), "Upsample(scale_factor=(2.0, 3.0), mode=nearest)");
  EXPECT_EQ(nn::Upsample(2).str(), "Upsample(scale_factor=2.0, mode=nearest)");
  const Tensor x = ferry::from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2});
  EXPECT_EQ(nn::Upsample(2)(x).to_vector<float>(),
            (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  EXPECT_EQ(up(x).shape(), (ferry::Shape{1, 1, 4, 6}));
  EXPECT_THROW(nn::Upsample(2, "bicubic"), ferry::NotSupported);
  EXPECT_THROW(nn::Upsample(2, "nearest", /*align_corners=*/true), ferry::InvalidArgument);
  EXPECT_EQ(nn::Upsample(2, "bilinear", true).str(), "Upsample(scale_factor=2.0, mode=bilinear)");  // as torch
  // Sizes that are no whole factor, against torch 1.13's F.interpolate(mode="bilinear") on this 2 x 3 image.
  const Tensor image = ferry::from_vector<float>({1, 4, 2, 0, 3, 5}, {1, 1, 2, 3});
  for (const char* name : {"cpu", "sim:0"}) {
    const Tensor on = image.to(Device::parse(name));
    const std::vector<float> half = nn::functional::upsample_bilinear2d(on, {3, 5}).to_vector<float>();
    const std::vector<float> torch_half = {1.0f, 2.2f, 4.0f, 2.8f, 2.0f, 0.5f, 1.7f, 3.5f,
                                           3.5f, 3.5f, 0.0f, 1.2f, 3.0f, 4.2f, 5.0f};
    const std::vector<float> aligned = nn::functional::upsample_bilinear2d(on, {3, 5}, true).to_vector<float>();
    const std::vector<float> torch_aligned = {1.0f, 2.5f, 4.0f, 3.0f, 2.0f, 0.5f, 2.0f, 3.5f,
                                              3.5f, 3.5f, 0.0f, 1.5f, 3.0f, 4.0f, 5.0f};
    ASSERT_EQ(half.size(), torch_half.size());
    for (std::size_t i = 0; i < half.size(); ++i) {
      EXPECT_NEAR(half[i], torch_half[i], 1e-6) << name << " at " << i;
      EXPECT_NEAR(aligned[i], torch_aligned[i], 1e-6) << name << " aligned at " << i;
    }
    EXPECT_EQ(nn::functional::upsample_bilinear2d(on, {1, 2}).to_vector<float>(), (std::vector<float>{1.25f, 3.5f}));
  }
  EXPECT_THROW(nn::functional::upsample_bilinear2d(image, {0, 2}), ferry::InvalidArgument);
  EXPECT_THROW(nn::functional::upsample_bilinear2d(image.select(0, 0), {2, 2}), ferry::ShapeMismatch);
  EXPECT_THROW(nn::Upsample(0), ferry::InvalidArgument);
  EXPECT_THROW(up(x.select(0, 0)), ferry::ShapeMismatch);
}

// ConvTranspose2d and ConvTranspose1d: PyTorch's reprs (torch 1.13) and shapes; the transposed convolution is the
// adjoint of conv2d (<conv2d(x, w), y> = <x, conv_transpose2d(y, w)> for the same weight); and its refusals.
TEST(NNModule, ConvTransposeIsTheAdjointOfConv2d) {
  namespace F = nn::functional;
  nn::ConvTranspose2d up(3, 4, 3, {.stride = 2, .padding = 1, .output_padding = 1});
  EXPECT_EQ(up.str(), "ConvTranspose2d(3, 4, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1))");
  EXPECT_EQ(nn::ConvTranspose2d(4, 6, {3, 2}, {.stride = {2, 1}, .padding = {1, 0}, .groups = 2, .bias = false,
                                               .dilation = {1, 2}})
                .str(),
            "ConvTranspose2d(4, 6, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2, "
            "bias=False)");
  EXPECT_EQ(nn::ConvTranspose1d(4, 2, 4, {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2,
                                          .dilation = 2})
                .str(),
            "ConvTranspose1d(4, 2, kernel_size=(4,), stride=(2,), padding=(1,), dilation=(2,), output_padding=(1,), "
            "groups=2)");
  EXPECT_EQ(up.weight.shape(), (ferry::Shape{3, 4, 3, 3}));
  EXPECT_EQ(up(ferry::ones({2, 3, 5, 7})).shape(), (ferry::Shape{2, 4, 10, 14}));  // doubles H and W
  EXPECT_EQ(up(ferry::ones({3, 5, 7})).shape(), (ferry::Shape{4, 10, 14}));        // unbatched
  EXPECT_EQ(nn::ConvTranspose1d(2, 3, 4, {.stride = 2, .padding = 1})(ferry::ones({1, 2, 8})).shape(),
            (ferry::Shape{1, 3, 16}));

  for (const char* name : {"cpu", "sim:0"}) {
    const Device device = Device::parse(name);
    const ferry::TensorOptions like{.device = device, .dtype = ferry::DType::Float64};
    ferry::manual_seed(5);
    const Tensor w = ferry::randn({4, 3, 3, 2}, like);  // conv2d (O=4, C=3); conv_transpose2d (C_in=4, C_out=3)
    const Tensor x = ferry::randn({2, 3, 9, 8}, like);
    const Tensor y_conv = F::conv2d(x, w, Tensor(), {2, 3}, {1, 0}, {1, 2});
    const Tensor y = ferry::randn(y_conv.shape(), like);
    // y is (2, 4, 5, 2); output_padding (0, 2) gives back x's size: 9 = (5 - 1) * 2 - 2 * 1 + 1 * (3 - 1) + 0 + 1
    // and 8 = (2 - 1) * 3 - 0 + 2 * (2 - 1) + 2 + 1
    const Tensor x_back = F::conv_transpose2d(y, w, Tensor(), {2, 3}, {1, 0}, {0, 2}, 1, {1, 2});
    ASSERT_EQ(x_back.shape(), x.shape()) << name;
    const double lhs = ferry::sum(ferry::mul(y_conv, y)).item<double>();
    const double rhs = ferry::sum(ferry::mul(x, x_back)).item<double>();
    EXPECT_NEAR(lhs, rhs, 1e-10 * std::max(1.0, std::abs(lhs))) << name;
  }

  EXPECT_THROW(up(ferry::ones({2, 2, 5, 5})), ferry::ShapeMismatch);  // 2 channels, weight wants 3
  EXPECT_THROW(nn::ConvTranspose2d(3, 4, 3, {.groups = 2}), ferry::InvalidArgument);
  EXPECT_THROW(nn::ConvTranspose2d(4, 3, 3, {.groups = 2}), ferry::InvalidArgument);
  // output_padding must stay below the stride or the dilation (PyTorch's rule)
  EXPECT_THROW(nn::ConvTranspose2d(3, 4, 3, {.stride = 2, .output_padding = 2})(ferry::ones({1, 3, 4, 4})),
               ferry::InvalidArgument);
  EXPECT_THROW(F::conv_transpose2d(ferry::ones({1, 1, 2, 2}), ferry::ones({1, 1, 3, 3}), Tensor(), 1, 2),
               ferry::ShapeMismatch);  // output (2 - 1) - 4 + 2 + 1 = 0 rows
  EXPECT_THROW(F::conv_transpose2d(ferry::arange(4).reshape({1, 1, 2, 2}), ferry::ones({1, 1, 1, 1})),
               ferry::DTypeMismatch);
}

// Unfold and Fold against torch 1.13 (values and reprs); unfold + matmul is conv2d; fold undoes unfold up to the
// count of blocks over each pixel; and their refusals.
TEST(NNModule, UnfoldAndFoldFollowPyTorch) {
  namespace F = nn::functional;
  for (const char* name : {"cpu", "sim:0"}) {
    const Device device = Device::parse(name);
    const Tensor x = ferry::arange(12, {.device = device, .dtype = DType::Float32}).reshape({1, 1, 3, 4});
    const Tensor u = F::unfold(x, 2, 1, 0, {1, 2});
    EXPECT_EQ(u.shape(), (ferry::Shape{1, 4, 4})) << name;
    EXPECT_EQ(u.to_vector<float>(), (std::vector<float>{0, 2, 4, 6, 1, 3, 5, 7, 4, 6, 8, 10, 5, 7, 9, 11})) << name;
    EXPECT_EQ(F::fold(u, {3, 4}, 2, 1, 0, {1, 2}).to_vector<float>(),
              (std::vector<float>{0, 1, 2, 3, 8, 10, 12, 14, 8, 9, 10, 11})) << name;  // the middle row twice

    ferry::manual_seed(9);
    const ferry::TensorOptions f64{.device = device, .dtype = DType::Float64};
    const Tensor image = ferry::randn({2, 3, 7, 6}, f64), weight = ferry::randn({4, 3, 3, 2}, f64);
    const Tensor conv = F::conv2d(image, weight, Tensor(), {2, 1}, {1, 0}, {1, 2});
    const Tensor columns = F::unfold(image, {3, 2}, {1, 2}, {1, 0}, {2, 1});  // (2, 18, L)
    const Tensor by_hand = ferry::matmul(weight.reshape({4, 18}), columns).reshape(conv.shape());
    EXPECT_LT(ferry::max(ferry::abs(ferry::sub(by_hand, conv))).item<double>(), 1e-12) << name;
  }
  EXPECT_EQ(nn::Unfold(nn::Size2(2, 3)).str(), "Unfold(kernel_size=(2, 3), dilation=1, padding=0, stride=1)");
  EXPECT_EQ(nn::Fold({4, 5}, 3).str(), "Fold(output_size=(4, 5), kernel_size=3, dilation=1, padding=0, stride=1)");
  EXPECT_EQ(nn::Unfold(2)(ferry::ones({3, 4, 4})).shape(), (ferry::Shape{12, 9}));  // unbatched
  EXPECT_THROW(nn::functional::unfold(ferry::ones({1, 1, 2, 2}), 3), ferry::ShapeMismatch);           // no block fits
  EXPECT_THROW(nn::functional::fold(ferry::ones({1, 5, 4}), {3, 3}, 2), ferry::ShapeMismatch);         // 5 % 4
  EXPECT_THROW(nn::functional::fold(ferry::ones({1, 4, 5}), {3, 3}, 2), ferry::ShapeMismatch);         // 4 blocks
  EXPECT_THROW(nn::functional::unfold(ferry::ones({1, 1, 4, 4}), 2, 1, 0, 0), ferry::InvalidArgument);  // stride 0
}

// functional::pad against torch 1.13's F.pad in each mode, on cpu and sim, and its refusals.
TEST(NNModule, PadFollowsPyTorchInEveryMode) {
  namespace F = nn::functional;
  for (const char* name : {"cpu", "sim:0"}) {
    const Device device = Device::parse(name);
    const Tensor x = ferry::arange(6, {.device = device, .dtype = DType::Float32}).reshape({1, 2, 3});
    EXPECT_EQ(F::pad(x, {2, 1}, "reflect").to_vector<float>(),
              (std::vector<float>{2, 1, 0, 1, 2, 1, 5, 4, 3, 4, 5, 4})) << name;
    EXPECT_EQ(F::pad(x, {2, 1}, "replicate").to_vector<float>(),
              (std::vector<float>{0, 0, 0, 1, 2, 2, 3, 3, 3, 4, 5, 5})) << name;
    EXPECT_EQ(F::pad(x, {2, 1}, "circular").to_vector<float>(),
              (std::vector<float>{1, 2, 0, 1, 2, 0, 4, 5, 3, 4, 5, 3})) << name;
    const Tensor constant = F::pad(x, {1, -1, 0, 1}, "constant", 9);  // a negative size crops
    EXPECT_EQ(constant.shape(), (ferry::Shape{1, 3, 3})) << name;
    EXPECT_EQ(constant.to_vector<float>(), (std::vector<float>{9, 0, 1, 9, 3, 4, 9, 9, 9})) << name;
    const Tensor y = ferry::arange(12, {.device = device, .dtype = DType::Float32}).reshape({1, 1, 3, 4});
    EXPECT_EQ(F::pad(y, {1, 2, 2, 1}, "reflect").to_vector<float>(),
              (std::vector<float>{9, 8, 9, 10, 11, 10, 9, 5, 4, 5, 6, 7, 6, 5, 1, 0, 1, 2, 3, 2, 1,
                                  5, 4, 5, 6, 7, 6, 5, 9, 8, 9, 10, 11, 10, 9, 5, 4, 5, 6, 7, 6, 5})) << name;
    EXPECT_EQ(F::pad(y, {}).storage(), y.storage());  // nothing to pad: the input itself
  }
  const Tensor x = ferry::ones({2, 3});
  EXPECT_THROW(F::pad(x, {1}), ferry::InvalidArgument);                  // not pairs
  EXPECT_THROW(F::pad(x, {1, 1, 1, 1, 1, 1}), ferry::ShapeMismatch);     // 3 dims of a 2-d input
  EXPECT_THROW(F::pad(x, {3, 0}, "reflect"), ferry::ShapeMismatch);      // 3 >= the dim's 3
  EXPECT_THROW(F::pad(x, {4, 0}, "circular"), ferry::ShapeMismatch);     // 4 > 3
  EXPECT_THROW(F::pad(x, {-1, 0}, "replicate"), ferry::InvalidArgument);  // negative outside constant
  EXPECT_THROW(F::pad(x, {-2, -2}), ferry::ShapeMismatch);               // cuts 4 of 3
  EXPECT_THROW(F::pad(x, {1, 1}, "wrap"), ferry::InvalidArgument);
  EXPECT_THROW(F::pad(x, {1, 1}, "reflect", 1.0), ferry::InvalidArgument);
}

// RNN, LSTM and GRU: PyTorch's reprs (torch 1.13), parameter names and shapes, output and state shapes in each
// layout, dropout between layers only in training, and the refusals.
TEST(NNModule, RecurrentLayersFollowPyTorch) {
  nn::LSTM lstm(10, 20, {.num_layers = 2, .bias = false, .batch_first = true, .dropout = 0.5, .bidirectional = true});
  EXPECT_EQ(lstm.str(), "LSTM(10, 20, num_layers=2, bias=False, batch_first=True, dropout=0.5, bidirectional=True)");
  EXPECT_EQ(nn::GRU(3, 4).str(), "GRU(3, 4)");
  EXPECT_EQ(nn::RNN(3, 4, {}, "relu").str(), "RNN(3, 4)");  // torch 1.13 prints no nonlinearity
  const nn::NamedTensors params = nn::LSTM(3, 4, {.num_layers = 2, .bidirectional = true}).named_parameters();
  ASSERT_EQ(params.size(), 16u);
  EXPECT_EQ(params[0].first, "weight_ih_l0");
  EXPECT_EQ(params[0].second.shape(), (ferry::Shape{16, 3}));
  EXPECT_EQ(params[4].first, "weight_ih_l0_reverse");
  EXPECT_EQ(params[8].first, "weight_ih_l1");
  EXPECT_EQ(params[8].second.shape(), (ferry::Shape{16, 8}));  // the layer below's two directions
  EXPECT_EQ(params[15].first, "bias_hh_l1_reverse");
  EXPECT_EQ(nn::GRU(3, 4).named_parameters()[1].second.shape(), (ferry::Shape{12, 4}));

  const nn::RNNOutput r = lstm.forward(ferry::randn({3, 7, 10}), Tensor());  // (N, L, in)
  EXPECT_EQ(r.output.shape(), (ferry::Shape{3, 7, 40}));
  EXPECT_EQ(r.h_n.shape(), (ferry::Shape{4, 3, 20}));
  EXPECT_EQ(r.c_n.shape(), (ferry::Shape{4, 3, 20}));
  nn::GRU gru(4, 5, {.num_layers = 2, .dropout = 0.9});
  const nn::RNNOutput unbatched = gru.forward(ferry::randn({6, 4}), ferry::zeros({2, 5}));
  EXPECT_EQ(unbatched.output.shape(), (ferry::Shape{6, 5}));
  EXPECT_EQ(unbatched.h_n.shape(), (ferry::Shape{2, 5}));
  EXPECT_FALSE(unbatched.c_n.defined());
  const Tensor x = ferry::randn({6, 2, 4});
  gru.eval();  // no dropout: the same output twice
  EXPECT_EQ(gru(x).to_vector<float>(), gru(x).to_vector<float>());
  gru.train();  // dropout 0.9 between the layers changes the second layer's input from draw to draw
  EXPECT_NE(gru(x).to_vector<float>(), gru(x).to_vector<float>());

  EXPECT_THROW(lstm(ferry::randn({3, 7, 9})), ferry::ShapeMismatch);               // input_size 10
  EXPECT_THROW(lstm(ferry::randn({3, 0, 10})), ferry::ShapeMismatch);              // no steps
  EXPECT_THROW(lstm.forward(ferry::randn({3, 7, 10}), ferry::zeros({4, 2, 20})), ferry::ShapeMismatch);  // N = 3
  EXPECT_THROW(gru.forward(x, Tensor(), ferry::zeros({2, 2, 5})), ferry::InvalidArgument);  // c0 is LSTM's
  EXPECT_THROW(nn::RNN(3, 4, {}, "sigmoid"), ferry::InvalidArgument);
  EXPECT_THROW(nn::LSTM(3, 0), ferry::InvalidArgument);
  EXPECT_THROW(nn::GRU(3, 4, {.dropout = 1.5}), ferry::InvalidArgument);
  EXPECT_THROW(nn::GRU(3, 4)(ferry::ones({2, 3}, {.dtype = DType::Int64})), ferry::DTypeMismatch);
}

// TransformerEncoderLayer and TransformerEncoder: PyTorch's tree and names, shapes in each layout, the causal mask
// (generate_square_subsequent_mask, or is_causal: the same result), and the refusals.
TEST(NNModule, TransformerEncoderFollowsPyTorch) {
  nn::TransformerEncoderLayer layer(8, 2, {.dim_feedforward = 16, .dropout = 0.0});
  EXPECT_EQ(layer.str(),
            "TransformerEncoderLayer(\n"
            "  (self_attn): MultiheadAttention(\n"
            "    embed_dim=8, num_heads=2, batch_first=False\n"  // torch prints no line of its own here
            "    (out_proj): Linear(in_features=8, out_features=8, bias=True)\n"
            "  )\n"
            "  (linear1): Linear(in_features=8, out_features=16, bias=True)\n"
            "  (dropout): Dropout(p=0.0, inplace=False)\n"
            "  (linear2): Linear(in_features=16, out_features=8, bias=True)\n"
            "  (norm1): LayerNorm((8,), eps=1e-05, elementwise_affine=True)\n"
            "  (norm2): LayerNorm((8,), eps=1e-05, elementwise_affine=True)\n"
            "  (dropout1): Dropout(p=0.0, inplace=False)\n"
            "  (dropout2): Dropout(p=0.0, inplace=False)\n"
            ")");
  EXPECT_EQ(layer.named_parameters().size(), 12u);
  EXPECT_EQ(layer(ferry::randn({5, 3, 8})).shape(), (ferry::Shape{5, 3, 8}));
  EXPECT_EQ(layer(ferry::randn({5, 8})).shape(), (ferry::Shape{5, 8}));  // unbatched
  const Tensor mask = nn::generate_square_subsequent_mask(3);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(mask.to_vector<float>(), (std::vector<float>{0, -inf, -inf, 0, 0, -inf, 0, 0, 0}));

  nn::TransformerEncoder encoder(8, 2, 2, {.dim_feedforward = 16, .dropout = 0.0, .batch_first = true}, true);
  const nn::NamedTensors params = encoder.named_parameters();
  EXPECT_EQ(params.size(), 2u * 12 + 2);
  EXPECT_EQ(params.front().first, "layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(params.back().first, "norm.bias");
  const Tensor x = ferry::randn({2, 4, 8});
  const Tensor by_mask = encoder.forward(x, {.mask = nn::generate_square_subsequent_mask(4)});
  const Tensor by_flag = encoder.forward(x, {.is_causal = true});
  EXPECT_LT(ferry::max(ferry::abs(ferry::sub(by_mask, by_flag))).item<float>(), 1e-5);
  // causal: the first position's output does not depend on the later ones
  Tensor changed = x.clone();
  changed.narrow(1, 3, 1).fill_(5.0);
  EXPECT_EQ(encoder.forward(changed, {.is_causal = true}).narrow(1, 0, 3).to_vector<float>(),
            by_flag.narrow(1, 0, 3).to_vector<float>());

  EXPECT_THROW(nn::TransformerEncoderLayer(8, 3), ferry::InvalidArgument);  // 8 does not divide by 3 heads
  EXPECT_THROW(nn::TransformerEncoderLayer(8, 2, {.activation = "tanh"}), ferry::InvalidArgument);
  EXPECT_THROW(nn::TransformerEncoder(8, 2, 0), ferry::InvalidArgument);
  EXPECT_THROW(layer(ferry::randn({5, 3, 7})), ferry::ShapeMismatch);
}

// TransformerDecoderLayer, TransformerDecoder and Transformer: PyTorch's tree, names and sizes (the default
// nn.Transformer holds 44,140,544 parameters, as torch counts them), shapes in each layout, causality of the target,
// xavier re-initialisation, and the refusals.
TEST(NNModule, TransformerDecoderFollowsPyTorch) {
  nn::TransformerDecoderLayer layer(8, 2, {.dim_feedforward = 16, .dropout = 0.0});
  std::vector<std::string> names;
  for (const auto& [name, child] : layer.named_children()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"self_attn", "multihead_attn", "linear1", "dropout", "linear2", "norm1",
                                             "norm2", "norm3", "dropout1", "dropout2", "dropout3"}));
  EXPECT_EQ(layer.named_parameters().size(), 18u);
  const Tensor memory = ferry::randn({6, 3, 8});
  EXPECT_EQ(layer.forward(ferry::randn({5, 3, 8}), memory).shape(), (ferry::Shape{5, 3, 8}));
  EXPECT_EQ(layer.forward(ferry::randn({5, 8}), ferry::randn({6, 8})).shape(), (ferry::Shape{5, 8}));  // unbatched
  EXPECT_THROW(layer(ferry::randn({5, 3, 8})), ferry::InvalidArgument);  // no memory

  nn::TransformerDecoder decoder(8, 2, 2, {.dim_feedforward = 16, .dropout = 0.0}, true);
  const nn::NamedTensors params = decoder.named_parameters();
  EXPECT_EQ(params.size(), 2u * 18 + 2);
  EXPECT_EQ(params.front().first, "layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(params[4].first, "layers.0.multihead_attn.in_proj_weight");
  EXPECT_EQ(params.back().first, "norm.bias");
  // causal target: the first positions' outputs do not depend on the later target positions
  const Tensor tgt = ferry::randn({4, 3, 8});
  const Tensor by_flag = decoder.forward(tgt, memory, {.tgt_is_causal = true});
  const Tensor by_mask = decoder.forward(tgt, memory, {.tgt_mask = nn::generate_square_subsequent_mask(4)});
  EXPECT_LT(ferry::max(ferry::abs(ferry::sub(by_mask, by_flag))).item<float>(), 1e-5);
  Tensor changed = tgt.clone();
  changed.narrow(0, 3, 1).fill_(5.0);
  EXPECT_EQ(decoder.forward(changed, memory, {.tgt_is_causal = true}).narrow(0, 0, 3).to_vector<float>(),
            by_flag.narrow(0, 0, 3).to_vector<float>());
  // ... but every position depends on all of the memory
  Tensor other_memory = memory.clone();
  other_memory.narrow(0, 5, 1).fill_(5.0);
  EXPECT_NE(decoder.forward(tgt, other_memory, {.tgt_is_causal = true}).narrow(0, 0, 1).to_vector<float>(),
            by_flag.narrow(0, 0, 1).to_vector<float>());

  EXPECT_EQ(nn::Transformer().parameter_count(), 44140544);
  ferry::manual_seed(3);
  nn::Transformer small({.d_model = 8, .nhead = 2, .num_encoder_layers = 1, .num_decoder_layers = 1,
                         .layer = {.dim_feedforward = 16, .dropout = 0.0, .batch_first = true}});
  const nn::NamedTensors small_params = small.named_parameters();
  EXPECT_EQ(small_params.size(), 12u + 2 + 18 + 2);
  EXPECT_EQ(small_params.front().first, "encoder.layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(small_params.back().first, "decoder.norm.bias");
  // xavier_uniform_ over every matrix: linear1's bound is sqrt(6 / (8 + 16)) = 0.5 (Linear's own would be 1/sqrt(8))
  const Tensor w = small.encoder->named_parameters()[4].second;  // layers.0.linear1.weight (16, 8)
  EXPECT_EQ(small.encoder->named_parameters()[4].first, "layers.0.linear1.weight");
  EXPECT_LE(ferry::max(ferry::abs(w)).item<float>(), 0.5f);
  EXPECT_GT(ferry::max(ferry::abs(w)).item<float>(), 0.4f);  // 128 draws: above 1/sqrt(8) = 0.354 for sure
  const Tensor out = small.forward(ferry::randn({2, 6, 8}), ferry::randn({2, 4, 8}), {.tgt_is_causal = true});
  EXPECT_EQ(out.shape(), (ferry::Shape{2, 4, 8}));
  EXPECT_THROW(small.forward(ferry::randn({2, 6, 8}), ferry::randn({3, 4, 8})), ferry::InvalidArgument);  // batch
  EXPECT_THROW(small.forward(ferry::randn({2, 6, 7}), ferry::randn({2, 4, 7})), ferry::InvalidArgument);  // d_model
  EXPECT_THROW(small.forward(ferry::randn({6, 8}), ferry::randn({2, 4, 8})), ferry::InvalidArgument);     // dims
  EXPECT_THROW(small(ferry::randn({2, 6, 8})), ferry::InvalidArgument);                                    // no tgt
  EXPECT_THROW(nn::TransformerDecoderLayer(8, 2, {.activation = "tanh"}), ferry::InvalidArgument);
  EXPECT_THROW(nn::TransformerDecoder(8, 2, 0), ferry::InvalidArgument);
}

// GroupNorm: its repr, batch-size independence (a sample alone normalizes as in a batch), and its checks.
TEST(NNModule, GroupNormIsPerSampleAndChecksItsShapes) {
  nn::GroupNorm norm(2, 4);
  EXPECT_EQ(norm.str(), "GroupNorm(2, 4, eps=1e-05, affine=True)");
  EXPECT_EQ(nn::GroupNorm(1, 3, 1e-3, false).str(), "GroupNorm(1, 3, eps=0.001, affine=False)");
  EXPECT_EQ(norm.named_parameters().size(), 2u);
  ferry::manual_seed(5);
  const Tensor x = ferry::randn({3, 4, 5});
  const std::vector<float> batch = norm(x).select(0, 1).to_vector<float>();
  const std::vector<float> alone = norm(x.narrow(0, 1, 1)).select(0, 0).to_vector<float>();
  EXPECT_EQ(batch, alone);
  const Tensor group = norm(x).narrow(1, 0, 2).select(0, 0);  // the first group of sample 0: mean 0, variance 1
  EXPECT_NEAR(ferry::mean(group).item<float>(), 0.0F, 1e-6F);
  EXPECT_NEAR(ferry::var(group, {}, false).item<float>(), 1.0F, 1e-4F);
  EXPECT_THROW(nn::GroupNorm(3, 4), ferry::InvalidArgument);
  EXPECT_THROW(norm(ferry::randn({2, 6, 3})), ferry::ShapeMismatch);
  EXPECT_THROW(nn::functional::group_norm(ferry::randn({2, 6}), 4), ferry::InvalidArgument);
}

// Softplus: the linear branch past the threshold (no overflow, gradient 1, not NaN), and its checks.
TEST(NNModule, SoftplusStaysFiniteAndChecksBeta) {
  Tensor x = ferry::from_vector<float>({-100, 0, 1000}).requires_grad_();
  nn::Softplus layer;
  const Tensor y = layer(x);
  const std::vector<float> v = y.to_vector<float>();
  EXPECT_NEAR(v[0], 3.783505853677006e-44F, 1.5e-45F);  // torch's value: e^-100 rounded to a float32 subnormal
  EXPECT_FLOAT_EQ(v[1], std::log(2.0F));
  EXPECT_EQ(v[2], 1000.0F);
  ferry::sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<float>()[2], 1.0F);
  EXPECT_NEAR(x.grad().to_vector<float>()[1], 0.5F, 1e-7F);
  EXPECT_EQ(nn::Softplus(2, 1.5).extra_repr(), "beta=2, threshold=1.5");
  EXPECT_THROW(nn::Softplus(0), ferry::InvalidArgument);
  EXPECT_THROW(nn::functional::softplus(x, -1), ferry::InvalidArgument);
  EXPECT_THROW(nn::functional::softplus(ferry::arange(3)), ferry::DTypeMismatch);
}

// cross_entropy's one kernel (each row's loss and its gradient in one pass) against log_softmax and nll_loss, which
// do not use it: rows shorter than a vector, with a tail, and longer than cuda's block; the edge rows too: large
// equal values, a -inf that is not the target (its gradient 0), a -inf target (loss inf), a NaN (all NaN).
TEST(NNModule, CrossEntropysKernelIsLogSoftmaxAndNll) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<Device> devices = ferry::testing::accelerators();
  devices.insert(devices.begin(), ferry::kCPU);
  for (const Device& device : devices) {
    for (const DType dtype : {DType::Float32, DType::Float64}) {
      for (const std::int64_t classes : {1, 7, 90, 1000}) {
        SCOPED_TRACE(device.str() + " " + std::string(ferry::dtype_name(dtype)) + ", " + std::to_string(classes) +
                     " classes");
        ferry::manual_seed(static_cast<std::uint64_t>(classes));
        Tensor x = ferry::mul(ferry::randn({7, classes}, {.device = device, .dtype = dtype}), 4.0);
        Tensor target = ferry::randint(0, classes, {7}, {.device = device});
        if (classes >= 7) {
          target = ferry::from_vector<std::int64_t>({0, 1, 2, 3, 4, 5, 6}).to(device);
          x.select(0, 1).fill_(1000.0);                   // large equal values
          x.select(0, 2).narrow(0, 5, 1).fill_(-inf);     // a class that cannot be: gradient 0 there
          x.select(0, 3).narrow(0, 3, 1).fill_(-inf);     // the target cannot be: loss inf
          x.select(0, 4).narrow(0, classes - 1, 1).fill_(nan);  // NaN: the row's loss and gradient NaN
        }
        const Tensor g = ferry::randn({7}, {.device = device, .dtype = dtype});  // a weight per row
        const Tensor fused_in = x.detach().requires_grad_(true), composed_in = x.detach().requires_grad_(true);
        const Tensor fused = nn::cross_entropy(fused_in, target, nn::Reduction::None);
        const Tensor composed =
            nn::nll_loss(ferry::log_softmax(composed_in, 1), target, {.reduction = nn::Reduction::None});
        EXPECT_TRUE(ferry::testing::all_close(fused.cpu(), composed.cpu(), 1e-6, 1e-6));
        ferry::sum(ferry::mul(fused, g)).backward();
        ferry::sum(ferry::mul(composed, g)).backward();
        EXPECT_TRUE(ferry::testing::all_close(fused_in.grad().cpu(), composed_in.grad().cpu(), 1e-5, 1e-7));
      }
    }
  }
  // The mean's gradient carries its 1 / N.
  const Tensor x = ferry::randn({4, 3}).requires_grad_(true);
  nn::cross_entropy(x, ferry::from_vector<std::int64_t>({0, 1, 2, 0})).backward();
  const Tensor each = x.detach().requires_grad_(true);
  ferry::sum(nn::cross_entropy(each, ferry::from_vector<std::int64_t>({0, 1, 2, 0}), nn::Reduction::None)).backward();
  EXPECT_TRUE(ferry::testing::all_close(x.grad(), ferry::div(each.grad(), 4.0), 1e-6, 1e-8));
  // A class of probability 0 is no NaN in the composed losses either: not where it is not the target, nor in a row
  // that is ignored (PyTorch gives 0 there).
  const Tensor masked = ferry::from_vector<float>({-inf, 1, 2, 0, 1, -inf}, {2, 3}).requires_grad_(true);
  const Tensor rows = nn::cross_entropy(masked, ferry::from_vector<std::int64_t>({1, -100}),
                                        {.reduction = nn::Reduction::None, .ignore_index = -100});
  const std::vector<float> got = rows.to_vector<float>();
  EXPECT_NEAR(got[0], std::log(1 + std::exp(1.0F)), 1e-6F);
  EXPECT_EQ(got[1], 0.0F);
  ferry::sum(rows).backward();
  for (const float v : masked.grad().to_vector<float>()) EXPECT_FALSE(std::isnan(v));
}

// cross_entropy's and nll_loss's options: every row ignored gives NaN for the mean (PyTorch's 0/0) and 0 for the
// sum; bad options are refused with the numbers; a negative target without ignore_index says how to skip it.
TEST(NNModule, ClassLossOptionsCheckTheirInputs) {
  const Tensor logits = ferry::randn({3, 4});
  const Tensor ignored = ferry::from_vector<std::int64_t>({-100, -100, -100});
  EXPECT_TRUE(std::isnan(nn::cross_entropy(logits, ignored, {.ignore_index = -100}).item<float>()));
  EXPECT_EQ(nn::cross_entropy(logits, ignored, {.reduction = nn::Reduction::Sum, .ignore_index = -100}).item<float>(),
            0.0F);
  const Tensor target = ferry::from_vector<std::int64_t>({0, 3, 1});
  EXPECT_THROW(nn::cross_entropy(logits, target, {.label_smoothing = 1.5}), ferry::InvalidArgument);
  EXPECT_THROW(nn::cross_entropy(logits, target, {.weight = ferry::ones({3})}), ferry::ShapeMismatch);
  EXPECT_THROW(nn::nll_loss(logits, target, {.weight = ferry::ones({4}, {.dtype = DType::Int64})}),
               ferry::DTypeMismatch);
  EXPECT_THROW(nn::nll_loss(logits, ferry::from_vector<std::int64_t>({0, 4, 1}), {.ignore_index = -100}),
               ferry::InvalidArgument);
  try {
    nn::cross_entropy(logits, ferry::from_vector<std::int64_t>({0, -100, 1}));
    ADD_FAILURE() << "a target of -100 without ignore_index was accepted";
  } catch (const ferry::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("pass {.ignore_index = -100}"), std::string::npos) << e.what();
  }
  // ignore_index may name a real class: its rows are skipped like any other.
  const Tensor kept = nn::cross_entropy(logits.narrow(0, 0, 2), target.narrow(0, 0, 2), nn::Reduction::Sum);
  EXPECT_FLOAT_EQ(nn::cross_entropy(logits, target, {.reduction = nn::Reduction::Sum, .ignore_index = 1}).item<float>(),
                  kept.item<float>());
  // The callable classes carry their options.
  EXPECT_FLOAT_EQ(nn::CrossEntropyLoss({.label_smoothing = 0.1})(logits, target).item<float>(),
                  nn::cross_entropy(logits, target, {.label_smoothing = 0.1}).item<float>());
  EXPECT_FLOAT_EQ(nn::NLLLoss()(ferry::log_softmax(logits, 1), target).item<float>(),
                  nn::cross_entropy(logits, target).item<float>());
}

// The elementwise losses at their edges: binary_cross_entropy at p = 0 and 1 is finite (logs clamped at -100, as
// PyTorch), its logits form stays finite for logits of 1000, smooth_l1 with beta 0 is l1; the classes carry their
// options; bad inputs are refused.
TEST(NNModule, ElementwiseLossesAreFiniteAtTheirEdgesAndCheckTheirInputs) {
  const Tensor p = ferry::from_vector<float>({0, 1, 0.5F});
  const Tensor t = ferry::from_vector<float>({1, 0, 1});
  // -log(0) and -log(1 - 1) both clamp to 100; -log(0.5)
  EXPECT_FLOAT_EQ(nn::binary_cross_entropy(p, t, {.reduction = nn::Reduction::Sum}).item<float>(),
                  200.0F + std::log(2.0F));
  const Tensor huge = ferry::from_vector<float>({1000, -1000, 0});
  const std::vector<float> per_element =
      nn::binary_cross_entropy_with_logits(huge, t, {.reduction = nn::Reduction::None}).to_vector<float>();
  EXPECT_FLOAT_EQ(per_element[0], 0.0F);      // sure and right
  EXPECT_FLOAT_EQ(per_element[1], 0.0F);      // sure and right (target 0)
  EXPECT_FLOAT_EQ(per_element[2], std::log(2.0F));
  EXPECT_FLOAT_EQ(nn::binary_cross_entropy_with_logits(huge, ferry::from_vector<float>({0, 1, 1}),
                                                       {.reduction = nn::Reduction::Sum})
                      .item<float>(),
                  2000.0F + std::log(2.0F));  // sure and wrong, twice: finite
  const Tensor x = ferry::randn({4, 3}), y = ferry::randn({4, 3});
  EXPECT_FLOAT_EQ(nn::smooth_l1_loss(x, y, nn::Reduction::Mean, 0).item<float>(), nn::l1_loss(x, y).item<float>());
  EXPECT_NEAR(nn::HuberLoss(nn::Reduction::Sum, 2.0)(x, y).item<float>(),
              2.0F * nn::SmoothL1Loss(nn::Reduction::Sum, 2.0)(x, y).item<float>(), 1e-4);
  EXPECT_FLOAT_EQ(nn::L1Loss(nn::Reduction::Sum)(x, y).item<float>(),
                  ferry::sum(ferry::abs(ferry::sub(x, y))).item<float>());
  EXPECT_NEAR(nn::BCEWithLogitsLoss()(x, ferry::sigmoid(y)).item<float>(),
              nn::BCELoss()(ferry::sigmoid(x), ferry::sigmoid(y)).item<float>(), 1e-5);
  EXPECT_THROW(nn::l1_loss(x, y.t()), ferry::ShapeMismatch);
  EXPECT_THROW(nn::smooth_l1_loss(x, y, nn::Reduction::Mean, -1), ferry::InvalidArgument);
  EXPECT_THROW(nn::huber_loss(x, y, nn::Reduction::Mean, 0), ferry::InvalidArgument);
  EXPECT_THROW(nn::binary_cross_entropy(ferry::ones({3}, {.dtype = DType::Int64}), t), ferry::DTypeMismatch);
  EXPECT_THROW(nn::binary_cross_entropy(p, t, {.weight = ferry::ones({3}, {.device = Device::parse("sim:0")})}),
               ferry::DeviceMismatch);
}

// The composed losses stay on the device: on sim:0 a forward and backward with every option moves no bytes and
// waits for nothing (the ledger would show a crossing or a sync).
TEST(NNModule, ClassLossOptionsNeitherCopyNorSync) {
  const Device sim = Device::parse("sim:0");
  Tensor logits = ferry::randn({8, 5}, {.device = sim}).requires_grad_(true);
  const Tensor target = ferry::randint(0, 5, {8}, {.device = sim});
  const Tensor weight = ferry::rand({5}, {.device = sim});
  ferry::Ledger& ledger = ferry::Ledger::global();
  ledger.clear();
  Tensor loss = nn::cross_entropy(logits, target,
                                  {.weight = weight, .ignore_index = 3, .label_smoothing = 0.1});
  loss.backward();
  EXPECT_EQ(ledger.totals().transfers, 0);
  EXPECT_EQ(ledger.totals().syncs, 0);
  EXPECT_EQ(logits.grad().device(), sim);
}

// Sequential runs a Linear or BatchNorm followed by a ReLU as one fused layer (one autograd node, no tensor for
// the layer's output before the ReLU); switched off, it runs them one by one. Same values and gradients, same
// state_dict, in training and in eval.
TEST(NNModule, SequentialFusesTheReluAfterALayerWithTheSameResults) {
  auto run = [](bool fused, bool training) {
    ferry::manual_seed(21);
    nn::Sequential model(nn::Conv2d(2, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU(), nn::Flatten(),
                         nn::Linear(4 * 5 * 5, 16), nn::ReLU(), nn::Linear(16, 3), nn::ReLU());
    model.to(DType::Float64);
    if (!training) model.eval();
    nn::functional::set_fused_activations(fused);
    const Tensor x = ferry::randn({6, 2, 5, 5}, {.dtype = DType::Float64});
    Tensor out = model(x);
    nn::functional::set_fused_activations(true);
    const std::string last_node = out.impl()->grad_fn ? out.impl()->grad_fn->name : "";
    ferry::sum(ferry::mul(out, out)).backward();
    std::vector<std::vector<double>> values = {out.to_vector<double>()};
    for (const Tensor& p : model.parameters()) values.push_back(p.grad().to_vector<double>());
    for (const Tensor& b : model.buffers()) values.push_back(b.to(DType::Float64).to_vector<double>());
    return std::pair{values, last_node};
  };
  for (const bool training : {true, false}) {
    const auto [fused, fused_node] = run(true, training);
    const auto [unfused, unfused_node] = run(false, training);
    EXPECT_EQ(fused_node, "linear_relu");
    EXPECT_EQ(unfused_node, "relu");
    ASSERT_EQ(fused.size(), unfused.size());
    for (std::size_t k = 0; k < fused.size(); ++k) {
      ASSERT_EQ(fused[k].size(), unfused[k].size()) << k;
      for (std::size_t i = 0; i < fused[k].size(); ++i) {
        EXPECT_NEAR(fused[k][i], unfused[k][i], 1e-12 * (1 + std::abs(unfused[k][i])))
            << (training ? "training" : "eval") << " tensor " << k << " element " << i;
      }
    }
  }
}
