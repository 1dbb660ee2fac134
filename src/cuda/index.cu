// index.cu — index_select (gather rows of the middle dim) and its backward index_add (scatter-add with
// atomics, or in the cpu's order when deterministic_algorithms()); gather (one index per element) and its
// backward scatter_add, the same way. Bad indices do not fault: they are written
// to the device's error report and raised as InvalidArgument at the next sync. Not here: the shape
// bookkeeping (src/core/ops.cpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "device_report.cuh"
#include "elementwise.cuh"
#include "ferry/determinism.h"
#include "kernels.h"
#include "launch_grid.h"

namespace ferry::cuda {

namespace {

constexpr int kIndexThreads = 256;

// out (outer, n_out, inner words) = in (outer, n_in, inner words) rows picked by index (n_out).
// A "word" is 1..16 bytes: rows are copied verbatim, so the widest word that divides a row is used.
template <typename Word>
__global__ void __launch_bounds__(kIndexThreads)
    index_select_kernel(Word* out, const Word* in, const std::int64_t* index, std::int64_t outer, std::int64_t n_in,
                        std::int64_t n_out, std::int64_t inner, DeviceErrorReport* report) {
  const std::int64_t total = outer * n_out * inner;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = t % inner, row = t / inner;
    const std::int64_t j = row % n_out, o = row / n_out;
    const std::int64_t picked = index[j];
    if (picked < 0 || picked >= n_in) {
      report_kernel_error(report, KernelErrorKind::IndexSelect, picked, n_in);
      out[t] = Word{};
      continue;
    }
    out[t] = in[(o * n_in + picked) * inner + i];
  }
}

__device__ __forceinline__ void atomic_add(float* address, float v) { atomicAdd(address, v); }
__device__ __forceinline__ void atomic_add(double* address, double v) { atomicAdd(address, v); }
__device__ __forceinline__ void atomic_add(std::int32_t* address, std::int32_t v) { atomicAdd(address, v); }
__device__ __forceinline__ void atomic_add(std::int64_t* address, std::int64_t v) {  // wraps like int64 addition
  atomicAdd(reinterpret_cast<unsigned long long*>(address), static_cast<unsigned long long>(v));
}
__device__ __forceinline__ void atomic_add(std::uint8_t* address, std::uint8_t v) {  // CAS on the enclosing word
  auto* word = reinterpret_cast<unsigned int*>(reinterpret_cast<std::uintptr_t>(address) & ~std::uintptr_t{3});
  const unsigned int shift = static_cast<unsigned int>(reinterpret_cast<std::uintptr_t>(address) & 3) * 8;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    const unsigned int sum = (((assumed >> shift) & 0xffu) + v) & 0xffu;
    old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (sum << shift));
  } while (old != assumed);
}

// a + b in T, integers wrapping as two's complement (as the atomics above and the cpu's adds), no signed overflow
template <typename T>
__device__ __forceinline__ T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

// out (outer, n_out, inner) += src (outer, n_src, inner): source element t = (o, j, i) is added at
// out[o, target, i], with target = index[j] (index_add: one index per source row, kPerElement false) or index[t]
// (scatter_add: one per element, kPerElement true). One atomic per element.
template <typename T, bool kPerElement>
__global__ void __launch_bounds__(kIndexThreads)
    add_at_kernel(T* out, const T* src, const std::int64_t* index, std::int64_t outer, std::int64_t n_out,
                  std::int64_t n_src, std::int64_t inner, DeviceErrorReport* report) {
  const std::int64_t total = outer * n_src * inner;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = t % inner, row = t / inner;
    const std::int64_t j = row % n_src, o = row / n_src;
    const std::int64_t target = index[kPerElement ? t : j];
    if (target < 0 || target >= n_out) {
      report_kernel_error(report, kPerElement ? KernelErrorKind::ScatterAdd : KernelErrorKind::IndexAdd, target, n_out);
      continue;
    }
    atomic_add(out + (o * n_out + target) * inner + i, src[t]);
  }
}

