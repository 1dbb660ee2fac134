// test_onednn_conv.cpp — float32 conv2d through oneDNN (src/cpu/onednn_conv.h), the host devices' library layer,
// against ferry's im2col paths: the output and all three gradients, on shapes that cover strides, padding,
// dilation, odd sizes, 1x1 kernels, one input channel, one sample, no bias and groups; the same bits on every run,
// on sim as on cpu, and replayed from a graph captured on sim as run eagerly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../src/cpu/onednn_conv.h"
#include "ferry/ferry.h"
#include "ferry/graph.h"
#include "ferry/nn/functional.h"

namespace F = ferry::nn::functional;
using ferry::Device;
using ferry::Shape;
using ferry::Tensor;

namespace {

struct Case {
  Shape x, w;
  ferry::nn::Size2 stride, padding, dilation;
  bool bias = true;
  bool input_grad = true;
  std::int64_t groups = 1;
};

std::string describe(const Case& c) {
  return "x " + ferry::shape_str(c.x) + " w " + ferry::shape_str(c.w) + " stride (" + std::to_string(c.stride.h) + ", " +
         std::to_string(c.stride.w) + ") padding (" + std::to_string(c.padding.h) + ", " + std::to_string(c.padding.w) +
         ") dilation (" + std::to_string(c.dilation.h) + ", " + std::to_string(c.dilation.w) + ")" +
         (c.bias ? "" : " no bias") + (c.groups > 1 ? " groups " + std::to_string(c.groups) : "");
}

ferry::Backend::Conv2dShape shape_of(const Case& c) {
  ferry::Backend::Conv2dShape s;
  s.batch = c.x[0];
  s.in_channels = c.x[1] / c.groups;
  s.height = c.x[2];
  s.width = c.x[3];
  s.out_channels = c.w[0] / c.groups;
  s.kernel_h = c.w[2];
  s.kernel_w = c.w[3];
  s.stride_h = c.stride.h;
  s.stride_w = c.stride.w;
  s.pad_h = c.padding.h;
  s.pad_w = c.padding.w;
  s.dilation_h = c.dilation.h;
  s.dilation_w = c.dilation.w;
  return s;
}

// out, then the gradients of x (when asked), w and b, of sum(out * r) for a fixed random r.
std::vector<std::vector<float>> run(const Case& c, Device device) {
  ferry::manual_seed(7);
  Tensor x = ferry::randn(c.x).to(device).requires_grad_(c.input_grad);
  Tensor w = (ferry::randn(c.w) * 0.2).to(device).requires_grad_(true);
  Tensor b = c.bias ? ferry::randn({c.w[0]}).to(device).requires_grad_(true) : Tensor();
  Tensor out = F::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
  const Tensor r = ferry::randn(out.shape()).to(device);
  ferry::sum(out * r).backward();
  std::vector<std::vector<float>> results{out.detach().cpu().to_vector<float>()};
  if (c.input_grad) results.push_back(x.grad().cpu().to_vector<float>());
  results.push_back(w.grad().cpu().to_vector<float>());
  if (c.bias) results.push_back(b.grad().cpu().to_vector<float>());
  return results;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{8, 1, 28, 28}, {32, 1, 3, 3}, 1, 1, 1, true, false},  // fmnist's first layer: no input gradient
      {{4, 8, 14, 14}, {16, 8, 3, 3}, 1, 1, 1},
      {{3, 4, 9, 9}, {6, 4, 3, 3}, 2, 1, 1},
      {{2, 3, 6, 6}, {4, 3, 3, 3}, 2, 0, 1},           // the last row and column are never read
      {{2, 3, 10, 10}, {5, 3, 3, 3}, 1, 2, 2},         // dilation
      {{2, 3, 7, 6}, {3, 3, 3, 2}, {2, 1}, {1, 0}, {1, 2}},
      {{2, 16, 5, 5}, {8, 16, 1, 1}, 1, 0, 1},         // pointwise
      {{1, 5, 11, 7}, {7, 5, 5, 3}, 1, {2, 1}, 1, false},  // one sample, no bias
      {{2, 8, 8, 8}, {8, 4, 3, 3}, 1, 1, 1, true, true, 2},  // groups: one convolution per group
  };
  return all;
}

void expect_close(const std::vector<std::vector<float>>& actual, const std::vector<std::vector<float>>& expected,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t k = 0; k < actual.size(); ++k) {
    ASSERT_EQ(actual[k].size(), expected[k].size()) << what << " result " << k;
    double scale = 0;
    for (float v : expected[k]) scale = std::max(scale, std::abs(static_cast<double>(v)));
    for (std::size_t i = 0; i < actual[k].size(); ++i) {
      ASSERT_NEAR(actual[k][i], expected[k][i], 2e-5 * (1 + scale)) << what << " result " << k << " element " << i;
    }
  }
}

}  // namespace

