// conv.cu — im2col and col2im for one NCHW sample, so that a convolution is one GEMM (the op layer
// composes them with gemm.cpp). col2im gathers instead of scattering: each image element sums its
// column entries in the cpu's order, with no atomics, so results match the cpu bit for bit.
// Not here: cuDNN convolutions (a later version may add them behind the same interface).
#include <cuda_runtime.h>

#include "elementwise.cuh"
#include "kernels.h"
#include "launch_grid.h"

namespace ferry::cuda {

namespace {

constexpr int kConvThreads = 256;

// Geometry as the kernels see it (a copy of Backend::Conv2dShape plus the output size).
struct ConvGeometry {
  std::int64_t channels, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  std::int64_t out_h, out_w;
};

ConvGeometry geometry_of(const Backend::Conv2dShape& s) {
  return {s.in_channels, s.height, s.width, s.kernel_h, s.kernel_w, s.stride_h, s.stride_w, s.pad_h, s.pad_w,
          s.dilation_h, s.dilation_w, s.out_h(), s.out_w()};
}

// image (C, H, W) -> columns (C*kh*kw, oh*ow): one thread per column entry, writes coalesced along ow.
template <typename T>
__global__ void __launch_bounds__(kConvThreads) im2col_kernel(T* columns, const T* image, ConvGeometry g) {
  const std::int64_t total = g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t x = t % g.out_w, y = (t / g.out_w) % g.out_h, row = t / (g.out_w * g.out_h);
    const std::int64_t kw = row % g.kernel_w, kh = (row / g.kernel_w) % g.kernel_h, c = row / (g.kernel_w * g.kernel_h);
    const std::int64_t iy = y * g.stride_h - g.pad_h + kh * g.dilation_h;
    const std::int64_t ix = x * g.stride_w - g.pad_w + kw * g.dilation_w;
    const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
    columns[t] = inside ? image[(c * g.height + iy) * g.width + ix] : T(0);
  }
}

// columns (C*kh*kw, oh*ow) -> image (C, H, W), overwritten: one thread per image element, summing
// the (at most one per (kh, kw)) column entries that came from it, in (kh, kw) order.
template <typename T>
__global__ void __launch_bounds__(kConvThreads) col2im_kernel(T* image, const T* columns, ConvGeometry g) {
  const std::int64_t total = g.channels * g.height * g.width;
  const std::int64_t plane = g.out_h * g.out_w;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t ix = t % g.width, iy = (t / g.width) % g.height, c = t / (g.width * g.height);
    T sum = T(0);
    for (std::int64_t kh = 0; kh < g.kernel_h; ++kh) {
      const std::int64_t ty = iy + g.pad_h - kh * g.dilation_h;  // = y * stride_h
      if (ty < 0 || ty % g.stride_h != 0 || ty / g.stride_h >= g.out_h) continue;
      const std::int64_t y = ty / g.stride_h;
      for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
        const std::int64_t tx = ix + g.pad_w - kw * g.dilation_w;
        if (tx < 0 || tx % g.stride_w != 0 || tx / g.stride_w >= g.out_w) continue;
        const std::int64_t x = tx / g.stride_w;
        sum += columns[((c * g.kernel_h + kh) * g.kernel_w + kw) * plane + y * g.out_w + x];
      }
    }
    image[t] = sum;
  }
}

unsigned grid_for(std::int64_t n) { return grid_stride_blocks(n, kConvThreads); }

}  // namespace

void launch_im2col(const KernelTensor& columns, const KernelTensor& image, const Backend::Conv2dShape& shape,
                   cudaStream_t stream) {
  const ConvGeometry g = geometry_of(shape);
  const std::int64_t total = g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w;
  if (total <= 0) return;
  dispatch_float(image.dtype, "im2col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    im2col_kernel<T><<<grid_for(total), kConvThreads, 0, stream>>>(static_cast<T*>(columns.data),
                                                                    static_cast<const T*>(image.data), g);
    FERRY_LAUNCH_CHECK();
  });
}

void launch_col2im(const KernelTensor& image, const KernelTensor& columns, const Backend::Conv2dShape& shape,
                   cudaStream_t stream) {
  const ConvGeometry g = geometry_of(shape);
  const std::int64_t total = g.channels * g.height * g.width;
  if (total <= 0) return;
  dispatch_float(image.dtype, "col2im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    col2im_kernel<T><<<grid_for(total), kConvThreads, 0, stream>>>(static_cast<T*>(image.data),
                                                                    static_cast<const T*>(columns.data), g);
    FERRY_LAUNCH_CHECK();
  });
}

}  // namespace ferry::cuda
