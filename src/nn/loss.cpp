// loss.cpp — cross_entropy (the backend's fused log-softmax + NLL gives each row's loss and the gradient
// in one call; weights, ignore_index and label smoothing compose log_softmax and nll_loss), nll_loss, and the
// elementwise losses mse, l1, smooth_l1, huber, binary_cross_entropy and its logits form, kl_div, and the losses
// over pairs and triplets of vectors (cosine_embedding, triplet_margin), all composed from tensor ops. Not here:
// layers (functional.cpp).
#include "ferry/nn/loss.h"

#include "../core/internal.h"
#include "../core/ready_event.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/factories.h"
#include "ferry/nn/distance.h"
#include "ferry/nn/functional.h"
#include "ferry/ops.h"

namespace ferry::nn::functional {

namespace {
// A loss reduced to one number, marked ready (core/ready_event.h): on an accelerator, item() of it waits for the
// loss's own kernels, not for the backward pass and update queued after them.
Tensor marked(Tensor loss) {
  ferry::detail::mark_ready(loss);
  return loss;
}

// The checks cross_entropy and nll_loss share: input (N, C) floating with C > 0, target (N) int64 or int32, a
// weight (C) of the input's dtype class and device.
void check_class_loss(const char* op, const Tensor& input, const Tensor& target, const Tensor& weight) {
  check_same_device(op, {&input, &target, &weight});
  FERRY_CHECK(is_floating(input.dtype()), DTypeMismatch, op, ": expected float32 or float64 input, got ",
              dtype_name(input.dtype()));
  if (is_storage_only(input.dtype())) throw_storage_only(input.dtype(), op);
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
  Tensor keep, kept;  // (N) bool, and as 1 or 0 in the input's dtype; undefined: all kept
  if (ignore_index) {
    keep = ne(target, static_cast<double>(*ignore_index));
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
  // The target's log-probability picked out (a product with a one-hot row would make 0 * -inf = NaN of any class
  // whose probability is 0); an ignored row's terms chosen away, not multiplied by 0, for the same reason.
  const Tensor picked = gather(log_probs, 1, target.unsqueeze(1)).squeeze(1);  // (N): log_probs[i, t_i]
  const auto drop_ignored = [&](const Tensor& t) {
    return keep.defined() ? where(keep, t, zeros({}, like)) : t;
  };
  Tensor rows = drop_ignored(neg(mul(picked, row_weight)));  // (N): -w[t_i] * log_probs[i, t_i]
  if (smoothing > 0) {
    // (N): -sum_c w[c] * log_probs[i, c]
    const Tensor smooth = drop_ignored(neg(sum(mul(log_probs, weight.unsqueeze(0)), {1})));
    rows = add(mul(rows, 1 - smoothing), mul(smooth, smoothing / static_cast<double>(classes)));
  }
  if (reduction == Reduction::None) return rows;
  if (reduction == Reduction::Sum) return marked(sum(rows));
  return marked(div(sum(rows), sum(row_weight)));
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
  return reduction == Reduction::None ? out : marked(out);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  FERRY_CHECK(options.label_smoothing >= 0 && options.label_smoothing <= 1, InvalidArgument,
              "cross_entropy: label_smoothing must be between 0.0 and 1.0, got ", options.label_smoothing);
  if (!options.weight.defined() && !options.ignore_index && options.label_smoothing == 0)
    return cross_entropy(logits, target, options.reduction);
  check_class_loss("cross_entropy", logits, target, options.weight);
  return class_loss("cross_entropy", ferry::log_softmax(logits, 1), target, options.weight, options.ignore_index,
                    options.label_smoothing, options.reduction);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& options) {
  check_class_loss("nll_loss", log_probs, target, options.weight);
  return class_loss("nll_loss", log_probs, target, options.weight, options.ignore_index, 0, options.reduction);
}

namespace {
Tensor reduce(const Tensor& loss, Reduction reduction) {
  if (reduction == Reduction::Mean) return marked(mean(loss));
  if (reduction == Reduction::Sum) return marked(sum(loss));
  return loss;
}

// The checks of the elementwise losses: one device, one shape, floating input.
void check_pair(const char* op, const Tensor& input, const Tensor& target) {
  check_same_device(op, {&input, &target});
  FERRY_CHECK(is_floating(input.dtype()), DTypeMismatch, op, ": expected a float32 or float64 input, got ",
              dtype_name(input.dtype()));
  if (is_storage_only(input.dtype())) throw_storage_only(input.dtype(), op);
  FERRY_CHECK(input.shape() == target.shape(), ShapeMismatch, op, ": expected input and target of one shape, got ",
              shape_str(input.shape()), " and ", shape_str(target.shape()));
}

// Per element of d = input - target: 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, times `scale` (huber's
// delta; smooth_l1's 1). PyTorch's gradient for the input, -1 times it for the target: scale where d > beta,
// -scale where d < -beta, else scale d / beta (finite at infinite d and NaN at NaN, where the composition's gave
// 0 * inf and 0).
Tensor smooth_l1(const Tensor& input, const Tensor& target, double beta, double scale) {
  const Tensor d = sub(input.detach(), target.detach());
  Tensor loss;
  {
    autograd::NoGradGuard no_grad;
    const Tensor magnitude = abs(d);
    loss = mul(where(lt(magnitude, beta), mul(square(d), 0.5 / beta), sub(magnitude, 0.5 * beta)), scale);
  }
  if (autograd::needs_grad({&input, &target})) {
    autograd::record("smooth_l1", {input, target}, loss, [d, beta, scale](const Tensor& g) {
      const TensorOptions like{.device = d.device(), .dtype = d.dtype()};
      const Tensor slope = where(gt(d, beta), full({}, scale, like),
                                 where(lt(d, -beta), full({}, -scale, like), mul(d, scale / beta)));
      const Tensor gi = mul(g, slope);
      return std::vector<Tensor>{gi, neg(gi)};
    }, autograd::Saved::Inputs);
  }
  return loss;
}
}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_same_device("mse_loss", {&input, &target});
  FERRY_CHECK(input.shape() == target.shape(), ShapeMismatch, "mse_loss: expected input and target of one shape, got ",
              shape_str(input.shape()), " and ", shape_str(target.shape()));
  return reduce(square(sub(input, target)), reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_pair("l1_loss", input, target);
  return reduce(abs(sub(input, target)), reduction);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  check_pair("smooth_l1_loss", input, target);
  FERRY_CHECK(beta >= 0, InvalidArgument, "smooth_l1_loss: beta must be non-negative, got ", beta);
  if (beta == 0) return reduce(abs(sub(input, target)), reduction);  // l1
  return reduce(smooth_l1(input, target, beta, 1.0), reduction);
}

Tensor huber_loss(const Tensor& input, const Tensor& target, Reduction reduction, double delta) {
  check_pair("huber_loss", input, target);
  FERRY_CHECK(delta > 0, InvalidArgument, "huber_loss: delta must be positive, got ", delta);
  return reduce(smooth_l1(input, target, delta, delta), reduction);
}

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const BCELossOptions& options) {
  check_pair("binary_cross_entropy", input, target);
  check_same_device("binary_cross_entropy", {&input, &options.weight});
  // -(t log p + (1 - t) log(1 - p)), each log at least -100 (PyTorch's clamp)
  Tensor loss;
  {
    autograd::NoGradGuard no_grad;
    const Tensor log_p = clamp(log(input), -100.0), log_q = clamp(log(rsub(input, 1.0)), -100.0);
    loss = neg(add(mul(target, log_p), mul(rsub(target, 1.0), log_q)));
  }
  if (autograd::needs_grad({&input, &target})) {
    // PyTorch's gradients: (p - t) / max(p (1 - p), 1e-12) for p, finite at p = 0 and 1 where the composition's
    // are 0 * inf = NaN; log(1 - p) - log(p) for t, with the forward's clamped logs.
    autograd::record("binary_cross_entropy", {input, target}, loss,
                     [p = input.detach(), t = target.detach(), rp = input.requires_grad(),
                      rt = target.requires_grad()](const Tensor& g) {
      Tensor gp, gt;
      if (rp) gp = mul(g, div(sub(p, t), clamp(mul(p, rsub(p, 1.0)), 1e-12)));
      if (rt) gt = mul(g, sub(clamp(log(rsub(p, 1.0)), -100.0), clamp(log(p), -100.0)));
      return std::vector<Tensor>{gp, gt};
    }, autograd::Saved::Inputs);
  }
  if (options.weight.defined()) loss = mul(loss, options.weight);
  return reduce(loss, options.reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        const BCEWithLogitsOptions& options) {
  check_pair("binary_cross_entropy_with_logits", logits, target);
  check_same_device("binary_cross_entropy_with_logits", {&logits, &options.weight, &options.pos_weight});
  // -log sigmoid(x) = softplus(-x), never exp of a large number; its gradient -sigmoid(-x) is -0.5 at x = 0, where
  // log(1 + exp(-|x|)) + max(-x, 0) has a corner on each term.
  const Tensor softplus_neg = softplus(neg(logits));
  const Tensor log_weight =
      options.pos_weight.defined() ? add(mul(sub(options.pos_weight, 1.0), target), 1.0) : Tensor();
  Tensor loss = add(mul(rsub(target, 1.0), logits), log_weight.defined() ? mul(log_weight, softplus_neg) : softplus_neg);
  if (options.weight.defined()) loss = mul(loss, options.weight);
  return reduce(loss, options.reduction);
}

Tensor kl_div(const Tensor& input, const Tensor& target, const KLDivOptions& options) {
  check_pair("kl_div", input, target);
  // target (log target - input); with probabilities, 0 where target = 0 (PyTorch's xlogy)
  Tensor loss;
  if (options.log_target) {
    loss = mul(exp(target), sub(target, input));
  } else {
    const Tensor zero = zeros({}, {.device = target.device(), .dtype = target.dtype()});
    loss = sub(where(eq(target, 0.0), zero, mul(target, log(target))), mul(target, input));
  }
  switch (options.reduction) {
    case KLDivReduction::None: return loss;
    case KLDivReduction::Sum: return marked(sum(loss));
    case KLDivReduction::Mean: return marked(mean(loss));
    case KLDivReduction::BatchMean:
      return marked(input.dim() == 0 ? sum(loss) : div(sum(loss), static_cast<double>(input.size(0))));
  }
  return loss;
}

namespace {
// The checks of the losses over rows of vectors: x (N, D) or (D) each, one device, floating.
void check_rows(const char* op, std::initializer_list<const Tensor*> rows) {
  check_same_device(op, rows);
  const Tensor& first = **rows.begin();
  for (const Tensor* t : rows) {
    FERRY_CHECK(is_floating(t->dtype()), DTypeMismatch, op, ": expected float32 or float64 inputs, got ",
                dtype_name(t->dtype()));
    if (is_storage_only(t->dtype())) throw_storage_only(t->dtype(), op);
    FERRY_CHECK(t->shape() == first.shape() && (t->dim() == 1 || t->dim() == 2), ShapeMismatch, op,
                ": expected inputs of one shape, (N, D) or (D), got ", shape_str(first.shape()), " and ",
                shape_str(t->shape()));
  }
}
}  // namespace

Tensor cosine_embedding_loss(const Tensor& x1, const Tensor& x2, const Tensor& target,
                             const CosineEmbeddingOptions& options) {
  check_rows("cosine_embedding_loss", {&x1, &x2});
  check_same_device("cosine_embedding_loss", {&x1, &target});
  const int d = x1.dim() - 1;
  FERRY_CHECK(target.dim() == d && (d == 0 || target.size(0) == x1.size(0)), ShapeMismatch,
              "cosine_embedding_loss: expected a target of shape ", shape_str(d == 0 ? Shape{} : Shape{x1.size(0)}),
              " (one 1 or -1 per row), got ", shape_str(target.shape()));
  constexpr double kEpsilon = 1e-12;  // PyTorch's, added to each squared norm
  const Tensor dot = sum(mul(x1, x2), {d});
  const Tensor denominator = sqrt(mul(add(sum(square(x1), {d}), kEpsilon), add(sum(square(x2), {d}), kEpsilon)));
  const Tensor cos = div(dot, denominator);
  const Tensor zero = zeros({}, {.device = cos.device(), .dtype = cos.dtype()});
  const Tensor loss = add(where(eq(target, 1.0), rsub(cos, 1.0), zero),
                          where(eq(target, -1.0), clamp(sub(cos, options.margin), 0.0), zero));
  return reduce(loss, options.reduction);
}

Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           const TripletMarginOptions& options) {
  check_rows("triplet_margin_loss", {&anchor, &positive, &negative});
  FERRY_CHECK(options.margin > 0, InvalidArgument, "triplet_margin_loss: margin must be positive, got ",
              options.margin);
  const Tensor d_positive = pairwise_distance(anchor, positive, options.p, options.eps);
  Tensor d_negative = pairwise_distance(anchor, negative, options.p, options.eps);
  if (options.swap) d_negative = minimum(d_negative, pairwise_distance(positive, negative, options.p, options.eps));
  return reduce(clamp(add(sub(d_positive, d_negative), options.margin), 0.0), options.reduction);
}

}  // namespace ferry::nn::functional
