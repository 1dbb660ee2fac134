// scan.cu — cumsum: inclusive prefix sums along the middle dim of a contiguous (outer, n, inner) tensor, with the
// cpu's rule (src/cpu/host_kernels.cpp): each column summed in order in double (integers in int64), each prefix
// rounded to the dtype. One thread per column (o, i), so the sums are the cpu's bit for bit; a long single
// column is a serial walk (a parallel scan would regroup the additions and lose that agreement).
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "elementwise.cuh"
#include "kernels.h"
#include "launch_grid.h"

namespace ferry::cuda {

namespace {

constexpr int kScanThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kScanThreads)
    cumsum_kernel(T* out, const T* in, std::int64_t outer, std::int64_t n, std::int64_t inner) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, long long>;
  const std::int64_t columns = outer * inner;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < columns;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t at = (c / inner) * n * inner + c % inner;
    Acc sum = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      // unsigned addition for integers: wraps as the cpu's int64 does, without signed overflow
      if constexpr (std::is_floating_point_v<T>) sum += static_cast<Acc>(in[at + j * inner]);
      else sum = static_cast<Acc>(static_cast<unsigned long long>(sum) +
                                  static_cast<unsigned long long>(static_cast<Acc>(in[at + j * inner])));
      out[at + j * inner] = static_cast<T>(sum);
    }
  }
}

}  // namespace

void launch_cumsum(const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t n,
                   std::int64_t inner, cudaStream_t stream) {
  FERRY_ASSERT(in.dtype == out.dtype, "cumsum: the op layer passes one dtype");
  const std::int64_t columns = outer * inner;
  if (columns == 0 || n == 0) return;
  const unsigned grid = grid_stride_blocks(columns, kScanThreads);
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, bool>) {  // the op layer sums bools as int64
      cumsum_kernel<T><<<grid, kScanThreads, 0, stream>>>(static_cast<T*>(out.data), static_cast<const T*>(in.data),
                                                          outer, n, inner);
      FERRY_LAUNCH_CHECK();
    }
  });
}

}  // namespace ferry::cuda
