// host_conv.h — conv2d for host-memory devices (cpu, sim): OpenMP over samples, each sample's im2col +
// single-threaded GEMM in a thread's own cache-sized buffer (PyTorch's slow_conv2d scheme). Not part of the
// public API; functional.cpp falls back to the portable backend path (chunked im2col + batched GEMM).
#pragma once

#include "ferry/backend.h"
#include "ferry/tensor.h"

namespace ferry::nn::detail {

// True when conv2d `s` on `device` takes the host path: host memory (fused host kernels on), more than one
// OpenMP thread and sample, enough work to pay for a parallel region, and not already inside one.
bool use_host_conv(Device device, const Backend::Conv2dShape& s);

// out (N, O, oh, ow) = conv(x (N, C, H, W), w (O, C, kh, kw)) + bias (O) when defined. All contiguous.
// `keep_columns`, when defined, (N, K * L) with K = C * kh * kw and L = oh * ow: each sample's im2col
// columns are written there (for backward to reuse, as PyTorch's slow_conv2d keeps `finput`) instead of
// into a per-thread scratch buffer.
void host_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out,
                         const Backend::Conv2dShape& s, const Tensor& keep_columns = Tensor());
// grad_input (N, C, H, W) and/or grad_weight (O, C, kh, kw) from grad (N, O, oh, ow); either may be null (then w,
// or x, may be undefined: w is read for the input's gradient only, x for the weight's).
// `columns`: forward's kept columns (N, K * L), or undefined to recompute them from x.
void host_conv2d_backward(const Tensor& grad, const Tensor& x, const Tensor& w, const Backend::Conv2dShape& s,
                          Tensor* grad_input, Tensor* grad_weight, const Tensor& columns = Tensor());

}  // namespace ferry::nn::detail
