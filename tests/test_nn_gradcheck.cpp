// test_nn_gradcheck.cpp — every nn backward (layers and losses) against central finite differences in
// float64, on cpu and on sim:0; the two devices must give identical numbers. Not here: PyTorch parity
// (test_nn_parity.cpp), module bookkeeping (test_nn_module.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>
#include <algorithm>

#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/nn/activation.h"
#include "ferry/nn/batchnorm.h"
#include "ferry/nn/conv.h"
#include "ferry/nn/distance.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/pixel_shuffle.h"
#include "ferry/nn/pooling.h"
#include "ferry/nn/rnn.h"
#include "ferry/nn/sequential.h"
#include "ferry/ops.h"
#include "ferry/random.h"
#include "test_helpers.h"

namespace F = ferry::nn::functional;
using ferry::Device;
using ferry::DType;
using ferry::Shape;
using ferry::Tensor;

namespace {

// One differentiable argument: host values (float64), its shape, and whether it is checked.
struct Argument {
  Shape shape;
  std::vector<double> values;
  bool check = true;
};

Argument random_argument(const Shape& shape, std::uint64_t seed, double scale = 1, bool check = true) {
  ferry::manual_seed(seed);
  Tensor t = ferry::randn(shape, {.dtype = DType::Float64});
  std::vector<double> values = t.to_vector<double>();
  for (double& v : values) v *= scale;
  return {shape, values, check};
}

Tensor materialise(const Argument& a, Device device, bool requires_grad) {
  Tensor t = ferry::from_vector(a.values, a.shape).to(device);
  if (requires_grad) t.requires_grad_(true);
  return t;
}

using Function = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradcheckResult {
  std::vector<std::vector<double>> analytic;  // per argument (empty when not checked)
  std::vector<double> output;
};

// Checks d(sum(f(args) * w))/d(args) by backward against central differences (eps 1e-6, atol 1e-5,
// rtol 1e-3: torch.autograd.gradcheck's tolerances) on `device`, w a fixed random projection.
GradcheckResult gradcheck(const Function& f, const std::vector<Argument>& args, Device device,
                          const std::string& what) {
  constexpr double eps = 1e-6, atol = 1e-5, rtol = 1e-3;
  std::vector<Tensor> inputs;
  for (const Argument& a : args) inputs.push_back(materialise(a, device, a.check));
  Tensor out = f(inputs);
  ferry::manual_seed(99);
  const Tensor projection = ferry::randn(out.shape(), {.device = device, .dtype = DType::Float64});
  ferry::sum(ferry::mul(out, projection)).backward();

  GradcheckResult result;
  result.output = out.to_vector<double>();
  auto objective = [&](const std::vector<Argument>& perturbed) {
    ferry::autograd::NoGradGuard no_grad;
    std::vector<Tensor> xs;
    for (const Argument& a : perturbed) xs.push_back(materialise(a, device, false));
    return ferry::sum(ferry::mul(f(xs), projection)).item<double>();
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (!args[i].check) {
      result.analytic.emplace_back();
      continue;
    }
    const Tensor grad = inputs[i].grad();
    EXPECT_TRUE(grad.defined()) << what << ": no gradient for argument " << i << " on " << device.str();
    if (!grad.defined()) return result;
    EXPECT_EQ(grad.device(), device) << what;
    const std::vector<double> analytic = grad.to_vector<double>();
    std::vector<Argument> perturbed = args;
    for (std::size_t j = 0; j < analytic.size(); ++j) {
      const double saved = perturbed[i].values[j];
      perturbed[i].values[j] = saved + eps;
      const double plus = objective(perturbed);
      perturbed[i].values[j] = saved - eps;
      const double minus = objective(perturbed);
      perturbed[i].values[j] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      EXPECT_LE(std::abs(numeric - analytic[j]), atol + rtol * std::abs(numeric))
          << what << " on " << device.str() << ": argument " << i << " element " << j << ": analytic "
          << analytic[j] << " numeric " << numeric;
    }
    result.analytic.push_back(analytic);
  }
  return result;
}

void expect_near(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-10 * (1 + std::abs(b[i]))) << what << " " << i;
}

// Runs the check on cpu and sim:0, which must give identical outputs and gradients (sim computes with the
// cpu kernels), and on cuda:0 where present, which must agree to float64 rounding.
void check_everywhere(const Function& f, const std::vector<Argument>& args, const std::string& what) {
  const GradcheckResult on_cpu = gradcheck(f, args, ferry::kCPU, what);
  const GradcheckResult on_sim = gradcheck(f, args, Device::parse("sim:0"), what);
  EXPECT_EQ(on_cpu.output, on_sim.output) << what << ": sim:0 output differs from cpu";
  EXPECT_EQ(on_cpu.analytic, on_sim.analytic) << what << ": sim:0 gradients differ from cpu";
  if (ferry::is_available(ferry::DeviceType::CUDA)) {
    const GradcheckResult on_cuda = gradcheck(f, args, Device(ferry::DeviceType::CUDA, 0), what);
    expect_near(on_cuda.output, on_cpu.output, what + ": cuda:0 output");
    for (std::size_t i = 0; i < on_cpu.analytic.size(); ++i) {
      expect_near(on_cuda.analytic[i], on_cpu.analytic[i], what + ": cuda:0 gradient " + std::to_string(i));
    }
  }
}

}  // namespace

TEST(NNGradcheck, Linear) {
  check_everywhere([](const std::vector<Tensor>& a) { return F::linear(a[0], a[1], a[2]); },
                   {random_argument({3, 4}, 1), random_argument({5, 4}, 2), random_argument({5}, 3)}, "linear");
  check_everywhere([](const std::vector<Tensor>& a) { return F::linear(a[0], a[1]); },
                   {random_argument({2, 3, 4}, 4), random_argument({2, 4}, 5)}, "linear 3-d input, no bias");
  // Only the weight requires grad (the input of a first layer): the input's gradient is skipped.
  check_everywhere([](const std::vector<Tensor>& a) { return F::linear(a[0], a[1], a[2]); },
                   {random_argument({3, 4}, 6, 1, false), random_argument({2, 4}, 7), random_argument({2}, 8)},
                   "linear, input without grad");
}

