// composed_layers.cpp — the layers built from tensor ops (ferry/ops.h) rather than kernels of their own: gelu,
// silu, leaky_relu, softplus, layer_norm and embedding. Each runs on any device. Autograd differentiates most
// through their ops; gelu and layer_norm are one node each with a closed-form backward of fewer passes, and where the
// backend has them (Backend::gelu_library, layer_norm_library: cpu, sim and cuda, float32 and float64) one backend
// call each way instead, with the library layers on (functional::library_layers). Every gradient is checked against
// finite differences and PyTorch's fixtures.
#include <algorithm>
#include <cmath>

#include "../core/internal.h"
#include "checks.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"
#include "ferry/ops.h"

namespace ferry::nn::functional {

namespace {

using ferry::detail::compute_stream;
using ferry::detail::kernel_view;
using ferry::detail::kernel_view_or_null;

// Whether gelu and layer_norm take the backend's calls for x (and its weight and bias, each undefined or of x's
// dtype and device): the library layers on, elements to compute, and a backend that has the call for the dtype.
bool use_library(const Tensor& x, const std::vector<const Tensor*>& params, bool (Backend::*has)(DType, int)) {
  if (!library_layers() || x.numel() == 0) return false;
  for (const Tensor* t : params) {
    if (t->defined() && (t->dtype() != x.dtype() || t->device() != x.device())) return false;
  }
  return (backend(x.device()).*has)(x.dtype(), x.device().index);
}

// An uninitialised tensor of x's device and dtype.
Tensor like(const Tensor& x, const Shape& shape) { return empty(shape, {.device = x.device(), .dtype = x.dtype()}); }

}  // namespace

Tensor gelu(const Tensor& x, const std::string& approximate) {
  FERRY_CHECK(approximate == "none" || approximate == "tanh", InvalidArgument,
              "gelu: approximate must be 'none' or 'tanh', got '", ferry::detail::printable(approximate), "'");
  check_floating("gelu", x);
  if (approximate == "none") {  // x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2; d/dx = Phi(x) + x phi(x)
    // One backend call each way where the backend has them (the same bits); else composed from tensor ops.
    const bool library = use_library(x, {}, &Backend::gelu_library);
    const Tensor input = library ? x.detach().contiguous() : x.detach();
    Tensor cdf, out;
    {
      autograd::NoGradGuard no_grad;
      if (library) {
        cdf = like(input, input.shape());
        out = like(input, input.shape());
        backend(input.device()).gelu_forward(kernel_view(out), kernel_view(cdf), kernel_view(input),
                                             compute_stream(input.device()));
      } else {
        cdf = mul(add(erf(mul(x, M_SQRT1_2)), 1.0), 0.5);
        out = mul(x, cdf);
      }
    }
    if (autograd::needs_grad({&x})) {
      autograd::record("gelu", {x}, out, [x = input, cdf, library](const Tensor& g) {
        if (library && g.dtype() == x.dtype()) {
          const Tensor grad = g.contiguous();
          Tensor dx = like(x, x.shape());
          backend(x.device()).gelu_backward(kernel_view(dx), kernel_view(grad), kernel_view(x), kernel_view(cdf),
                                            compute_stream(x.device()));
          return std::vector<Tensor>{dx};
        }
        const Tensor pdf = mul(exp(mul(square(x), -0.5)), 0.5 * M_2_SQRTPI * M_SQRT1_2);  // phi(x)
        return std::vector<Tensor>{mul(g, add(cdf, mul(x, pdf)))};
      }, autograd::Saved::Inputs);
    }
    return out;
  }
  const double k = std::sqrt(2.0 / M_PI);
  const Tensor inner = mul(add(x, mul(mul(square(x), x), 0.044715)), k);
  return mul(mul(x, 0.5), add(tanh(inner), 1.0));
}

Tensor silu(const Tensor& x) {
  check_floating("silu", x);
  return mul(x, sigmoid(x));
}

Tensor softplus(const Tensor& x, double beta, double threshold) {
  check_floating("softplus", x);
  FERRY_CHECK(beta > 0 && std::isfinite(beta), InvalidArgument, "softplus: beta must be a positive number, got ", beta);
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    const Tensor bx = mul(x, beta);
    // The smooth branch sees beta x clamped to the threshold, so its e^(beta x) stays finite where the linear
    // branch is taken.
    const Tensor smooth = div(log1p(exp(clamp(bx, std::nullopt, threshold))), beta);
    out = where(gt(bx, threshold), x, smooth);
  }
  if (autograd::needs_grad({&x})) {  // g where beta x > threshold, else g sigmoid(beta x): NaN stays NaN (PyTorch's)
    autograd::record("softplus", {x}, out, [x = x.detach(), beta, threshold](const Tensor& g) {
      const Tensor bx = mul(x, beta);
      return std::vector<Tensor>{where(gt(bx, threshold), g, mul(g, sigmoid(bx)))};
    }, autograd::Saved::Inputs);
  }
  return out;
}

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  check_floating("leaky_relu", x);
  return where(gt(x, 0.0), x, mul(x, negative_slope));
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_floating("layer_norm", x);
  const auto k = static_cast<int>(normalized_shape.size());
  FERRY_CHECK(k >= 1 && x.dim() >= k &&
                  Shape(x.shape().end() - k, x.shape().end()) == normalized_shape,
              ShapeMismatch, "layer_norm: given normalized_shape=", shape_str(normalized_shape),
              ", expected input with shape [*, ", shape_str(normalized_shape).substr(1), ", but got input of size ",
              shape_str(x.shape()));
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!t->defined()) continue;
    FERRY_CHECK(t->shape() == normalized_shape, ShapeMismatch, "layer_norm: ", name, " has shape ",
                shape_str(t->shape()), ", expected normalized_shape ", shape_str(normalized_shape));
  }
  std::vector<int> dims, leading;  // the normalized dims; the others (summed over for weight's and bias' gradient)
  for (int d = 0; d < x.dim(); ++d) (d < x.dim() - k ? leading : dims).push_back(d);
  Shape kept = x.shape();  // rstd's shape: (*, 1, ..., 1)
  std::fill(kept.end() - k, kept.end(), 1);
  const std::int64_t row_size = shape_numel(normalized_shape), rows = row_size > 0 ? x.numel() / row_size : 0;
  // One backend call each way where the backend has them; else composed from tensor ops.
  const bool library = use_library(x, {&weight, &bias}, &Backend::layer_norm_library);
  Tensor normalized, rstd, out;  // x-hat; 1 / sqrt(var + eps), (*, 1, ..., 1)
  if (library) {
    autograd::NoGradGuard no_grad;
    const Tensor input = x.detach().contiguous();
    const Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
    const Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
    normalized = like(input, input.shape());
    rstd = like(input, {rows});
    out = w.defined() || b.defined() ? like(input, input.shape()) : normalized;
    backend(x.device()).layer_norm_forward(kernel_view(out), kernel_view(normalized), kernel_view(rstd),
                                           kernel_view(input), kernel_view_or_null(w), kernel_view_or_null(b), rows,
                                           row_size, eps, compute_stream(x.device()));
    rstd = rstd.reshape(kept);
  } else {
    autograd::NoGradGuard no_grad;
    const Tensor centred = sub(x, mean(x, dims, true));
    const Tensor variance = mean(square(centred), dims, true);  // biased, as PyTorch normalizes
    rstd = rsqrt(add(variance, eps));
    normalized = mul(centred, rstd);
    out = normalized;
    if (weight.defined()) out = mul(out, weight);
    if (bias.defined()) out = add(out, bias);
  }
  if (autograd::needs_grad({&x, &weight, &bias})) {
    const bool want_x = x.requires_grad(), want_w = weight.defined() && weight.requires_grad(),
               want_b = bias.defined() && bias.requires_grad();
    // Without weight and bias the output is x-hat itself: the node keeps a detached alias (no cycle through the
    // output's own history) and checks the output's version, as a saved output.
    const bool affine = weight.defined() || bias.defined();
    autograd::record("layer_norm", {x, weight, bias}, out,
        [w = weight.defined() ? weight.detach() : Tensor(), normalized = normalized.detach(), rstd, dims, leading,
         normalized_shape, rows, row_size, want_x, want_w, want_b, library](const Tensor& g) {
          // dx = rstd (dx^ - mean(dx^) - x^ mean(dx^ x^)), dx^ = g w; dw = sum(g x^), db = sum(g) over the rest
          Tensor gx, gw, gb;
          if (library && g.dtype() == normalized.dtype()) {
            const Tensor grad = g.contiguous(), wc = w.defined() ? w.contiguous() : Tensor();
            if (want_x) gx = like(normalized, normalized.shape());
            if (want_w) gw = like(normalized, normalized_shape);
            if (want_b) gb = like(normalized, normalized_shape);
            backend(normalized.device()).layer_norm_backward(
                kernel_view_or_null(gx), kernel_view_or_null(gw), kernel_view_or_null(gb), kernel_view(grad),
                kernel_view_or_null(wc), kernel_view(normalized), kernel_view(rstd), rows, row_size,
                compute_stream(normalized.device()));
            return std::vector<Tensor>{gx, gw, gb};
          }
          if (want_x) {
            const Tensor gn = w.defined() ? mul(g, w) : g;
            gx = mul(sub(sub(gn, mean(gn, dims, true)), mul(normalized, mean(mul(gn, normalized), dims, true))), rstd);
          }
          if (want_w) gw = leading.empty() ? mul(g, normalized) : sum(mul(g, normalized), leading);
          if (want_b) gb = leading.empty() ? g : sum(g, leading);
          return std::vector<Tensor>{gx, gw, gb};
        }, affine ? autograd::Saved::Inputs : autograd::Saved::InputsAndOutput,
        /*inputs_read=*/2);  // weight; x's own values are not read, x-hat is kept
  }
  return out;
}

Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<std::int64_t> padding_idx) {
  FERRY_CHECK(indices.dtype() == DType::Int64 || indices.dtype() == DType::Int32, DTypeMismatch,
              "embedding: expected int64 or int32 indices, got ", dtype_name(indices.dtype()));
  FERRY_CHECK(weight.dim() == 2, ShapeMismatch, "embedding: weight must be (num_embeddings, embedding_dim), got ",
              shape_str(weight.shape()));
  const std::int64_t rows = weight.size(0);
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  Tensor out = index_select(weight, 0, indices.reshape({-1}).to(DType::Int64)).reshape(out_shape);
  if (padding_idx) {
    const std::int64_t pad = *padding_idx < 0 ? *padding_idx + rows : *padding_idx;
    FERRY_CHECK(pad >= 0 && pad < rows, InvalidArgument, "embedding: padding_idx must be within num_embeddings (",
                rows, "), got ", *padding_idx);
    if (out.requires_grad()) {  // the same values; the padding rows' through a detached alias, so no gradient
      const Tensor padded = eq(indices, static_cast<double>(pad)).unsqueeze(-1);
      out = where(padded, out.detach(), out);
    }
  }
  return out;
}

}  // namespace ferry::nn::functional
