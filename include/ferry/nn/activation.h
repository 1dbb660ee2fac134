// ferry/nn/activation.h — the layers without parameters between the others: ReLU, Flatten, Dropout.
// Not here: pooling (ferry/nn/pooling.h).
#pragma once

#include "ferry/nn/module.h"

namespace ferry::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;  // any shape
  std::string type_name() const override { return "ReLU"; }
};

// Flattens dims [start_dim, end_dim] into one: (N, C, H, W) -> (N, C*H*W) by default. A view when the
// input is contiguous.
class Flatten : public Module {
 public:
  explicit Flatten(int start_dim = 1, int end_dim = -1) : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Flatten"; }
  std::string extra_repr() const override;

  int start_dim, end_dim;
};

// In train(): zero each element with probability p and scale the rest by 1/(1-p), from ferry's
// counter-based generator (the same mask on every device for the same seed). In eval(): the identity.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Dropout"; }
  std::string extra_repr() const override;

  double p;
};

}  // namespace ferry::nn