TEST(NNGradcheck, Conv2d) {
  check_everywhere(
      [](const std::vector<Tensor>& a) { return F::conv1d(a[0], a[1], a[2], 2, 1, 2, 2); },
      {random_argument({2, 4, 9}, 20), random_argument({6, 2, 3}, 21), random_argument({6}, 22)},
      "conv1d stride 2 pad 1 dilation 2 groups 2");
  check_everywhere(
      [](const std::vector<Tensor>& a) { return F::conv_transpose2d(a[0], a[1], a[2], 2, 1, 1); },
      {random_argument({2, 3, 3, 4}, 24), random_argument({3, 2, 3, 3}, 25), random_argument({2}, 26)},
      "conv_transpose2d stride 2 padding 1 output_padding 1");
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        return F::conv_transpose2d(a[0], a[1], Tensor(), {2, 1}, {0, 1}, {1, 0}, 2, {1, 2});
      },
      {random_argument({1, 4, 3, 3}, 27), random_argument({4, 1, 2, 3}, 28)},
      "conv_transpose2d groups 2, no bias, stride (2,1) padding (0,1) output_padding (1,0) dilation (1,2)");
  check_everywhere(
      [](const std::vector<Tensor>& a) { return F::conv_transpose2d(a[0], a[1], a[2], 1, 0, 1, 1, 2); },
      {random_argument({2, 2, 3, 2}, 29), random_argument({2, 3, 2, 2}, 30), random_argument({3}, 31)},
      "conv_transpose2d output_padding past the stride (dilation 2)");
  check_everywhere([](const std::vector<Tensor>& a) { return F::conv_transpose2d(a[0], a[1], a[2]); },
                   {random_argument({2, 3, 2, 3}, 32), random_argument({3, 2, 1, 1}, 33), random_argument({2}, 34)},
                   "conv_transpose2d pointwise (1x1)");
  check_everywhere(
      [](const std::vector<Tensor>& a) { return F::conv_transpose1d(a[0], a[1], a[2], 3, 1, 2); },
      {random_argument({2, 2, 4}, 35), random_argument({2, 3, 3}, 36), random_argument({3}, 37)},
      "conv_transpose1d stride 3 padding 1 output_padding 2");
  check_everywhere([](const std::vector<Tensor>& a) { return F::upsample_bilinear2d(a[0], {5, 2}); },
                   {random_argument({2, 2, 3, 4}, 38)}, "upsample_bilinear2d up in H, down in W");
  check_everywhere([](const std::vector<Tensor>& a) { return F::upsample_bilinear2d(a[0], {4, 7}, true); },
                   {random_argument({1, 2, 3, 3}, 39)}, "upsample_bilinear2d align_corners");
  check_everywhere([](const std::vector<Tensor>& a) { return F::upsample_nearest2d(a[0], {2, 3}); },
                   {random_argument({1, 2, 3, 2}, 23)}, "upsample_nearest2d");
  check_everywhere(
      [](const std::vector<Tensor>& a) { return F::conv2d(a[0], a[1], a[2], 1, 1, 1, 2); },
      {random_argument({2, 4, 4, 3}, 17), random_argument({6, 2, 3, 3}, 18), random_argument({6}, 19)},
      "conv2d groups 2");
  check_everywhere(
      [](const std::vector<Tensor>& a) { return F::conv2d(a[0], a[1], a[2], 1, 1); },
      {random_argument({2, 3, 5, 4}, 11), random_argument({4, 3, 3, 3}, 12), random_argument({4}, 13)},
      "conv2d 3x3 pad 1");
  check_everywhere(
      [](const std::vector<Tensor>& a) { return F::conv2d(a[0], a[1], a[2], {2, 1}, {1, 0}, {1, 2}); },
      {random_argument({2, 2, 7, 6}, 14), random_argument({3, 2, 3, 2}, 15), random_argument({3}, 16)},
      "conv2d stride (2,1) padding (1,0) dilation (1,2)");
  check_everywhere([](const std::vector<Tensor>& a) { return F::conv2d(a[0], a[1], Tensor(), 2, 2, 2); },
                   {random_argument({1, 2, 7, 7}, 17), random_argument({2, 2, 3, 3}, 18)},
                   "conv2d no bias, stride 2, padding 2, dilation 2");
  check_everywhere([](const std::vector<Tensor>& a) { return F::conv2d(a[0], a[1], a[2]); },
                   {random_argument({2, 3, 3, 4}, 19), random_argument({2, 3, 1, 1}, 20), random_argument({2}, 21)},
                   "conv2d pointwise (1x1)");
  check_everywhere([](const std::vector<Tensor>& a) { return F::conv2d(a[0], a[1], a[2], 1, 1); },
                   {random_argument({2, 2, 4, 4}, 22, 1, false), random_argument({2, 2, 3, 3}, 23),
                    random_argument({2}, 24)},
                   "conv2d, input without grad");
}

TEST(NNGradcheck, BatchNorm) {
  // Training: batch statistics (no running statistics given), affine.
  check_everywhere(
      [](const std::vector<Tensor>& a) { return F::batch_norm(a[0], Tensor(), Tensor(), a[1], a[2], true); },
      {random_argument({4, 3, 2, 3}, 31), random_argument({3}, 32), random_argument({3}, 33)},
      "batch_norm 2d training");
  check_everywhere([](const std::vector<Tensor>& a) { return F::batch_norm(a[0], Tensor(), Tensor(), a[1], a[2], true); },
                   {random_argument({6, 4}, 34), random_argument({4}, 35), random_argument({4}, 36)},
                   "batch_norm 1d training");
  check_everywhere([](const std::vector<Tensor>& a) { return F::batch_norm(a[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
                   {random_argument({3, 2, 5}, 37)}, "batch_norm training without affine");
  // Eval: fixed running statistics.
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        const Tensor running_mean = ferry::from_vector<double>({0.1, -0.2, 0.3}).to(a[0].device());
        const Tensor running_var = ferry::from_vector<double>({0.5, 1.5, 2.0}).to(a[0].device());
        return F::batch_norm(a[0], running_mean, running_var, a[1], a[2], false);
      },
      {random_argument({2, 3, 2, 2}, 38), random_argument({3}, 39), random_argument({3}, 40)}, "batch_norm eval");
}

namespace {
// The devices whose layers these tests compare: cpu first, then sim:0 and cuda:0 where present.
std::vector<Device> every_device() {
  std::vector<Device> devices = ferry::testing::accelerators();
  devices.insert(devices.begin(), ferry::kCPU);
  return devices;
}
}  // namespace

// layer_norm as the backend's calls (Backend::layer_norm_forward / backward: src/cpu/layer_norm.cpp on cpu and sim,
// src/cuda/layer_norm.cu on cuda) against the composed layer (library layers off), on every device, forward and
// every gradient: float64 to 1e-12 and float32 to a few ulp, with and without weight and bias, over one and two
// normalized dims, rows longer than a host column chunk (64) and a cuda block (256 threads), more rows than a cuda
// column chunk (128), only some inputs wanting a gradient, and rows holding a large offset, +-inf or NaN (without
// weight and bias there, whose gradients would sum the NaN rows).
TEST(NNGradcheck, LayerNormKernelsMatchTheComposedLayer) {
  struct Case {
    Shape x, normalized;
    bool weight, bias, x_grad, edges = false;
  };
  for (const Device device : every_device()) {
    for (const Case& c : {Case{{4, 3, 5}, {5}, true, true, true}, Case{{2, 3, 4}, {3, 4}, true, false, true},
                          Case{{7, 150}, {150}, false, true, true}, Case{{3, 6}, {6}, false, false, true},
                          Case{{6, 70}, {70}, true, true, false}, Case{{300, 513}, {513}, true, true, true},
                          Case{{260, 40}, {40}, true, false, false}, Case{{8, 33}, {33}, false, false, true, true}}) {
      for (const DType dtype : {DType::Float64, DType::Float32}) {
        SCOPED_TRACE(device.str() + " " + ferry::shape_str(c.x) + " over " + ferry::shape_str(c.normalized) + " " +
                     std::string(ferry::dtype_name(dtype)));
        auto run = [&] {
          const auto make = [&](const Shape& shape, std::uint64_t seed, bool grad) {
            ferry::manual_seed(seed);
            Tensor t = ferry::randn(shape, {.dtype = dtype});
            if (grad && c.edges) {  // rows 0-3: a large offset, one +inf, one -inf, one NaN
              const std::int64_t d = t.size(-1);
              t.select(0, 0).add_(1e4);
              t.select(0, 1).narrow(0, d / 2, 1).fill_(INFINITY);
              t.select(0, 2).narrow(0, 1, 1).fill_(-INFINITY);
              t.select(0, 3).narrow(0, d - 1, 1).fill_(NAN);
            }
            t = t.to(device);
            if (grad) t.requires_grad_(true);
            return t;
          };
          Tensor x = make(c.x, 61, c.x_grad);
          Tensor w = c.weight ? make(c.normalized, 62, false).requires_grad_(true) : Tensor();
          Tensor b = c.bias ? make(c.normalized, 63, false).requires_grad_(true) : Tensor();
          Tensor out = F::layer_norm(x, c.normalized, w, b, 1e-5);
          std::vector<std::vector<double>> results{ferry::testing::values(out.cpu())};
          if (out.requires_grad()) {
            ferry::manual_seed(5);
            ferry::sum(ferry::mul(out, ferry::randn(out.shape(), {.dtype = dtype}).to(device))).backward();
            for (const Tensor& t : {x, w, b}) {
              if (t.defined() && t.requires_grad()) results.push_back(ferry::testing::values(t.grad().cpu()));
            }
          }
          return results;
        };
        const auto kernels = run();
        F::set_library_layers(false);
        const auto composed = run();
        F::set_library_layers(true);
        ASSERT_EQ(kernels.size(), composed.size());
        const double tolerance = dtype == DType::Float64 ? 1e-12 : 1e-5;
        for (std::size_t k = 0; k < kernels.size(); ++k) {
          ASSERT_EQ(kernels[k].size(), composed[k].size());
          for (std::size_t i = 0; i < kernels[k].size(); ++i) {
            const double got = kernels[k][i], want = composed[k][i];
            if (std::isnan(want) || std::isinf(want)) {
              EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : got == want) << "result " << k << " " << i;
              continue;
            }
            // A row of 1e4 + N(0, 1) loses 4 digits of its centred values to the mean's rounding.
            const double scale = c.edges ? 1e3 : 1;
            EXPECT_NEAR(got, want, scale * tolerance * (1 + std::abs(want))) << "result " << k << " " << i;
          }
        }
      }
    }
  }
}

