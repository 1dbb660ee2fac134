// gelu.cpp — GELU (the exact form, x Phi(x)) over host memory: the host devices' Backend::gelu_forward and
// gelu_backward (cpu, and sim, which records the calls in a capture), one pass each way where the composed layer
// (src/nn/composed_layers.cpp) runs five kernels forward and seven backward. erf and e^x through vec_math.h, as the
// unary kernel's, so each loop vectorises; the constants rounded to the dtype as the tensor-scalar kernel rounds
// them; each operation rounded on its own (this file is compiled without multiply-add contraction), so the result
// is the composed layer's, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "dispatch.h"
#include "host_kernels.h"
#include "strided.h"
#include "vec_math.h"

namespace ferry::cpu {

namespace {

constexpr std::int64_t kBlock = 4096;          // elements a loop runs at a time; blocks split over threads
constexpr std::int64_t kPassesPerElement = 4;  // erf or e^x counts as a few elementwise passes
constexpr double kPdfScale = 0.5 * M_2_SQRTPI * M_SQRT1_2;  // 1 / sqrt(2 pi)

// body(begin, end) over [0, n) in blocks of kBlock, the blocks split over threads when the work is large enough.
template <typename Body>
void blocks(std::int64_t n, Body&& body) {
  const std::int64_t count = (n + kBlock - 1) / kBlock;
  parallel_for(count, kBlock * kPassesPerElement, [&](std::int64_t b) {
    body(b * kBlock, std::min(n, (b + 1) * kBlock));
  });
}

}  // namespace

void HostKernels::gelu_forward(const KernelTensor& out, const KernelTensor& cdf, const KernelTensor& in,
                               const Stream& /*stream*/) {
  dispatch_float(in.dtype, "gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = in.ptr<const T>();
    T *o = out.ptr<T>(), *c = cdf.ptr<T>();
    const T scale = static_cast<T>(M_SQRT1_2), one = 1, half = static_cast<T>(0.5);
    blocks(in.numel(), [&](std::int64_t begin, std::int64_t end) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {  // mul(add(erf(mul(x, 1/sqrt 2)), 1), 0.5), then mul(x, cdf)
        const T p = (erf_of(x[i] * scale) + one) * half;
        c[i] = p;
        o[i] = x[i] * p;
      }
    });
  });
}

void HostKernels::gelu_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& in,
                                const KernelTensor& cdf, const Stream& /*stream*/) {
  dispatch_float(in.dtype, "gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *g = grad_out.ptr<const T>(), *x = in.ptr<const T>(), *c = cdf.ptr<const T>();
    T* d = grad_in.ptr<T>();
    const T minus_half = static_cast<T>(-0.5), pdf_scale = static_cast<T>(kPdfScale);
    blocks(in.numel(), [&](std::int64_t begin, std::int64_t end) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) {  // mul(g, add(cdf, mul(x, mul(exp(mul(square(x), -0.5)), k))))
        const T pdf = exp_of((x[i] * x[i]) * minus_half) * pdf_scale;
        d[i] = g[i] * (c[i] + x[i] * pdf);
      }
    });
  });
}

}  // namespace ferry::cpu
