// composed_layers.cpp — the layers built from tensor ops (ferry/ops.h) rather than kernels of their own: gelu,
// silu, leaky_relu, softplus, layer_norm and embedding. Each runs on any device. Autograd differentiates most
// through their ops; gelu and layer_norm are one node each with a closed-form backward of fewer passes, and on host
// memory each is one pass (a row) each way instead (gelu_kernels.h, layer_norm_kernels.h). Every gradient is
// checked against finite differences and PyTorch's fixtures.
#include <algorithm>
#include <cmath>

#include "batch_norm_kernels.h"
#include "checks.h"
#include "gelu_kernels.h"
#include "layer_norm_kernels.h"
#include "ferry/autograd.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"
#include "ferry/ops.h"

namespace ferry::nn::functional {

Tensor gelu(const Tensor& x, const std::string& approximate) {
  FERRY_CHECK(approximate == "none" || approximate == "tanh", InvalidArgument,
              "gelu: approximate must be 'none' or 'tanh', got '", ferry::detail::printable(approximate), "'");
  check_floating("gelu", x);
  if (approximate == "none") {  // x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2; d/dx = Phi(x) + x phi(x)
    // On host memory one pass each way (gelu_kernels.h), the same bits; elsewhere composed from tensor ops.
    const bool host = detail::use_host_float_loops(x);
    const Tensor input = host ? x.detach().contiguous() : x.detach();
    Tensor cdf, out;
    {
      autograd::NoGradGuard no_grad;
      if (host) {
        detail::gelu_host_forward(input, out, cdf);
      } else {
        cdf = mul(add(erf(mul(x, M_SQRT1_2)), 1.0), 0.5);
        out = mul(x, cdf);
      }
    }
    if (autograd::needs_grad({&x})) {
      autograd::record("gelu", {x}, out, [x = input, cdf](const Tensor& g) {
        if (detail::use_host_float_loops(x) && g.dtype() == x.dtype()) {
          return std::vector<Tensor>{detail::gelu_host_backward(g.contiguous(), x.contiguous(), cdf)};
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
  // On host memory one pass a row each way (layer_norm_kernels.h); elsewhere composed from tensor ops.
  const bool host = detail::use_host_float_loops(x);
  Tensor normalized, rstd, out;  // x-hat; 1 / sqrt(var + eps), (*, 1, ..., 1)
  if (host) {
    autograd::NoGradGuard no_grad;
    detail::layer_norm_host_forward(x.detach().contiguous(), weight, bias, eps, rows, row_size, out,
                                    normalized, rstd);
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
         normalized_shape, rows, row_size, want_x, want_w, want_b](const Tensor& g) {
          // dx = rstd (dx^ - mean(dx^) - x^ mean(dx^ x^)), dx^ = g w; dw = sum(g x^), db = sum(g) over the rest
          Tensor gx, gw, gb;
          if (detail::use_host_float_loops(normalized) && g.dtype() == normalized.dtype()) {
            detail::layer_norm_host_backward(g.contiguous(), w, normalized, rstd, rows, row_size, want_x, want_w,
                                             want_b, gx, gw, gb);
            if (gw.defined()) gw = gw.reshape(normalized_shape);
            if (gb.defined()) gb = gb.reshape(normalized_shape);
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
