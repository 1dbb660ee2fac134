// ferry/nn/conv.h — Conv2d (NCHW) and Conv1d (NCL) with stride, padding, dilation and groups, and their transposes
// ConvTranspose2d and ConvTranspose1d, in PyTorch's layout and initialisation. Not here: the maths
// (functional::conv2d: im2col + GEMM, and functional::conv_transpose2d, in ferry/nn/functional.h).
#pragma once

#include "ferry/nn/functional.h"
#include "ferry/nn/module.h"

namespace ferry::nn {

struct Conv2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  std::int64_t groups = 1;  // > 1: grouped (in and out channels divisible by it); = in_channels: depthwise
  bool bias = true;
};

class Conv2d : public Module {
 public:
  // weight (out, in / groups, kh, kw) ~ kaiming_uniform(a = sqrt(5)); bias (out) ~ U(-1/sqrt(fan_in),
  // 1/sqrt(fan_in)) with fan_in = in / groups * kh * kw. Drawn from ferry's generator on options.device.
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size, const Conv2dOptions& conv = {},
         const TensorOptions& options = {});

  Tensor forward(const Tensor& input) override;  // (N, in, H, W) -> (N, out, oh, ow)
  std::string type_name() const override { return "Conv2d"; }
  std::string extra_repr() const override;

  std::int64_t in_channels, out_channels;
  Size2 kernel_size;
  Conv2dOptions options;
  Tensor weight;  // (out, in / groups, kh, kw)
  Tensor bias;    // (out), undefined when options.bias = false
};

struct Conv1dOptions {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t dilation = 1;
  std::int64_t groups = 1;
  bool bias = true;
};

// Over sequences (audio, text features): functional::conv1d, which is conv2d on a height of 1.
class Conv1d : public Module {
 public:
  // weight (out, in / groups, k) and bias (out) initialised as Conv2d's (fan_in = in / groups * k).
  Conv1d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size, const Conv1dOptions& conv = {},
         const TensorOptions& options = {});

  Tensor forward(const Tensor& input) override;  // (N, in, L) -> (N, out, ol)
  std::string type_name() const override { return "Conv1d"; }
  std::string extra_repr() const override;

  std::int64_t in_channels, out_channels, kernel_size;
  Conv1dOptions options;
  Tensor weight;  // (out, in / groups, k)
  Tensor bias;    // (out), undefined when options.bias = false
};

struct ConvTranspose2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;         // taken off each side of the full output
  Size2 output_padding = 0;  // added to one side: picks the output size when stride > 1 (below stride or dilation)
  std::int64_t groups = 1;
  bool bias = true;
  Size2 dilation = 1;
};

// The learned upsampling of decoders, U-Nets and GAN generators: functional::conv_transpose2d, the adjoint of
// Conv2d. With kernel 4, stride 2, padding 1 it doubles H and W; kernel 2, stride 2 doubles them with no overlap.
class ConvTranspose2d : public Module {
 public:
  // weight (in, out / groups, kh, kw) ~ kaiming_uniform(a = sqrt(5)) and bias (out) ~ U(-1/sqrt(fan_in),
  // 1/sqrt(fan_in)), with PyTorch's fan_in = out / groups * kh * kw (the weight's dim 1 times its kernel).
  ConvTranspose2d(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size,
                  const ConvTranspose2dOptions& conv = {}, const TensorOptions& options = {});

  // (N, in, H, W) -> (N, out, oh, ow), oh = (H - 1) * stride - 2 * padding + dilation * (kh - 1) + output_padding + 1
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ConvTranspose2d"; }
  std::string extra_repr() const override;

  std::int64_t in_channels, out_channels;
  Size2 kernel_size;
  ConvTranspose2dOptions options;
  Tensor weight;  // (in, out / groups, kh, kw)
  Tensor bias;    // (out), undefined when options.bias = false
};

struct ConvTranspose1dOptions {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t output_padding = 0;
  std::int64_t groups = 1;
  bool bias = true;
  std::int64_t dilation = 1;
};

// functional::conv_transpose1d: ConvTranspose2d on a height of 1.
class ConvTranspose1d : public Module {
 public:
  // weight (in, out / groups, k) and bias (out) initialised as ConvTranspose2d's (fan_in = out / groups * k).
  ConvTranspose1d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size,
                  const ConvTranspose1dOptions& conv = {}, const TensorOptions& options = {});

  Tensor forward(const Tensor& input) override;  // (N, in, L) -> (N, out, ol)
  std::string type_name() const override { return "ConvTranspose1d"; }
  std::string extra_repr() const override;

  std::int64_t in_channels, out_channels, kernel_size;
  ConvTranspose1dOptions options;
  Tensor weight;  // (in, out / groups, k)
  Tensor bias;    // (out), undefined when options.bias = false
};

}  // namespace ferry::nn
