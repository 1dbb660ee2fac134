// ferry/nn/pooling.h — MaxPool2d and AvgPool2d (NCHW), PyTorch's defaults (stride = kernel size, average
// counts the padding). Not here: the maths (functional::max_pool2d / avg_pool2d in ferry/nn/functional.h).
#pragma once

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

}  // namespace ferry::nn
