// block_reduce.cuh — a value combined over the threads of one block, every thread getting the result: the row
// reductions of the kernels that give a block one row at a time (loss.cu's cross-entropy, softmax.cu, layer_norm.cu;
// launch_grid.h's row_grid sizes their launches).
#pragma once

#include <cuda_runtime.h>

namespace ferry::cuda {

// Combine `v` over the block with `op`; every thread gets the result. blockDim.x is a multiple of 32, at most
// 1024; `shared` holds 32 values. The warps' results are combined in warp order, the same on every run.
template <typename T, typename Op>
__device__ T block_all_reduce(T v, Op op, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, mask));
  __syncthreads();  // `shared` may still be read from the previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < warps; ++w) v = op(v, shared[w]);
  return v;
}

}  // namespace ferry::cuda
