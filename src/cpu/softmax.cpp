// softmax.cpp — softmax and log_softmax along the last dim over host memory: the host devices'
// Backend::softmax_forward and softmax_backward (cpu, and sim, which records the calls in a capture). Each row is
// read twice and written once forward (the max, then e^x and its sum, then the scale), read twice backward, where
// the composed op (src/core/ops.cpp) runs seven kernels forward and four backward, each a pass over the whole
// tensor and most allocating one. The arithmetic is the composed op's, operation for operation: e^x through
// UnaryOp::Exp's function (vec_math.h's exp_f32 in float, so the loops vectorise), each sum in double rounded to
// the dtype, as the reduce kernel's; the results agree with the composed op's up to the order of a sum's terms.
#include <cmath>
#include <cstdint>
#include <limits>

#include "dispatch.h"
#include "host_kernels.h"
#include "strided.h"
#include "vec_math.h"

namespace ferry::cpu {

namespace {

// A row's work in elementwise passes (the max, e^x, the scale), for the decision to split rows over threads.
constexpr std::int64_t kPassesPerElement = 3;

// The row's shift: its max. A row holding +inf, or all -inf, is then NaN throughout (inf - inf), as PyTorch's. NaN
// never wins the comparison: it reaches the result through e^x.
template <typename T>
T row_shift(const T* x, std::int64_t n) {
  T top = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : top)
  for (std::int64_t i = 0; i < n; ++i) top = x[i] > top ? x[i] : top;
  return top;
}

template <typename T>
void softmax_row(T* y, const T* x, std::int64_t n) {
  const T shift = row_shift(x, n);
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (std::int64_t i = 0; i < n; ++i) {
    const T e = exp_of(x[i] - shift);
    y[i] = e;
    total += static_cast<double>(e);
  }
  const T sum = static_cast<T>(total);
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = y[i] / sum;
}

template <typename T>
void log_softmax_row(T* y, const T* x, std::int64_t n) {
  const T shift = row_shift(x, n);
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(exp_of(x[i] - shift));
  const T log_sum = std::log(static_cast<T>(total));
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = (x[i] - shift) - log_sum;
}

// dx = y (g - sum(g y))
template <typename T>
void softmax_backward_row(T* dx, const T* g, const T* y, std::int64_t n) {
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(g[i] * y[i]);
  const T dot = static_cast<T>(total);
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dx[i] = y[i] * (g[i] - dot);
}

// dx = g - e^y sum(g)
template <typename T>
void log_softmax_backward_row(T* dx, const T* g, const T* y, std::int64_t n) {
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(g[i]);
  const T sum = static_cast<T>(total);
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dx[i] = g[i] - exp_of(y[i]) * sum;
}

}  // namespace

void HostKernels::softmax_forward(const KernelTensor& out, const KernelTensor& in, std::int64_t rows, std::int64_t n,
                                  bool log, const Stream& /*stream*/) {
  dispatch_float(in.dtype, log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = in.ptr<const T>();
    T* y = out.ptr<T>();
    parallel_for(rows, n * kPassesPerElement, [&](std::int64_t r) {
      if (log) log_softmax_row(y + r * n, x + r * n, n);
      else softmax_row(y + r * n, x + r * n, n);
    });
  });
}

void HostKernels::softmax_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& out,
                                   std::int64_t rows, std::int64_t n, bool log, const Stream& /*stream*/) {
  dispatch_float(out.dtype, log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *g = grad_out.ptr<const T>(), *y = out.ptr<const T>();
    T* dx = grad_in.ptr<T>();
    parallel_for(rows, n * kPassesPerElement, [&](std::int64_t r) {
      if (log) log_softmax_backward_row(dx + r * n, g + r * n, y + r * n, n);
      else softmax_backward_row(dx + r * n, g + r * n, y + r * n, n);
    });
  });
}

}  // namespace ferry::cpu
