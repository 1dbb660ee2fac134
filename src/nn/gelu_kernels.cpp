// gelu_kernels.cpp — GELU's host loops (see the header): erf and e^x through vec_math.h, as the unary kernel's,
// so each loop vectorises; the constants rounded to the dtype as the tensor-scalar kernel rounds them.
#include "gelu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../cpu/dispatch.h"
#include "../cpu/strided.h"
#include "../cpu/vec_math.h"
#include "ferry/factories.h"

namespace ferry::nn::detail {

namespace {

constexpr std::int64_t kBlock = 4096;          // elements a loop runs at a time; blocks split over threads
constexpr std::int64_t kPassesPerElement = 4;  // erf or e^x counts as a few elementwise passes
constexpr double kPdfScale = 0.5 * M_2_SQRTPI * M_SQRT1_2;  // 1 / sqrt(2 pi)

// body(begin, end) over [0, n) in blocks of kBlock, the blocks split over threads when the work is large enough.
template <typename Body>
void blocks(std::int64_t n, Body&& body) {
  const std::int64_t count = (n + kBlock - 1) / kBlock;
  cpu::parallel_for(count, kBlock * kPassesPerElement, [&](std::int64_t b) {
    body(b * kBlock, std::min(n, (b + 1) * kBlock));
  });
}

}  // namespace

void gelu_host_forward(const Tensor& x, Tensor& out, Tensor& cdf) {
  const TensorOptions like{.device = x.device(), .dtype = x.dtype()};
  out = empty(x.shape(), like);
  cdf = empty(x.shape(), like);
  cpu::dispatch_float(x.dtype(), "gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x.data<T>();
    T *o = out.data<T>(), *c = cdf.data<T>();
    const T scale = static_cast<T>(M_SQRT1_2), one = 1, half = static_cast<T>(0.5);
    blocks(x.numel(), [&](std::int64_t begin, std::int64_t end) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {  // mul(add(erf(mul(x, 1/sqrt 2)), 1), 0.5), then mul(x, cdf)
        const T p = (cpu::erf_of(in[i] * scale) + one) * half;
        c[i] = p;
        o[i] = in[i] * p;
      }
    });
  });
}

Tensor gelu_host_backward(const Tensor& g, const Tensor& x, const Tensor& cdf) {
  Tensor dx = empty(x.shape(), {.device = x.device(), .dtype = x.dtype()});
  cpu::dispatch_float(x.dtype(), "gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *gp = g.data<T>(), *in = x.data<T>(), *c = cdf.data<T>();
    T* d = dx.data<T>();
    const T minus_half = static_cast<T>(-0.5), pdf_scale = static_cast<T>(kPdfScale);
    blocks(x.numel(), [&](std::int64_t begin, std::int64_t end) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {  // mul(g, add(cdf, mul(x, mul(exp(mul(square(x), -0.5)), k))))
        const T pdf = cpu::exp_of((in[i] * in[i]) * minus_half) * pdf_scale;
        d[i] = gp[i] * (c[i] + in[i] * pdf);
      }
    });
  });
  return dx;
}

}  // namespace ferry::nn::detail
