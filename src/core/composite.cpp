// composite.cpp — the composed ops of ferry/ops.h (clamp, masked_fill, isnan, all, isclose, chunk, repeat, flip,
// one_hot, ...): each is a few ops of ops.cpp on the input's device, so every backend runs it and autograd
// differentiates it, with no kernel of its own. norm records its own backward (the composition's is NaN at 0).
#include <algorithm>
#include <cmath>
#include <limits>

#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "internal.h"

namespace ferry {

namespace {
// The 0-d tensor a bound or fill value is compared and combined as: a's dtype when it holds the value exactly
// (floating, or a whole number in an integer dtype's range), else float32, so `where` promotes (as PyTorch's
// result_type of a tensor and a Python scalar).
Tensor scalar_like(const Tensor& a, double value) {
  const bool exact = is_floating(a.dtype()) || (a.dtype() != DType::Bool && detail::holds_whole(a.dtype(), value));
  return scalar_tensor(value, {.device = a.device(), .dtype = exact ? a.dtype() : DType::Float32});
}

Tensor all_false(const Tensor& a) { return zeros(a.shape(), {.device = a.device(), .dtype = DType::Bool}); }

// The dims a reduction over `dims` reduces (empty: all), normalized.
std::vector<bool> reduced_dims(const Tensor& a, const std::vector<int>& dims, const char* op) {
  std::vector<bool> reduced(static_cast<std::size_t>(a.dim()), dims.empty());
  for (int d : dims) reduced[static_cast<std::size_t>(normalize_dim(d, a.dim(), op))] = true;
  return reduced;
}
}  // namespace

Tensor clamp(const Tensor& a, std::optional<double> min, std::optional<double> max) {
  FERRY_CHECK(min.has_value() || max.has_value(), InvalidArgument, "clamp: at least one of 'min' or 'max' must not be "
              "None (give a lower bound, an upper bound, or both)");
  FERRY_CHECK(a.dtype() != DType::Bool, DTypeMismatch, "clamp: not implemented for 'Bool' tensors");
  // min(max(a, lo), hi) as two selects: NaN fails both comparisons and stays.
  Tensor out = a;
  {
    autograd::NoGradGuard no_grad;
    if (min) out = where(lt(out, *min), scalar_like(a, *min), out);
    if (max) out = where(gt(out, *max), scalar_like(a, *max), out);
  }
  if (autograd::needs_grad({&a})) {
    // The gradient reaches `a` only where lo <= a <= hi, so not at NaN (PyTorch's clamp backward).
    autograd::record("clamp", {a}, out, [a = a.detach(), min, max](const Tensor& g) {
      Tensor inside = min ? ge(a, *min) : ge(a, -std::numeric_limits<double>::infinity());
      if (max) inside = logical_and(inside, le(a, *max));
      return std::vector<Tensor>{where(inside, g, scalar_like(g, 0.0))};
    }, autograd::Saved::Inputs);
  }
  return out;  // a new tensor: at least one bound was applied
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  check_same_device("masked_fill", {&a, &mask});
  FERRY_CHECK(mask.dtype() == DType::Bool, DTypeMismatch, "masked_fill only supports boolean masks, but got mask with "
              "dtype ", dtype_name(mask.dtype()));
  FERRY_CHECK(broadcast_shapes("masked_fill", a.shape(), mask.shape()) == a.shape(), ShapeMismatch,
              "masked_fill: the mask ", shape_str(mask.shape()), " must broadcast to the tensor's shape ",
              shape_str(a.shape()), " (the result keeps the tensor's shape)");
  FERRY_CHECK(is_floating(a.dtype()) || std::nearbyint(value) == value, InvalidArgument, "masked_fill: the value ",
              value, " is not a whole number, and the tensor is ", dtype_name(a.dtype()),
              ": it would be truncated. Convert the tensor to a floating dtype first");
  const Tensor fill = scalar_tensor(value, {.device = a.device(), .dtype = a.dtype()});
  return where(mask, fill, a);
}

Tensor isnan(const Tensor& a) { return is_floating(a.dtype()) ? ne(a, a) : all_false(a); }

Tensor isinf(const Tensor& a) {
  return is_floating(a.dtype()) ? eq(abs(a), std::numeric_limits<double>::infinity()) : all_false(a);
}

Tensor isfinite(const Tensor& a) {
  if (!is_floating(a.dtype())) return logical_not(all_false(a));
  autograd::NoGradGuard no_grad;
  return eq(sub(a, a), 0.0);  // x - x is 0 for a finite x, NaN for inf and NaN
}

Tensor logical_and(const Tensor& a, const Tensor& b) {
  autograd::NoGradGuard no_grad;
  return minimum(ne(a.detach(), 0.0), ne(b.detach(), 0.0));
}

Tensor logical_or(const Tensor& a, const Tensor& b) {
  autograd::NoGradGuard no_grad;
  return maximum(ne(a.detach(), 0.0), ne(b.detach(), 0.0));
}

Tensor std(const Tensor& a, std::vector<int> dims, bool unbiased, bool keepdim) {
  const Tensor v = var(a, std::move(dims), unbiased, keepdim);
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = sqrt(v);
  }
  if (autograd::needs_grad({&v})) {
    // g / (2 std), and 0 where std is 0 (PyTorch's: a constant slice has no direction to move; sqrt's own
    // gradient there, g / 0 times var's 0, is NaN).
    autograd::record("std", {v}, out, [o = out.detach()](const Tensor& g) {
      const Tensor zero = scalar_like(g, 0.0);
      return std::vector<Tensor>{where(eq(o, 0.0), zero, div(g, mul(o, 2.0)))};
    }, autograd::Saved::Output);
  }
  return out;
}

