// ferry/nn/loss.h — losses: cross-entropy (fused log-softmax + NLL, one backend call for the loss and its
// gradient) and mean squared error, as functions and as small callable classes. Not here: layers.
#pragma once

#include "ferry/tensor.h"

namespace ferry::nn {

enum class Reduction { None, Mean, Sum };

namespace functional {
// logits (N, C) float, target (N) int64 class indices -> loss () (Mean, Sum) or (N) (None).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean);
// input and target of one shape (target is not differentiated) -> () or the input's shape.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
}  // namespace functional

// Also reachable as nn::cross_entropy / nn::mse_loss.
using functional::cross_entropy;
using functional::mse_loss;

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(Reduction reduction = Reduction::Mean) : reduction_(reduction) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return functional::cross_entropy(logits, target, reduction_);
  }

 private:
  Reduction reduction_;
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
