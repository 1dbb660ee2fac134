// layer_norm.cpp — LayerNorm over host memory: the host devices' Backend::layer_norm_forward and
// layer_norm_backward (cpu, and sim, which records the calls in a capture), one pass a row each way where the
// composed layer (src/nn/composed_layers.cpp) runs nine kernels forward and about eleven backward, each a pass over
// the whole tensor. The arithmetic is the composed layer's: sums in double rounded to the dtype, the rest in the
// dtype, each operation rounded on its own (this file is compiled without multiply-add contraction, as the cuda
// kernels use the _rn intrinsics). Rows split over OpenMP threads; the weight's and bias' gradients are column
// sums, split by columns so that each keeps the rows' order (the same result on any number of threads).
#include <algorithm>
#include <array>
#include <cmath>

#include "dispatch.h"
#include "host_kernels.h"
#include "strided.h"

namespace ferry::cpu {

namespace {

constexpr std::int64_t kColumnsPerChunk = 64;  // the column sums' split: one chunk's accumulators stay in registers

}  // namespace

void HostKernels::layer_norm_forward(const KernelTensor& out, const KernelTensor& normalized, const KernelTensor& rstd,
                                     const KernelTensor& in, const KernelTensor& weight, const KernelTensor& bias,
                                     std::int64_t rows, std::int64_t d, double eps, const Stream& /*stream*/) {
  dispatch_float(in.dtype, "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = in.ptr<const T>();
    T *xh = normalized.ptr<T>(), *r = rstd.ptr<T>(), *o = out.ptr<T>();
    const T *wp = weight.ptr<const T>(), *bp = bias.ptr<const T>();
    const bool affine = wp != nullptr || bp != nullptr;
    const T epsilon = static_cast<T>(eps);
    const double per = 1.0 / static_cast<double>(d);
    parallel_for(rows, 4 * d, [&](std::int64_t row) {
      const T* p = x + row * d;
      T* q = xh + row * d;
      double total = 0;
#pragma omp simd reduction(+ : total)
      for (std::int64_t i = 0; i < d; ++i) total += static_cast<double>(p[i]);
      const T mean = static_cast<T>(total * per);
      double squares = 0;
#pragma omp simd reduction(+ : squares)
      for (std::int64_t i = 0; i < d; ++i) {
        const T centred = p[i] - mean;
        q[i] = centred;
        squares += static_cast<double>(centred * centred);
      }
      const T variance = static_cast<T>(squares * per);
      const T inv = T(1) / std::sqrt(static_cast<T>(variance + epsilon));
      r[row] = inv;
#pragma omp simd
      for (std::int64_t i = 0; i < d; ++i) q[i] = q[i] * inv;
      if (!affine) return;
      T* y = o + row * d;
#pragma omp simd
      for (std::int64_t i = 0; i < d; ++i) {
        const T scaled = wp ? q[i] * wp[i] : q[i];
        y[i] = bp ? scaled + bp[i] : scaled;
      }
    });
  });
}

void HostKernels::layer_norm_backward(const KernelTensor& grad_in, const KernelTensor& grad_weight,
                                      const KernelTensor& grad_bias, const KernelTensor& grad_out,
                                      const KernelTensor& weight, const KernelTensor& normalized,
                                      const KernelTensor& rstd, std::int64_t rows, std::int64_t d,
                                      const Stream& /*stream*/) {
  dispatch_float(normalized.dtype, "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *gp = grad_out.ptr<const T>(), *xh = normalized.ptr<const T>(), *r = rstd.ptr<const T>();
    const T* wp = weight.ptr<const T>();
    const double per = 1.0 / static_cast<double>(d);
    if (T* dx = grad_in.ptr<T>()) {
      parallel_for(rows, 3 * d, [&](std::int64_t row) {
        const T *gr = gp + row * d, *xr = xh + row * d;
        T* out = dx + row * d;
        double s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
        for (std::int64_t i = 0; i < d; ++i) {
          const T gn = wp ? gr[i] * wp[i] : gr[i];
          s1 += static_cast<double>(gn);
          s2 += static_cast<double>(gn * xr[i]);
        }
        const T m1 = static_cast<T>(s1 * per), m2 = static_cast<T>(s2 * per), inv = r[row];
#pragma omp simd
        for (std::int64_t i = 0; i < d; ++i) {
          const T gn = wp ? gr[i] * wp[i] : gr[i];
          out[i] = ((gn - m1) - xr[i] * m2) * inv;
        }
      });
    }
    T* dw = grad_weight.ptr<T>();
    T* db = grad_bias.ptr<T>();
    if (dw == nullptr && db == nullptr) return;
    const std::int64_t chunks = (d + kColumnsPerChunk - 1) / kColumnsPerChunk;
    parallel_for(chunks, rows * kColumnsPerChunk, [&](std::int64_t chunk) {
      const std::int64_t first = chunk * kColumnsPerChunk, count = std::min(kColumnsPerChunk, d - first);
      std::array<double, kColumnsPerChunk> sw{}, sb{};
      for (std::int64_t row = 0; row < rows; ++row) {
        const T *gr = gp + row * d + first, *xr = xh + row * d + first;
#pragma omp simd
        for (std::int64_t i = 0; i < count; ++i) {
          sw[i] += static_cast<double>(gr[i] * xr[i]);
          sb[i] += static_cast<double>(gr[i]);
        }
      }
      for (std::int64_t i = 0; i < count; ++i) {
        if (dw) dw[first + i] = static_cast<T>(sw[i]);
        if (db) db[first + i] = static_cast<T>(sb[i]);
      }
    });
  });
}

}  // namespace ferry::cpu