Tensor norm(const Tensor& a, std::vector<int> dims, bool keepdim) {
  FERRY_CHECK(is_floating(a.dtype()), DTypeMismatch, "norm: expected a floating point tensor, got ",
              dtype_name(a.dtype()));
  const std::vector<bool> reduced = reduced_dims(a, dims, "norm");
  Shape kept = a.shape();  // the result's shape with keepdim
  for (std::size_t d = 0; d < kept.size(); ++d) {
    if (reduced[d]) kept[d] = 1;
  }
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = sqrt(sum(square(a), dims, keepdim));
  }
  if (autograd::needs_grad({&a})) {
    // d|a|/da = a / |a|, and 0 where |a| is 0 (a subgradient, as PyTorch's; the composed form gives 0/0 = NaN).
    autograd::record("norm", {a}, out, [a = a.detach(), n = out.detach(), kept](const Tensor& g) {
      const Tensor n_kept = n.reshape(kept);
      const Tensor ratio = where(eq(n_kept, 0.0), zeros({}, {.device = a.device(), .dtype = a.dtype()}), div(a, n_kept));
      return std::vector<Tensor>{mul(ratio, g.reshape(kept))};
    }, autograd::Saved::InputsAndOutput);
  }
  return out;
}

Tensor all(const Tensor& a, std::vector<int> dims, bool keepdim) {
  autograd::NoGradGuard no_grad;
  return eq(sum(eq(a.detach(), 0.0), std::move(dims), keepdim), 0.0);  // no zero (NaN counts as nonzero)
}

Tensor any(const Tensor& a, std::vector<int> dims, bool keepdim) {
  autograd::NoGradGuard no_grad;
  return gt(sum(ne(a.detach(), 0.0), std::move(dims), keepdim), 0.0);
}