// gelu as the backend's calls (Backend::gelu_forward / backward: src/cpu/gelu.cpp on cpu and sim, src/cuda/gelu.cu
// on cuda) gives the composed layer's bits on the same device (library layers off), forward and backward, float32
// and float64, over a tensor longer than a host block (4096) and a strided one, with the edges: large |x| (erf
// saturates, e^-x^2/2 underflows), +-inf, NaN, -0.
TEST(NNGradcheck, GeluKernelsGiveTheComposedLayersBits) {
  for (const Device device : every_device()) {
    for (const DType dtype : {DType::Float32, DType::Float64}) {
      SCOPED_TRACE(device.str() + " " + std::string(ferry::dtype_name(dtype)));
      auto run = [&](bool strided) {
        ferry::manual_seed(71);
        Tensor x = ferry::mul(ferry::randn({3, 5000}, {.dtype = dtype}), 3.0);
        const Tensor edges = ferry::from_vector<double>({40, -40, INFINITY, -INFINITY, NAN, -0.0}).to(dtype);
        x.narrow(1, 0, 6).copy_(edges.expand({3, 6}));
        if (strided) x = x.t().contiguous().t();
        x = x.to(device).requires_grad_(true);
        const Tensor out = F::gelu(x);
        ferry::sum(ferry::mul(out, ferry::randn(out.shape(), {.dtype = dtype}).to(device))).backward();
        return std::pair{ferry::testing::values(out.cpu()), ferry::testing::values(x.grad().cpu())};
      };
      for (const bool strided : {false, true}) {
        const auto kernels = run(strided);
        F::set_library_layers(false);
        const auto composed = run(strided);
        F::set_library_layers(true);
        for (const auto& [h, c, what] : {std::tuple{&kernels.first, &composed.first, "output"},
                                         std::tuple{&kernels.second, &composed.second, "gradient"}}) {
          ASSERT_EQ(h->size(), c->size());
          for (std::size_t i = 0; i < h->size(); ++i) {
            const double a = (*h)[i], b = (*c)[i];
            EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)))
                << what << " " << i << (strided ? " (strided)" : "") << ": " << a << " vs " << b;
          }
        }
      }
    }
  }
}

TEST(NNGradcheck, BatchNormComposedPathMatchesFused) {
  // The composed path (what cuda runs without cuDNN) against the backend's BatchNorm (src/cpu/batch_norm.cpp: per
  // channel, and for (N, C) features a block of channels at a time, with a partial block), on sim with the library
  // layers and the fused host passes off.
  const auto composed_only = [](bool on) {
    F::set_library_layers(!on);
    F::set_fused_host_kernels(!on);
  };
  for (const Shape& shape : {Shape{5, 3, 4, 2}, Shape{33, 150}}) {
    const std::int64_t C = shape[1];
    const Argument x = random_argument(shape, 41), w = random_argument({C}, 42), b = random_argument({C}, 43);
    auto run = [&](Device device) {
      Tensor xs = materialise(x, device, true), ws = materialise(w, device, true), bs = materialise(b, device, true);
      Tensor running_mean = ferry::zeros({C}, {.device = device, .dtype = DType::Float64});
      Tensor running_var = ferry::ones({C}, {.device = device, .dtype = DType::Float64});
      Tensor out = F::batch_norm(xs, running_mean, running_var, ws, bs, true);
      ferry::manual_seed(5);
      ferry::sum(ferry::mul(out, ferry::randn(out.shape(), {.device = device, .dtype = DType::Float64}))).backward();
      return std::vector<std::vector<double>>{out.to_vector<double>(),          xs.grad().to_vector<double>(),
                                              ws.grad().to_vector<double>(),    bs.grad().to_vector<double>(),
                                              running_mean.to_vector<double>(), running_var.to_vector<double>()};
    };
    const auto fused = run(ferry::kCPU);
    composed_only(true);
    const auto composed = run(Device::parse("sim:0"));
    composed_only(false);
    for (std::size_t k = 0; k < fused.size(); ++k) {
      for (std::size_t i = 0; i < fused[k].size(); ++i) {
        EXPECT_NEAR(fused[k][i], composed[k][i], 1e-12) << ferry::shape_str(shape) << " result " << k << " " << i;
      }
    }
  }
  check_everywhere([&](const std::vector<Tensor>& a) {
    composed_only(true);
    Tensor out = F::batch_norm(a[0], Tensor(), Tensor(), a[1], a[2], true);
    composed_only(false);
    return out;
  }, {random_argument({3, 2, 3}, 44), random_argument({2}, 45), random_argument({2}, 46)}, "batch_norm composed path");
}

// A layer with its ReLU fused (one node, the ReLU in the layer's pass) against finite differences, and against
// the layer followed by relu() to float64 rounding.
TEST(NNGradcheck, FusedActivations) {
  using F::Activation;
  check_everywhere([](const std::vector<Tensor>& a) { return F::linear(a[0], a[1], a[2], Activation::ReLU); },
                   {random_argument({4, 5}, 51), random_argument({6, 5}, 52), random_argument({6}, 53)}, "linear relu");
  check_everywhere([](const std::vector<Tensor>& a) { return F::linear(a[0], a[1], Tensor(), Activation::ReLU); },
                   {random_argument({2, 3, 4}, 54), random_argument({3, 4}, 55)}, "linear relu, 3-d input, no bias");
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        return F::batch_norm(a[0], Tensor(), Tensor(), a[1], a[2], true, 0.1, 1e-5, Tensor(), Activation::ReLU);
      },
      {random_argument({4, 3, 2, 3}, 56), random_argument({3}, 57), random_argument({3}, 58)}, "batch_norm relu");
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        F::set_fused_host_kernels(false);
        F::set_library_layers(false);  // not the fused BatchNorm + ReLU kernels either
        Tensor out = F::batch_norm(a[0], Tensor(), Tensor(), a[1], a[2], true, 0.1, 1e-5, Tensor(), Activation::ReLU);
        F::set_library_layers(true);
        F::set_fused_host_kernels(true);
        return out;
      },
      {random_argument({3, 2, 5}, 59), random_argument({2}, 60), random_argument({2}, 61)},
      "batch_norm relu, composed path");
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        const Tensor running_mean = ferry::from_vector<double>({0.1, -0.2, 0.3}).to(a[0].device());
        const Tensor running_var = ferry::from_vector<double>({0.5, 1.5, 2.0}).to(a[0].device());
        return F::batch_norm(a[0], running_mean, running_var, a[1], a[2], false, 0.1, 1e-5, Tensor(), Activation::ReLU);
      },
      {random_argument({2, 3, 2, 2}, 62), random_argument({3}, 63), random_argument({3}, 64)}, "batch_norm relu eval");

  // Fused against unfused, values and gradients.
  const std::vector<Argument> args = {random_argument({7, 5}, 65), random_argument({4, 5}, 66), random_argument({4}, 67)};
  auto run = [&](bool fused) {
    std::vector<Tensor> in;
    for (const Argument& a : args) in.push_back(materialise(a, ferry::kCPU, true));
    Tensor out = fused ? F::linear(in[0], in[1], in[2], Activation::ReLU) : F::relu(F::linear(in[0], in[1], in[2]));
    ferry::sum(ferry::mul(out, out)).backward();
    return std::vector<std::vector<double>>{out.to_vector<double>(), in[0].grad().to_vector<double>(),
                                            in[1].grad().to_vector<double>(), in[2].grad().to_vector<double>()};
  };
  const auto fused = run(true), unfused = run(false);
  for (std::size_t k = 0; k < fused.size(); ++k) expect_near(fused[k], unfused[k], "fused linear relu " + std::to_string(k));
}

