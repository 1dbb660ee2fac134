// fill.cu — kernels that write values without reading a tensor: fill, arange, and the counter-based
// random draws, which call the same Philox functions as the cpu so one seed gives one set of numbers
// on every device (DESIGN.md invariant 8). Not here: ops that read operands (unary.cu, binary.cu).
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>

#include "../core/philox.h"
#include "elementwise.cuh"
#include "kernels.h"
#include "launch_grid.h"

namespace ferry::cuda {

namespace {

template <typename T>
struct FillMap {
  static constexpr int kVec = vector_width<T>();
  struct Loaded {};
  T* out;
  T value;

  __device__ __forceinline__ Loaded load(std::int64_t) const { return {}; }
  __device__ __forceinline__ void store(std::int64_t p, const Loaded&) const {
    Pack<T, kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = value;
    reinterpret_cast<Pack<T, kVec>*>(out)[p] = o;
  }
  __device__ __forceinline__ void element(std::int64_t i) const { out[i] = value; }
  __device__ __forceinline__ void strided(const std::int64_t (&off)[1]) const { out[off[0]] = value; }
};

// out (n,) at `stride` elements: out[i] = start + i * step as one fused multiply-add, which is what the
// cpu's Release build computes (GCC contracts `a + b * c` at -O3 -march=x86-64-v3), so the float64
// results agree bit for bit there; a cpu build without FMA can differ in the last bit.
template <typename T>
__global__ void arange_kernel(T* out, std::int64_t n, std::int64_t stride, double start, double step) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i * stride] = cast_to<T>(__fma_rn(static_cast<double>(i), step, start));
  }
}

// out (n,) contiguous: element i from counter offset + i of the Philox stream named by `seed`, scaled
// with one fused multiply-add as the cpu's Release build does (see arange_kernel).
template <typename T>
__global__ void random_kernel(T* out, std::int64_t n, RandomKind kind, double low, double high, std::uint64_t range,
                              std::uint64_t seed, std::uint64_t offset) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const auto u = static_cast<std::uint64_t>(i);
    double v;
    switch (kind) {
      case RandomKind::Uniform:
        v = __fma_rn(high - low, detail::philox_uniform(seed, offset, u), low);
        break;
      case RandomKind::Normal:
        v = __fma_rn(high, detail::philox_normal(seed, offset, u), low);
        break;
      default:
        v = low + static_cast<double>(detail::philox_below(seed, offset, u, range));
        break;
    }
    out[i] = cast_to<T>(v);
  }
}

unsigned grid_for(std::int64_t n, int blocks_per_multiprocessor) {
  return grid_stride_blocks(n, kElementwiseThreads, blocks_per_multiprocessor);
}

}  // namespace

void launch_fill(const KernelTensor& out, double value, cudaStream_t stream) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  dispatch_with_storage(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = cast_to<T>(value);
    using Map = FillMap<T>;
    const Map map{static_cast<T*>(out.data), v};
    if (out.is_contiguous()) {
      unsigned char bytes[sizeof(T)];
      std::memcpy(bytes, &v, sizeof(T));
      bool all_zero = true;
      for (unsigned char b : bytes) all_zero = all_zero && b == 0;
      if (all_zero) {  // zeros: the memset engine path
        FERRY_CUDA_CHECK(cudaMemsetAsync(out.data, 0, static_cast<std::size_t>(n) * sizeof(T), stream));
        return;
      }
      if (is_aligned(out.data, sizeof(T) * Map::kVec)) {
        launch_contiguous(map, n, stream);
        return;
      }
    }
    const KernelTensor* operands[1] = {&out};
    launch_strided<1>(map, operands, n, stream);
  });
}

void launch_arange(const KernelTensor& out, double start, double step, cudaStream_t stream) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  const std::int64_t stride = out.ndim > 0 ? out.strides[0] : 1;
  dispatch_with_storage(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    arange_kernel<T><<<grid_for(n, 8), kElementwiseThreads, 0, stream>>>(static_cast<T*>(out.data), n, stride, start,
                                                                         step);
    FERRY_LAUNCH_CHECK();
  });
}

void launch_random(const KernelTensor& out, RandomKind kind, double low, double high, std::uint64_t seed,
                   std::uint64_t offset, cudaStream_t stream) {
  FERRY_ASSERT(out.is_contiguous(), "random() writes contiguous tensors");
  const std::int64_t n = out.numel();
  if (n == 0) return;
  // [low, high) of an Integer draw has at most 2^32 values (checked by randint)
  const std::uint64_t range = kind == RandomKind::Integer ? static_cast<std::uint64_t>(high - low) : 0;
  dispatch_with_storage(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    random_kernel<T><<<grid_for(n, 16), kElementwiseThreads, 0, stream>>>(static_cast<T*>(out.data), n, kind, low,
                                                                          high, range, seed, offset);
    FERRY_LAUNCH_CHECK();
  });
}

}  // namespace ferry::cuda
