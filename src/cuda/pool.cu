// pool.cu — 2-d max and average pooling over (planes, H, W), forward and backward, with the cpu's
// rules (max: NaN wins, argmax is the flat index in the plane, -1 for an all-padding window; average
// counts padding). Backward passes gather per input element in the cpu's order: no atomics, the same
// sums bit for bit. Not here: the NCHW bookkeeping (the op layer).
#include <cuda_runtime.h>

#include <limits>

#include "elementwise.cuh"
#include "kernels.h"
#include "launch_grid.h"

namespace ferry::cuda {

namespace {

constexpr int kPoolThreads = 256;

struct PoolGeometry {
  std::int64_t planes, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, out_h, out_w;
};

PoolGeometry geometry_of(const Backend::Pool2dShape& s) {
  return {s.planes, s.height, s.width, s.kernel_h, s.kernel_w, s.stride_h, s.stride_w, s.pad_h, s.pad_w,
          s.out_h(), s.out_w()};
}

// Floor division for a possibly negative numerator and a positive divisor.
__device__ __forceinline__ std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// The outputs [first, last] along one axis whose window covers input position i.
__device__ __forceinline__ void covering_outputs(std::int64_t i, std::int64_t pad, std::int64_t kernel,
                                                 std::int64_t stride, std::int64_t outputs, std::int64_t& first,
                                                 std::int64_t& last) {
  // window of output o: [o*stride - pad, o*stride - pad + kernel - 1]
  first = floor_div(i + pad - kernel, stride) + 1;
  if (first < 0) first = 0;
  last = floor_div(i + pad, stride);
  if (last > outputs - 1) last = outputs - 1;
}

// in (planes, H, W) -> out, argmax (planes, oh, ow): the cpu's scan, including where it stops on NaN.
template <typename T>
__global__ void __launch_bounds__(kPoolThreads)
    max_pool2d_kernel(T* out, std::int64_t* argmax, const T* in, PoolGeometry g) {
  const std::int64_t total = g.planes * g.out_h * g.out_w;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t xo = t % g.out_w, y = (t / g.out_w) % g.out_h, p = t / (g.out_w * g.out_h);
    const T* plane = in + p * g.height * g.width;
    T best = -std::numeric_limits<T>::infinity();
    std::int64_t best_index = -1;
    for (std::int64_t kh = 0; kh < g.kernel_h; ++kh) {
      const std::int64_t iy = y * g.stride_h - g.pad_h + kh;
      if (iy < 0 || iy >= g.height) continue;
      for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const std::int64_t ix = xo * g.stride_w - g.pad_w + kw;
        if (ix < 0 || ix >= g.width) continue;
        const T v = plane[iy * g.width + ix];
        // PyTorch's rule, as the cpu: the first maximum in window order; the first NaN wins over all after it.
        if (best_index < 0 || (best == best && (v > best || v != v))) {
          best = v;
          best_index = iy * g.width + ix;
        }
      }
    }
    out[t] = best;
    argmax[t] = best_index;
  }
}

// grad_out, argmax (planes, oh, ow) -> grad_in (planes, H, W), overwritten: each input element sums
// the gradients of the outputs that picked it, in increasing output order.
template <typename T>
__global__ void __launch_bounds__(kPoolThreads)
    max_pool2d_backward_kernel(T* grad_in, const T* grad_out, const std::int64_t* argmax, PoolGeometry g) {
  const std::int64_t total = g.planes * g.height * g.width;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t ix = t % g.width, iy = (t / g.width) % g.height, p = t / (g.width * g.height);
    const std::int64_t flat = iy * g.width + ix;
    std::int64_t y0, y1, x0, x1;
    covering_outputs(iy, g.pad_h, g.kernel_h, g.stride_h, g.out_h, y0, y1);
    covering_outputs(ix, g.pad_w, g.kernel_w, g.stride_w, g.out_w, x0, x1);
    const std::int64_t base = p * g.out_h * g.out_w;
    T sum = T(0);
    for (std::int64_t y = y0; y <= y1; ++y) {
      for (std::int64_t x = x0; x <= x1; ++x) {
        const std::int64_t o = base + y * g.out_w + x;
        if (argmax[o] == flat) sum += grad_out[o];
      }
    }
    grad_in[t] = sum;
  }
}

