// clip_grad.cpp — clip_grad_norm_ and clip_grad_value_ (ferry/nn/clip_grad.h): device ops only, so that a step
// that clips can be captured; the one optional read is error_if_nonfinite's.
#include "ferry/nn/clip_grad.h"

#include <cmath>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ops.h"

namespace ferry::nn::utils {

namespace {

// The defined gradients of `parameters`, checked: one device, floating dtypes.
std::vector<Tensor> gradients(const std::vector<Tensor>& parameters, const char* op) {
  std::vector<Tensor> grads;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    Tensor g = parameters[i].grad();
    if (!g.defined()) continue;
    FERRY_CHECK(is_floating(g.dtype()), InvalidArgument, op, ": the gradient of parameter ", i, " is ",
                dtype_name(g.dtype()), "; gradients are float32 or float64");
    FERRY_CHECK(grads.empty() || g.device() == grads.front().device(), InvalidArgument, op,
                ": the gradients are on more than one device (", grads.front().device().str(), " and ",
                g.device().str(), " for parameter ", i, "); clip each device's parameters on their own");
    grads.push_back(std::move(g));
  }
  return grads;
}

// The p-norm of one gradient, a 0-dim tensor on its device.
Tensor one_norm(const Tensor& g, double p) {
  if (std::isinf(p)) return max(abs(g));
  if (p == 2) return norm(g);
  if (p == 1) return sum(abs(g));
  return pow(sum(pow(abs(g), p)), 1.0 / p);
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  FERRY_CHECK(max_norm >= 0, InvalidArgument, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  FERRY_CHECK(norm_type > 0, InvalidArgument, "clip_grad_norm_: norm_type must be > 0 (2, 1, or kInfinityNorm for "
              "the largest element), got ", norm_type);
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> grads = gradients(parameters, "clip_grad_norm_");
  if (grads.empty()) return zeros({});
  std::vector<Tensor> norms;
  norms.reserve(grads.size());
  for (const Tensor& g : grads) norms.push_back(one_norm(g, norm_type).to(grads.front().dtype()));
  const Tensor total = one_norm(stack(norms), norm_type);
  if (error_if_nonfinite) {
    const double value = detail::host_copy(total, "clip_grad_norm_ (error_if_nonfinite)").item<double>();
    FERRY_CHECK(std::isfinite(value), Error, "clip_grad_norm_: the total ", norm_type, "-norm of the gradients of ",
                grads.size(), grads.size() == 1 ? " parameter is " : " parameters is ", value,
                "; the gradients are left as they were (error_if_nonfinite)");
  }
  // min(1, max_norm / (total + 1e-6)), on the device: no read, the same launches whether or not it clips.
  const Tensor scale = clamp(div(full({}, max_norm, {.device = total.device(), .dtype = total.dtype()}),
                                 add(total, 1e-6)),
                             std::nullopt, 1.0);
  for (const Tensor& g : grads) {
    Tensor target = g;
    target.mul_(scale.to(g.dtype()));
  }
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  FERRY_CHECK(clip_value >= 0, InvalidArgument, "clip_grad_value_: clip_value must be >= 0, got ", clip_value);
  autograd::NoGradGuard no_grad;
  for (const Tensor& g : gradients(parameters, "clip_grad_value_")) {
    Tensor target = g;
    target.copy_(clamp(g, -clip_value, clip_value));
  }
}

}  // namespace ferry::nn::utils
