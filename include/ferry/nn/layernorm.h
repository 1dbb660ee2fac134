// ferry/nn/layernorm.h — LayerNorm: each sample normalized over its last dims (the transformer's normalization),
// PyTorch's parameters, names and defaults. Not here: the maths (functional::layer_norm in ferry/nn/functional.h),
// BatchNorm (ferry/nn/batchnorm.h), which normalizes over the batch instead.
#pragma once

#include "ferry/nn/module.h"

namespace ferry::nn {

class LayerNorm : public Module {
 public:
  // weight (normalized_shape) = 1 and bias (normalized_shape) = 0 when elementwise_affine, as PyTorch.
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                     const TensorOptions& options = {});

  Tensor forward(const Tensor& input) override;  // (*, normalized_shape) -> the same shape
  std::string type_name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;

  Shape normalized_shape;
  double eps;
  Tensor weight, bias;  // undefined without elementwise_affine
};

}  // namespace ferry::nn