Tensor isclose(const Tensor& a_in, const Tensor& b_in, double rtol, double atol, bool equal_nan) {
  check_same_device("isclose", {&a_in, &b_in});
  FERRY_CHECK(a_in.dtype() == b_in.dtype(), DTypeMismatch, "isclose(): expected both inputs to have the same dtype, "
              "but got ", dtype_name(a_in.dtype()), " and ", dtype_name(b_in.dtype()));
  FERRY_CHECK(rtol >= 0 && atol >= 0, InvalidArgument, "isclose(): rtol (", rtol, ") and atol (", atol,
              ") must be non-negative");
  autograd::NoGradGuard no_grad;
  const Tensor a = a_in.detach(), b = b_in.detach();
  if (a.dtype() == DType::Bool) return eq(a, b);
  Tensor close = eq(a, b);  // equal values, inf included, are close
  const Tensor a64 = is_floating(a.dtype()) ? a : a.to(DType::Float64), b64 = is_floating(b.dtype()) ? b : b.to(DType::Float64);
  const Tensor within = le(abs(sub(a64, b64)), add(mul(abs(b64), rtol), atol));
  close = logical_or(close, logical_and(within, logical_and(isfinite(a64), isfinite(b64))));
  if (equal_nan) close = logical_or(close, logical_and(isnan(a), isnan(b)));
  return close;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  return all(isclose(a, b, rtol, atol, equal_nan)).item<double>() != 0;
}

std::vector<Tensor> chunk(const Tensor& a, std::int64_t chunks, int dim) {
  FERRY_CHECK(chunks > 0, InvalidArgument, "chunk expects `chunks` to be greater than 0, got: ", chunks);
  FERRY_CHECK(a.dim() > 0, InvalidArgument, "chunk expects at least a 1-dimensional tensor");
  const std::int64_t n = a.size(dim);
  return split(a, n == 0 ? 0 : (n + chunks - 1) / chunks, dim);
}

std::vector<Tensor> split(const Tensor& a, std::int64_t split_size, int dim) {
  FERRY_CHECK(a.dim() > 0, InvalidArgument, "split expects at least a 1-dimensional tensor");
  const int d = normalize_dim(dim, a.dim(), "split");
  const std::int64_t n = a.size(d);
  FERRY_CHECK(split_size > 0 || (split_size == 0 && n == 0), InvalidArgument, "split: split_size can only be 0 if ",
              "dimension size is 0, but got dimension size of ", n, " and split_size ", split_size);
  std::vector<Tensor> pieces;
  if (n == 0) {
    pieces.push_back(a.narrow(d, 0, 0));
    return pieces;
  }
  for (std::int64_t start = 0; start < n; start += split_size) pieces.push_back(a.narrow(d, start, std::min(split_size, n - start)));
  return pieces;
}

Tensor repeat(const Tensor& a, const Shape& repeats) {
  const int k = static_cast<int>(repeats.size());
  FERRY_CHECK(k >= a.dim(), InvalidArgument, "repeat: number of dimensions of repeat dims (", k, ") can not be "
              "smaller than number of dimensions of tensor (", a.dim(), ")");
  for (std::int64_t r : repeats) {
    FERRY_CHECK(r >= 0, InvalidArgument, "repeat: repeats ", shape_str(repeats), " must be non-negative");
  }
  // (s0, s1) as (1, s0, 1, s1), expanded to (r0, s0, r1, s1) and laid out as (r0 * s0, r1 * s1).
  Shape padded(static_cast<std::size_t>(k - a.dim()), 1);
  padded.insert(padded.end(), a.shape().begin(), a.shape().end());
  Shape interleaved, pairs, out_shape;
  for (int i = 0; i < k; ++i) {
    interleaved.insert(interleaved.end(), {1, padded[i]});
    pairs.insert(pairs.end(), {repeats[i], padded[i]});
    out_shape.push_back(repeats[i] * padded[i]);
  }
  Tensor out = a.reshape(interleaved).expand(pairs).reshape(out_shape);
  return out.storage() == a.storage() ? out.clone() : out;  // always a copy, as PyTorch's repeat
}

