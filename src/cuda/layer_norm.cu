// layer_norm.cu — LayerNorm over the last d elements of contiguous (rows, d): the Backend::layer_norm_forward /
// layer_norm_backward contract (ferry/backend.h), one launch forward and three backward (the input's gradient; the
// weight's and bias' as column sums in two steps), where the composed layer launches nine kernels forward and about
// eleven backward. The host loops' arithmetic (src/cpu/layer_norm.cpp): each sum in double rounded to the dtype,
// every other operation in the dtype and rounded on its own (src/core/rounded.h). The sums' order differs from the
// cpu's, so the two devices agree to rounding, not bit for bit; on one card the result is the same on every run.
// Not here: autograd (src/nn/composed_layers.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../core/rounded.h"
#include "block_reduce.cuh"
#include "device_state.h"
#include "elementwise.cuh"
#include "kernels.h"
#include "launch_grid.h"

namespace ferry::cuda {

namespace {

using ferry::detail::rounded_add;
using ferry::detail::rounded_div;
using ferry::detail::rounded_mul;
using ferry::detail::rounded_sqrt;
using ferry::detail::rounded_sub;

constexpr std::int64_t kMaxRowThreads = 256;  // threads a row; a row of d <= 256 gets d rounded up to a warp
// The column sums: a block takes 32 columns (one a lane) over a chunk of rows, its 8 warps each a row in 8 of the
// chunk; the chunks' partial sums (double) are then added in chunk order. Fixed sizes, so the result depends on
// the shape only.
constexpr int kColumnThreads = 256, kColumnsPerBlock = 32, kRowLanes = kColumnThreads / kColumnsPerBlock;
constexpr std::int64_t kRowsPerChunk = 128;
constexpr std::int64_t kMaxChunks = 65535;  // gridDim.y's limit

__device__ double block_sum(double v, double* shared) {
  return block_all_reduce(v, [](double a, double b) { return a + b; }, shared);
}

// One block a row (grid-stride over rows): mean, then the centred values (kept in `normalized`) and their squares'
// mean, then x-hat = centred rstd and out = x-hat w + b.
template <typename T>
__global__ void layer_norm_forward_kernel(T* out, T* normalized, T* rstd, const T* in, const T* weight, const T* bias,
                                          std::int64_t rows, std::int64_t d, T eps, double per) {
  __shared__ double shared[32];
  const bool affine = weight != nullptr || bias != nullptr;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * d;
    T* q = normalized + row * d;
    double total = 0;
    for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) total += static_cast<double>(x[i]);
    const T mean = static_cast<T>(block_sum(total, shared) * per);
    double squares = 0;
    for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const T centred = rounded_sub(x[i], mean);
      q[i] = centred;
      squares += static_cast<double>(rounded_mul(centred, centred));
    }
    const T variance = static_cast<T>(block_sum(squares, shared) * per);
    const T inv = rounded_div(T(1), rounded_sqrt(rounded_add(variance, eps)));
    if (threadIdx.x == 0) rstd[row] = inv;
    T* y = out + row * d;
    for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {  // this thread's own centred values
      const T v = rounded_mul(q[i], inv);
      q[i] = v;
      if (!affine) continue;
      const T scaled = weight ? rounded_mul(v, weight[i]) : v;
      y[i] = bias ? rounded_add(scaled, bias[i]) : scaled;
    }
  }
}

// One block a row: dx = ((gn - mean(gn)) - x-hat mean(gn x-hat)) rstd, gn = g w.
template <typename T>
__global__ void layer_norm_backward_kernel(T* dx, const T* grad, const T* weight, const T* normalized, const T* rstd,
                                           std::int64_t rows, std::int64_t d, double per) {
  __shared__ double shared[32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T *g = grad + row * d, *xh = normalized + row * d;
    double s1 = 0, s2 = 0;
    for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const T gn = weight ? rounded_mul(g[i], weight[i]) : g[i];
      s1 += static_cast<double>(gn);
      s2 += static_cast<double>(rounded_mul(gn, xh[i]));
    }
    const T m1 = static_cast<T>(block_sum(s1, shared) * per);
    const T m2 = static_cast<T>(block_sum(s2, shared) * per);
    const T inv = rstd[row];
    T* out = dx + row * d;
    for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const T gn = weight ? rounded_mul(g[i], weight[i]) : g[i];
      out[i] = rounded_mul(rounded_sub(rounded_sub(gn, m1), rounded_mul(xh[i], m2)), inv);
    }
  }
}

