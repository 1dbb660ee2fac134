// host_bn_relu_pool.h — BatchNorm (training) + ReLU + 2x2/2 max pooling as one layer over host memory (cpu,
// and sim outside a capture): the CNNs' block tail. The normalised activation is never stored: forward pools it
// as it is computed, and backward rebuilds the sparse gradient it would have had from the pooled output and the
// argmax. Per channel, 4 passes over the full-size tensors instead of 13 for BatchNorm + ReLU then pooling.
// Not here: the autograd node and the fallback (functional.cpp), the arithmetic (batch_norm_rule.h).
#pragma once

#include <cstdint>

#include "ferry/tensor.h"

namespace ferry::nn::detail {

// True when `device` runs the fused layer for a (N, C, H, W) input of `dtype` in training.
bool use_host_bn_relu_pool(Device device, DType dtype, std::int64_t height, std::int64_t width);

// x (N, C, H, W) contiguous; weight, bias (C) or undefined (ones, zeros); running_mean, running_var (C) or
// undefined (then not updated). Writes out (N, C, H/2, W/2): max over each window of relu(BatchNorm(x)),
// argmax (N, C, H/2, W/2) int64: the winner's index in its (H, W) plane (PyTorch's rule: the first maximum in
// window order, the first NaN), save_mean and save_invstd (C).
void host_bn_relu_pool_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                               const Tensor& running_var, double factor, double eps, const Tensor& out,
                               const Tensor& argmax, const Tensor& save_mean, const Tensor& save_invstd);

// grad_out (N, C, H/2, W/2) contiguous, with out, argmax and the saved statistics of the forward -> grad_x
// (N, C, H, W), grad_weight and grad_bias (C).
void host_bn_relu_pool_backward(const Tensor& grad_out, const Tensor& out, const Tensor& argmax, const Tensor& x,
                                const Tensor& weight, const Tensor& save_mean, const Tensor& save_invstd,
                                const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias);

}  // namespace ferry::nn::detail
