// layer_norm_kernels.h — LayerNorm over host memory (cpu, and sim outside a graph capture) as one pass a row each
// way, where the composed layer (composed_layers.cpp) runs eight kernels forward and about ten backward, each a
// pass over the whole tensor. The arithmetic is the composed layer's: sums in double rounded to the dtype, the rest
// in the dtype. Not part of the public API.
#pragma once

#include <cstdint>

#include "ferry/tensor.h"

namespace ferry::nn::detail {

// layer_norm takes the loops below where use_host_float_loops (batch_norm_kernels.h) says yes.

// x (rows, d) contiguous, weight and bias (d) or undefined -> out (rows, d); normalized (rows, d) = x-hat and rstd
// (rows) = 1 / sqrt(var + eps), kept for backward. out is `normalized` itself when there is no weight or bias.
void layer_norm_host_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, std::int64_t rows,
                             std::int64_t d, Tensor& out, Tensor& normalized, Tensor& rstd);

// g (rows, d) contiguous and the forward's normalized and rstd -> gx (rows, d) = rstd (gn - mean(gn) - x-hat
// mean(gn x-hat)) with gn = g w, gw (d) = sum over rows of g x-hat, gb (d) = sum of g; each only when wanted.
void layer_norm_host_backward(const Tensor& g, const Tensor& weight, const Tensor& normalized, const Tensor& rstd,
                              std::int64_t rows, std::int64_t d, bool want_x, bool want_w, bool want_b, Tensor& gx,
                              Tensor& gw, Tensor& gb);

}  // namespace ferry::nn::detail
