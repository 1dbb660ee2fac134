// loss.cpp — cross_entropy (the backend's fused log-softmax + NLL gives each row's loss and the gradient
// in one call) and mse_loss (composed from tensor ops). Not here: layers (functional.cpp).
#include "ferry/nn/loss.h"

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/factories.h"
#include "ferry/ops.h"

namespace ferry::nn::functional {

Tensor cross_entropy(const Tensor& logits, const Tensor& target_in, Reduction reduction) {
  check_same_device("cross_entropy", {&logits, &target_in});
  FERRY_CHECK(is_floating(logits.dtype()), DTypeMismatch, "cross_entropy: expected float32 or float64 logits, got ",
              dtype_name(logits.dtype()));
  FERRY_CHECK(target_in.dtype() == DType::Int64 || target_in.dtype() == DType::Int32, DTypeMismatch,
              "cross_entropy: expected int64 class indices as target, got ", dtype_name(target_in.dtype()));
  FERRY_CHECK(logits.dim() == 2, ShapeMismatch, "cross_entropy: expected logits (N, C), got shape ",
              shape_str(logits.shape()));
  FERRY_CHECK(target_in.dim() == 1 && target_in.size(0) == logits.size(0), ShapeMismatch,
              "cross_entropy: expected target (", logits.size(0), ") for logits ", shape_str(logits.shape()),
              ", got shape ", shape_str(target_in.shape()));
  FERRY_CHECK(logits.size(1) > 0, ShapeMismatch, "cross_entropy: logits ", shape_str(logits.shape()), " have no classes");

  const std::int64_t rows = logits.size(0);
  const Tensor x = logits.detach().contiguous();                    // (N, C)
  const Tensor target = target_in.to(DType::Int64).contiguous();  // (N)
  const bool want_grad = autograd::needs_grad({&logits});
  const double grad_scale = reduction == Reduction::Mean ? 1.0 / static_cast<double>(rows) : 1.0;
  Tensor loss_rows = empty({rows}, {.device = x.device(), .dtype = x.dtype()});  // (N)
  Tensor grad = want_grad ? empty(x.shape(), {.device = x.device(), .dtype = x.dtype()}) : Tensor();  // (N, C)
  if (rows > 0) {
    backend(x.device()).cross_entropy(ferry::detail::kernel_view(loss_rows),
                                      want_grad ? ferry::detail::kernel_view(grad) : KernelTensor{},
                                      ferry::detail::kernel_view(x), ferry::detail::kernel_view(target), grad_scale,
                                      ferry::detail::compute_stream(x.device()));
  }
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = reduction == Reduction::Mean ? mean(loss_rows) : reduction == Reduction::Sum ? sum(loss_rows) : loss_rows;
  }
  if (want_grad) {
    autograd::record("cross_entropy", {logits}, out, [grad, reduction](const Tensor& g) {
      // g is () for mean/sum, (N) for none; grad already holds the 1/N of the mean.
      return std::vector<Tensor>{mul(grad, reduction == Reduction::None ? g.unsqueeze(1) : g)};
    });
  }
  return out;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_same_device("mse_loss", {&input, &target});
  FERRY_CHECK(input.shape() == target.shape(), ShapeMismatch, "mse_loss: expected input and target of one shape, got ",
              shape_str(input.shape()), " and ", shape_str(target.shape()));
  const Tensor squared = square(sub(input, target));
  if (reduction == Reduction::Mean) return mean(squared);
  if (reduction == Reduction::Sum) return sum(squared);
  return squared;
}

}  // namespace ferry::nn::functional
