// gelu_kernels.h — GELU (the exact form, x Phi(x)) over host memory (cpu, and sim outside a graph capture) as one
// pass each way, where the composed layer (composed_layers.cpp) runs five kernels forward and seven backward. Each
// operation is the composed one's, rounded as it is (this file is compiled without multiply-add contraction), so
// the two give the same bits. Not part of the public API.
#pragma once

#include "ferry/tensor.h"

namespace ferry::nn::detail {

// gelu takes the loops below where use_host_float_loops (batch_norm_kernels.h) says yes.

// x contiguous -> out = x Phi(x) and cdf = Phi(x) = (1 + erf(x / sqrt 2)) / 2, kept for backward.
void gelu_host_forward(const Tensor& x, Tensor& out, Tensor& cdf);

// g, x and the forward's cdf (contiguous, one shape) -> g (Phi(x) + x phi(x)), phi(x) = e^(-x^2 / 2) / sqrt(2 pi).
Tensor gelu_host_backward(const Tensor& g, const Tensor& x, const Tensor& cdf);

}  // namespace ferry::nn::detail
