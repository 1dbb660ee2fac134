// conv_grads.h — the two gradients of a convolution, shared by conv2d's backward and conv_transpose2d (whose
// forward is conv2d's input gradient and whose weight gradient is conv2d's, with the roles of input and output
// swapped). Not part of the public API.
#pragma once

#include "ferry/backend.h"
#include "ferry/tensor.h"

namespace ferry::nn::functional {

// For conv2d `s` (input (N, C, H, W), weight (O, C, kh, kw), output (N, O, oh, ow)) and g its output's gradient
// (N, O, oh, ow), contiguous: *grad_input (N, C, H, W) = the input gradient, read from g and w; *grad_weight
// (O, C, kh, kw) = the weight gradient summed over the batch, read from g and x. Either pointer may be null (then x
// or w is not read). `library`: try the device's library (cuDNN) first; a call it refuses is composed (im2col +
// GEMM + col2im). `kept_columns`: the host path's columns of x kept by forward (N, K * L), or undefined.
void conv2d_grads(const Tensor& g, const Tensor& x, const Tensor& w, const Backend::Conv2dShape& s, bool library,
                  Tensor* grad_input, Tensor* grad_weight, const Tensor& kept_columns = Tensor());

}  // namespace ferry::nn::functional
