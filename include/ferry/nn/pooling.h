// ferry/nn/pooling.h — the spatial resampling layers (NCHW): MaxPool2d, AvgPool2d, AdaptiveAvgPool2d and
// AdaptiveMaxPool2d down, Upsample (nearest, bilinear) up; PyTorch's defaults (stride = kernel size, average counts
// the padding). Not here: the maths (functional::max_pool2d, avg_pool2d, adaptive_avg_pool2d, adaptive_max_pool2d,
// upsample_nearest2d, upsample_bilinear2d in ferry/nn/functional.h).
#pragma once

#include <string>

#include "ferry/nn/functional.h"
#include "ferry/nn/module.h"

namespace ferry::nn {

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0)
      : kernel_size(kernel_size), stride(stride == Size2(0) ? kernel_size : stride), padding(padding) {}
  Tensor forward(const Tensor& input) override;  // (N, C, H, W) -> (N, C, oh, ow)
  std::string type_name() const override { return "MaxPool2d"; }
  std::string extra_repr() const override;

  Size2 kernel_size, stride, padding;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size, Size2 stride = 0, Size2 padding = 0)
      : kernel_size(kernel_size), stride(stride == Size2(0) ? kernel_size : stride), padding(padding) {}
  Tensor forward(const Tensor& input) override;  // (N, C, H, W) -> (N, C, oh, ow)
  std::string type_name() const override { return "AvgPool2d"; }
  std::string extra_repr() const override;

  Size2 kernel_size, stride, padding;
};

// Averages down to output_size whatever the input's height and width (ResNet's global pooling before the
// classifier: AdaptiveAvgPool2d(1)).
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override;  // (N, C, H, W) -> (N, C, oh, ow); (C, H, W) -> (C, oh, ow)
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  std::string extra_repr() const override;

  Size2 output_size;
};

// The largest value of each adaptive window (functional::adaptive_max_pool2d): a fixed output size from any input.
class AdaptiveMaxPool2d : public Module {
 public:
  explicit AdaptiveMaxPool2d(Size2 output_size) : output_size(output_size) {}
  Tensor forward(const Tensor& input) override;  // (N, C, H, W) -> (N, C, oh, ow); (C, H, W) -> (C, oh, ow)
  std::string type_name() const override { return "AdaptiveMaxPool2d"; }
  std::string extra_repr() const override;

  Size2 output_size;
};

// Upsampling by whole factors (a U-Net's or GAN generator's way up): torch's nn.Upsample(scale_factor=s, mode=...,
// align_corners=...) with mode "nearest" (each value repeated) or "bilinear" (functional::upsample_bilinear2d).
// Other modes are NotSupported; align_corners only goes with "bilinear" (InvalidArgument otherwise, as torch).
class Upsample : public Module {
 public:
  explicit Upsample(Size2 scale_factor, std::string mode = "nearest", bool align_corners = false);
  Tensor forward(const Tensor& input) override;  // (N, C, H, W) -> (N, C, H sh, W sw)
  std::string type_name() const override { return "Upsample"; }
  std::string extra_repr() const override;  // "scale_factor=2.0, mode=nearest"

  Size2 scale_factor;
  std::string mode;
  bool align_corners;
};

}  // namespace ferry::nn
