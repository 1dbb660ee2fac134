// loss.cu — softmax cross-entropy over the last dim of (rows, classes) logits with int64 targets:
// the loss of each row and, when asked, its gradient, in the cpu's arithmetic (e^(x - max) in the dtype,
// the sum in double; CUDA's expf is within 2 ulp where the cpu's is within 1). A target out of range
// leaves NaN and is raised at the next sync. Not here: the mean over rows and autograd (the op layer).
#include <cuda_runtime.h>

#include <cmath>

#include "block_reduce.cuh"
#include "device_report.cuh"
#include "elementwise.cuh"
#include "kernels.h"
#include "launch_grid.h"

namespace ferry::cuda {

namespace {

// One block per row (grid-stride over rows). blockDim.x is a multiple of 32, at most 1024.
template <typename T>
__global__ void cross_entropy_kernel(T* loss, T* grad, const T* logits, const std::int64_t* target, std::int64_t rows,
                                     std::int64_t classes, double grad_scale, DeviceErrorReport* report) {
  __shared__ T shared_top[32];
  __shared__ double shared_total[32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = logits + row * classes;
    // the max as the cpu takes it: (top < v) ? v : top, so NaN never wins (and still makes the row NaN through e^x)
    T top = x[0];
    for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) top = top < x[c] ? x[c] : top;
    top = block_all_reduce(top, [](T a, T b) { return a < b ? b : a; }, shared_top);
    double total = 0;
    for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) total += static_cast<double>(exp(x[c] - top));
    total = block_all_reduce(total, [](double a, double b) { return a + b; }, shared_total);
    const double log_sum = log(total) + static_cast<double>(top);
    const std::int64_t t = target[row];
    const bool valid = t >= 0 && t < classes;
    if (threadIdx.x == 0) {
      if (!valid) report_kernel_error(report, KernelErrorKind::CrossEntropyTarget, t, classes);
      loss[row] = valid ? static_cast<T>(log_sum - static_cast<double>(x[t])) : static_cast<T>(NAN);
    }
    if (grad) {
      T* g = grad + row * classes;
      for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
        const double p = static_cast<double>(exp(x[c] - top)) / total;
        g[c] = valid ? static_cast<T>((p - (c == t ? 1.0 : 0.0)) * grad_scale) : static_cast<T>(NAN);
      }
    }
  }
}

}  // namespace

void launch_cross_entropy(const KernelTensor& loss_rows, const KernelTensor& grad, const KernelTensor& logits,
                          const KernelTensor& target, double grad_scale, DeviceErrorReport* report,
                          cudaStream_t stream) {
  const std::int64_t rows = logits.shape[0], classes = logits.shape[1];
  if (rows == 0) return;
  FERRY_CHECK(classes > 0, InvalidArgument, "cross_entropy: expected at least one class, got logits of shape (", rows,
              ", 0)");
  FERRY_ASSERT(target.dtype == DType::Int64, "cross_entropy: the op layer passes int64 targets");
  dispatch_float(logits.dtype, "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const RowGrid grid = row_grid(rows, classes, 256);
    cross_entropy_kernel<T><<<grid.blocks, grid.threads, 0, stream>>>(
        static_cast<T*>(loss_rows.data), grad.data ? static_cast<T*>(grad.data) : nullptr,
        static_cast<const T*>(logits.data), static_cast<const std::int64_t*>(target.data), rows, classes, grad_scale,
        report);
    FERRY_LAUNCH_CHECK();
  });
}

}  // namespace ferry::cuda