// BatchNorm + ReLU as one call each way (src/cpu/batch_norm.cpp on cpu and sim, the arithmetic of cuda's
// kernels) against the same layer composed from per-channel passes and a ReLU: outputs, the three gradients,
// the saved statistics' effect on the running ones, in float32 and float64, for images, sequences and
// features (inner 1), and for a channel whose mean is 1000 times its spread (the shifted sums keep the
// variance; sum(x^2) / n - mean^2 in float would lose it).
// A fused BatchNorm layer's {out, grad input, grad weight, grad bias, running mean, running var} against the
// composed layers', each element within tol of the largest entry (the gradients scale with the number of elements
// summed). Fatal failures, so call it through ASSERT_NO_FATAL_FAILURE.
void expect_batch_norm_results_near(const std::vector<Tensor>& fused, const std::vector<Tensor>& composed, double tol,
                                    const std::string& what) {
  const char* names[] = {"out", "grad input", "grad weight", "grad bias", "running mean", "running var"};
  for (int i = 0; i < 6; ++i) {
    const std::vector<double> a = fused[i].to_vector<double>(), b = composed[i].to_vector<double>();
    ASSERT_EQ(a.size(), b.size()) << names[i] << " of " << what;
    double largest = 0;
    for (double v : b) largest = std::max(largest, std::abs(v));
    for (std::size_t k = 0; k < a.size(); ++k) {
      ASSERT_NEAR(a[k], b[k], tol * (1 + largest)) << names[i] << " element " << k << " of " << what;
    }
  }
}

TEST(NNGradcheck, FusedBatchNormReluMatchesTheComposedLayer) {
  struct Case {
    Shape shape;
    double offset;
  };
  for (const DType dtype : {DType::Float32, DType::Float64}) {
    for (const Case& c : {Case{{16, 8, 7, 7}, 1.5}, Case{{5, 3, 11}, -2.0}, Case{{64, 10}, 0.5},
                          Case{{33, 150}, -1.0}, Case{{4, 2, 300}, 1000.0}}) {
      for (const char* device : {"cpu", "sim:0"}) {
        const std::int64_t C = c.shape[1];
        ferry::manual_seed(71);
        const Tensor x = ferry::add(ferry::randn(c.shape, {.dtype = dtype}), c.offset);
        const Tensor probe = ferry::randn(c.shape, {.dtype = dtype});
        const Tensor w0 = ferry::add(ferry::mul(ferry::randn({C}, {.dtype = dtype}), 0.5), 1.0);
        const Tensor b0 = ferry::mul(ferry::randn({C}, {.dtype = dtype}), 0.5);
        auto run = [&](bool fused) {
          const Device d = Device::parse(device);
          F::set_library_layers(fused);
          // Copies: on cpu, to() returns the tensor itself, and the two runs would share (and sum) their gradients.
          Tensor in = x.to(d).clone().requires_grad_();
          Tensor weight = w0.to(d).clone().requires_grad_(), bias = b0.to(d).clone().requires_grad_();
          Tensor running_mean = ferry::full({C}, 0.25, {.device = d, .dtype = dtype});
          Tensor running_var = ferry::full({C}, 2.0, {.device = d, .dtype = dtype});
          Tensor out = F::batch_norm(in, running_mean, running_var, weight, bias, true, 0.1, 1e-5, Tensor(),
                                     F::Activation::ReLU);
          F::set_library_layers(true);
          ferry::sum(ferry::mul(out, probe.to(d))).backward();
          return std::vector<Tensor>{out.detach().cpu(), in.grad().cpu(), weight.grad().cpu(), bias.grad().cpu(),
                                     running_mean.cpu(), running_var.cpu()};
        };
        const std::vector<Tensor> fused = run(true), composed = run(false);
        ASSERT_NO_FATAL_FAILURE(expect_batch_norm_results_near(
            fused, composed, dtype == DType::Float32 ? 2e-4 : 1e-9,
            ferry::shape_str(c.shape) + " offset " + std::to_string(c.offset) + " " + std::string(ferry::dtype_name(dtype)) +
                " on " + device));
      }
    }
  }
}

// BatchNorm + ReLU + 2x2/2 max pooling as one host layer (cpu and sim) against the three composed: values,
// the three gradients and the running statistics, at even and odd sizes (an odd last row and column are in the
// statistics but in no window), with and without affine parameters and momentum, and with a mean of 1000.
TEST(NNGradcheck, FusedBatchNormReluMaxPoolMatchesTheComposedLayers) {
  struct Case {
    Shape shape;
    double offset;
    bool affine;
    std::optional<double> momentum;
  };
  for (const DType dtype : {DType::Float32, DType::Float64}) {
    for (const Case& c : {Case{{16, 8, 14, 14}, 1.5, true, 0.1}, Case{{3, 2, 7, 5}, -0.5, true, 0.1},
                          Case{{4, 3, 2, 2}, 0.0, false, std::nullopt}, Case{{2, 4, 9, 12}, 1000.0, true, 0.3},
                          Case{{8, 32, 28, 28}, 0.2, true, 0.1}}) {
      for (const char* device : {"cpu", "sim:0"}) {
        const std::int64_t C = c.shape[1];
        ferry::manual_seed(73);
        const Tensor x = ferry::add(ferry::randn(c.shape, {.dtype = dtype}), c.offset);
        const Shape pooled{c.shape[0], C, c.shape[2] / 2, c.shape[3] / 2};
        const Tensor probe = ferry::randn(pooled, {.dtype = dtype});
        const Tensor w0 = ferry::add(ferry::mul(ferry::randn({C}, {.dtype = dtype}), 0.5), 1.0);
        const Tensor b0 = ferry::mul(ferry::randn({C}, {.dtype = dtype}), 0.5);
        auto run = [&](bool fused) {
          const Device d = Device::parse(device);
          F::set_library_layers(fused);
          // Copies: on cpu, to() returns the tensor itself, and the two runs would share (and sum) their gradients.
          Tensor in = x.to(d).clone().requires_grad_();
          Tensor weight = c.affine ? w0.to(d).clone().requires_grad_() : Tensor();
          Tensor bias = c.affine ? b0.to(d).clone().requires_grad_() : Tensor();
          Tensor running_mean = ferry::full({C}, 0.25, {.device = d, .dtype = dtype});
          Tensor running_var = ferry::full({C}, 2.0, {.device = d, .dtype = dtype});
          const Tensor batches = ferry::full({}, 3, {.device = d, .dtype = DType::Int64});
          Tensor out = F::batch_norm_relu_max_pool2d(in, running_mean, running_var, weight, bias, true, c.momentum,
                                                     1e-5, batches);
          F::set_library_layers(true);
          EXPECT_EQ(out.shape(), pooled);
          ferry::sum(ferry::mul(out, probe.to(d))).backward();
          return std::vector<Tensor>{out.detach().cpu(), in.grad().cpu(),
                                     c.affine ? weight.grad().cpu() : ferry::zeros({C}, {.dtype = dtype}),
                                     c.affine ? bias.grad().cpu() : ferry::zeros({C}, {.dtype = dtype}),
                                     running_mean.cpu(), running_var.cpu()};
        };
        const std::vector<Tensor> fused = run(true), composed = run(false);
        ASSERT_NO_FATAL_FAILURE(expect_batch_norm_results_near(
            fused, composed, dtype == DType::Float32 ? 2e-4 : 1e-9,
            ferry::shape_str(c.shape) + " offset " + std::to_string(c.offset) + " " + std::string(ferry::dtype_name(dtype)) +
                " on " + device));
      }
    }
  }
  // And against finite differences, on cpu and sim (float64, no running statistics).
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        return F::batch_norm_relu_max_pool2d(a[0], Tensor(), Tensor(), a[1], a[2], true);
      },
      {random_argument({3, 2, 5, 4}, 81), random_argument({2}, 82), random_argument({2}, 83)},
      "batch_norm_relu_max_pool2d");
}