// in (planes, H, W) -> out (planes, oh, ow): the sum in (kh, kw) order times 1 / (kh * kw).
template <typename T>
__global__ void __launch_bounds__(kPoolThreads) avg_pool2d_kernel(T* out, const T* in, PoolGeometry g) {
  const std::int64_t total = g.planes * g.out_h * g.out_w;
  const T scale = T(1) / static_cast<T>(g.kernel_h * g.kernel_w);
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t xo = t % g.out_w, y = (t / g.out_w) % g.out_h, p = t / (g.out_w * g.out_h);
    const T* plane = in + p * g.height * g.width;
    T total_value = 0;
    for (std::int64_t kh = 0; kh < g.kernel_h; ++kh) {
      const std::int64_t iy = y * g.stride_h - g.pad_h + kh;
      if (iy < 0 || iy >= g.height) continue;
      for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const std::int64_t ix = xo * g.stride_w - g.pad_w + kw;
        if (ix >= 0 && ix < g.width) total_value += plane[iy * g.width + ix];
      }
    }
    out[t] = total_value * scale;
  }
}

// grad_out (planes, oh, ow) -> grad_in (planes, H, W), overwritten: each input element sums
// grad_out * scale of the windows that cover it, in increasing output order.
template <typename T>
__global__ void __launch_bounds__(kPoolThreads) avg_pool2d_backward_kernel(T* grad_in, const T* grad_out, PoolGeometry g) {
  const std::int64_t total = g.planes * g.height * g.width;
  const T scale = T(1) / static_cast<T>(g.kernel_h * g.kernel_w);
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t ix = t % g.width, iy = (t / g.width) % g.height, p = t / (g.width * g.height);
    std::int64_t y0, y1, x0, x1;
    covering_outputs(iy, g.pad_h, g.kernel_h, g.stride_h, g.out_h, y0, y1);
    covering_outputs(ix, g.pad_w, g.kernel_w, g.stride_w, g.out_w, x0, x1);
    const T* go = grad_out + p * g.out_h * g.out_w;
    T sum = T(0);
    for (std::int64_t y = y0; y <= y1; ++y) {
      for (std::int64_t x = x0; x <= x1; ++x) sum += go[y * g.out_w + x] * scale;
    }
    grad_in[t] = sum;
  }
}

unsigned grid_for(std::int64_t n) { return grid_stride_blocks(n, kPoolThreads); }

}  // namespace

void launch_max_pool2d(const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& in,
                       const Backend::Pool2dShape& shape, cudaStream_t stream) {
  const PoolGeometry g = geometry_of(shape);
  const std::int64_t total = g.planes * g.out_h * g.out_w;
  if (total <= 0) return;
  dispatch_float(in.dtype, "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool2d_kernel<T><<<grid_for(total), kPoolThreads, 0, stream>>>(
        static_cast<T*>(out.data), static_cast<std::int64_t*>(argmax.data), static_cast<const T*>(in.data), g);
    FERRY_LAUNCH_CHECK();
  });
}

void launch_max_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& argmax,
                                const Backend::Pool2dShape& shape, cudaStream_t stream) {
  const PoolGeometry g = geometry_of(shape);
  const std::int64_t total = g.planes * g.height * g.width;
  if (total <= 0) return;
  dispatch_float(grad_in.dtype, "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_pool2d_backward_kernel<T><<<grid_for(total), kPoolThreads, 0, stream>>>(
        static_cast<T*>(grad_in.data), static_cast<const T*>(grad_out.data),
        static_cast<const std::int64_t*>(argmax.data), g);
    FERRY_LAUNCH_CHECK();
  });
}

void launch_avg_pool2d(const KernelTensor& out, const KernelTensor& in, const Backend::Pool2dShape& shape,
                       cudaStream_t stream) {
  const PoolGeometry g = geometry_of(shape);
  const std::int64_t total = g.planes * g.out_h * g.out_w;
  if (total <= 0) return;
  dispatch_float(in.dtype, "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool2d_kernel<T><<<grid_for(total), kPoolThreads, 0, stream>>>(static_cast<T*>(out.data),
                                                                        static_cast<const T*>(in.data), g);
    FERRY_LAUNCH_CHECK();
  });
}

void launch_avg_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out,
                                const Backend::Pool2dShape& shape, cudaStream_t stream) {
  const PoolGeometry g = geometry_of(shape);
  const std::int64_t total = g.planes * g.height * g.width;
  if (total <= 0) return;
  dispatch_float(grad_in.dtype, "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_pool2d_backward_kernel<T><<<grid_for(total), kPoolThreads, 0, stream>>>(
        static_cast<T*>(grad_in.data), static_cast<const T*>(grad_out.data), g);
    FERRY_LAUNCH_CHECK();
  });
}

}  // namespace ferry::cuda