// The same sum in a fixed order (ferry/determinism.h): one thread per column (o, i) walks the n_src source rows
// in order, as the cpu does, so the result matches the cpu bit for bit. Fewer threads (outer * inner), no atomics.
template <typename T, bool kPerElement>
__global__ void __launch_bounds__(kIndexThreads)
    add_at_in_order_kernel(T* out, const T* src, const std::int64_t* index, std::int64_t outer, std::int64_t n_out,
                           std::int64_t n_src, std::int64_t inner, DeviceErrorReport* report) {
  const std::int64_t columns = outer * inner;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < columns;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = c % inner, o = c / inner;
    for (std::int64_t j = 0; j < n_src; ++j) {
      const std::int64_t t = (o * n_src + j) * inner + i;
      const std::int64_t target = index[kPerElement ? t : j];
      if (target < 0 || target >= n_out) {
        report_kernel_error(report, kPerElement ? KernelErrorKind::ScatterAdd : KernelErrorKind::IndexAdd, target,
                            n_out);
        continue;
      }
      T& sum = out[(o * n_out + target) * inner + i];
      sum = wrap_add(sum, src[t]);
    }
  }
}

// out (outer, n_out, inner) = in (outer, n_in, inner) picked element by element: out[t] = in[o, index[t], i].
// Word is an unsigned type of the element's size: the values are moved, never interpreted.
template <typename Word>
__global__ void __launch_bounds__(kIndexThreads)
    gather_kernel(Word* out, const Word* in, const std::int64_t* index, std::int64_t outer, std::int64_t n_in,
                  std::int64_t n_out, std::int64_t inner, DeviceErrorReport* report) {
  const std::int64_t total = outer * n_out * inner;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = t % inner, o = t / inner / n_out;
    const std::int64_t picked = index[t];
    if (picked < 0 || picked >= n_in) {
      report_kernel_error(report, KernelErrorKind::Gather, picked, n_in);
      out[t] = Word{};
      continue;
    }
    out[t] = in[(o * n_in + picked) * inner + i];
  }
}

unsigned grid_for(std::int64_t n) { return grid_stride_blocks(n, kIndexThreads); }

template <typename Word>
void run_index_select(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
                      std::int64_t n_in, std::int64_t n_out, std::int64_t inner_words, DeviceErrorReport* report,
                      cudaStream_t stream) {
  index_select_kernel<Word><<<grid_for(outer * n_out * inner_words), kIndexThreads, 0, stream>>>(
      static_cast<Word*>(out.data), static_cast<const Word*>(in.data), static_cast<const std::int64_t*>(index.data),
      outer, n_in, n_out, inner_words, report);
  FERRY_LAUNCH_CHECK();
}

template <typename Word>
void run_gather(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
                std::int64_t n_in, std::int64_t n_out, std::int64_t inner, DeviceErrorReport* report,
                cudaStream_t stream) {
  gather_kernel<Word><<<grid_for(outer * n_out * inner), kIndexThreads, 0, stream>>>(
      static_cast<Word*>(out.data), static_cast<const Word*>(in.data), static_cast<const std::int64_t*>(index.data),
      outer, n_in, n_out, inner, report);
  FERRY_LAUNCH_CHECK();
}

// index_add (kPerElement false) or scatter_add (true): atomics, or the cpu's order under deterministic_algorithms().
template <bool kPerElement>
void run_add_at(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index, std::int64_t outer,
                std::int64_t n_out, std::int64_t n_src, std::int64_t inner, DeviceErrorReport* report,
                cudaStream_t stream) {
  if (outer * n_src * inner == 0) return;
  const bool deterministic = deterministic_algorithms();
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, bool>) {  // the cpu adds nothing into bool tensors either
      T* to = static_cast<T*>(out.data);
      const T* from = static_cast<const T*>(src.data);
      const auto* idx = static_cast<const std::int64_t*>(index.data);
      if (deterministic) {
        add_at_in_order_kernel<T, kPerElement><<<grid_for(outer * inner), kIndexThreads, 0, stream>>>(
            to, from, idx, outer, n_out, n_src, inner, report);
      } else {
        add_at_kernel<T, kPerElement><<<grid_for(outer * n_src * inner), kIndexThreads, 0, stream>>>(
            to, from, idx, outer, n_out, n_src, inner, report);
      }
      FERRY_LAUNCH_CHECK();
    }
  });
}

}  // namespace

