// batch_norm.cpp — training-mode BatchNorm (+ ReLU) as two passes over host memory (sums, then apply), per
// channel, or for (N, C) features per block of channels, with the arithmetic of cuda's fused kernels
// (src/nn/batch_norm_rule.h): the host devices' Backend::batch_norm_* (cpu, and sim, which records the calls in a
// capture). With the library layers off, and in evaluation mode, BatchNorm is composed from the passes in
// src/nn/batch_norm_kernels.cpp instead.
#include <algorithm>
#include <cstdint>

#include "../nn/batch_norm_rule.h"
#include "batch_norm_channel.h"
#include "dispatch.h"
#include "host_kernels.h"
#include "strided.h"

namespace ferry::cpu {

using nn::detail::BatchNormSums;

namespace {
// sum(dy') and sum(dy' (x - mean)) over one row, dy' = dy masked by the ReLU's output y when kRelu. The
// mask goes through a small buffer first: GCC 12 vectorises the select and the double sums as two loops,
// not as one (measured: one loop ran unvectorised, 20 % of a cnn step).
template <typename T, bool kRelu>
BatchNormSums gradient_sums(const T* dy, const T* y, const T* x, std::int64_t n, double mean) {
  constexpr std::int64_t kChunk = 256;
  T masked[kChunk];
  double s1 = 0, s2 = 0;
  for (std::int64_t start = 0; start < n; start += kChunk) {
    const std::int64_t m = std::min(kChunk, n - start);
    const T* g = dy + start;
    if constexpr (kRelu) {
#pragma omp simd
      for (std::int64_t i = 0; i < m; ++i) masked[i] = nn::detail::relu_masked(dy[start + i], y[start + i]);
      g = masked;
    }
    const T* xs = x + start;
#pragma omp simd reduction(+ : s1, s2)
    for (std::int64_t i = 0; i < m; ++i) {
      const double gi = static_cast<double>(g[i]);
      s1 += gi;
      s2 += gi * (static_cast<double>(xs[i]) - mean);
    }
  }
  return {s1, s2};
}

// dx = dy' k + x a + b over one row.
template <typename T, bool kRelu>
void gradient_apply(T* dx, const T* dy, const T* y, const T* x, std::int64_t n, T k, T a, T b) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    dx[i] = (kRelu ? nn::detail::relu_masked(dy[i], y[i]) : dy[i]) * k + x[i] * a + b;
  }
}

// --- features: x (N, C) (inner 1, BatchNorm1d's), a block of kFeatureBlock channels per task --------------------
// The per-channel loops above would read one element per row, C apart: here each row's block of channels is read
// as one contiguous, vectorised run, with a sum per channel. Every channel still adds its N values in row order,
// as the per-channel loops do.
constexpr std::int64_t kFeatureBlock = 64;

template <typename T>
void features_forward(T* y, const T* x, const T* w, const T* b, T* rm, T* rv, T* save_mean, T* save_invstd,
                      std::int64_t N, std::int64_t C, double eps, double factor, bool relu) {
  const double count = static_cast<double>(N);
  parallel_for((C + kFeatureBlock - 1) / kFeatureBlock, N * kFeatureBlock * 3, [&](std::int64_t block) {
    const std::int64_t c0 = block * kFeatureBlock, m = std::min(kFeatureBlock, C - c0);
    double shift_by[kFeatureBlock], s1[kFeatureBlock] = {}, s2[kFeatureBlock] = {};
    for (std::int64_t j = 0; j < m; ++j) shift_by[j] = static_cast<double>(x[c0 + j]);  // K: row 0's value
    for (std::int64_t n = 0; n < N; ++n) {
      const T* row = x + n * C + c0;
#pragma omp simd
      for (std::int64_t j = 0; j < m; ++j) {
        const double d = static_cast<double>(row[j]) - shift_by[j];
        s1[j] += d;
        s2[j] += d * d;
      }
    }
    T scale[kFeatureBlock], shift[kFeatureBlock];
    for (std::int64_t j = 0; j < m; ++j) {
      const auto f = channel_numbers(c0 + j, shift_by[j], {s1[j], s2[j]}, count, eps, w, b, rm, rv, factor, save_mean,
                                     save_invstd);
      scale[j] = static_cast<T>(f.scale);
      shift[j] = static_cast<T>(f.shift);
    }
    for (std::int64_t n = 0; n < N; ++n) {
      const T* row = x + n * C + c0;
      T* dst = y + n * C + c0;
      if (relu) {
#pragma omp simd
        for (std::int64_t j = 0; j < m; ++j) dst[j] = nn::detail::relu_value<T>(row[j] * scale[j] + shift[j]);
      } else {
#pragma omp simd
        for (std::int64_t j = 0; j < m; ++j) dst[j] = row[j] * scale[j] + shift[j];
      }
    }
  });
}