// Block (tile, chunk): for its 32 columns, the sums of g x-hat and of g over its chunk of rows, each in double, into
// partial_w / partial_b (chunks, d).
template <typename T>
__global__ void column_partial_kernel(double* partial_w, double* partial_b, const T* grad, const T* normalized,
                                      std::int64_t rows, std::int64_t d, std::int64_t rows_per_chunk) {
  __shared__ double shared_w[kRowLanes][kColumnsPerBlock], shared_b[kRowLanes][kColumnsPerBlock];
  const int lane = threadIdx.x % kColumnsPerBlock, row_lane = threadIdx.x / kColumnsPerBlock;
  const std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * kColumnsPerBlock + lane;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  double sw = 0, sb = 0;
  if (column < d) {
    for (std::int64_t r = first + row_lane; r < last; r += kRowLanes) {
      const T g = grad[r * d + column];
      sw += static_cast<double>(rounded_mul(g, normalized[r * d + column]));
      sb += static_cast<double>(g);
    }
  }
  shared_w[row_lane][lane] = sw;
  shared_b[row_lane][lane] = sb;
  __syncthreads();
  if (row_lane != 0 || column >= d) return;
  for (int k = 1; k < kRowLanes; ++k) {  // in lane order: the same sum on every run
    sw += shared_w[k][lane];
    sb += shared_b[k][lane];
  }
  partial_w[blockIdx.y * d + column] = sw;
  partial_b[blockIdx.y * d + column] = sb;
}

// One thread a column: the chunks' partial sums in chunk order, rounded to the dtype.
template <typename T>
__global__ void column_finish_kernel(T* dw, T* db, const double* partial_w, const double* partial_b,
                                     std::int64_t chunks, std::int64_t d) {
  for (std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; column < d;
       column += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double sw = 0, sb = 0;
    for (std::int64_t c = 0; c < chunks; ++c) {
      sw += partial_w[c * d + column];
      sb += partial_b[c * d + column];
    }
    if (dw) dw[column] = static_cast<T>(sw);
    if (db) db[column] = static_cast<T>(sb);
  }
}

}  // namespace

bool layer_norm_supported(DType dtype) { return dtype == DType::Float32 || dtype == DType::Float64; }

void launch_layer_norm_forward(const KernelTensor& out, const KernelTensor& normalized, const KernelTensor& rstd,
                               const KernelTensor& in, const KernelTensor& weight, const KernelTensor& bias,
                               std::int64_t rows, std::int64_t d, double eps, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  dispatch_float(in.dtype, "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const RowGrid grid = row_grid(rows, d, kMaxRowThreads);
    layer_norm_forward_kernel<T><<<grid.blocks, grid.threads, 0, stream>>>(
        out.ptr<T>(), normalized.ptr<T>(), rstd.ptr<T>(), in.ptr<const T>(), weight.ptr<const T>(),
        bias.ptr<const T>(), rows, d, static_cast<T>(eps), 1.0 / static_cast<double>(d));
    FERRY_LAUNCH_CHECK();
  });
}

void launch_layer_norm_backward(const KernelTensor& grad_in, const KernelTensor& grad_weight,
                                const KernelTensor& grad_bias, const KernelTensor& grad_out,
                                const KernelTensor& weight, const KernelTensor& normalized, const KernelTensor& rstd,
                                std::int64_t rows, std::int64_t d, cudaStream_t stream) {
  if (d == 0) return;
  dispatch_float(normalized.dtype, "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (grad_in.data != nullptr && rows > 0) {
      const RowGrid grid = row_grid(rows, d, kMaxRowThreads);
      layer_norm_backward_kernel<T><<<grid.blocks, grid.threads, 0, stream>>>(
          grad_in.ptr<T>(), grad_out.ptr<const T>(), weight.ptr<const T>(), normalized.ptr<const T>(),
          rstd.ptr<const T>(), rows, d, 1.0 / static_cast<double>(d));
      FERRY_LAUNCH_CHECK();
    }
    if (grad_weight.data == nullptr && grad_bias.data == nullptr) return;
    // Chunks of 128 rows (more where 65535 chunks would not hold them); at least one, so that no rows sum to 0.
    const std::int64_t per_chunk =
        std::max(kRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks + kRowLanes - 1) / kRowLanes * kRowLanes;
    const std::int64_t chunks = std::max<std::int64_t>(1, (rows + per_chunk - 1) / per_chunk);
    const std::int64_t tiles = (d + kColumnsPerBlock - 1) / kColumnsPerBlock;
    ScratchBuffer partial(sizeof(double) * 2 * static_cast<std::size_t>(chunks * d), stream);  // freed in stream order
    double* partial_w = partial.as<double>();
    double* partial_b = partial_w + chunks * d;
    column_partial_kernel<T><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)), kColumnThreads, 0,
                               stream>>>(partial_w, partial_b, grad_out.ptr<const T>(), normalized.ptr<const T>(),
                                         rows, d, per_chunk);
    FERRY_LAUNCH_CHECK();
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((d + 255) / 256, 4096));
    column_finish_kernel<T><<<blocks, 256, 0, stream>>>(grad_weight.ptr<T>(), grad_bias.ptr<T>(), partial_w,
                                                        partial_b, chunks, d);
    FERRY_LAUNCH_CHECK();
  });
}

}  // namespace ferry::cuda
