// multinomial.cpp — torch.multinomial (ferry/ops.h), composed from cumsum, rand, le and sum (with replacement) or
// from rand, log and topk (without: the Gumbel top-k), so every device draws the same indices with no host read.
// A file of its own: it needs cumsum (gather.cpp) and topk (sort.cpp), which the fuzz targets' subset of the core
// (fuzz/CMakeLists.txt) leaves out.
#include <limits>

#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "internal.h"

namespace ferry {

Tensor multinomial(const Tensor& probs, std::int64_t num_samples, bool replacement) {
  FERRY_CHECK(probs.dim() == 1 || probs.dim() == 2, ShapeMismatch, "multinomial: prob_dist must be 1 or 2 dim, got ",
              shape_str(probs.shape()));
  FERRY_CHECK(is_floating(probs.dtype()), DTypeMismatch, "multinomial: only floating-point dtypes are supported for "
              "prob_dist, got ", dtype_name(probs.dtype()));
  const std::int64_t n = probs.size(-1);
  FERRY_CHECK(n >= 1, InvalidArgument, "multinomial: prob_dist has no categories");
  FERRY_CHECK(num_samples >= 1, InvalidArgument, "multinomial: cannot sample ", num_samples, " (<= 0) samples");
  FERRY_CHECK(replacement || num_samples <= n, InvalidArgument,
              "multinomial: cannot sample n_sample > prob_dist.size(-1) samples without replacement (", num_samples,
              " > ", n, ")");
  autograd::NoGradGuard no_grad;
  const Tensor p = probs.dim() == 1 ? probs.detach().unsqueeze(0) : probs.detach();  // (rows, n)
  const std::int64_t rows = p.size(0);
  const TensorOptions like{.device = p.device(), .dtype = p.dtype()};
  Tensor picked;  // (rows, num_samples) int64
  if (replacement) {
    // The index of a uniform point of [0, total): how many running sums lie at or below it (a zero weight never
    // wins: its running sum equals the one before it).
    const Tensor running = cumsum(p, 1);                                                     // (rows, n)
    const Tensor points = mul(rand({rows, num_samples}, like), running.narrow(1, n - 1, 1));  // (rows, k)
    const Tensor below = le(running.unsqueeze(1), points.unsqueeze(2));                 // (rows, k, n)
    picked = clamp(sum(below, {2}), std::nullopt, static_cast<double>(n - 1));
  } else {
    // Gumbel top-k: the k largest keys log p - log(-log u) are a draw without replacement (zero weights: -inf).
    const Tensor u = clamp(rand({rows, n}, like), std::numeric_limits<float>::min(), std::nullopt);  // no log(0)
    const Tensor keys = sub(log(p), log(neg(log(u))));
    picked = topk(keys, num_samples, 1).second;
  }
  return probs.dim() == 1 ? picked.squeeze(0) : picked;
}

}  // namespace ferry
