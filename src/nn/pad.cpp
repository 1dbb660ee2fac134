// pad.cpp — functional::pad, PyTorch's F.pad: constant, reflect, replicate and circular padding of the last dims,
// composed of differentiable tensor ops (narrow, expand, index_select, cat) on the input's device, so autograd
// differentiates it and every device runs it.
#include <string>
#include <vector>

#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"
#include "ferry/ops.h"

namespace ferry::nn::functional {

namespace {

// x with `left` elements before and `right` after along dim, filled as `mode` says; negative sizes (constant mode
// only) cut elements off instead.
Tensor pad_dim(Tensor x, int dim, std::int64_t left, std::int64_t right, const std::string& mode, double value) {
  std::int64_t n = x.size(dim);
  if (left < 0 || right < 0) {
    FERRY_CHECK(-std::min<std::int64_t>(left, 0) - std::min<std::int64_t>(right, 0) <= n, ShapeMismatch,
                "pad: negative padding (", left, ", ", right, ") of dim ", dim, " cuts off more than its ", n,
                " elements");
    const std::int64_t cut_left = std::max<std::int64_t>(-left, 0), cut_right = std::max<std::int64_t>(-right, 0);
    x = x.narrow(dim, cut_left, n - cut_left - cut_right);
    n = x.size(dim);
    left = std::max<std::int64_t>(left, 0);
    right = std::max<std::int64_t>(right, 0);
  }
  if (left == 0 && right == 0) return x;
  auto sized = [&](std::int64_t count) {  // x's shape with `count` along dim
    Shape shape = x.shape();
    shape[dim] = count;
    return shape;
  };
  auto side = [&](std::int64_t count, bool before) -> Tensor {
    if (mode == "constant") return full(sized(count), value, {.device = x.device(), .dtype = x.dtype()});
    if (mode == "replicate") return x.narrow(dim, before ? 0 : n - 1, 1).expand(sized(count));
    if (mode == "circular") return x.narrow(dim, before ? n - count : 0, count);
    // reflect: the mirror image without the edge element, x[count], ..., x[1] before and x[n-2], ... after
    const double first = before ? static_cast<double>(count) : static_cast<double>(n - 2);
    const Tensor index = arange(first, first - static_cast<double>(count), -1,
                                {.device = x.device(), .dtype = DType::Int64});
    return index_select(x, dim, index);
  };
  if (mode == "replicate") {
    FERRY_CHECK(n > 0, ShapeMismatch, "pad: replicate padding of dim ", dim, " needs at least one element, got shape ",
                shape_str(x.shape()));
  } else if (mode == "reflect") {
    FERRY_CHECK(left < n && right < n, ShapeMismatch, "pad: reflect padding (", left, ", ", right, ") of dim ", dim,
                " must be smaller than its size ", n, " (shape ", shape_str(x.shape()), ")");
  } else if (mode == "circular") {
    FERRY_CHECK(left <= n && right <= n, ShapeMismatch, "pad: circular padding (", left, ", ", right, ") of dim ", dim,
                " must be at most its size ", n, " (shape ", shape_str(x.shape()), ")");
  }
  std::vector<Tensor> parts;
  if (left > 0) parts.push_back(side(left, true));
  parts.push_back(x);
  if (right > 0) parts.push_back(side(right, false));
  return cat(parts, dim);
}

}  // namespace

Tensor pad(const Tensor& input, const std::vector<std::int64_t>& pad, const std::string& mode, double value) {
  FERRY_CHECK(mode == "constant" || mode == "reflect" || mode == "replicate" || mode == "circular", InvalidArgument,
              "pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got '",
              ferry::detail::printable(mode), "'");
  FERRY_CHECK(mode == "constant" || value == 0, InvalidArgument, "pad: mode '", mode,
              "' takes no value (it is for 'constant' only), got ", value);
  FERRY_CHECK(pad.size() % 2 == 0, InvalidArgument, "pad: expected pairs of sizes (left, right) from the last dim "
              "backwards, got ", pad.size(), " numbers");
  const std::size_t dims = pad.size() / 2;
  FERRY_CHECK(dims <= static_cast<std::size_t>(input.dim()), ShapeMismatch, "pad: ", pad.size(),
              " sizes pad ", dims, " dims, but the input ", shape_str(input.shape()), " has ", input.dim());
  for (std::size_t k = 0; k < dims; ++k) {
    FERRY_CHECK(mode == "constant" || (pad[2 * k] >= 0 && pad[2 * k + 1] >= 0), InvalidArgument, "pad: mode '", mode,
                "' takes no negative sizes, got (", pad[2 * k], ", ", pad[2 * k + 1], ")");
  }
  Tensor out = input;
  for (std::size_t k = 0; k < dims; ++k) {
    out = pad_dim(out, input.dim() - 1 - static_cast<int>(k), pad[2 * k], pad[2 * k + 1], mode, value);
  }
  return out;
}

}  // namespace ferry::nn::functional
