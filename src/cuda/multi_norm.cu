// multi_norm.cu — clip_grad_norm_'s two passes over many tensors as one launch each way on the card
// (Backend::multi_norm / multi_scale, ferry/backend.h): a table of up to kTableSize tensors per launch, passed by
// value, where the composed form launches three kernels and a copy per gradient for the norms and a kernel per
// gradient for the scale. The norms in two steps, so that the result is the same on every run: each block sums (or
// takes the largest |x| of) one chunk of one tensor into a double, then one thread a tensor combines its chunks in
// order, rounds to the dtype and takes the square root. The arithmetic is the composed ops' (|x| as UnaryOp::Abs,
// the square in the dtype, sums in double); the order of a sum's terms differs from the cpu's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../core/rounded.h"
#include "block_reduce.cuh"
#include "device_state.h"
#include "elementwise.cuh"
#include "kernels.h"

namespace ferry::cuda {

namespace {

using ferry::detail::rounded_mul;

constexpr int kTableSize = 48;                  // 48 x 24 bytes: well inside 4 KB of kernel arguments
constexpr int kThreads = 256;
constexpr std::int64_t kChunk = 16 * kThreads;  // elements a block reduces (16 a thread)
constexpr int kMaxScaleBlocks = 1024;           // per tensor; the scale's grid-stride loop takes the rest

enum class NormKind : int { Two, One, Max };

struct NormTable {
  const void* data[kTableSize];
  std::int64_t numel[kTableSize];
  std::int64_t first_chunk[kTableSize + 1];  // tensor t's chunks: [first_chunk[t], first_chunk[t + 1])
};

// NaN wins, as the max reduction.
__device__ __forceinline__ double larger(double a, double b) { return a != a || b != b ? NAN : (b > a ? b : a); }

template <typename T>
__device__ __forceinline__ T magnitude(T v) {
  return v < 0 ? -v : v;
}

// One block a chunk: its tensor found in the table, its partial sum (or largest |x|) into partial[chunk].
template <typename T>
__global__ void norm_partial_kernel(NormTable table, int tensors, NormKind kind, double* partial) {
  __shared__ double shared[32];
  const std::int64_t chunk = blockIdx.x;
  int t = 0;
  while (t + 1 < tensors && table.first_chunk[t + 1] <= chunk) ++t;
  const T* x = static_cast<const T*>(table.data[t]);
  const std::int64_t begin = (chunk - table.first_chunk[t]) * kChunk;
  const std::int64_t end = begin + kChunk < table.numel[t] ? begin + kChunk : table.numel[t];
  double v = 0;  // |x| >= 0: the largest starts at 0 too
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const T e = x[i];
    if (kind == NormKind::Two) v += static_cast<double>(rounded_mul(e, e));
    else if (kind == NormKind::One) v += static_cast<double>(magnitude(e));
    else v = larger(v, static_cast<double>(magnitude(e)));
  }
  if (kind == NormKind::Max) v = block_all_reduce(v, [](double a, double b) { return larger(a, b); }, shared);
  else v = block_all_reduce(v, [](double a, double b) { return a + b; }, shared);
  if (threadIdx.x == 0) partial[chunk] = v;
}

// One thread a tensor: its chunks in order, rounded to the dtype; the square root for the 2-norm.
template <typename T>
__global__ void norm_finish_kernel(NormTable table, int tensors, NormKind kind, const double* partial, T* norms) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= tensors) return;
  double v = 0;
  for (std::int64_t c = table.first_chunk[t]; c < table.first_chunk[t + 1]; ++c) {
    v = kind == NormKind::Max ? larger(v, partial[c]) : v + partial[c];
  }
  const T rounded = static_cast<T>(v);
  norms[t] = kind == NormKind::Two ? static_cast<T>(sqrt(rounded)) : rounded;
}

struct ScaleTable {
  void* data[kTableSize];
  std::int64_t numel[kTableSize];
};

template <typename T>
__global__ void scale_kernel(ScaleTable table, const T* scale) {
  const T s = *scale;
  T* x = static_cast<T*>(table.data[blockIdx.y]);
  const std::int64_t n = table.numel[blockIdx.y];
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] = rounded_mul(x[i], s);
  }
}

}  // namespace

bool multi_norm_supported(DType dtype) { return dtype == DType::Float32 || dtype == DType::Float64; }

void launch_multi_norm(const KernelTensor* tensors, std::size_t count, const KernelTensor& norms, double p,
                       cudaStream_t stream) {
  const NormKind kind = std::isinf(p) ? NormKind::Max : p == 1 ? NormKind::One : NormKind::Two;
  FERRY_CHECK(std::isinf(p) || p == 1 || p == 2, InvalidArgument, "multi_norm: p must be 1, 2 or inf, got ", p);
  dispatch_float(norms.dtype, "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (std::size_t first = 0; first < count; first += kTableSize) {
      const int n = static_cast<int>(std::min<std::size_t>(kTableSize, count - first));
      NormTable table{};
      std::int64_t chunks = 0;
      for (int j = 0; j < n; ++j) {
        const KernelTensor& x = tensors[first + j];
        FERRY_CHECK(x.dtype == norms.dtype, DTypeMismatch, "multi_norm: one launch takes tensors of one dtype");
        table.data[j] = x.data;
        table.numel[j] = x.numel();
        table.first_chunk[j] = chunks;
        chunks += std::max<std::int64_t>(1, (table.numel[j] + kChunk - 1) / kChunk);  // an empty tensor: 0
      }
      table.first_chunk[n] = chunks;
      ScratchBuffer partial(sizeof(double) * static_cast<std::size_t>(chunks), stream);  // freed in stream order
      norm_partial_kernel<T><<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(table, n, kind,
                                                                                     partial.as<double>());
      FERRY_LAUNCH_CHECK();
      norm_finish_kernel<T><<<1, 64, 0, stream>>>(table, n, kind, partial.as<double>(), norms.ptr<T>() + first);
      FERRY_LAUNCH_CHECK();
    }
  });
}

void launch_multi_scale(const KernelTensor* tensors, std::size_t count, const KernelTensor& scale,
                        cudaStream_t stream) {
  dispatch_float(scale.dtype, "clip_grad_norm_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (std::size_t first = 0; first < count; first += kTableSize) {
      const int n = static_cast<int>(std::min<std::size_t>(kTableSize, count - first));
      ScaleTable table{};
      std::int64_t largest = 0;
      for (int j = 0; j < n; ++j) {
        FERRY_CHECK(tensors[first + j].dtype == scale.dtype, DTypeMismatch,
                    "multi_scale: one launch takes tensors of one dtype");
        table.data[j] = tensors[first + j].data;
        table.numel[j] = tensors[first + j].numel();
        largest = std::max(largest, table.numel[j]);
      }
      if (largest == 0) continue;
      const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((largest + kThreads - 1) / kThreads,
                                                                       kMaxScaleBlocks));
      scale_kernel<T><<<dim3(blocks, static_cast<unsigned>(n)), kThreads, 0, stream>>>(table, scale.ptr<const T>());
      FERRY_LAUNCH_CHECK();
    }
  });
}

}  // namespace ferry::cuda
