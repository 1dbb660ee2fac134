// softmax.cu — softmax and log_softmax along the last dim of contiguous (rows, n), one launch each way: the
// Backend::softmax_forward / softmax_backward contract (ferry/backend.h), where the composed op launches seven
// kernels forward and four backward. One block a row (grid-stride over rows), the cpu's arithmetic
// (src/cpu/softmax.cpp): the shift is the row's max (a row holding +inf, or all -inf, is NaN, as PyTorch's); e^x
// in the dtype; each sum in double, rounded to the dtype. Float e^x is CUDA's expf (2 ulp) where the cpu's is
// within 1 ulp, so the two devices agree to a few ulp, not bit for bit. Not here: autograd (src/core/ops.cpp).
#include <cuda_runtime.h>

#include <cmath>

#include "block_reduce.cuh"
#include "elementwise.cuh"
#include "kernels.h"
#include "launch_grid.h"

namespace ferry::cuda {

namespace {

constexpr std::int64_t kMaxThreads = 256;  // threads a row; a row of n <= 256 gets n rounded up to a warp

// The row's shift: the block's max, ignoring NaN as the cpu's `x > top ? x : top` (a NaN reaches the row through e^x).
template <typename T>
__device__ T row_shift(const T* x, std::int64_t n, T* shared) {
  T top = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) top = x[i] > top ? x[i] : top;
  return block_all_reduce(top, [](T a, T b) { return b > a ? b : a; }, shared);
}

__device__ double block_sum(double v, double* shared) {
  return block_all_reduce(v, [](double a, double b) { return a + b; }, shared);
}

template <typename T>
__global__ void softmax_forward_kernel(T* out, const T* in, std::int64_t rows, std::int64_t n, bool take_log) {
  __shared__ T shared_top[32];
  __shared__ double shared_total[32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * n;
    T* y = out + row * n;
    const T shift = row_shift(x, n, shared_top);
    double total = 0;
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const T e = exp(x[i] - shift);
      if (!take_log) y[i] = e;
      total += static_cast<double>(e);
    }
    const T sum = static_cast<T>(block_sum(total, shared_total));
    if (take_log) {
      const T log_sum = log(sum);
      for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = (x[i] - shift) - log_sum;
    } else {
      for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) y[i] = y[i] / sum;  // this thread's own e^x
    }
  }
}

// softmax: dx = y (g - sum(g y)); log_softmax: dx = g - e^y sum(g).
template <typename T>
__global__ void softmax_backward_kernel(T* dx, const T* grad, const T* out, std::int64_t rows, std::int64_t n,
                                        bool take_log) {
  __shared__ double shared_total[32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *g = grad + row * n, *y = out + row * n;
    T* d = dx + row * n;
    double total = 0;
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      total += static_cast<double>(take_log ? g[i] : g[i] * y[i]);
    }
    const T sum = static_cast<T>(block_sum(total, shared_total));
    if (take_log) {
      for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = g[i] - exp(y[i]) * sum;
    } else {
      for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = y[i] * (g[i] - sum);
    }
  }
}

// Runs launch(T{}, blocks, threads) for a float32 or float64 (rows, n); other dtypes are refused
// (softmax_supported said no to them).
template <typename F>
void launch_rows(DType dtype, bool take_log, std::int64_t rows, std::int64_t n, F&& launch) {
  if (rows == 0 || n == 0) return;
  const RowGrid grid = row_grid(rows, n, kMaxThreads);
  dispatch_float(dtype, take_log ? "log_softmax" : "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch(T{}, grid.blocks, grid.threads);
  });
}

}  // namespace

bool softmax_supported(DType dtype) { return dtype == DType::Float32 || dtype == DType::Float64; }

void launch_softmax_forward(const KernelTensor& out, const KernelTensor& in, std::int64_t rows, std::int64_t n,
                            bool log, cudaStream_t stream) {
  launch_rows(in.dtype, log, rows, n, [&](auto tag, unsigned blocks, unsigned threads) {
    using T = decltype(tag);
    softmax_forward_kernel<T><<<blocks, threads, 0, stream>>>(static_cast<T*>(out.data),
                                                              static_cast<const T*>(in.data), rows, n, log);
    FERRY_LAUNCH_CHECK();
  });
}

void launch_softmax_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& out,
                             std::int64_t rows, std::int64_t n, bool log, cudaStream_t stream) {
  launch_rows(out.dtype, log, rows, n, [&](auto tag, unsigned blocks, unsigned threads) {
    using T = decltype(tag);
    softmax_backward_kernel<T><<<blocks, threads, 0, stream>>>(
        static_cast<T*>(grad_in.data), static_cast<const T*>(grad_out.data), static_cast<const T*>(out.data), rows, n,
        log);
    FERRY_LAUNCH_CHECK();
  });
}

}  // namespace ferry::cuda
