// onednn_conv.h — float32 conv2d on host memory (cpu, sim) through oneDNN, the library PyTorch's cpu convolutions
// run on: its kernels pick their instruction set from the CPU (AVX-512 where there is one), whatever kernels the
// machine's OpenBLAS was told to use. ferry's tensors stay NCHW; each call reorders into oneDNN's blocked layouts
// and back. Not here: the autograd node and argument checks (functional.cpp), float64 and the fallback path
// (host_conv.cpp: im2col + OpenBLAS), builds without oneDNN (FERRY_HAVE_ONEDNN unset: every call here says no).
#pragma once

#include "ferry/backend.h"
#include "ferry/tensor.h"

namespace ferry::nn::detail {

// True when conv2d `s` on `device` in `dtype` runs here: a build with oneDNN, the switch on (functional::set_onednn,
// FERRY_ONEDNN), host memory with the fused host kernels on (not in a graph capture), float32, not inside an
// OpenMP parallel region, and a shape oneDNN takes (asked once per shape; a refusal sends it to host_conv.cpp).
bool use_onednn_conv(Device device, DType dtype, const Backend::Conv2dShape& s);

// out (N, O, oh, ow) = conv(x (N, C, H, W), w (O, C, kh, kw)) + bias (O) when defined. All contiguous float32.
void onednn_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                           const Backend::Conv2dShape& s);
// grad_input (N, C, H, W) and/or grad_weight (O, C, kh, kw), allocated by the caller, from grad (N, O, oh, ow);
// either may be null (then w, or x, may be undefined: w is read for the input's gradient only, x for the weight's).
void onednn_conv2d_backward(const Tensor& grad, const Tensor& x, const Tensor& w, const Backend::Conv2dShape& s,
                            Tensor* grad_input, Tensor* grad_weight);

}  // namespace ferry::nn::detail
