// ferry/nn/linear.h — Linear: y = x W^T + b, PyTorch's layout and initialisation.
// Not here: the maths (functional::linear in ferry/nn/functional.h).
#pragma once

#include "ferry/nn/module.h"

namespace ferry::nn {

class Linear : public Module {
 public:
  // weight (out, in) ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)); bias (out) the same
  // bound. Drawn from ferry's generator on options.device (the same numbers on every device).
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true, const TensorOptions& options = {});

  Tensor forward(const Tensor& input) override;  // (*, in) -> (*, out)
  bool fuses_relu() const override { return true; }
  Tensor forward_relu(const Tensor& input) override;  // relu(forward(input)), bias and ReLU in one pass
  std::string type_name() const override { return "Linear"; }
  std::string extra_repr() const override;

  std::int64_t in_features, out_features;
  Tensor weight;  // (out, in)
  Tensor bias;    // (out), undefined when bias = false
};

}  // namespace ferry::nn
