// batch_norm_rule.h — the per-channel arithmetic of fused BatchNorm (+ ReLU), shared by the host loops
// (src/cpu/batch_norm.cpp, which sim runs) and the cuda kernels (src/cuda/batch_norm.cu): how a channel's
// sums become its batch statistics, the running-statistics update, and the per-channel coefficients of the
// forward apply and of the input gradient. Everything here is double; the callers round to the tensor's
// dtype once, where they store.
//
// The forward sums are shifted by one value of the channel (its first element): with s1 = sum(x - K) and
// s2 = sum((x - K)^2), var = s2/n - (s1/n)^2 keeps its digits when |mean| >> std, where sum(x^2) would not.
#pragma once

#include <cmath>

#include "../core/host_device.h"

namespace ferry::nn::detail {

// Sums over (a slice of) one channel. Forward: s1 = sum(x - K), s2 = sum((x - K)^2).
// Backward: s1 = sum(dy), s2 = sum(dy * (x - mean)), dy masked by the ReLU when there is one.
struct BatchNormSums {
  double s1 = 0, s2 = 0;
};

// One channel's forward numbers: the batch mean and biased variance, invstd = 1/sqrt(var + eps), and
// y = x * scale + shift (scale = weight * invstd, shift = bias - mean * scale).
struct BatchNormForward {
  double mean = 0, var = 0, invstd = 0, scale = 0, shift = 0;
};

// The batch mean and biased variance from the forward sums over all `count` elements of the channel, shifted
// by `shift_by` (K above). Also what the composed layer's statistics pass uses (src/nn/batch_norm_kernels.cpp).
struct BatchNormStatistics {
  double mean = 0, var = 0;
};
FERRY_HOST_DEVICE inline BatchNormStatistics batch_norm_statistics(double shift_by, BatchNormSums sums, double count) {
  const double d = sums.s1 / count;
  double var = sums.s2 / count - d * d;
  if (var < 0) var = 0;  // rounding can dip below 0 (NaN stays NaN)
  return {shift_by + d, var};
}

FERRY_HOST_DEVICE inline BatchNormForward batch_norm_forward_numbers(double shift_by, BatchNormSums sums, double count,
                                                                    double eps, double weight, double bias) {
  BatchNormForward f;
  const BatchNormStatistics st = batch_norm_statistics(shift_by, sums, count);
  f.mean = st.mean;
  f.var = st.var;
  f.invstd = 1.0 / std::sqrt(f.var + eps);
  f.scale = weight * f.invstd;
  f.shift = bias - f.mean * f.scale;
  return f;
}

// running = (1 - factor) running + factor value; the variance enters unbiased (count / (count - 1)), as in
// PyTorch and cuDNN.
FERRY_HOST_DEVICE inline double running_mean_update(double running, double mean, double factor) {
  return (1 - factor) * running + factor * mean;
}
FERRY_HOST_DEVICE inline double running_var_update(double running, double var, double count, double factor) {
  return (1 - factor) * running + factor * var * (count / (count - 1));
}

// One channel's backward numbers: grad_x = dy * k + x * a + b (dy masked), and the parameter gradients
// grad_weight = sum(dy * xhat), grad_bias = sum(dy). From grad_x = w invstd (dy - mean(dy) - xhat mean(dy xhat)).
struct BatchNormBackward {
  double k = 0, a = 0, b = 0, grad_weight = 0, grad_bias = 0;
};

FERRY_HOST_DEVICE inline BatchNormBackward batch_norm_backward_numbers(BatchNormSums sums, double mean, double invstd,
                                                                      double weight, double count) {
  BatchNormBackward r;
  r.k = weight * invstd;
  r.a = -r.k * invstd * invstd * sums.s2 / count;
  r.b = -r.k * sums.s1 / count - r.a * mean;
  r.grad_weight = sums.s2 * invstd;
  r.grad_bias = sums.s1;
  return r;
}

// The ReLU as ferry's relu op computes it (NaN stays NaN), and its gradient mask from the ReLU's output.
template <typename T>
FERRY_HOST_DEVICE inline T relu_value(T y) {
  return y < T(0) ? T(0) : y;
}
template <typename T>
FERRY_HOST_DEVICE inline T relu_masked(T grad, T out) {
  return out > T(0) ? grad : T(0);
}

}  // namespace ferry::nn::detail
