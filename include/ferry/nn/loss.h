// ferry/nn/loss.h — losses: cross-entropy (fused log-softmax + NLL, one backend call for the loss and its
// gradient), negative log-likelihood and mean squared error, as functions and as small callable classes.
// Not here: layers; softmax and log_softmax (ferry/ops.h).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "ferry/tensor.h"

namespace ferry::nn {

enum class Reduction { None, Mean, Sum };

// PyTorch's nll_loss options. The mean is weighted: sum_i w[t_i] * loss_i / sum_i w[t_i] over the rows not ignored
// (NaN when every row is ignored, as PyTorch).
struct NLLLossOptions {
  Reduction reduction = Reduction::Mean;
  Tensor weight{};                           // (C) floating, a weight per class; undefined: all 1
  // Rows whose target equals it add nothing to the loss, the mean's count or the gradient. Unset (ferry's default):
  // every target must be a class, 0 <= t < C. PyTorch's default is -100, so a PyTorch port that marks padding with
  // -100 passes {.ignore_index = -100}; ferry's default keeps cross_entropy one fused kernel that reads no target.
  std::optional<std::int64_t> ignore_index{};
};

// PyTorch's cross_entropy options with class-index targets: NLLLossOptions plus label smoothing, the loss against
// (1 - s) * onehot(t) + s / C. The defaults take the fused kernel; any other option composes log_softmax and nll.
struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  Tensor weight{};                           // (C) floating, a weight per class; undefined: all 1
  std::optional<std::int64_t> ignore_index{};  // as in NLLLossOptions
  double label_smoothing = 0;                // s in [0, 1]
};

namespace functional {
// logits (N, C) float, target (N) int64 (or int32) class indices -> loss () (Mean, Sum) or (N) (None).
// A target outside [0, C) (and not ignore_index) throws InvalidArgument (on a GPU at the next sync: it is
// found on the device).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean);
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options);
// log_probs (N, C) (e.g. log_softmax(logits, 1)), target (N) class indices -> -log_probs[i, t_i] per row, reduced.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& options = {});
// input and target of one shape (target is not differentiated) -> () or the input's shape.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
}  // namespace functional

// Also reachable as nn::cross_entropy / nn::mse_loss.
using functional::cross_entropy;
using functional::mse_loss;
using functional::nll_loss;

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(Reduction reduction = Reduction::Mean) : options_{.reduction = reduction} {}
  explicit CrossEntropyLoss(CrossEntropyOptions options) : options_(std::move(options)) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return functional::cross_entropy(logits, target, options_);
  }

 private:
  CrossEntropyOptions options_;
};

class NLLLoss {
 public:
  explicit NLLLoss(NLLLossOptions options = {}) : options_(std::move(options)) {}
  Tensor operator()(const Tensor& log_probs, const Tensor& target) const {
    return functional::nll_loss(log_probs, target, options_);
  }

 private:
  NLLLossOptions options_;
};

class MSELoss {
 public:
  explicit MSELoss(Reduction reduction = Reduction::Mean) : reduction_(reduction) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::mse_loss(input, target, reduction_);
  }

 private:
  Reduction reduction_;
};

}  // namespace ferry::nn
