// convert.cu — dtype conversion on the GPU (UnaryOp::Copy between dtypes, Tensor::to(dtype)): every
// pair of the eight dtypes (the 16-bit ones through float, ferry/half.h), each value cast as the cpu
// casts it (to bool: != 0; floating to integer: truncation through int64). Not here: same-dtype copies
// (a memcpy, unary.cu).
#include <cuda_runtime.h>

#include "elementwise.cuh"
#include "kernels.h"

namespace ferry::cuda {

namespace {

template <typename O, typename I>
struct ConvertFn {
  __device__ __forceinline__ O operator()(I x) const { return cast_to<O>(x); }
};

}  // namespace

void launch_convert(const KernelTensor& out, const KernelTensor& in, cudaStream_t stream) {
  if (out.numel() == 0) return;
  dispatch_with_storage(out.dtype, [&](auto out_tag) {
    using O = typename decltype(out_tag)::type;
    dispatch_with_storage(in.dtype, [&](auto in_tag) {
      using I = typename decltype(in_tag)::type;
      run_unary_map<O, I>(out, in, ConvertFn<O, I>{}, stream);
    });
  });
}

}  // namespace ferry::cuda
