// gelu.cu — GELU (the exact form, x Phi(x)) as one launch each way: the Backend::gelu_forward / gelu_backward
// contract (ferry/backend.h), where the composed layer launches five kernels forward and seven backward. Each
// operation is the composed one's on this card (erf and e^x as the unary kernels call them, the constants rounded to
// the dtype as the tensor-scalar kernel rounds them), rounded on its own (src/core/rounded.h), so the two give the
// same bits. A grid-stride loop over the elements, float32 and float64. Not here: autograd
// (src/nn/composed_layers.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../core/rounded.h"
#include "elementwise.cuh"
#include "kernels.h"

namespace ferry::cuda {

namespace {

using ferry::detail::rounded_add;
using ferry::detail::rounded_mul;

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;  // the loops stride over the rest
constexpr double kPdfScale = 0.5 * M_2_SQRTPI * M_SQRT1_2;  // 1 / sqrt(2 pi)

__device__ __forceinline__ std::int64_t first_element() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t element_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

// cdf = mul(add(erf(mul(x, 1/sqrt 2)), 1), 0.5), out = mul(x, cdf).
template <typename T>
__global__ void gelu_forward_kernel(T* out, T* cdf, const T* in, std::int64_t n, T scale) {
  for (std::int64_t i = first_element(); i < n; i += element_stride()) {
    const T x = in[i];
    const T p = rounded_mul(rounded_add(static_cast<T>(erf(rounded_mul(x, scale))), T(1)), T(0.5));
    cdf[i] = p;
    out[i] = rounded_mul(x, p);
  }
}

// dx = mul(g, add(cdf, mul(x, mul(exp(mul(square(x), -0.5)), 1 / sqrt(2 pi))))).
template <typename T>
__global__ void gelu_backward_kernel(T* dx, const T* grad, const T* in, const T* cdf, std::int64_t n, T pdf_scale) {
  for (std::int64_t i = first_element(); i < n; i += element_stride()) {
    const T x = in[i];
    const T pdf = rounded_mul(static_cast<T>(exp(rounded_mul(rounded_mul(x, x), T(-0.5)))), pdf_scale);
    dx[i] = rounded_mul(grad[i], rounded_add(cdf[i], rounded_mul(x, pdf)));
  }
}

// Runs launch(T{}, blocks) for float32 or float64 over n elements, then checks the launch.
template <typename F>
void launch_elements(DType dtype, std::int64_t n, F&& launch) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  dispatch_float(dtype, "gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(T{}, blocks);
  });
  FERRY_LAUNCH_CHECK();
}

}  // namespace

bool gelu_supported(DType dtype) { return dtype == DType::Float32 || dtype == DType::Float64; }

void launch_gelu_forward(const KernelTensor& out, const KernelTensor& cdf, const KernelTensor& in,
                         cudaStream_t stream) {
  launch_elements(in.dtype, in.numel(), [&](auto zero, unsigned blocks) {
    using T = decltype(zero);
    gelu_forward_kernel<T><<<blocks, kThreads, 0, stream>>>(out.ptr<T>(), cdf.ptr<T>(), in.ptr<const T>(), in.numel(),
                                                            static_cast<T>(M_SQRT1_2));
  });
}

void launch_gelu_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& in,
                          const KernelTensor& cdf, cudaStream_t stream) {
  launch_elements(in.dtype, in.numel(), [&](auto zero, unsigned blocks) {
    using T = decltype(zero);
    gelu_backward_kernel<T><<<blocks, kThreads, 0, stream>>>(grad_in.ptr<T>(), grad_out.ptr<const T>(),
                                                             in.ptr<const T>(), cdf.ptr<const T>(), in.numel(),
                                                             static_cast<T>(kPdfScale));
  });
}

}  // namespace ferry::cuda
