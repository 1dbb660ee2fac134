// layer_norm_kernels.cpp — LayerNorm's host loops (see the header). Rows split over OpenMP threads; the weight's
// and bias' gradients are column sums, split by columns so that each keeps the rows' order (the same result on
// any number of threads, as the composed layer's reduce).
#include "layer_norm_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "../cpu/dispatch.h"
#include "../cpu/strided.h"
#include "ferry/error.h"
#include "ferry/factories.h"

namespace ferry::nn::detail {

namespace {

constexpr std::int64_t kColumnsPerChunk = 64;  // the column sums' split: one chunk's accumulators stay in registers

}  // namespace

void layer_norm_host_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, std::int64_t rows,
                             std::int64_t d, Tensor& out, Tensor& normalized, Tensor& rstd) {
  const TensorOptions like{.device = x.device(), .dtype = x.dtype()};
  normalized = empty(x.shape(), like);
  rstd = empty({rows}, like);
  const bool affine = weight.defined() || bias.defined();
  out = affine ? empty(x.shape(), like) : normalized;
  const Tensor w = weight.defined() ? weight.contiguous() : Tensor(), b = bias.defined() ? bias.contiguous() : Tensor();
  cpu::dispatch_float(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x.data<T>();
    T *xh = normalized.data<T>(), *r = rstd.data<T>(), *o = out.data<T>();
    const T* wp = w.defined() ? w.data<T>() : nullptr;
    const T* bp = b.defined() ? b.data<T>() : nullptr;
    const double per = 1.0 / static_cast<double>(d);
    cpu::parallel_for(rows, 4 * d, [&](std::int64_t row) {
      const T* p = in + row * d;
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
      const T inv = T(1) / std::sqrt(static_cast<T>(variance + static_cast<T>(eps)));
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

void layer_norm_host_backward(const Tensor& g, const Tensor& weight, const Tensor& normalized, const Tensor& rstd,
                              std::int64_t rows, std::int64_t d, bool want_x, bool want_w, bool want_b, Tensor& gx,
                              Tensor& gw, Tensor& gb) {
  const TensorOptions like{.device = g.device(), .dtype = normalized.dtype()};
  const Tensor w = weight.defined() ? weight.contiguous() : Tensor();
  if (want_x) gx = empty(normalized.shape(), like);
  if (want_w) gw = empty({d}, like);
  if (want_b) gb = empty({d}, like);
  cpu::dispatch_float(normalized.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *gp = g.data<T>(), *xh = normalized.data<T>(), *r = rstd.data<T>();
    const T* wp = w.defined() ? w.data<T>() : nullptr;
    const double per = 1.0 / static_cast<double>(d);
    if (want_x) {
      T* dx = gx.data<T>();
      cpu::parallel_for(rows, 3 * d, [&](std::int64_t row) {
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
    if (!want_w && !want_b) return;
    T* dw = want_w ? gw.data<T>() : nullptr;
    T* db = want_b ? gb.data<T>() : nullptr;
    const std::int64_t chunks = (d + kColumnsPerChunk - 1) / kColumnsPerChunk;
    cpu::parallel_for(chunks, rows * kColumnsPerChunk, [&](std::int64_t chunk) {
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

}  // namespace ferry::nn::detail