void launch_index_select(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index,
                         std::int64_t outer, std::int64_t n_in, std::int64_t inner, DeviceErrorReport* report,
                         cudaStream_t stream) {
  FERRY_ASSERT(index.dtype == DType::Int64, "index_select: the op layer passes int64 indices");
  const std::int64_t n_out = index.numel();
  if (outer * n_out * inner == 0) return;
  const std::size_t row_bytes = static_cast<std::size_t>(inner) * element_size(in.dtype);
  // the widest word that divides a row and the alignment of both tensors
  std::size_t word = 16;
  while (word > 1 && (row_bytes % word != 0 || !is_aligned(in.data, word) || !is_aligned(out.data, word))) word /= 2;
  const auto inner_words = static_cast<std::int64_t>(row_bytes / word);
  switch (word) {
    case 16: run_index_select<uint4>(out, in, index, outer, n_in, n_out, inner_words, report, stream); break;
    case 8: run_index_select<std::uint64_t>(out, in, index, outer, n_in, n_out, inner_words, report, stream); break;
    case 4: run_index_select<std::uint32_t>(out, in, index, outer, n_in, n_out, inner_words, report, stream); break;
    case 2: run_index_select<std::uint16_t>(out, in, index, outer, n_in, n_out, inner_words, report, stream); break;
    default: run_index_select<std::uint8_t>(out, in, index, outer, n_in, n_out, inner_words, report, stream); break;
  }
}

void launch_index_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index, std::int64_t outer,
                      std::int64_t n_out, std::int64_t inner, DeviceErrorReport* report, cudaStream_t stream) {
  FERRY_ASSERT(index.dtype == DType::Int64, "index_add: the op layer passes int64 indices");
  FERRY_ASSERT(src.dtype == out.dtype, "index_add: source and destination dtypes differ");
  run_add_at<false>(out, src, index, outer, n_out, index.numel(), inner, report, stream);
}

void launch_gather(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
                   std::int64_t n_in, std::int64_t inner, DeviceErrorReport* report, cudaStream_t stream) {
  FERRY_ASSERT(index.dtype == DType::Int64, "gather: the op layer passes int64 indices");
  const std::int64_t total = index.numel();
  if (total == 0) return;
  const std::int64_t n_out = total / (outer * inner);
  switch (element_size(in.dtype)) {
    case 8: run_gather<std::uint64_t>(out, in, index, outer, n_in, n_out, inner, report, stream); break;
    case 4: run_gather<std::uint32_t>(out, in, index, outer, n_in, n_out, inner, report, stream); break;
    case 2: run_gather<std::uint16_t>(out, in, index, outer, n_in, n_out, inner, report, stream); break;
    default: run_gather<std::uint8_t>(out, in, index, outer, n_in, n_out, inner, report, stream); break;
  }
}

void launch_scatter_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index,
                        std::int64_t outer, std::int64_t n_out, std::int64_t inner, DeviceErrorReport* report,
                        cudaStream_t stream) {
  FERRY_ASSERT(index.dtype == DType::Int64, "scatter_add: the op layer passes int64 indices");
  FERRY_ASSERT(src.dtype == out.dtype, "scatter_add: source and destination dtypes differ");
  if (index.numel() == 0) return;
  run_add_at<true>(out, src, index, outer, n_out, index.numel() / (outer * inner), inner, report, stream);
}

}  // namespace ferry::cuda
