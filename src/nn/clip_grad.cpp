// clip_grad.cpp — clip_grad_norm_ and clip_grad_value_ (ferry/nn/clip_grad.h): device ops only, so that a step
// that clips can be captured; the one optional read is error_if_nonfinite's. The norms and the scale are one backend
// call each over all the gradients where the backend has them (Backend::multi_norm, multi_scale).
#include "ferry/nn/clip_grad.h"

#include <cmath>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"
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
  const Device device = grads.front().device();
  const DType dtype = grads.front().dtype();
  // The norms and the scale as one backend call each (Backend::multi_norm) where the backend has them: the
  // gradients contiguous and of one dtype, p = 1, 2 or inf, the library layers on; else one norm and one scale
  // per gradient.
  std::vector<KernelTensor> views;
  bool library = functional::library_layers() && (norm_type == 1 || norm_type == 2 || std::isinf(norm_type)) &&
                 backend(device).multi_norm_library(dtype, device.index);
  for (const Tensor& g : grads) {  // an empty gradient's inf-norm is an error (PyTorch's), which max() raises
    library = library && g.dtype() == dtype && g.is_contiguous() && (g.numel() > 0 || !std::isinf(norm_type));
    if (library) views.push_back(detail::kernel_view(g));
  }
  Tensor norms;
  if (library) {
    norms = empty({static_cast<std::int64_t>(grads.size())}, {.device = device, .dtype = dtype});
    backend(device).multi_norm(views.data(), views.size(), detail::kernel_view(norms), norm_type,
                               detail::compute_stream(device));
  } else {
    std::vector<Tensor> each;
    each.reserve(grads.size());
    for (const Tensor& g : grads) each.push_back(one_norm(g, norm_type).to(dtype));
    norms = stack(each);
  }
  const Tensor total = one_norm(norms, norm_type);
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
  if (library) {
    const Tensor factor = scale.to(dtype);
    backend(device).multi_scale(views.data(), views.size(), detail::kernel_view(factor),
                                detail::compute_stream(device));
    for (const Tensor& g : grads) g.impl()->bump_version();  // written in place, as mul_ would
    return total;
  }
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
