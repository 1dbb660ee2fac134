// multi_norm.cpp — clip_grad_norm_'s two passes over many tensors on host memory: the host devices'
// Backend::multi_norm and multi_scale (cpu, and sim, which records the calls in a capture). Each tensor's norm is
// the composed ops' arithmetic, loop for loop: the square (or |x|) in the dtype, summed in double as the reduce
// kernel sums a whole tensor (one vectorised loop), rounded to the dtype, then the square root in the dtype; the
// largest |x| with NaN winning, as the max reduction. The tensors split over threads; a large one's scale splits
// over blocks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "dispatch.h"
#include "host_kernels.h"
#include "strided.h"

namespace ferry::cpu {

namespace {

constexpr std::int64_t kBlock = 1 << 16;  // elements a scaling task takes at a time

// |x| as UnaryOp::Abs takes it (-0 stays -0).
template <typename T>
T magnitude(T v) {
  return v < 0 ? -v : v;
}

template <typename T>
T norm_of(const T* x, std::int64_t n, double p) {
  if (n == 0) return 0;
  if (std::isinf(p)) {  // max(abs(x)) as the max reduction: the first element, then any larger one; NaN wins
    T best = magnitude(x[0]);
    for (std::int64_t i = 1; i < n && best == best; ++i) {
      const T v = magnitude(x[i]);
      if (v != v || v > best) best = v;
    }
    return best;
  }
  double total = 0;
  if (p == 1) {
#pragma omp simd reduction(+ : total)
    for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(magnitude(x[i]));
    return static_cast<T>(total);
  }
#pragma omp simd reduction(+ : total)
  for (std::int64_t i = 0; i < n; ++i) total += static_cast<double>(x[i] * x[i]);
  return std::sqrt(static_cast<T>(total));
}

}  // namespace

void HostKernels::multi_norm(const KernelTensor* tensors, std::size_t count, const KernelTensor& norms, double p,
                             const Stream& /*stream*/) {
  dispatch_float(norms.dtype, "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = norms.ptr<T>();
    std::int64_t largest = 0;
    for (std::size_t i = 0; i < count; ++i) largest = std::max(largest, tensors[i].numel());
    parallel_for(static_cast<std::int64_t>(count), largest, [&](std::int64_t i) {
      out[i] = norm_of(tensors[i].ptr<const T>(), tensors[i].numel(), p);
    });
  });
}

void HostKernels::multi_scale(const KernelTensor* tensors, std::size_t count, const KernelTensor& scale,
                              const Stream& /*stream*/) {
  dispatch_float(scale.dtype, "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = scale.ptr<const T>()[0];
    for (std::size_t t = 0; t < count; ++t) {
      T* x = tensors[t].ptr<T>();
      const std::int64_t n = tensors[t].numel();
      parallel_for((n + kBlock - 1) / kBlock, kBlock, [&](std::int64_t b) {
        const std::int64_t end = std::min(n, (b + 1) * kBlock);
#pragma omp simd
        for (std::int64_t i = b * kBlock; i < end; ++i) x[i] = x[i] * s;
      });
    }
  });
}

}  // namespace ferry::cpu
