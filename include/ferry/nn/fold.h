// ferry/nn/fold.h — Unfold and Fold, PyTorch's nn.Unfold / nn.Fold: an image's sliding blocks as columns, and
// columns summed back into an image. Not here: the maths (functional::unfold, functional::fold in
// ferry/nn/functional.h).
#pragma once

#include <string>

#include "ferry/nn/functional.h"
#include "ferry/nn/module.h"

namespace ferry::nn {

class Unfold : public Module {
 public:
  explicit Unfold(Size2 kernel_size, Size2 dilation = 1, Size2 padding = 0, Size2 stride = 1)
      : kernel_size(kernel_size), dilation(dilation), padding(padding), stride(stride) {}
  Tensor forward(const Tensor& input) override;  // (N, C, H, W) -> (N, C kh kw, L)
  std::string type_name() const override { return "Unfold"; }
  std::string extra_repr() const override;  // "kernel_size=3, dilation=1, padding=0, stride=1"

  Size2 kernel_size, dilation, padding, stride;
};

class Fold : public Module {
 public:
  Fold(Size2 output_size, Size2 kernel_size, Size2 dilation = 1, Size2 padding = 0, Size2 stride = 1)
      : output_size(output_size), kernel_size(kernel_size), dilation(dilation), padding(padding), stride(stride) {}
  Tensor forward(const Tensor& input) override;  // (N, C kh kw, L) -> (N, C, output_size)
  std::string type_name() const override { return "Fold"; }
  std::string extra_repr() const override;

  Size2 output_size, kernel_size, dilation, padding, stride;
};

}  // namespace ferry::nn
