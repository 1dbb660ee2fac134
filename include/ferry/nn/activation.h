// ferry/nn/activation.h — the layers without parameters between the others: ReLU, GELU, SiLU, Sigmoid, Tanh,
// LeakyReLU, Softmax, LogSoftmax, Flatten, Dropout.
// Not here: pooling (ferry/nn/pooling.h).
#pragma once

#include <string>

#include "ferry/nn/module.h"

namespace ferry::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override;  // any shape
  std::string type_name() const override { return "ReLU"; }
};

// functional::gelu (ferry/nn/functional.h): exact (erf) by default, or approximate = "tanh".
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "GELU"; }
  std::string extra_repr() const override;

  std::string approximate;
};

class SiLU : public Module {  // x sigmoid(x), also called swish
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "SiLU"; }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Sigmoid"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Tanh"; }
};

class LeakyReLU : public Module {  // x where x > 0, else negative_slope x
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "LeakyReLU"; }
  std::string extra_repr() const override;

  double negative_slope;
};

class Softplus : public Module {  // log(1 + e^(beta x)) / beta; x where beta x > threshold
 public:
  explicit Softplus(double beta = 1, double threshold = 20);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Softplus"; }
  std::string extra_repr() const override;

  double beta;
  double threshold;
};

// softmax(input, dim) and log_softmax(input, dim) (ferry/ops.h) as layers, e.g. a classifier's last layer when
// it should give probabilities. For training, prefer logits and cross_entropy (one fused kernel).
class Softmax : public Module {
 public:
  explicit Softmax(int dim) : dim(dim) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Softmax"; }
  std::string extra_repr() const override;

  int dim;
};

class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int dim) : dim(dim) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "LogSoftmax"; }
  std::string extra_repr() const override;

  int dim;
};

// The input itself: a placeholder where a model's structure wants a layer (a skipped block, a removed head).
class Identity : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input; }
  std::string type_name() const override { return "Identity"; }
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

// Channel dropout (functional::dropout2d / dropout1d): in train(), each whole channel of each sample is zeroed with
// probability p and the rest scaled by 1/(1-p) (neighbouring pixels are correlated, so dropping single ones does
// little); in eval(), the identity. Dropout2d takes (N, C, H, W); Dropout1d (N, C, L) or (C, L).
class Dropout2d : public Module {
 public:
  explicit Dropout2d(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Dropout2d"; }
  std::string extra_repr() const override;

  double p;
};

class Dropout1d : public Module {
 public:
  explicit Dropout1d(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Dropout1d"; }
  std::string extra_repr() const override;

  double p;
};

}  // namespace ferry::nn
