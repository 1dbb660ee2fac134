// groupnorm.cpp — nn::GroupNorm and functional::group_norm: layer_norm over each (sample, group) row of the input
// viewed as (N, G, C/G * positions), so the statistics and the backward are layer_norm's single autograd node;
// then the per-channel affine. Runs on any device.
#include <algorithm>
#include <utility>

#include "checks.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/groupnorm.h"
#include "ferry/ops.h"

namespace ferry::nn {

namespace functional {

Tensor group_norm(const Tensor& input, std::int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_floating("group_norm", input);
  FERRY_CHECK(input.dim() >= 2, ShapeMismatch, "group_norm: expected an input (N, C, *) of at least 2 dims, got ",
              shape_str(input.shape()));
  const std::int64_t n = input.size(0), channels = input.size(1);
  FERRY_CHECK(num_groups >= 1 && channels % num_groups == 0, InvalidArgument, "group_norm: expected the ", channels,
              " channels of input ", shape_str(input.shape()), " to divide into num_groups=", num_groups);
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!t->defined()) continue;
    FERRY_CHECK(t->shape() == Shape{channels}, ShapeMismatch, "group_norm: ", name, " must be (", channels,
                ") for ", channels, " channels, got ", shape_str(t->shape()));
  }
  // C/G channels times the positions; an empty batch (N = 0) or no positions gives an empty output, as PyTorch's
  std::int64_t per_group = channels / num_groups;
  for (int i = 2; i < input.dim(); ++i) per_group *= input.size(i);
  // (N, G, C/G * positions): each row one (sample, group), normalized by layer_norm without affine
  const Tensor rows = input.reshape({n, num_groups, per_group});
  Tensor out = layer_norm(rows, {per_group}, Tensor(), Tensor(), eps).reshape(input.shape());
  Shape channel_shape(static_cast<std::size_t>(input.dim()), 1);  // (1, C, 1, ...)
  channel_shape[1] = channels;
  if (weight.defined()) out = mul(out, weight.reshape(channel_shape));
  if (bias.defined()) out = add(out, bias.reshape(channel_shape));
  return out;
}

}  // namespace functional

GroupNorm::GroupNorm(std::int64_t num_groups, std::int64_t num_channels, double eps, bool affine,
                     const TensorOptions& options)
    : num_groups(num_groups), num_channels(num_channels), eps(eps) {
  FERRY_CHECK(num_groups >= 1 && num_channels >= 1 && num_channels % num_groups == 0, InvalidArgument,
              "GroupNorm: num_channels (", num_channels, ") must be divisible by num_groups (", num_groups, ")");
  FERRY_CHECK(eps > 0, InvalidArgument, "GroupNorm: eps must be > 0, got ", eps);
  if (affine) {
    const TensorOptions like{.device = options.device, .dtype = options.dtype};
    weight = register_parameter("weight", ones({num_channels}, like));
    bias = register_parameter("bias", zeros({num_channels}, like));
  }
}

Tensor GroupNorm::forward(const Tensor& input) {
  FERRY_CHECK(input.dim() >= 2 && input.size(1) == num_channels, ShapeMismatch, "GroupNorm(", num_groups, ", ",
              num_channels, "): expected an input (N, ", num_channels, ", *), got ", shape_str(input.shape()));
  return functional::group_norm(input, num_groups, weight, bias, eps);
}

std::string GroupNorm::extra_repr() const {
  return ferry::detail::concat(num_groups, ", ", num_channels, ", eps=", eps,  // 1e-05, as Python prints it
                               ", affine=", weight.defined() ? "True" : "False");
}

}  // namespace ferry::nn
