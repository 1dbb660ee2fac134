// conv_transpose.cpp — conv_transpose2d and conv_transpose1d (PyTorch's "deconvolution"): the adjoint of conv2d.
// Its forward is conv2d's input gradient, its input gradient is conv2d itself, and its weight gradient is conv2d's
// with input and output swapped, so all three run on conv2d's paths (cuDNN on cuda, im2col + GEMM + col2im
// elsewhere) through conv2d_grads (conv_grads.h).
#include <string>
#include <vector>

#include "checks.h"
#include "conv_grads.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/factories.h"
#include "ferry/nn/functional.h"
#include "ferry/ops.h"

namespace ferry::nn::functional {

Tensor conv_transpose2d(const Tensor& input_in, const Tensor& weight, const Tensor& bias, Size2 stride, Size2 padding,
                        Size2 output_padding, std::int64_t groups, Size2 dilation) {
  check_same_device("conv_transpose2d", {&input_in, &weight, &bias});
  check_floating("conv_transpose2d", input_in, "input");
  FERRY_CHECK(weight.dtype() == input_in.dtype() && (!bias.defined() || bias.dtype() == input_in.dtype()),
              DTypeMismatch, "conv_transpose2d: expected input, weight and bias of one dtype, got ",
              dtype_name(input_in.dtype()), ", ", dtype_name(weight.dtype()),
              bias.defined() ? ", " + std::string(dtype_name(bias.dtype())) : std::string());
  FERRY_CHECK(input_in.dim() == 3 || input_in.dim() == 4, ShapeMismatch,
              "conv_transpose2d: expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape ",
              shape_str(input_in.shape()));
  if (input_in.dim() == 3) {
    return conv_transpose2d(input_in.unsqueeze(0), weight, bias, stride, padding, output_padding, groups, dilation)
        .squeeze(0);
  }
  const Tensor& input = input_in;
  FERRY_CHECK(weight.dim() == 4, ShapeMismatch,
              "conv_transpose2d: expected weight (in_channels, out_channels / groups, kh, kw), got shape ",
              shape_str(weight.shape()));
  FERRY_CHECK(groups >= 1 && weight.size(0) % groups == 0, InvalidArgument, "conv_transpose2d: groups=", groups,
              " must be positive and divide the weight's ", weight.size(0), " input channels");
  FERRY_CHECK(input.size(1) == weight.size(0), ShapeMismatch, "conv_transpose2d: expected input ",
              shape_str(input.shape()), " to have ", weight.size(0), " channels (weight ", shape_str(weight.shape()),
              "), but got ", input.size(1), " channels instead");
  const std::int64_t out_channels = weight.size(1) * groups;
  FERRY_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out_channels), ShapeMismatch,
              "conv_transpose2d: expected bias (", out_channels, "), got shape ", shape_str(bias.shape()));
  FERRY_CHECK(stride.h >= 1 && stride.w >= 1 && padding.h >= 0 && padding.w >= 0 && dilation.h >= 1 &&
                  dilation.w >= 1 && output_padding.h >= 0 && output_padding.w >= 0,
              InvalidArgument, "conv_transpose2d: expected stride >= 1, padding >= 0, output_padding >= 0, "
              "dilation >= 1, got stride (", stride.h, ", ", stride.w, "), padding (", padding.h, ", ", padding.w,
              "), output_padding (", output_padding.h, ", ", output_padding.w, "), dilation (", dilation.h, ", ",
              dilation.w, ")");
  // As PyTorch: each output padding below its stride or its dilation, so the output still maps onto the input.
  FERRY_CHECK((output_padding.h < stride.h || output_padding.h < dilation.h) &&
                  (output_padding.w < stride.w || output_padding.w < dilation.w),
              InvalidArgument, "conv_transpose2d: output_padding must be smaller than either stride or dilation, got "
              "output_padding (", output_padding.h, ", ", output_padding.w, "), stride (", stride.h, ", ", stride.w,
              "), dilation (", dilation.h, ", ", dilation.w, ")");
  if (groups != 1) {  // one transposed convolution per group, joined by cat (as conv2d)
    const std::int64_t in_per_group = weight.size(0) / groups, out_per_group = weight.size(1);
    std::vector<Tensor> outputs;
    for (std::int64_t g = 0; g < groups; ++g) {
      outputs.push_back(conv_transpose2d(input.narrow(1, g * in_per_group, in_per_group),
                                         weight.narrow(0, g * in_per_group, in_per_group),
                                         bias.defined() ? bias.narrow(0, g * out_per_group, out_per_group) : Tensor(),
                                         stride, padding, output_padding, 1, dilation));
    }
    return cat(outputs, 1);
  }

  // The conv2d this is the adjoint of: its input is our output (N, out_channels, oh, ow), its output our input.
  const Size2 kernel(weight.size(2), weight.size(3));
  const Backend::Conv2dShape s = conv2d_shape(
      input.size(0), out_channels,
      (input.size(2) - 1) * stride.h - 2 * padding.h + dilation.h * (kernel.h - 1) + output_padding.h + 1,
      (input.size(3) - 1) * stride.w - 2 * padding.w + dilation.w * (kernel.w - 1) + output_padding.w + 1,
      input.size(1), kernel, stride, padding, dilation);
  FERRY_CHECK(s.height >= 1 && s.width >= 1, ShapeMismatch, "conv_transpose2d: calculated output size (", s.height,
              " x ", s.width, ") is too small for input ", shape_str(input.shape()), " and kernel (", s.kernel_h,
              " x ", s.kernel_w, ") with stride (", stride.h, ", ", stride.w, ") and padding (", padding.h, ", ",
              padding.w, ")");

  // The conv2d's output is (N, C_in, H + extra_h, W + extra_w): extra > 0 only where an output padding reaches a
  // stride or more (allowed below the dilation). Those rows and columns of x are zeros, adding nothing.
  const std::int64_t H = input.size(2), W = input.size(3), extra_h = s.out_h() - H, extra_w = s.out_w() - W;
  Tensor x = input.detach().contiguous();  // (N, C_in, H, W): the conv2d's output gradient
  if (extra_h > 0 || extra_w > 0) {
    const Tensor padded = zeros({s.batch, s.out_channels, H + extra_h, W + extra_w}, {.device = x.device(),
                                                                                      .dtype = x.dtype()});
    padded.narrow(2, 0, H).narrow(3, 0, W).copy_(x);
    x = padded;
  }
  const Tensor w = weight.detach().contiguous();  // (C_in, C_out, kh, kw): the conv2d's weight (O, C, kh, kw)
  const bool library = x.numel() > 0 && w.numel() > 0 && library_layers() &&
                       backend(x.device()).conv2d_library(s, x.dtype(), x.device().index);
  Tensor out;  // (N, C_out, oh, ow)
  conv2d_grads(x, Tensor(), w, s, library, &out, nullptr);
  if (bias.defined() && out.numel() > 0) out.add_(bias.detach().view({1, out_channels, 1, 1}));

  if (autograd::needs_grad({&input, &weight, &bias})) {
    const bool want_x = input.requires_grad(), want_w = weight.requires_grad(), want_b = bias.requires_grad();
    autograd::record("conv_transpose2d", {input, weight, bias}, out,
                     [x, w, s, H, W, library, want_x, want_w, want_b](const Tensor& grad) {
                       const Tensor g = grad.contiguous();  // (N, C_out, oh, ow)
                       Tensor gx, gw, gb;
                       if (want_b) gb = sum(g, {0, 2, 3});
                       if (want_x) {  // the input gradient of the adjoint: the convolution itself
                         autograd::NoGradGuard no_grad;
                         gx = conv2d(g, w, Tensor(), Size2(s.stride_h, s.stride_w), Size2(s.pad_h, s.pad_w),
                                     Size2(s.dilation_h, s.dilation_w))
                                  .narrow(2, 0, H)
                                  .narrow(3, 0, W)
                                  .contiguous();
                       }
                       if (want_w) conv2d_grads(x, g, Tensor(), s, library, nullptr, &gw);
                       return std::vector<Tensor>{gx, gw, gb};
                     }, autograd::Saved::Inputs, /*inputs_read=*/2);  // not the bias
  }
  return out;
}

Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias, std::int64_t stride,
                        std::int64_t padding, std::int64_t output_padding, std::int64_t groups, std::int64_t dilation) {
  FERRY_CHECK(input.dim() == 2 || input.dim() == 3, ShapeMismatch,
              "conv_transpose1d: expected a 2-d (C, L) or 3-d (N, C, L) input, got shape ", shape_str(input.shape()));
  FERRY_CHECK(weight.dim() == 3, ShapeMismatch,
              "conv_transpose1d: expected weight (in_channels, out_channels / groups, k), got shape ",
              shape_str(weight.shape()));
  const int height = input.dim() - 1;  // the inserted dim of size 1, just before the length
  return conv_transpose2d(input.unsqueeze(height), weight.unsqueeze(2), bias, Size2(1, stride), Size2(0, padding),
                          Size2(0, output_padding), groups, Size2(1, dilation))
      .squeeze(height);
}

}  // namespace ferry::nn::functional