// nn::Sequential runs [BatchNorm2d, ReLU, MaxPool2d(2)] as the fused layer, and only that exact tail.
TEST(NNGradcheck, SequentialFusesTheBatchNormReluMaxPoolTail) {
  ferry::manual_seed(79);
  ferry::nn::Sequential model;
  model.push_back(ferry::nn::Conv2d(1, 4, 3, {.padding = 1}));
  model.push_back(ferry::nn::BatchNorm2d(4));
  model.push_back(ferry::nn::ReLU());
  model.push_back(ferry::nn::MaxPool2d(2));
  auto made_by = [](const Tensor& t) { return t.impl()->grad_fn ? t.impl()->grad_fn->name : std::string(); };
  const Tensor x = ferry::randn({6, 1, 16, 12});
  const Tensor fused_out = model.forward(x);
  EXPECT_EQ(made_by(fused_out), "batch_norm_relu_max_pool2d");
  F::set_fused_activations(false);
  const Tensor plain_out = model.forward(x);
  F::set_fused_activations(true);
  EXPECT_EQ(made_by(plain_out), "max_pool2d");
  EXPECT_TRUE(ferry::testing::all_close(fused_out, plain_out, 1e-4, 1e-5));
  model.eval();  // evaluation: the running statistics, composed
  EXPECT_EQ(made_by(model.forward(x)), "max_pool2d");
  ferry::nn::Sequential other;  // a ReLU and a 3x3 pooling after the BatchNorm: not the fused tail
  other.push_back(ferry::nn::BatchNorm2d(4));
  other.push_back(ferry::nn::ReLU());
  other.push_back(ferry::nn::MaxPool2d(3));
  EXPECT_EQ(made_by(other.forward(ferry::randn({6, 4, 9, 9}))), "max_pool2d");
}

TEST(NNGradcheck, Conv2dPortablePath) {
  // The path every non-host device takes (chunked im2col + batched GEMM through the backend), checked
  // on sim with the host kernels off; the default (host) path is what the other tests check on cpu and sim.
  F::set_fused_host_kernels(false);
  check_everywhere(
      [](const std::vector<Tensor>& a) { return F::conv2d(a[0], a[1], a[2], {2, 1}, {1, 0}, {1, 2}); },
      {random_argument({3, 2, 7, 6}, 47), random_argument({3, 2, 3, 2}, 48), random_argument({3}, 49)},
      "portable conv2d stride (2,1) padding (1,0) dilation (1,2)");
  check_everywhere([](const std::vector<Tensor>& a) { return F::conv2d(a[0], a[1], a[2]); },
                   {random_argument({2, 3, 3, 4}, 50), random_argument({2, 3, 1, 1}, 51), random_argument({2}, 52)},
                   "portable conv2d pointwise (1x1)");
  F::set_fused_host_kernels(true);
}

TEST(NNGradcheck, Pooling) {
  check_everywhere([](const std::vector<Tensor>& a) { return F::max_pool2d(a[0], 2); },
                   {random_argument({2, 2, 4, 6}, 51)}, "max_pool2d k2");
  check_everywhere([](const std::vector<Tensor>& a) { return F::max_pool2d(a[0], 3, 2, 1); },
                   {random_argument({1, 2, 5, 5}, 52)}, "max_pool2d k3 s2 p1");
  check_everywhere([](const std::vector<Tensor>& a) { return F::avg_pool2d(a[0], 2); },
                   {random_argument({2, 2, 4, 6}, 53)}, "avg_pool2d k2");
  check_everywhere([](const std::vector<Tensor>& a) { return F::avg_pool2d(a[0], {3, 2}, {2, 1}, {1, 1}); },
                   {random_argument({1, 2, 5, 4}, 54)}, "avg_pool2d k(3,2) s(2,1) p1");
}

// PyTorch's max-pool rule on both cpu loops (the 2x2/2 fast path and the general one): the first maximum in
// window order wins a tie, and the first NaN in a window wins over everything after it.
TEST(NNGradcheck, MaxPoolTiesAndNaNsFollowPyTorch) {
  const double nan = std::nan("");
  // One 4x4 plane: window (0,0) ties at 5 (first wins: index 0), window (0,1) has a NaN second (index 3),
  // window (1,0) a NaN after the maximum (index 12), window (1,1) two NaNs (the first, index 11).
  const std::vector<double> values = {5, 1, 2, nan,  //
                                      5, 0, 3, 4,    //
                                      1, 9, 0, nan,  //
                                      nan, 2, 8, nan};
  for (const auto& [kernel, stride, padding] : {std::tuple{2, 2, 0}, std::tuple{3, 1, 0}}) {
    const Tensor x = ferry::from_vector(values, {1, 1, 4, 4});
    const Tensor out = F::max_pool2d(x, kernel, stride, padding);
    const std::vector<double> got = out.to_vector<double>();
    if (kernel == 2) {
      ASSERT_EQ(got.size(), 4u);
      EXPECT_EQ(got[0], 5);
      EXPECT_TRUE(std::isnan(got[1]) && std::isnan(got[2]) && std::isnan(got[3]));
      // The gradient lands on the chosen element: index 0 for the tie, the first NaN elsewhere.
      Tensor xr = x.detach().requires_grad_(true);
      ferry::sum(F::max_pool2d(xr, 2, 2, 0)).backward();
      const std::vector<double> g = xr.grad().to_vector<double>();
      for (int i : {0, 3, 11, 12}) EXPECT_EQ(g[i], 1) << "element " << i;
      EXPECT_EQ(std::count(g.begin(), g.end(), 1.0), 4);
    } else {  // 3x3 stride 1: the top-left window has no NaN (its maximum is 9), the other three have one
      ASSERT_EQ(got.size(), 4u);
      EXPECT_EQ(got[0], 9);
      EXPECT_TRUE(std::isnan(got[1]) && std::isnan(got[2]) && std::isnan(got[3]));
    }
  }
}

// The 2x2/2 loop (eight outputs at a time for float32, with a masked last block) against the window rule
// written out here, at every row width from 2 to 40 (full blocks, partial blocks, odd widths whose last column
// no window reads), with ties and, in some planes, NaNs: the values and where the gradient lands.
template <typename T>
void check_max_pool_2x2_rows() {
  std::uint64_t state = 12345;
  auto next = [&state] { return (state = state * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
  for (const std::int64_t height : {2, 3, 5}) {
    for (std::int64_t width = 2; width <= 40; ++width) {
      const std::int64_t planes = 3, oh = height / 2, ow = width / 2;
      std::vector<T> values(planes * height * width);
      for (std::size_t i = 0; i < values.size(); ++i) {
        values[i] = static_cast<T>(static_cast<int>(next() % 7) - 3);  // seven values: many ties
        if (i / (height * width) == 2 && next() % 9 == 0) values[i] = std::numeric_limits<T>::quiet_NaN();
      }
      std::vector<T> weights(planes * oh * ow);  // distinct: the gradient says which element each window chose
      for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<T>(i + 1);
      const Tensor x = ferry::from_vector(values, {1, planes, height, width}).requires_grad_(true);
      const Tensor out = F::max_pool2d(x, 2, 2);
      ferry::sum(out * ferry::from_vector(weights, {1, planes, oh, ow})).backward();
      const std::vector<T> got = out.to_vector<T>(), grad = x.grad().to_vector<T>();
      std::vector<T> want_grad(values.size(), T(0));
      for (std::int64_t p = 0; p < planes; ++p) {
        for (std::int64_t y = 0; y < oh; ++y) {
          for (std::int64_t xo = 0; xo < ow; ++xo) {
            const std::int64_t first = p * height * width + 2 * y * width + 2 * xo;
            std::int64_t best = first;  // window order; the first maximum, or the first NaN, wins
            for (const std::int64_t i : {first + 1, first + width, first + width + 1}) {
              const T v = values[i], b = values[best];
              if (b == b && (v > b || v != v)) best = i;
            }
            const std::int64_t o = (p * oh + y) * ow + xo;
            want_grad[best] = weights[o];
            const T want = values[best];
            ASSERT_TRUE(want != want ? got[o] != got[o] : got[o] == want)
                << "height " << height << " width " << width << " output " << o << ": " << got[o] << ", want " << want;
          }
        }
      }
      for (std::size_t i = 0; i < grad.size(); ++i) {
        ASSERT_EQ(grad[i], want_grad[i]) << "height " << height << " width " << width << " element " << i;
      }
    }
  }
}

TEST(NNGradcheck, MaxPool2x2RowsMatchTheWindowRuleAtEveryWidth) {
  check_max_pool_2x2_rows<float>();
  check_max_pool_2x2_rows<double>();
}

TEST(NNGradcheck, ActivationsAndDropout) {
  check_everywhere([](const std::vector<Tensor>& a) { return F::relu(a[0]); }, {random_argument({3, 5}, 61)}, "relu");
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        ferry::manual_seed(7);  // the same mask for every evaluation
        return F::dropout(a[0], 0.4, true);
      },
      {random_argument({4, 6}, 62)}, "dropout");
}

