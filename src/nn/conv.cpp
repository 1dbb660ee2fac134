// conv.cpp — the Conv2d, Conv1d, ConvTranspose2d and ConvTranspose1d layers: PyTorch's parameters and
// initialisation around the functional convolutions.
#include "ferry/nn/conv.h"

#include <cmath>

#include "ferry/factories.h"
#include "ferry/nn/init.h"

namespace ferry::nn {

namespace {
std::string pair_str(Size2 s) { return ferry::detail::concat("(", s.h, ", ", s.w, ")"); }

// InvalidArgument unless the channels and kernel are positive and groups divides both channel counts.
void check_channels(const char* layer, std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size,
                    std::int64_t groups) {
  FERRY_CHECK(in_channels > 0 && out_channels > 0 && kernel_size.h > 0 && kernel_size.w > 0, InvalidArgument, layer,
              ": expected positive channels and kernel size, got in_channels=", in_channels,
              ", out_channels=", out_channels, ", kernel_size=", pair_str(kernel_size));
  FERRY_CHECK(groups >= 1, InvalidArgument, layer, ": groups must be a positive integer, got ", groups);
  FERRY_CHECK(in_channels % groups == 0, InvalidArgument, layer, ": in_channels (", in_channels,
              ") must be divisible by groups (", groups, ")");
  FERRY_CHECK(out_channels % groups == 0, InvalidArgument, layer, ": out_channels (", out_channels,
              ") must be divisible by groups (", groups, ")");
}
}  // namespace

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size, const Conv2dOptions& conv,
               const TensorOptions& tensor_options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(conv) {
  check_channels("Conv2d", in_channels, out_channels, kernel_size, options.groups);
  const std::int64_t in_per_group = in_channels / options.groups;
  const TensorOptions like{.device = tensor_options.device, .dtype = tensor_options.dtype};
  weight = register_parameter("weight", empty({out_channels, in_per_group, kernel_size.h, kernel_size.w}, like));
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (options.bias) {
    bias = register_parameter("bias", empty({out_channels}, like));
    const double fan_in = static_cast<double>(in_per_group * kernel_size.h * kernel_size.w);
    init::uniform_(bias, -1.0 / std::sqrt(fan_in), 1.0 / std::sqrt(fan_in));
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  return functional::conv2d(input, weight, bias, options.stride, options.padding, options.dilation, options.groups);
}

std::string Conv2d::extra_repr() const {
  std::string text = ferry::detail::concat(in_channels, ", ", out_channels, ", kernel_size=", pair_str(kernel_size),
                                    ", stride=", pair_str(options.stride));
  if (options.padding != Size2(0)) text += ", padding=" + pair_str(options.padding);
  if (options.dilation != Size2(1)) text += ", dilation=" + pair_str(options.dilation);
  if (options.groups != 1) text += ferry::detail::concat(", groups=", options.groups);
  if (!options.bias) text += ", bias=False";
  return text;
}

Conv1d::Conv1d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size, const Conv1dOptions& conv,
               const TensorOptions& tensor_options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(conv) {
  // The 2-d layer checks the sizes and draws the parameters as PyTorch does for this shape; keep them 3-d.
  Conv2d plane(in_channels, out_channels, Size2(1, kernel_size),
               {.stride = Size2(1, conv.stride), .padding = Size2(0, conv.padding), .dilation = Size2(1, conv.dilation),
                .groups = conv.groups, .bias = conv.bias},
               tensor_options);
  weight = register_parameter("weight", plane.weight.detach().squeeze(2).clone());
  if (conv.bias) bias = register_parameter("bias", plane.bias.detach().clone());
}

Tensor Conv1d::forward(const Tensor& input) {
  return functional::conv1d(input, weight, bias, options.stride, options.padding, options.dilation, options.groups);
}

std::string Conv1d::extra_repr() const {
  auto one = [](std::int64_t v) { return ferry::detail::concat("(", v, ",)"); };  // Python's 1-tuple
  std::string text = ferry::detail::concat(in_channels, ", ", out_channels, ", kernel_size=", one(kernel_size),
                                           ", stride=", one(options.stride));
  if (options.padding != 0) text += ", padding=" + one(options.padding);
  if (options.dilation != 1) text += ", dilation=" + one(options.dilation);
  if (options.groups != 1) text += ferry::detail::concat(", groups=", options.groups);
  if (!options.bias) text += ", bias=False";
  return text;
}

ConvTranspose2d::ConvTranspose2d(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size,
                                 const ConvTranspose2dOptions& conv, const TensorOptions& tensor_options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(conv) {
  check_channels("ConvTranspose2d", in_channels, out_channels, kernel_size, options.groups);
  const std::int64_t out_per_group = out_channels / options.groups;
  const TensorOptions like{.device = tensor_options.device, .dtype = tensor_options.dtype};
  weight = register_parameter("weight", empty({in_channels, out_per_group, kernel_size.h, kernel_size.w}, like));
  init::kaiming_uniform_(weight, std::sqrt(5.0));  // fan_in = weight's dim 1 * kernel, as PyTorch's
  if (options.bias) {
    bias = register_parameter("bias", empty({out_channels}, like));
    const double fan_in = static_cast<double>(out_per_group * kernel_size.h * kernel_size.w);
    init::uniform_(bias, -1.0 / std::sqrt(fan_in), 1.0 / std::sqrt(fan_in));
  }
}

Tensor ConvTranspose2d::forward(const Tensor& input) {
  return functional::conv_transpose2d(input, weight, bias, options.stride, options.padding, options.output_padding,
                                      options.groups, options.dilation);
}

std::string ConvTranspose2d::extra_repr() const {
  std::string text = ferry::detail::concat(in_channels, ", ", out_channels, ", kernel_size=", pair_str(kernel_size),
                                           ", stride=", pair_str(options.stride));
  if (options.padding != Size2(0)) text += ", padding=" + pair_str(options.padding);
  if (options.dilation != Size2(1)) text += ", dilation=" + pair_str(options.dilation);
  if (options.output_padding != Size2(0)) text += ", output_padding=" + pair_str(options.output_padding);
  if (options.groups != 1) text += ferry::detail::concat(", groups=", options.groups);
  if (!options.bias) text += ", bias=False";
  return text;
}

ConvTranspose1d::ConvTranspose1d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size,
                                 const ConvTranspose1dOptions& conv, const TensorOptions& tensor_options)
    : in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(conv) {
  // The 2-d layer checks the sizes and draws the parameters as PyTorch does for this shape; keep them 3-d.
  ConvTranspose2d plane(in_channels, out_channels, Size2(1, kernel_size),
                        {.stride = Size2(1, conv.stride), .padding = Size2(0, conv.padding),
                         .output_padding = Size2(0, conv.output_padding), .groups = conv.groups, .bias = conv.bias,
                         .dilation = Size2(1, conv.dilation)},
                        tensor_options);
  weight = register_parameter("weight", plane.weight.detach().squeeze(2).clone());
  if (conv.bias) bias = register_parameter("bias", plane.bias.detach().clone());
}

Tensor ConvTranspose1d::forward(const Tensor& input) {
  return functional::conv_transpose1d(input, weight, bias, options.stride, options.padding, options.output_padding,
                                      options.groups, options.dilation);
}

std::string ConvTranspose1d::extra_repr() const {
  auto one = [](std::int64_t v) { return ferry::detail::concat("(", v, ",)"); };  // Python's 1-tuple
  std::string text = ferry::detail::concat(in_channels, ", ", out_channels, ", kernel_size=", one(kernel_size),
                                           ", stride=", one(options.stride));
  if (options.padding != 0) text += ", padding=" + one(options.padding);
  if (options.dilation != 1) text += ", dilation=" + one(options.dilation);
  if (options.output_padding != 0) text += ", output_padding=" + one(options.output_padding);
  if (options.groups != 1) text += ferry::detail::concat(", groups=", options.groups);
  if (!options.bias) text += ", bias=False";
  return text;
}

}  // namespace ferry::nn
