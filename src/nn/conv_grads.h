// conv_grads.h — the two gradients of a convolution, shared by conv2d's backward and conv_transpose2d (whose
// forward is conv2d's input gradient and whose weight gradient is conv2d's, with the roles of input and output
// swapped). Not part of the public API.
#pragma once

#include "ferry/backend.h"
#include "ferry/nn/functional.h"
#include "ferry/tensor.h"

namespace ferry::nn::functional {

// The conv2d of an image (batch, in_channels, height, width) by a weight (out_channels, in_channels, kernel).
inline Backend::Conv2dShape conv2d_shape(std::int64_t batch, std::int64_t in_channels, std::int64_t height,
                                         std::int64_t width, std::int64_t out_channels, Size2 kernel, Size2 stride,
                                         Size2 padding, Size2 dilation) {
  Backend::Conv2dShape s;
  s.batch = batch;
  s.in_channels = in_channels;
  s.height = height;
  s.width = width;
  s.out_channels = out_channels;
  s.kernel_h = kernel.h;
  s.kernel_w = kernel.w;
  s.stride_h = stride.h;
  s.stride_w = stride.w;
  s.pad_h = padding.h;
  s.pad_w = padding.w;
  s.dilation_h = dilation.h;
  s.dilation_w = dilation.w;
  return s;
}

// For conv2d `s` (input (N, C, H, W), weight (O, C, kh, kw), output (N, O, oh, ow)) and g its output's gradient
// (N, O, oh, ow), contiguous: *grad_input (N, C, H, W) = the input gradient, read from g and w; *grad_weight
// (O, C, kh, kw) = the weight gradient summed over the batch, read from g and x. Either pointer may be null (then x
// or w is not read). `library`: try the device's library (cuDNN) first; a call it refuses is composed (im2col +
// GEMM + col2im). `kept_columns`: the host path's columns of x kept by forward (N, K * L), or undefined.
void conv2d_grads(const Tensor& g, const Tensor& x, const Tensor& w, const Backend::Conv2dShape& s, bool library,
                  Tensor* grad_input, Tensor* grad_weight, const Tensor& kept_columns = Tensor());

}  // namespace ferry::nn::functional
