// sort.cu — stable argsort of each row of a contiguous (rows, n) tensor, with the cpu's order
// (src/cpu/host_kernels.cpp, std::stable_sort): ascending or descending, equal keys in their original order, NaN
// the largest value. One block per row runs a bottom-up merge sort of the row's indices in global memory: log2(n)
// passes, each splitting the merged output evenly over the block's threads by merge-path (a binary search on each
// thread's first output position), so every thread writes its own run and no pass needs atomics. The block's
// passes are separated by barriers; the index buffers ping-pong between `indices` and one scratch buffer.
// Not here: moving the sorted dim last, and the values (src/core/sort.cpp picks them with gather).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "elementwise.cuh"
#include "kernels.h"

namespace ferry::cuda {

namespace {

constexpr int kSortThreads = 256;

// a strictly before b in the order asked for; NaN is larger than every number.
template <typename T>
__device__ __forceinline__ bool goes_before(T a, T b, bool descending) {
  if constexpr (std::is_floating_point_v<T>) {
    const bool a_nan = a != a, b_nan = b != b;
    return descending ? (a > b || (a_nan && !b_nan)) : (a < b || (b_nan && !a_nan));
  } else {
    return descending ? a > b : a < b;
  }
}

template <typename T>
__global__ void __launch_bounds__(kSortThreads)
    argsort_kernel(std::int64_t* indices, std::int64_t* scratch, const T* keys_of_all, std::int64_t n,
                   bool descending) {
  const std::int64_t row = blockIdx.x;
  const T* keys = keys_of_all + row * n;
  std::int64_t* const result = indices + row * n;
  std::int64_t* src = result;
  std::int64_t* dst = scratch + row * n;
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) src[j] = j;
  __syncthreads();
  // this thread's share of each pass's output: positions [first, last)
  const std::int64_t share = (n + blockDim.x - 1) / blockDim.x;
  const std::int64_t first = std::min<std::int64_t>(n, threadIdx.x * share);
  const std::int64_t last = std::min<std::int64_t>(n, first + share);
  for (std::int64_t width = 1; width < n; width *= 2) {
    std::int64_t k = first;
    while (k < last) {
      // the pair of sorted runs A (src[start, start + len_a)) and B (the next len_b) that output k belongs to
      const std::int64_t start = k / (2 * width) * (2 * width);
      const std::int64_t len_a = std::min(width, n - start);
      const std::int64_t len_b = std::max<std::int64_t>(0, std::min(width, n - start - len_a));
      const std::int64_t* a = src + start;
      const std::int64_t* b = a + len_a;
      // merge path: how many of the first d outputs come from A (ties take A first: stable)
      const std::int64_t d = k - start;
      std::int64_t lo = std::max<std::int64_t>(0, d - len_b), hi = std::min(d, len_a);
      while (lo < hi) {
        const std::int64_t mid = (lo + hi) / 2;
        if (!goes_before(keys[b[d - 1 - mid]], keys[a[mid]], descending)) lo = mid + 1;
        else hi = mid;
      }
      std::int64_t i = lo, j = d - lo;
      const std::int64_t stop = std::min(last, start + len_a + len_b);
      for (; k < stop; ++k) {
        if (j >= len_b || (i < len_a && !goes_before(keys[b[j]], keys[a[i]], descending))) dst[k] = a[i++];
        else dst[k] = b[j++];
      }
    }
    __syncthreads();
    std::int64_t* const merged = dst;
    dst = src;
    src = merged;
  }
  if (src != result) {
    for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x) result[j] = src[j];
  }
}

}  // namespace

void launch_argsort(const KernelTensor& indices, const KernelTensor& in, std::int64_t rows, std::int64_t n,
                    bool descending, cudaStream_t stream) {
  FERRY_ASSERT(indices.dtype == DType::Int64, "argsort: the op layer passes int64 indices");
  if (rows == 0 || n == 0) return;
  FERRY_CHECK(rows <= 0x7fffffff, NotSupported, "argsort on cuda: ", rows, " rows is more than one launch's 2^31 - 1 "
              "blocks (one per row)");
  ScratchBuffer scratch(static_cast<std::size_t>(rows * n) * sizeof(std::int64_t), stream);
  // small rows: fewer threads (a warp at least), so many short rows do not leave most of each block idle
  const int threads = static_cast<int>(std::min<std::int64_t>(kSortThreads, (n + 31) / 32 * 32));
  dispatch_dtype(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    argsort_kernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        static_cast<std::int64_t*>(indices.data), scratch.as<std::int64_t>(), static_cast<const T*>(in.data), n,
        descending);
    FERRY_LAUNCH_CHECK();
  });
}

}  // namespace ferry::cuda
