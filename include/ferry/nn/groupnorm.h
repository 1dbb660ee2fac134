// ferry/nn/groupnorm.h — GroupNorm: each sample's channels split into groups, each group normalized over its
// channels and positions together (batch-size independent, so it works at batch 1 where BatchNorm cannot), then a
// per-channel affine; PyTorch's parameters, names and defaults. Not here: the maths (functional::group_norm in
// ferry/nn/functional.h).
#pragma once

#include <cstdint>

#include "ferry/nn/module.h"

namespace ferry::nn {

class GroupNorm : public Module {
 public:
  // num_channels must divide into num_groups; weight (num_channels) = 1 and bias (num_channels) = 0 when affine.
  GroupNorm(std::int64_t num_groups, std::int64_t num_channels, double eps = 1e-5, bool affine = true,
            const TensorOptions& options = {});

  Tensor forward(const Tensor& input) override;  // (N, C, *) -> the same shape
  std::string type_name() const override { return "GroupNorm"; }
  std::string extra_repr() const override;  // "2, 6, eps=1e-05, affine=True"

  std::int64_t num_groups, num_channels;
  double eps;
  Tensor weight, bias;  // undefined without affine
};

}  // namespace ferry::nn
