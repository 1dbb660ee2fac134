// ferry/nn/batchnorm.h — BatchNorm1d and BatchNorm2d with PyTorch's train/eval behaviour: batch
// statistics and running-statistics updates in train(), running statistics in eval().
// Not here: the maths (functional::batch_norm in ferry/nn/functional.h).
#pragma once

#include <optional>

#include "ferry/nn/module.h"

namespace ferry::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;  // nullopt: cumulative moving average (1 / num_batches_tracked)
  bool affine = true;                    // learn weight (ones) and bias (zeros)
  bool track_running_stats = true;       // keep running_mean (zeros), running_var (ones), num_batches_tracked
};

// Shared by both: normalises over every dim but the channel dim 1.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  bool fuses_relu() const override { return true; }
  Tensor forward_relu(const Tensor& input) override;  // relu(forward(input)), the ReLU in place
  // max_pool2d(relu(forward(input)), 2, 2) as functional::batch_norm_relu_max_pool2d; 4-d inputs only.
  bool fuses_relu_max_pool() const override { return true; }
  Tensor forward_relu_max_pool(const Tensor& input) override;
  std::string extra_repr() const override;

  std::int64_t num_features;
  BatchNormOptions options;
  Tensor weight, bias;                                      // (C) parameters when affine
  Tensor running_mean, running_var, num_batches_tracked;  // (C), (C), () int64 buffers when tracking

 protected:
  BatchNorm(std::int64_t num_features, const BatchNormOptions& bn, const TensorOptions& options);
  virtual void check_input(const Tensor& input) const = 0;

 private:
  enum class Tail { None, ReLU, ReLUMaxPool };  // what runs after the normalisation, in the same layer
  Tensor run(const Tensor& input, Tail tail);
};

class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(std::int64_t num_features, const BatchNormOptions& bn = {}, const TensorOptions& options = {})
      : BatchNorm(num_features, bn, options) {}
  std::string type_name() const override { return "BatchNorm1d"; }

 protected:
  void check_input(const Tensor& input) const override;  // (N, C) or (N, C, L)
};

class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(std::int64_t num_features, const BatchNormOptions& bn = {}, const TensorOptions& options = {})
      : BatchNorm(num_features, bn, options) {}
  std::string type_name() const override { return "BatchNorm2d"; }

 protected:
  void check_input(const Tensor& input) const override;  // (N, C, H, W)
};

}  // namespace ferry::nn
