// ferry/nn/distance.h — norms, similarities and distances of vectors along one dimension, PyTorch's:
// F.normalize, F.cosine_similarity, F.pairwise_distance (and torch.linalg.vector_norm along one dim) as functions,
// CosineSimilarity and PairwiseDistance as layers. Composed of tensor ops (vector_norm records its own backward),
// so they run on every device and autograd differentiates them. Not here: the losses built on them (ferry/nn/loss.h).
#pragma once

#include <string>

#include "ferry/nn/module.h"
#include "ferry/tensor.h"

namespace ferry::nn::functional {

// The p-norm of each vector along `dim`: (sum |x|^p)^(1/p); p = infinity: max |x|. p > 0. Its gradient is 0 where
// the norm is 0 (a subgradient, as PyTorch's; the composed form would give NaN there).
Tensor vector_norm(const Tensor& input, double p, int dim, bool keepdim = false);
// input / max(||input||_p along dim, eps): each vector scaled to norm 1 (a zero vector stays 0). The input's shape.
Tensor normalize(const Tensor& input, double p = 2, int dim = 1, double eps = 1e-12);
// sum over dim of (x1 / max(||x1||, eps)) (x2 / max(||x2||, eps)): the cosine of the angle between the vectors, in
// [-1, 1]. x1 and x2 broadcast ((3, 1, 6) with (1, 4, 6) along -1 -> (3, 4)); dim is dropped from the result.
Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int dim = 1, double eps = 1e-8);
// ||x1 - x2 + eps||_p along the last dim (PyTorch adds eps to the difference, so equal vectors are at a small
// positive distance and the gradient stays finite). x1 and x2 broadcast; keepdim keeps the last dim as 1.
Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p = 2, double eps = 1e-6, bool keepdim = false);

}  // namespace ferry::nn::functional

namespace ferry::nn {

// Two-input layers: forward(x1, x2). The one-input forward of Module throws InvalidArgument saying so.
class CosineSimilarity : public Module {
 public:
  explicit CosineSimilarity(int dim = 1, double eps = 1e-8) : dim(dim), eps(eps) {}
  Tensor forward(const Tensor& x1, const Tensor& x2) const;
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "CosineSimilarity"; }

  int dim;
  double eps;
};

class PairwiseDistance : public Module {
 public:
  explicit PairwiseDistance(double p = 2, double eps = 1e-6, bool keepdim = false) : p(p), eps(eps), keepdim(keepdim) {}
  Tensor forward(const Tensor& x1, const Tensor& x2) const;
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "PairwiseDistance"; }

  double p, eps;
  bool keepdim;
};

}  // namespace ferry::nn
