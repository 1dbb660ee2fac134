// batch_norm_channel.h — one channel's training statistics over host memory: the shifted sums of its N rows,
// the batch mean and invstd stored, the running statistics updated (batch_norm_rule.h's arithmetic). Shared by
// the BatchNorm + ReLU host loops (batch_norm.cpp) and the fused BatchNorm + ReLU + pooling layer
// (bn_relu_pool.cpp). Not here: the apply passes, which differ between the two.
#pragma once

#include <cstdint>

#include "../nn/batch_norm_rule.h"

namespace ferry::cpu {

// sum(x - K) and sum((x - K)^2) over one row of n elements, in double.
template <typename T>
nn::detail::BatchNormSums shifted_sums(const T* row, std::int64_t n, double shift_by) {
  double s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(row[i]) - shift_by;
    s1 += d;
    s2 += d * d;
  }
  return {s1, s2};
}

// Channel c's forward numbers from its shifted sums over `count` elements, with save_mean[c] and save_invstd[c]
// written and, when rm and rv are not null, running_mean[c] and running_var[c] updated by `factor`. w and b may be
// null (1 and 0).
template <typename T>
nn::detail::BatchNormForward channel_numbers(std::int64_t c, double shift_by, nn::detail::BatchNormSums sums,
                                             double count, double eps, const T* w, const T* b, T* rm, T* rv,
                                             double factor, T* save_mean, T* save_invstd) {
  using namespace nn::detail;
  const BatchNormForward f = batch_norm_forward_numbers(shift_by, sums, count, eps, w ? static_cast<double>(w[c]) : 1.0,
                                                        b ? static_cast<double>(b[c]) : 0.0);
  save_mean[c] = static_cast<T>(f.mean);
  save_invstd[c] = static_cast<T>(f.invstd);
  if (rm) {
    rm[c] = static_cast<T>(running_mean_update(static_cast<double>(rm[c]), f.mean, factor));
    rv[c] = static_cast<T>(running_var_update(static_cast<double>(rv[c]), f.var, count, factor));
  }
  return f;
}

// Channel c of x (N, C, inner): its forward numbers, with save_mean[c] and save_invstd[c] written and, when rm
// and rv are not null, running_mean[c] and running_var[c] updated by `factor`. w and b may be null (1 and 0).
template <typename T>
nn::detail::BatchNormForward channel_statistics(const T* x, std::int64_t N, std::int64_t C, std::int64_t inner,
                                                std::int64_t c, double eps, const T* w, const T* b, T* rm, T* rv,
                                                double factor, T* save_mean, T* save_invstd) {
  using namespace nn::detail;
  const double count = static_cast<double>(N * inner);
  const double shift_by = static_cast<double>(x[c * inner]);  // K: the channel's first element
  BatchNormSums sums;
  for (std::int64_t n = 0; n < N; ++n) {
    const BatchNormSums row = shifted_sums(x + (n * C + c) * inner, inner, shift_by);
    sums.s1 += row.s1;
    sums.s2 += row.s2;
  }
  return channel_numbers(c, shift_by, sums, count, eps, w, b, rm, rv, factor, save_mean, save_invstd);
}

}  // namespace ferry::cpu