Tensor flip(const Tensor& a, const std::vector<int>& dims) {
  std::vector<bool> seen(static_cast<std::size_t>(std::max(a.dim(), 1)), false);
  Tensor out = a;
  for (int dim : dims) {
    const int d = normalize_dim(dim, a.dim(), "flip");
    FERRY_CHECK(!seen[static_cast<std::size_t>(d)], InvalidArgument, "flip: dims has duplicates (dim ", d, ")");
    seen[static_cast<std::size_t>(d)] = true;
    if (a.dim() == 0) continue;
    const std::int64_t n = a.size(d);
    out = index_select(out, d, arange(n - 1, -1, -1, {.device = a.device(), .dtype = DType::Int64}));
  }
  return out.is_same(a) ? a.clone() : out;
}

namespace {
// a with the elements outside the kept triangle set to zero: keep [i, j] where j - i <= diagonal (lower) or
// >= diagonal (upper). The mask (rows, cols) is built from two aranges on a's device and broadcast over the batch.
Tensor triangle(const Tensor& a, std::int64_t diagonal, bool lower, const char* op) {
  FERRY_CHECK(a.dim() >= 2, InvalidArgument, op, ": the input needs at least 2 dims (a matrix or a batch of "
              "them), got ", a.dim(), " dims, shape ", shape_str(a.shape()));
  const std::int64_t rows = a.size(-2), cols = a.size(-1);
  const Tensor i = arange(0, static_cast<double>(rows), 1, {.device = a.device(), .dtype = DType::Int64}).unsqueeze(1);
  const Tensor j = arange(0, static_cast<double>(cols), 1, {.device = a.device(), .dtype = DType::Int64});
  const Tensor offset = sub(j, i);  // (rows, cols): j - i
  const Tensor drop = lower ? gt(offset, static_cast<double>(diagonal)) : lt(offset, static_cast<double>(diagonal));
  return masked_fill(a, drop, 0.0);
}
}  // namespace

Tensor tril(const Tensor& a, std::int64_t diagonal) { return triangle(a, diagonal, true, "tril"); }
Tensor triu(const Tensor& a, std::int64_t diagonal) { return triangle(a, diagonal, false, "triu"); }

Tensor one_hot(const Tensor& labels, std::int64_t num_classes) {
  FERRY_CHECK(labels.dtype() == DType::Int64, DTypeMismatch, "one_hot is only applicable to index tensor of type "
              "int64, got ", dtype_name(labels.dtype()));
  FERRY_CHECK(num_classes >= -1, InvalidArgument, "one_hot: num_classes should be -1 (inferred) or positive, got ",
              num_classes);
  const bool empty = labels.numel() == 0;
  if (num_classes == -1) {
    FERRY_CHECK(!empty, InvalidArgument, "one_hot: can not infer total number of classes from empty tensor; pass "
                "num_classes");
    num_classes = max(labels).item<std::int64_t>() + 1;  // a host read: a sync on an accelerator
  }
  if (labels.device().is_cpu() && !empty) {
    const std::int64_t lo = min(labels).item<std::int64_t>(), hi = max(labels).item<std::int64_t>();
    FERRY_CHECK(lo >= 0 && hi < num_classes, InvalidArgument, "one_hot: class values must be in [0, ", num_classes,
                "), got labels from ", lo, " to ", hi);
  }
  const Tensor classes = arange(0, static_cast<double>(num_classes), 1,
                                {.device = labels.device(), .dtype = DType::Int64});
  return eq(labels.unsqueeze(-1), classes).to(DType::Int64);
}

Tensor dot(const Tensor& a, const Tensor& b) {
  FERRY_CHECK(a.dim() == 1 && b.dim() == 1 && a.size(0) == b.size(0), ShapeMismatch, "dot: expected two 1-d tensors "
              "of the same size, got ", shape_str(a.shape()), " and ", shape_str(b.shape()));
  return matmul(a, b);
}

Tensor outer(const Tensor& a, const Tensor& b) {
  FERRY_CHECK(a.dim() == 1 && b.dim() == 1, ShapeMismatch, "outer: expected two 1-d tensors, got ",
              shape_str(a.shape()), " and ", shape_str(b.shape()));
  return mul(a.unsqueeze(1), b.unsqueeze(0));
}

}  // namespace ferry