// The composed layers of transformers: each gradient from its ops' backward, against finite differences.
TEST(NNGradcheck, GeluSiluLeakyReluLayerNormAndEmbedding) {
  check_everywhere([](const std::vector<Tensor>& a) { return F::gelu(a[0]); }, {random_argument({3, 5}, 71, 2)},
                   "gelu");
  check_everywhere([](const std::vector<Tensor>& a) { return F::gelu(a[0], "tanh"); },
                   {random_argument({3, 5}, 72, 2)}, "gelu tanh");
  check_everywhere([](const std::vector<Tensor>& a) { return F::silu(a[0]); }, {random_argument({3, 5}, 73, 2)},
                   "silu");
  check_everywhere([](const std::vector<Tensor>& a) { return F::leaky_relu(a[0], 0.1); },
                   {random_argument({3, 5}, 74, 2)}, "leaky_relu");
  check_everywhere([](const std::vector<Tensor>& a) { return F::softplus(a[0]); }, {random_argument({3, 5}, 79, 2)},
                   "softplus");
  check_everywhere([](const std::vector<Tensor>& a) { return F::adaptive_avg_pool2d(a[0], {3, 2}); },
                   {random_argument({2, 2, 5, 7}, 81)}, "adaptive_avg_pool2d, overlapping windows");
  check_everywhere([](const std::vector<Tensor>& a) { return F::adaptive_avg_pool2d(a[0], 1); },
                   {random_argument({2, 4, 3}, 82)}, "adaptive_avg_pool2d, global, 3-d input");
  check_everywhere([](const std::vector<Tensor>& a) { return F::unfold(a[0], {2, 3}, {2, 1}, 1, {1, 2}); },
                   {random_argument({2, 2, 5, 6}, 87)}, "unfold dilation (2,1) padding 1 stride (1,2)");
  check_everywhere([](const std::vector<Tensor>& a) { return F::fold(a[0], {4, 5}, 2, 1, 0, 1); },
                   {random_argument({2, 8, 12}, 88)}, "fold 2x2 blocks into 4x5");
  for (const char* mode : {"constant", "reflect", "replicate", "circular"}) {
    check_everywhere([mode](const std::vector<Tensor>& a) { return F::pad(a[0], {2, 1, 1, 2}, mode); },
                     {random_argument({2, 3, 4}, 85)}, std::string("pad ") + mode);
  }
  check_everywhere([](const std::vector<Tensor>& a) { return F::pad(a[0], {-1, 2}, "constant", 0.5); },
                   {random_argument({2, 4}, 86)}, "pad constant, cropping one side");
  check_everywhere([](const std::vector<Tensor>& a) { return F::adaptive_max_pool2d(a[0], {3, 2}); },
                   {random_argument({2, 2, 5, 7}, 83)}, "adaptive_max_pool2d, overlapping windows");
  check_everywhere([](const std::vector<Tensor>& a) { return F::adaptive_max_pool2d(a[0], {4, 3}); },
                   {random_argument({2, 3, 2}, 84)}, "adaptive_max_pool2d, larger than its 3-d input");
  check_everywhere([](const std::vector<Tensor>& a) { return F::softplus(a[0], 2, 1.5); },
                   {random_argument({3, 5}, 80, 2)}, "softplus beta 2 threshold 1.5");
  check_everywhere([](const std::vector<Tensor>& a) { return F::layer_norm(a[0], {2, 4}, a[1], a[2]); },
                   {random_argument({3, 2, 4}, 75), random_argument({2, 4}, 76), random_argument({2, 4}, 77)},
                   "layer_norm");
  check_everywhere([](const std::vector<Tensor>& a) { return F::layer_norm(a[0], {5}, Tensor(), Tensor(), 1e-3); },
                   {random_argument({4, 5}, 78)}, "layer_norm without affine");
  check_everywhere([](const std::vector<Tensor>& a) { return F::group_norm(a[0], 2, a[1], a[2]); },
                   {random_argument({2, 4, 3}, 83), random_argument({4}, 84), random_argument({4}, 85)},
                   "group_norm");
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        const Tensor indices = ferry::from_vector<std::int64_t>({1, 3, 1, 0, 4, 3}, {2, 3}).to(a[0].device());
        return F::embedding(indices, a[0], 2);  // padding row 2, unused (the padding rule is PyTorch fixtures')
      },
      {random_argument({5, 3}, 79)}, "embedding");
}

TEST(NNGradcheck, Losses) {
  for (auto reduction : {ferry::nn::Reduction::Mean, ferry::nn::Reduction::Sum, ferry::nn::Reduction::None}) {
    const std::string name = reduction == ferry::nn::Reduction::Mean ? "mean" : reduction == ferry::nn::Reduction::Sum ? "sum" : "none";
    check_everywhere(
        [reduction](const std::vector<Tensor>& a) {
          const Tensor target = ferry::from_vector<std::int64_t>({2, 0, 4, 1, 4}).to(a[0].device());
          return F::cross_entropy(a[0], target, reduction);
        },
        {random_argument({5, 5}, 71, 2)}, "cross_entropy " + name);
    check_everywhere([reduction](const std::vector<Tensor>& a) { return F::mse_loss(a[0], a[1], reduction); },
                     {random_argument({3, 4}, 72), random_argument({3, 4}, 73)}, "mse_loss " + name);
  }
  // The elementwise losses, each input differentiated (targets held fixed where PyTorch does not differentiate).
  const Argument x = random_argument({3, 4}, 74, 2), target = random_argument({3, 4}, 75, 1, false);
  check_everywhere([](const std::vector<Tensor>& a) { return F::l1_loss(a[0], a[1]); }, {x, target}, "l1_loss");
  check_everywhere([](const std::vector<Tensor>& a) { return F::smooth_l1_loss(a[0], a[1], ferry::nn::Reduction::Sum, 0.5); },
                   {x, target}, "smooth_l1_loss beta 0.5");
  check_everywhere([](const std::vector<Tensor>& a) { return F::huber_loss(a[0], a[1], ferry::nn::Reduction::None, 1.5); },
                   {x, target}, "huber_loss delta 1.5");
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        return F::binary_cross_entropy(ferry::sigmoid(a[0]), ferry::sigmoid(a[1]), {.weight = a[2]});
      },
      {x, target, random_argument({4}, 76, 1, false)}, "binary_cross_entropy with weight");
  check_everywhere(
      [](const std::vector<Tensor>& a) {
        return F::binary_cross_entropy_with_logits(a[0], ferry::sigmoid(a[1]),
                                                   {.reduction = ferry::nn::Reduction::Sum, .pos_weight = ferry::exp(a[2])});
      },
      {x, target, random_argument({4}, 77)}, "binary_cross_entropy_with_logits with pos_weight");
}