template <typename T, bool kRelu>
void features_backward(T* dx, T* grad_weight, T* grad_bias, const T* dy, const T* y, const T* x, const T* w,
                       const T* save_mean, const T* save_invstd, std::int64_t N, std::int64_t C) {
  const double count = static_cast<double>(N);
  parallel_for((C + kFeatureBlock - 1) / kFeatureBlock, N * kFeatureBlock * 4, [&](std::int64_t block) {
    const std::int64_t c0 = block * kFeatureBlock, m = std::min(kFeatureBlock, C - c0);
    double mean[kFeatureBlock], s1[kFeatureBlock] = {}, s2[kFeatureBlock] = {};
    for (std::int64_t j = 0; j < m; ++j) mean[j] = static_cast<double>(save_mean[c0 + j]);
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t at = n * C + c0;
#pragma omp simd
      for (std::int64_t j = 0; j < m; ++j) {
        const double g = static_cast<double>(kRelu ? nn::detail::relu_masked(dy[at + j], y[at + j]) : dy[at + j]);
        s1[j] += g;
        s2[j] += g * (static_cast<double>(x[at + j]) - mean[j]);
      }
    }
    T k[kFeatureBlock], a[kFeatureBlock], b[kFeatureBlock];
    for (std::int64_t j = 0; j < m; ++j) {
      const std::int64_t c = c0 + j;
      const auto r = nn::detail::batch_norm_backward_numbers({s1[j], s2[j]}, mean[j],
                                                             static_cast<double>(save_invstd[c]),
                                                             static_cast<double>(w[c]), count);
      grad_weight[c] = static_cast<T>(r.grad_weight);
      grad_bias[c] = static_cast<T>(r.grad_bias);
      k[j] = static_cast<T>(r.k);
      a[j] = static_cast<T>(r.a);
      b[j] = static_cast<T>(r.b);
    }
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t at = n * C + c0;
#pragma omp simd
      for (std::int64_t j = 0; j < m; ++j) {
        dx[at + j] = (kRelu ? nn::detail::relu_masked(dy[at + j], y[at + j]) : dy[at + j]) * k[j] + x[at + j] * a[j] +
                     b[j];
      }
    }
  });
}
}  // namespace

void HostKernels::batch_norm_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& weight,
                                     const KernelTensor& bias, const KernelTensor& running_mean,
                                     const KernelTensor& running_var, const KernelTensor& save_mean,
                                     const KernelTensor& save_invstd, const BatchNormShape& s, double factor,
                                     const Stream&) {
  dispatch_float(x.dtype, "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x.ptr<const T>();
    T* y = out.ptr<T>();
    const T* w = weight.ptr<const T>();
    const T* b = bias.ptr<const T>();
    T* rm = running_mean.data ? running_mean.ptr<T>() : nullptr;
    T* rv = running_var.data ? running_var.ptr<T>() : nullptr;
    const std::int64_t N = s.batch, C = s.channels, inner = s.inner;
    if (inner == 1) {
      features_forward(y, in, w, b, rm, rv, save_mean.ptr<T>(), save_invstd.ptr<T>(), N, C, s.eps, factor, s.relu);
      return;
    }
    parallel_for(C, N * inner * 3, [&](std::int64_t c) {
      const auto f = channel_statistics(in, N, C, inner, c, s.eps, w, b, rm, rv, factor, save_mean.ptr<T>(),
                                        save_invstd.ptr<T>());
      const T scale = static_cast<T>(f.scale), shift = static_cast<T>(f.shift);
      for (std::int64_t n = 0; n < N; ++n) {
        const T* row = in + (n * C + c) * inner;
        T* dst = y + (n * C + c) * inner;
        if (s.relu) {
#pragma omp simd
          for (std::int64_t i = 0; i < inner; ++i) dst[i] = nn::detail::relu_value<T>(row[i] * scale + shift);
        } else {
#pragma omp simd
          for (std::int64_t i = 0; i < inner; ++i) dst[i] = row[i] * scale + shift;
        }
      }
    });
  });
}

void HostKernels::batch_norm_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight,
                                      const KernelTensor& grad_bias, const KernelTensor& grad_out, const KernelTensor& x,
                                      const KernelTensor& out, const KernelTensor& weight, const KernelTensor& save_mean,
                                      const KernelTensor& save_invstd, const BatchNormShape& s, const Stream&) {
  dispatch_float(x.dtype, "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x.ptr<const T>();
    const T* dy = grad_out.ptr<const T>();
    const T* y = s.relu ? out.ptr<const T>() : nullptr;
    T* dx = grad_x.ptr<T>();
    const std::int64_t N = s.batch, C = s.channels, inner = s.inner;
    if (inner == 1) {
      const auto run = y ? features_backward<T, true> : features_backward<T, false>;
      run(dx, grad_weight.ptr<T>(), grad_bias.ptr<T>(), dy, y, in, weight.ptr<const T>(), save_mean.ptr<const T>(),
          save_invstd.ptr<const T>(), N, C);
      return;
    }
    const double count = static_cast<double>(N * inner);
    parallel_for(C, N * inner * 4, [&](std::int64_t c) {
      const double mean = static_cast<double>(save_mean.ptr<const T>()[c]);
      const double invstd = static_cast<double>(save_invstd.ptr<const T>()[c]);
      BatchNormSums sums;
      for (std::int64_t n = 0; n < N; ++n) {
        const std::int64_t base = (n * C + c) * inner;
        const BatchNormSums row = y ? gradient_sums<T, true>(dy + base, y + base, in + base, inner, mean)
                                    : gradient_sums<T, false>(dy + base, nullptr, in + base, inner, mean);
        sums.s1 += row.s1;
        sums.s2 += row.s2;
      }
      const auto r = nn::detail::batch_norm_backward_numbers(sums, mean, invstd,
                                                             static_cast<double>(weight.ptr<const T>()[c]), count);
      grad_weight.ptr<T>()[c] = static_cast<T>(r.grad_weight);
      grad_bias.ptr<T>()[c] = static_cast<T>(r.grad_bias);
      const T k = static_cast<T>(r.k), a = static_cast<T>(r.a), b = static_cast<T>(r.b);
      for (std::int64_t n = 0; n < N; ++n) {
        const std::int64_t base = (n * C + c) * inner;
        if (y) gradient_apply<T, true>(dx + base, dy + base, y + base, in + base, inner, k, a, b);
        else gradient_apply<T, false>(dx + base, dy + base, nullptr, in + base, inner, k, a, b);
      }
    });
  });
}

}  // namespace ferry::cpu
