// ferry/nn/loss.h — losses: cross-entropy (fused log-softmax + NLL, one backend call for the loss and its
// gradient), negative log-likelihood, mean squared error, L1, smooth L1, Huber, binary cross-entropy (on
// probabilities or, stably, on logits), KL divergence, and the embedding losses (cosine embedding, triplet margin),
// as functions and as small callable classes.
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

struct BCELossOptions {
  Reduction reduction = Reduction::Mean;
  Tensor weight{};  // broadcast to the input's shape: a weight per element (e.g. per class); undefined: all 1
};

// kl_div's reductions (libtorch's KLDivLossOptions): BatchMean is the sum over all elements divided by the batch
// size (the first dim), the KL divergence per sample; Mean divides by every element, as PyTorch's default does.
enum class KLDivReduction { None, BatchMean, Sum, Mean };

struct KLDivOptions {
  KLDivReduction reduction = KLDivReduction::Mean;
  bool log_target = false;  // the target holds log-probabilities
};

struct CosineEmbeddingOptions {
  double margin = 0;  // in [-1, 1]: a dissimilar pair (y = -1) costs max(0, cos - margin)
  Reduction reduction = Reduction::Mean;
};

struct TripletMarginOptions {
  double margin = 1.0;
  double p = 2;           // the norm of pairwise_distance
  double eps = 1e-6;      // pairwise_distance's
  bool swap = false;      // also measure the negative from the positive, and use the nearer (Balntas et al.)
  Reduction reduction = Reduction::Mean;
};

struct BCEWithLogitsOptions {
  Reduction reduction = Reduction::Mean;
  Tensor weight{};      // as BCELossOptions::weight
  Tensor pos_weight{};  // broadcast along the last dim (a weight per class) on the positive term; undefined: 1
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
// |input - target| per element, reduced. input and target of one shape (target is not differentiated).
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);
// Per element, d = input - target: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta 0: l1_loss).
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                      double beta = 1.0);
// Per element: 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta): smooth_l1_loss times delta (= beta).
Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean,
                  double delta = 1.0);
// probabilities in [0, 1] and targets in [0, 1] of one shape: -weight (t log p + (1 - t) log(1 - p)) per element,
// each log clamped at -100 as PyTorch (so p = 0 or 1 gives a finite loss), reduced.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const BCELossOptions& options = {});
// binary_cross_entropy(sigmoid(logits), target) without forming the sigmoid: (1 - t) x + l (log(1 + exp(-|x|)) +
// max(-x, 0)), l = 1 + (pos_weight - 1) t; finite for any logits.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        const BCEWithLogitsOptions& options = {});
// input (log-probabilities, e.g. log_softmax) and target (probabilities; log-probabilities with log_target) of one
// shape -> target (log target - input) per element (0 where target = 0), reduced: with BatchMean, KL(target ||
// exp(input)) per sample.
Tensor kl_div(const Tensor& input, const Tensor& target, const KLDivOptions& options = {});
// x1, x2 (N, D) or (D); target (N) or () of 1 (similar) and -1 (dissimilar) -> per row 1 - cos(x1, x2) for 1,
// max(0, cos(x1, x2) - margin) for -1 (cos with 1e-12 added to each squared norm, as PyTorch), reduced.
Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& target,
                             const CosineEmbeddingOptions& options = {});
// anchor, positive, negative (N, D) or (D) -> max(0, margin + d(a, p) - d(a, n)) per row, d =
// pairwise_distance(.., p, eps) (with swap, d(a, n) is min(d(a, n), d(p, n))), reduced.
Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           const TripletMarginOptions& options = {});
}  // namespace functional

// Also reachable as nn::cross_entropy, nn::mse_loss, ...
using functional::binary_cross_entropy;
using functional::binary_cross_entropy_with_logits;
using functional::cross_entropy;
using functional::cosine_embedding_loss;
using functional::huber_loss;
using functional::kl_div;
using functional::l1_loss;
using functional::mse_loss;
using functional::nll_loss;
using functional::smooth_l1_loss;
using functional::triplet_margin_loss;

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

class L1Loss {
 public:
  explicit L1Loss(Reduction reduction = Reduction::Mean) : reduction_(reduction) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::l1_loss(input, target, reduction_);
  }

 private:
  Reduction reduction_;
};

class SmoothL1Loss {
 public:
  explicit SmoothL1Loss(Reduction reduction = Reduction::Mean, double beta = 1.0) : reduction_(reduction), beta_(beta) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::smooth_l1_loss(input, target, reduction_, beta_);
  }

 private:
  Reduction reduction_;
  double beta_;
};

class HuberLoss {
 public:
  explicit HuberLoss(Reduction reduction = Reduction::Mean, double delta = 1.0) : reduction_(reduction), delta_(delta) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::huber_loss(input, target, reduction_, delta_);
  }

 private:
  Reduction reduction_;
  double delta_;
};

class BCELoss {
 public:
  explicit BCELoss(BCELossOptions options = {}) : options_(std::move(options)) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::binary_cross_entropy(input, target, options_);
  }

 private:
  BCELossOptions options_;
};

class BCEWithLogitsLoss {
 public:
  explicit BCEWithLogitsLoss(BCEWithLogitsOptions options = {}) : options_(std::move(options)) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return functional::binary_cross_entropy_with_logits(logits, target, options_);
  }

 private:
  BCEWithLogitsOptions options_;
};

class KLDivLoss {
 public:
  explicit KLDivLoss(KLDivOptions options = {}) : options_(options) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return functional::kl_div(input, target, options_);
  }

 private:
  KLDivOptions options_;
};

class CosineEmbeddingLoss {
 public:
  explicit CosineEmbeddingLoss(CosineEmbeddingOptions options = {}) : options_(options) {}
  Tensor operator()(const Tensor& x1, const Tensor& x2, const Tensor& target) const {
    return functional::cosine_embedding_loss(x1, x2, target, options_);
  }

 private:
  CosineEmbeddingOptions options_;
};

class TripletMarginLoss {
 public:
  explicit TripletMarginLoss(TripletMarginOptions options = {}) : options_(options) {}
  Tensor operator()(const Tensor& anchor, const Tensor& positive, const Tensor& negative) const {
    return functional::triplet_margin_loss(anchor, positive, negative, options_);
  }

 private:
  TripletMarginOptions options_;
};

}  // namespace ferry::nn