// The vector functions and the losses built on them, every input differentiated: vector_norm for p 1, 2, 3 and
// infinity (its hand-written backward for p 3), normalize, cosine_similarity broadcast, pairwise_distance, kl_div,
// cosine_embedding_loss, triplet_margin_loss with swap; and pixel_shuffle / pixel_unshuffle (pure rearrangements).
TEST(NNGradcheck, DistancesEmbeddingLossesAndPixelShuffle) {
  const Argument a = random_argument({3, 5}, 91), b = random_argument({3, 5}, 92), c = random_argument({3, 5}, 93);
  for (const double p : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
    check_everywhere([p](const std::vector<Tensor>& t) { return F::vector_norm(t[0], p, 1); }, {a},
                     "vector_norm p " + std::to_string(p));
    check_everywhere([p](const std::vector<Tensor>& t) { return F::normalize(t[0], p, 0); }, {a},
                     "normalize p " + std::to_string(p));
  }
  check_everywhere([](const std::vector<Tensor>& t) { return F::vector_norm(t[0], 2.5, -1, true); }, {a},
                   "vector_norm p 2.5 keepdim");
  check_everywhere([](const std::vector<Tensor>& t) { return F::cosine_similarity(t[0], t[1], -1); },
                   {random_argument({3, 1, 4}, 94), random_argument({1, 2, 4}, 95)}, "cosine_similarity broadcast");
  check_everywhere([](const std::vector<Tensor>& t) { return F::pairwise_distance(t[0], t[1], 3.0); }, {a, b},
                   "pairwise_distance p 3");
  check_everywhere(
      [](const std::vector<Tensor>& t) {
        return F::kl_div(ferry::log_softmax(t[0], 1), ferry::softmax(t[1], 1),
                         {.reduction = ferry::nn::KLDivReduction::BatchMean});
      },
      {a, random_argument({3, 5}, 96, 1, false)}, "kl_div batchmean");
  check_everywhere(
      [](const std::vector<Tensor>& t) {
        const Tensor y = ferry::from_vector<double>({1, -1, -1}).to(t[0].device());
        return F::cosine_embedding_loss(t[0], t[1], y, {.margin = -0.9, .reduction = ferry::nn::Reduction::Sum});
      },
      {a, b}, "cosine_embedding_loss");
  check_everywhere(
      [](const std::vector<Tensor>& t) {
        return F::triplet_margin_loss(t[0], t[1], t[2], {.margin = 4.0, .swap = true});
      },
      {a, b, c}, "triplet_margin_loss swap");
  check_everywhere([](const std::vector<Tensor>& t) { return F::pixel_shuffle(t[0], 2); },
                   {random_argument({2, 8, 2, 3}, 97)}, "pixel_shuffle 2");
  check_everywhere([](const std::vector<Tensor>& t) { return F::pixel_unshuffle(t[0], 3); },
                   {random_argument({1, 2, 3, 6}, 98)}, "pixel_unshuffle 3");
}

// LSTM and GRU (2 layers, bidirectional: the fused step on cpu and sim, the composed one on cuda) against finite
// differences through the input and both initial states, in float64.
TEST(NNGradcheck, RecurrentLayers) {
  for (const bool lstm : {true, false}) {
    const std::string what = lstm ? "LSTM" : "GRU";
    check_everywhere(
        [lstm](const std::vector<Tensor>& a) {
          ferry::manual_seed(11);
          const ferry::nn::RNNOptions options{.num_layers = 2, .bidirectional = true};
          std::shared_ptr<ferry::nn::RNNBase> layer;
          if (lstm) layer = std::make_shared<ferry::nn::LSTM>(3, 4, options, ferry::TensorOptions{.dtype = DType::Float64});
          else layer = std::make_shared<ferry::nn::GRU>(3, 4, options, ferry::TensorOptions{.dtype = DType::Float64});
          layer->to(a[0].device());
          const ferry::nn::RNNOutput r = layer->forward(a[0], a[1], lstm ? a[2] : Tensor());
          Tensor out = ferry::add(ferry::sum(ferry::square(r.output)), ferry::sum(r.h_n));
          return lstm ? ferry::add(out, ferry::sum(ferry::mul(r.c_n, r.c_n))) : out;
        },
        {random_argument({5, 2, 3}, 101), random_argument({4, 2, 4}, 102), random_argument({4, 2, 4}, 103, 1, lstm)},
        what);
  }
}

// The fused LSTM and GRU steps (the backend's recurrent cell: host loops on cpu and sim, one kernel each way on
// cuda) against the composed ones (the same layer with the library layers off), in float64, on every device: the
// outputs, final states and the gradients of the input, the initial states and every parameter agree to rounding,
// with each other and with the cpu's; sim gives the cpu's bits.
TEST(NNGradcheck, FusedRecurrentStepsMatchTheComposedOnes) {
  std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
  if (ferry::is_available(ferry::DeviceType::CUDA)) devices.push_back(Device::parse("cuda:0"));
  for (const bool lstm : {true, false}) {
    std::vector<std::vector<double>> on_cpu;
    for (const Device& device : devices) {
      const std::string what = std::string(lstm ? "LSTM" : "GRU") + " on " + device.str();
      EXPECT_TRUE(ferry::backend(device).rnn_cell_library({.batch = 2, .hidden = 5}, DType::Float64, device.index))
          << what << ": the backend has no fused cell";
      std::vector<std::vector<double>> runs[2];
      for (const bool fused : {true, false}) {
        F::set_library_layers(fused);
        ferry::manual_seed(12);
        const ferry::nn::RNNOptions options{.num_layers = 2, .batch_first = true};
        const ferry::TensorOptions like{.device = device, .dtype = DType::Float64};
        std::shared_ptr<ferry::nn::RNNBase> layer;
        if (lstm) layer = std::make_shared<ferry::nn::LSTM>(3, 5, options, like);
        else layer = std::make_shared<ferry::nn::GRU>(3, 5, options, like);
        const auto input = [&](const ferry::Shape& shape) {
          return ferry::randn(shape, {.dtype = DType::Float64}).to(device).requires_grad_(true);
        };
        Tensor x = input({2, 7, 3}), h0 = input({2, 2, 5});
        Tensor c0 = lstm ? input({2, 2, 5}) : Tensor();
        const ferry::nn::RNNOutput r = layer->forward(x, h0, c0);
        Tensor loss = ferry::add(ferry::sum(ferry::mul(r.output, ferry::sin(r.output))), ferry::sum(ferry::exp(r.h_n)));
        if (lstm) loss = ferry::add(loss, ferry::sum(ferry::square(r.c_n)));
        loss.backward();
        const auto host = [](const Tensor& t) { return t.cpu().to_vector<double>(); };
        auto& run = runs[fused ? 0 : 1];
        run = {host(r.output), host(r.h_n), host(x.grad()), host(h0.grad())};
        if (lstm) {
          run.push_back(host(r.c_n));
          run.push_back(host(c0.grad()));
        }
        for (const Tensor& p : layer->parameters()) run.push_back(host(p.grad()));
      }
      F::set_library_layers(true);
      ASSERT_EQ(runs[0].size(), runs[1].size());
      for (std::size_t k = 0; k < runs[0].size(); ++k) {
        expect_near(runs[0][k], runs[1][k], what + ": fused against composed, result " + std::to_string(k));
      }
      if (device.is_cpu()) {
        on_cpu = runs[0];
      } else if (device.type == ferry::DeviceType::Sim) {
        EXPECT_EQ(runs[0], on_cpu) << what << ": sim:0 differs from cpu";
      } else {
        for (std::size_t k = 0; k < runs[0].size(); ++k) {
          expect_near(runs[0][k], on_cpu[k], what + ": against the cpu, result " + std::to_string(k));
        }
      }
    }
  }
}

TEST(NNGradcheck, GatherScatterAddCumsumAndProd) {
  const auto index = [](std::vector<std::int64_t> v, Shape s, const Tensor& like) {
    return ferry::from_vector<std::int64_t>(v, s, {.device = like.device()});
  };
  for (int dim : {0, 1}) {
    const std::string d = std::to_string(dim);
    check_everywhere([&, dim](const std::vector<Tensor>& a) {
      return ferry::gather(a[0], dim, index({2, 0, 2, 1, 0, 0}, {2, 3}, a[0]));
    }, {random_argument({3, 4}, 91)}, "gather dim " + d);
    check_everywhere([&, dim](const std::vector<Tensor>& a) {
      return ferry::scatter_add(a[0], dim, index({1, 0, 1, 1, 2, 0}, {2, 3}, a[0]), a[1]);
    }, {random_argument({3, 4}, 92), random_argument({3, 3}, 93)}, "scatter_add dim " + d);
    check_everywhere([dim](const std::vector<Tensor>& a) { return ferry::cumsum(a[0], dim); },
                     {random_argument({3, 4}, 94)}, "cumsum dim " + d);
    check_everywhere([dim](const std::vector<Tensor>& a) { return ferry::prod(a[0], {dim}); },
                     {random_argument({3, 4}, 95)}, "prod dim " + d);
  }
}

