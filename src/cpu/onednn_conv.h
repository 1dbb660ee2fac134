// onednn_conv.h — float32 conv2d on host memory (cpu, sim) through oneDNN, the library PyTorch's cpu convolutions
// run on: its kernels pick their instruction set from the CPU (AVX-512 where there is one), whatever kernels the
// machine's OpenBLAS was told to use. The host devices' "library layer" (Backend::conv2d_library, as cuDNN is
// cuda's), so a graph captured on sim records these calls as it records any kernel. ferry's tensors stay NCHW;
// each call reorders into oneDNN's blocked layouts and back, in scratch blocks from the device's own allocator.
// Not here: the autograd node and argument checks (nn/functional.cpp), float64 and the fallback path
// (nn/host_conv.cpp: im2col + OpenBLAS), builds without oneDNN (FERRY_HAVE_ONEDNN unset: every query says no).
#pragma once

#include "ferry/backend.h"

namespace ferry::cpu {

// The switch (nn::functional::set_onednn, FERRY_ONEDNN=0 for a whole run); on by default.
void set_onednn_enabled(bool enabled);
bool onednn_enabled();

// True when conv2d `s` in `dtype` runs here: a build with oneDNN, the switch on, float32, not inside an OpenMP
// parallel region, and a shape oneDNN takes (asked once per shape and thread count; a refusal is remembered).
bool onednn_conv2d_supported(const Backend::Conv2dShape& s, DType dtype);

// The three directions; all tensors contiguous float32 in host memory, every output overwritten. Scratch blocks
// (oneDNN's layouts, its scratchpad) come from `memory` on device `index` and go back before the call returns.
// out (N, O, oh, ow) = conv(x (N, C, H, W), w (O, C, kh, kw)) + bias (O), bias.data null for none.
void onednn_conv2d_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& w,
                           const KernelTensor& bias, const Backend::Conv2dShape& s, Backend& memory, int index);
// grad_input (N, C, H, W) = the convolution's adjoint applied to grad_out (N, O, oh, ow).
void onednn_conv2d_backward_input(const KernelTensor& grad_input, const KernelTensor& grad_out, const KernelTensor& w,
                                  const Backend::Conv2dShape& s, Backend& memory, int index);
// grad_weight (O, C, kh, kw) = sum over samples and positions of grad_out x the input's columns.
void onednn_conv2d_backward_weight(const KernelTensor& grad_weight, const KernelTensor& grad_out,
                                   const KernelTensor& x, const Backend::Conv2dShape& s, Backend& memory, int index);

}  // namespace ferry::cpu
