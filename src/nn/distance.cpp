// distance.cpp — vector_norm, normalize, cosine_similarity, pairwise_distance and their layers, composed of tensor
// ops on the inputs' device; each checked against PyTorch 1.13 fixtures (tests/test_nn_parity.cpp).
#include "ferry/nn/distance.h"

#include <cmath>

#include "checks.h"
#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ops.h"

namespace ferry::nn::functional {

Tensor vector_norm(const Tensor& input, double p, int dim, bool keepdim) {
  check_floating("vector_norm", input);
  FERRY_CHECK(p > 0, InvalidArgument, "vector_norm: p must be positive (or infinity), got ", p);
  FERRY_CHECK(input.dim() > 0 && dim >= -input.dim() && dim < input.dim(), InvalidArgument, "vector_norm: dim ", dim,
              " is out of range for a tensor of shape ", shape_str(input.shape()));
  if (p == 2) return norm(input, {dim}, keepdim);
  if (p == 1) return sum(abs(input), {dim}, keepdim);  // abs's gradient, sign(x), is 0 at 0
  if (std::isinf(p)) return amax(abs(input), {dim}, keepdim);
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = pow(sum(pow(abs(input), p), {dim}, keepdim), 1.0 / p);
  }
  if (autograd::needs_grad({&input})) {
    // d||x||_p / dx = sign(x) |x|^(p-1) / ||x||_p^(p-1); 0 where the norm is 0
    const int d = dim < 0 ? dim + input.dim() : dim;
    autograd::record("vector_norm", {input}, out,
                     [x = input.detach(), n = out.detach(), p, d, keepdim](const Tensor& g) {
                       const Tensor n_kept = keepdim ? n : n.unsqueeze(d);
                       const Tensor g_kept = keepdim ? g : g.unsqueeze(d);
                       const Tensor scale = where(eq(n_kept, 0.0), zeros({}, {.device = x.device(), .dtype = x.dtype()}),
                                                  div(g_kept, pow(n_kept, p - 1)));
                       return std::vector<Tensor>{mul(mul(sign(x), pow(abs(x), p - 1)), scale)};
                     },
                     autograd::Saved::InputsAndOutput);
  }
  return out;
}

Tensor normalize(const Tensor& input, double p, int dim, double eps) {
  return div(input, clamp(vector_norm(input, p, dim, true), eps));
}

Tensor cosine_similarity(const Tensor& x1, const Tensor& x2, int dim, double eps) {
  check_same_device("cosine_similarity", {&x1, &x2});
  check_floating("cosine_similarity", x1, "x1");
  check_floating("cosine_similarity", x2, "x2");
  const Shape shape = broadcast_shapes("cosine_similarity", x1.shape(), x2.shape());
  const Tensor a = x1.expand(shape), b = x2.expand(shape);
  const Tensor unit_a = div(a, clamp(vector_norm(a, 2, dim, true), eps));
  const Tensor unit_b = div(b, clamp(vector_norm(b, 2, dim, true), eps));
  return sum(mul(unit_a, unit_b), {dim});
}

Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p, double eps, bool keepdim) {
  check_same_device("pairwise_distance", {&x1, &x2});
  check_floating("pairwise_distance", x1, "x1");
  check_floating("pairwise_distance", x2, "x2");
  return vector_norm(add(sub(x1, x2), eps), p, -1, keepdim);
}

}  // namespace ferry::nn::functional

namespace ferry::nn {

Tensor CosineSimilarity::forward(const Tensor& x1, const Tensor& x2) const {
  return functional::cosine_similarity(x1, x2, dim, eps);
}
Tensor CosineSimilarity::forward(const Tensor&) {
  throw InvalidArgument("CosineSimilarity compares two tensors: call forward(x1, x2)");
}

Tensor PairwiseDistance::forward(const Tensor& x1, const Tensor& x2) const {
  return functional::pairwise_distance(x1, x2, p, eps, keepdim);
}
Tensor PairwiseDistance::forward(const Tensor&) {
  throw InvalidArgument("PairwiseDistance compares two tensors: call forward(x1, x2)");
}

}  // namespace ferry::nn