TEST(NNGradcheck, SoftmaxFamily) {
  for (int dim : {0, 1, -1}) {
    const std::string d = std::to_string(dim);
    check_everywhere([dim](const std::vector<Tensor>& a) { return F::softmax(a[0], dim); },
                     {random_argument({3, 4}, 81, 3)}, "softmax dim " + d);
    check_everywhere([dim](const std::vector<Tensor>& a) { return F::log_softmax(a[0], dim); },
                     {random_argument({3, 4}, 82, 3)}, "log_softmax dim " + d);
    check_everywhere([dim](const std::vector<Tensor>& a) { return ferry::logsumexp(a[0], dim, dim == 0); },
                     {random_argument({3, 4}, 83, 3)}, "logsumexp dim " + d);
  }
  check_everywhere([](const std::vector<Tensor>& a) { return F::log_softmax(a[0], 1); },
                   {random_argument({2, 3, 2}, 84, 40)}, "log_softmax of large logits (3-d, dim 1)");
}

TEST(NNGradcheck, ClassLossOptions) {
  using ferry::nn::Reduction;
  for (auto reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    const std::string name = reduction == Reduction::Mean ? "mean" : reduction == Reduction::Sum ? "sum" : "none";
    // Targets with two ignored rows; the class weights (1 + argument 1) are differentiated too.
    const auto target_on = [](Device device) {
      return ferry::from_vector<std::int64_t>({2, -100, 4, 1, -100, 0}).to(device);
    };
    check_everywhere(
        [=](const std::vector<Tensor>& a) {
          return F::cross_entropy(a[0], target_on(a[0].device()),
                                  ferry::nn::CrossEntropyOptions{.reduction = reduction, .weight = ferry::add(a[1], 1.0),
                                                                 .ignore_index = -100, .label_smoothing = 0.25});
        },
        {random_argument({6, 5}, 85, 2), random_argument({5}, 86, 0.3)}, "cross_entropy options " + name);
    check_everywhere(
        [=](const std::vector<Tensor>& a) {
          return F::nll_loss(a[0], target_on(a[0].device()),
                             {.reduction = reduction, .weight = ferry::add(a[1], 1.0), .ignore_index = -100});
        },
        {random_argument({6, 5}, 87), random_argument({5}, 88, 0.3)}, "nll_loss " + name);
  }
}

namespace {
// For arguments too big for an element-by-element check: the derivative along random directions v,
// (F(a + h v) - F(a - h v)) / 2h, against the gradient's dot product with v (F = sum(f(args) * w)).
std::vector<std::vector<double>> directional_check(const Function& f, const std::vector<Argument>& args, Device device,
                                                   const std::string& what) {
  constexpr double h = 1e-6;
  std::vector<Tensor> inputs;
  for (const Argument& a : args) inputs.push_back(materialise(a, device, true));
  Tensor out = f(inputs);
  ferry::manual_seed(98);
  const Tensor projection = ferry::randn(out.shape(), {.device = device, .dtype = DType::Float64});
  ferry::sum(ferry::mul(out, projection)).backward();
  auto objective = [&](const std::vector<Argument>& perturbed) {
    ferry::autograd::NoGradGuard no_grad;
    std::vector<Tensor> xs;
    for (const Argument& a : perturbed) xs.push_back(materialise(a, device, false));
    return ferry::sum(ferry::mul(f(xs), projection)).item<double>();
  };
  std::vector<std::vector<double>> grads;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::vector<double> grad = inputs[i].grad().to_vector<double>();
    for (int trial = 0; trial < 2; ++trial) {
      const Argument direction = random_argument(args[i].shape, 500 + 10 * i + trial);
      std::vector<Argument> plus = args, minus = args;
      double analytic = 0;
      for (std::size_t j = 0; j < grad.size(); ++j) {
        plus[i].values[j] += h * direction.values[j];
        minus[i].values[j] -= h * direction.values[j];
        analytic += grad[j] * direction.values[j];
      }
      const double numeric = (objective(plus) - objective(minus)) / (2 * h);
      EXPECT_NEAR(numeric, analytic, 1e-6 + 1e-5 * std::abs(analytic))
          << what << " on " << device.str() << ": argument " << i << " direction " << trial;
    }
    grads.push_back(grad);
  }
  grads.push_back(out.to_vector<double>());
  return grads;
}
}  // namespace

TEST(NNGradcheck, Conv2dHostPathAlongRandomDirections) {
  // Big enough for the host path (samples over OpenMP threads, single-threaded BLAS per sample).
  struct Case {
    Shape x, w;
    ferry::nn::Size2 stride, padding, dilation;
  };
  for (const Case& c : {Case{{4, 8, 24, 24}, {16, 8, 3, 3}, 1, 1, 1}, Case{{4, 8, 40, 40}, {24, 8, 3, 3}, 2, 2, 2},
                        Case{{4, 32, 16, 16}, {32, 32, 1, 1}, 1, 0, 1}}) {
    const std::vector<Argument> args = {random_argument(c.x, 91), random_argument(c.w, 92), random_argument({c.w[0]}, 93)};
    const Function f = [&](const std::vector<Tensor>& a) { return F::conv2d(a[0], a[1], a[2], c.stride, c.padding, c.dilation); };
    const std::string what = "conv2d host path " + ferry::shape_str(c.x) + " * " + ferry::shape_str(c.w);
    const auto on_cpu = directional_check(f, args, ferry::kCPU, what);
    const auto on_sim = directional_check(f, args, Device::parse("sim:0"), what);
    EXPECT_EQ(on_cpu, on_sim) << what << ": sim:0 differs from cpu";
    F::set_fused_host_kernels(false);  // the portable path agrees
    const auto portable = directional_check(f, args, ferry::kCPU, what + " (portable)");
    F::set_fused_host_kernels(true);
    for (std::size_t k = 0; k < on_cpu.size(); ++k) {
      for (std::size_t j = 0; j < on_cpu[k].size(); ++j) {
        ASSERT_NEAR(on_cpu[k][j], portable[k][j], 1e-9 * (1 + std::abs(portable[k][j]))) << what << " " << k << " " << j;
      }
    }
  }
}

TEST(NNGradcheck, Conv2dBatchEqualsSampleBySample) {
  // Both conv paths: the host one (samples over OpenMP threads) and the portable one, with samples big
  // enough that its im2col buffer holds fewer samples than the batch (several chunks).
  for (const bool host : {true, false}) {
    F::set_fused_host_kernels(host);
    ferry::manual_seed(81);
    const Tensor x = ferry::randn({6, 16, 40, 40});
    Tensor w = ferry::randn({8, 16, 3, 3}).requires_grad_(true);
    Tensor b = ferry::randn({8}).requires_grad_(true);
    Tensor out = F::conv2d(x, w, b, 1, 1);
    ferry::sum(ferry::square(out)).backward();
    const std::vector<float> gw = w.grad().to_vector<float>();
    std::vector<double> gw_per_sample(gw.size(), 0.0);
    for (std::int64_t n = 0; n < 6; ++n) {
      Tensor wn = w.detach().clone().requires_grad_(true);
      Tensor one = F::conv2d(x.narrow(0, n, 1), wn, b.detach(), 1, 1);
      const std::vector<float> expected = out.detach().narrow(0, n, 1).contiguous().to_vector<float>();
      const std::vector<float> actual = one.detach().to_vector<float>();
      ASSERT_EQ(expected.size(), actual.size());
      for (std::size_t i = 0; i < actual.size(); i += 97) EXPECT_NEAR(actual[i], expected[i], 1e-4) << n << " " << i;
      ferry::sum(ferry::square(one)).backward();
      const std::vector<float> g = wn.grad().to_vector<float>();
      for (std::size_t i = 0; i < g.size(); ++i) gw_per_sample[i] += g[i];
    }
    for (std::size_t i = 0; i < gw.size(); ++i) {
      EXPECT_NEAR(gw[i], gw_per_sample[i], 1e-3 * (1 + std::abs(gw_per_sample[i]))) << (host ? "host" : "portable");
    }
  }
  F::set_fused_host_kernels(true);
}
