// loss.cpp — cross_entropy (the backend's fused log-softmax + NLL gives each row's loss and the gradient
// in one call; weights, ignore_index and label smoothing compose log_softmax and nll_loss), nll_loss and mse_loss
// (composed from tensor ops). Not here: layers (functional.cpp).
#include "ferry/nn/loss.h"

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/factories.h"
#include "ferry/ops.h"

namespace ferry::nn::functional {

namespace {
// The checks cross_entropy and nll_loss share: input (N, C) floating with C > 0, target (N) int64 or int32, a
// weight (C) of the input's dtype class and device.
void check_class_loss(const char* op, const Tensor& input, const Tensor& target, const Tensor& weight) {
  check_same_device(op, {&input, &target, &weight});
  FERRY_CHECK(is_floating(input.dtype()), DTypeMismatch, op, ": expected float32 or float64 input, got ",
              dtype_name(input.dtype()));
  FERRY_CHECK(target.dtype() == DType::Int64 || target.dtype() == DType::Int32, DTypeMismatch, op,
              ": expected int64 class indices as target, got ", dtype_name(target.dtype()));
  FERRY_CHECK(input.dim() == 2, ShapeMismatch, op, ": expected input (N, C), got shape ", shape_str(input.shape()));
  FERRY_CHECK(target.dim() == 1 && target.size(0) == input.size(0), ShapeMismatch, op, ": expected target (",
              input.size(0), ") for input ", shape_str(input.shape()), ", got shape ", shape_str(target.shape()));
  FERRY_CHECK(input.size(1) > 0, ShapeMismatch, op, ": input ", shape_str(input.shape()), " has no classes");
  if (weight.defined()) {
    FERRY_CHECK(is_floating(weight.dtype()), DTypeMismatch, op, ": expected a floating point weight, got ",
                dtype_name(weight.dtype()));
    FERRY_CHECK(weight.dim() == 1 && weight.size(0) == input.size(1), ShapeMismatch, op, ": expected a weight (",
                input.size(1), ") for ", input.size(1), " classes, got shape ", shape_str(weight.shape()));
  }
}

// The rows' losses w[t_i] * ((1 - s) * -log_probs[i, t_i] + s / C * sum_c w[c] / w[t_i] * -log_probs[i, c]) as
// PyTorch writes them (the smoothing term weighs each class by its own weight), 0 on ignored rows, reduced; the mean
// divides by the summed weights of the rows kept. All tensor ops on the input's device: no value is read back.
Tensor class_loss(const char* op, const Tensor& log_probs, const Tensor& target_in, const Tensor& weight_in,
                  std::optional<std::int64_t> ignore_index, double smoothing, Reduction reduction) {
  const std::int64_t classes = log_probs.size(1);
  const TensorOptions like{.device = log_probs.device(), .dtype = log_probs.dtype()};
  Tensor target = target_in.to(DType::Int64);                                      // (N)
  Tensor kept;                                                                     // (N) 1 or 0; undefined: all 1
  if (ignore_index) {
    const Tensor keep = ne(target, static_cast<double>(*ignore_index));
    kept = keep.to(log_probs.dtype());
    target = where(keep, target, zeros({}, {.device = target.device(), .dtype = DType::Int64}));
  }
  const Tensor weight = weight_in.defined() ? weight_in.to(log_probs.dtype()) : ones({classes}, like);  // (C)
  Tensor row_weight;  // (N): w[t_i]; index_select checks each target against C
  try {
    row_weight = index_select(weight, 0, target);
  } catch (const InvalidArgument& e) {  // found on the host (cpu, sim); a GPU reports it at its next sync
    throw InvalidArgument(ferry::detail::concat(op, ": a target is out of bounds for ", classes, " classes (",
                                                e.what(), ")"));
  }
  if (kept.defined()) row_weight = mul(row_weight, kept);
  const Tensor onehot =
      eq(target.unsqueeze(1), arange(classes, {.device = target.device()}).unsqueeze(0)).to(log_probs.dtype());
  Tensor rows = neg(mul(sum(mul(log_probs, onehot), {1}), row_weight));  // (N): -w[t_i] * log_probs[i, t_i]
  if (smoothing > 0) {
    Tensor smooth = neg(sum(mul(log_probs, weight.unsqueeze(0)), {1}));  // (N): -sum_c w[c] * log_probs[i, c]
    if (kept.defined()) smooth = mul(smooth, kept);
    rows = add(mul(rows, 1 - smoothing), mul(smooth, smoothing / static_cast<double>(classes)));
  }
  if (reduction == Reduction::None) return rows;
  if (reduction == Reduction::Sum) return sum(rows);
  return div(sum(rows), sum(row_weight));
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target_in, Reduction reduction) {
  check_class_loss("cross_entropy", logits, target_in, Tensor());

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

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  FERRY_CHECK(options.label_smoothing >= 0 && options.label_smoothing <= 1, InvalidArgument,
              "cross_entropy: label_smoothing must be between 0.0 and 1.0, got ", options.label_smoothing);
  if (!options.weight.defined() && !options.ignore_index && options.label_smoothing == 0)
    return cross_entropy(logits, target, options.reduction);
  check_class_loss("cross_entropy", logits, target, options.weight);
  return class_loss("cross_entropy", log_softmax(logits, 1), target, options.weight, options.ignore_index,
                    options.label_smoothing, options.reduction);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& options) {
  check_class_loss("nll_loss", log_probs, target, options.weight);
  return class_loss("nll_loss", log_probs, target, options.weight, options.ignore_index, 0, options.reduction);
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