TEST(OnednnConv, MatchesTheIm2colPathsOnEveryShape) {
  if (F::onednn_version().empty()) GTEST_SKIP() << "this build has no oneDNN";
  for (const Case& c : cases()) {
    const std::string what = describe(c);
    EXPECT_TRUE(ferry::backend(ferry::kCPU).conv2d_library(shape_of(c), ferry::DType::Float32, 0)) << what;
    const auto onednn = run(c, ferry::kCPU);
    F::set_onednn(false);
    const auto host = run(c, ferry::kCPU);  // im2col + GEMM, samples over threads where the shape is big enough
    F::set_fused_host_kernels(false);
    const auto portable = run(c, ferry::kCPU);  // im2col + GEMM through the backend
    F::set_fused_host_kernels(true);
    F::set_onednn(true);
    expect_close(onednn, host, what + " (oneDNN against the host path)");
    expect_close(onednn, portable, what + " (oneDNN against the portable path)");
  }
}

TEST(OnednnConv, SameBitsEveryRunAndOnSim) {
  if (F::onednn_version().empty()) GTEST_SKIP() << "this build has no oneDNN";
  const Case c{{16, 8, 14, 14}, {16, 8, 3, 3}, 1, 1, 1};
  const auto first = run(c, ferry::kCPU);
  EXPECT_EQ(run(c, ferry::kCPU), first) << "two runs of one oneDNN convolution differ";
  EXPECT_EQ(run(c, Device::parse("sim:0")), first) << "sim:0 (host memory, the cpu's kernels) differs from cpu";
}

TEST(OnednnConv, OffSwitchAndDoubleTakeTheIm2colPath) {
  if (F::onednn_version().empty()) GTEST_SKIP() << "this build has no oneDNN";
  const ferry::Backend::Conv2dShape s = shape_of(cases()[1]);
  ferry::Backend& cpu = ferry::backend(ferry::kCPU);
  ferry::Backend& sim = ferry::backend(Device::parse("sim:0"));
  EXPECT_TRUE(cpu.conv2d_library(s, ferry::DType::Float32, 0));
  EXPECT_TRUE(sim.conv2d_library(s, ferry::DType::Float32, 0));
  EXPECT_FALSE(cpu.conv2d_library(s, ferry::DType::Float64, 0));
  F::set_onednn(false);
  EXPECT_FALSE(cpu.conv2d_library(s, ferry::DType::Float32, 0));
  EXPECT_FALSE(sim.conv2d_library(s, ferry::DType::Float32, 0));
  F::set_onednn(true);
  ferry::Backend::Conv2dShape none = s;
  none.batch = 0;  // nothing to compute: not asked of oneDNN
  EXPECT_FALSE(ferry::cpu::onednn_conv2d_supported(none, ferry::DType::Float32));
}

// A graph captured on sim records oneDNN's calls as it records any kernel (cuda's graphs record cuDNN's): the
// replay gives the eager step's bits, output and gradients, on new input values too.
TEST(OnednnConv, ACaptureOnSimRecordsTheCallsAndReplaysTheEagerBits) {
  if (F::onednn_version().empty()) GTEST_SKIP() << "this build has no oneDNN";
  const Device sim = Device::parse("sim:0");
  ferry::manual_seed(3);
  const Tensor x = ferry::randn({8, 4, 12, 12}).to(sim).requires_grad_(true);
  const Tensor w = (ferry::randn({6, 4, 3, 3}) * 0.3).to(sim).requires_grad_(true);
  const Tensor b = ferry::randn({6}).to(sim).requires_grad_(true);
  const Tensor r = ferry::randn({8, 6, 12, 12}).to(sim);
  auto step = [&] {  // out, and the gradients of sum(out * r), into tensors that keep their addresses
    Tensor out = F::conv2d(x, w, b, 1, 1, 1);
    ferry::sum(out * r).backward();
    return out.detach();
  };
  auto read = [&](const Tensor& out) {
    return std::vector<std::vector<float>>{out.cpu().to_vector<float>(), x.grad().cpu().to_vector<float>(),
                                           w.grad().cpu().to_vector<float>(), b.grad().cpu().to_vector<float>()};
  };
  auto clear = [&] {
    for (const Tensor* t : {&x, &w, &b}) t->grad().zero_();
  };
  const auto eager = read(step());
  clear();

  Tensor out;
  ferry::Graph graph(sim);
  graph.capture([&] { out = step(); });
  ASSERT_TRUE(graph.captured());
  graph.replay();
  EXPECT_EQ(read(out), eager) << "the replayed convolution differs from the eager one";

  // New input values in the same tensor: the replay computes with them (oneDNN runs at replay, not at capture).
  x.detach().mul_(2.0);
  clear();
  graph.replay();
  const auto replayed = read(out);
  clear();
  EXPECT_EQ(replayed, read(step())) << "the replay on new input values differs from an eager step on them";
  EXPECT_NE(replayed[0], eager[0]);
}

TEST(OnednnConv, NamesItsVersionAndKernels) {
  const std::string line = F::onednn_version();
  if (line.empty()) GTEST_SKIP() << "this build has no oneDNN";
  EXPECT_EQ(line.rfind("oneDNN ", 0), 0u) << line;
  EXPECT_NE(line.find(" kernels)"), std::string::npos) << line;
}
