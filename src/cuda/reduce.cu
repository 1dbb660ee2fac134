// reduce.cu — sum, mean, prod, max, min, argmax, argmin over the middle dim of a contiguous
// (outer, reduce, inner) tensor into (outer, inner), with the cpu's rules: sums accumulate in double
// (integers in int64), mean of nothing is NaN, NaN wins max/min, ties go to the first index.
// Not here: the choice of dims and the permute that makes them one block (src/core/ops.cpp).
//
// inner == 1 (rows):  a warp per (row, split); inner > 1 (columns): a thread per (split, o, j),
// reading j-contiguous columns. When there are too few outputs to fill the GPU, the reduced dim is
// cut into `splits` segments; a second kernel combines the partial states of each output in order.
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "elementwise.cuh"
#include "kernels.h"

namespace ferry::cuda {

namespace {

constexpr int kReduceThreads = 256;  // threads per block (8 warps)

struct ReduceSpec {
  void* out = nullptr;
  bool mean = false;       // sum * scale
  double scale = 1;        // 1 / reduce
  bool want_index = false;  // arg ops write int64 indices
};

template <typename T>
__device__ __forceinline__ T shuffle_xor(T v, int mask) {
  if constexpr (sizeof(T) < 4) return static_cast<T>(__shfl_xor_sync(0xffffffffu, static_cast<int>(v), mask));
  else return __shfl_xor_sync(0xffffffffu, v, mask);
}

template <typename T>
struct SumReducer {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, long long>;
  using State = Acc;
  __device__ static State identity() { return Acc(0); }
  __device__ static State make(T v, std::int64_t) { return static_cast<Acc>(v); }
  __device__ static State combine(State a, State b) { return a + b; }
  __device__ static State shuffle(State s, int mask) { return shuffle_xor(s, mask); }
  __device__ static void write(const ReduceSpec& spec, std::int64_t i, State s) {
    T* out = static_cast<T*>(spec.out);
    if (spec.mean) out[i] = cast_to<T>(static_cast<double>(s) * spec.scale);
    else out[i] = cast_to<T>(s);
  }
};

// The product in double (integers: int64, wrapping as the cpu's: multiplied as unsigned, no signed overflow).
template <typename T>
struct ProdReducer {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, long long>;
  using State = Acc;
  __device__ static State identity() { return Acc(1); }
  __device__ static State make(T v, std::int64_t) { return static_cast<Acc>(v); }
  __device__ static State combine(State a, State b) {
    if constexpr (std::is_floating_point_v<T>) return a * b;
    else return static_cast<Acc>(static_cast<unsigned long long>(a) * static_cast<unsigned long long>(b));
  }
  __device__ static State shuffle(State s, int mask) { return shuffle_xor(s, mask); }
  __device__ static void write(const ReduceSpec& spec, std::int64_t i, State s) {
    static_cast<T*>(spec.out)[i] = cast_to<T>(s);
  }
};

// (value, index) with index -1 for "nothing seen". combine() is associative and commutative, so any
// order of combining gives what the cpu's left-to-right scan gives: the first NaN if there is one,
// else the first index holding the best value.
template <typename T, bool kMax>
struct ExtremumReducer {
  struct State {
    T value;
    std::int64_t index;
  };
  __device__ static State identity() { return {T{}, -1}; }
  __device__ static State make(T v, std::int64_t r) { return {v, r}; }
  __device__ static State combine(State a, State b) {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
    if (a_nan || b_nan) {
      if (a_nan && b_nan) return a.index <= b.index ? a : b;
      return a_nan ? a : b;
    }
    if (kMax ? a.value > b.value : a.value < b.value) return a;
    if (kMax ? b.value > a.value : b.value < a.value) return b;
    return a.index <= b.index ? a : b;
  }
  __device__ static State shuffle(State s, int mask) { return {shuffle_xor(s.value, mask), shuffle_xor(s.index, mask)}; }
  __device__ static void write(const ReduceSpec& spec, std::int64_t i, State s) {
    if (spec.want_index) static_cast<std::int64_t*>(spec.out)[i] = s.index;
    else static_cast<T*>(spec.out)[i] = s.value;
  }
};

template <typename R>
__device__ __forceinline__ typename R::State warp_combine(typename R::State s) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) s = R::combine(s, R::shuffle(s, mask));
  return s;
}

// in (rows, reduce): warp w takes row w / splits, segment w % splits of `segment` elements.
template <typename T, typename R>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_rows_kernel(const T* in, std::int64_t rows, std::int64_t reduce, std::int64_t segment, int splits,
                       typename R::State* partial, ReduceSpec spec) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warp = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= rows * splits) return;  // the whole warp leaves together
  const std::int64_t row = warp / splits;
  const std::int64_t begin = (warp % splits) * segment;
  const std::int64_t end = begin + segment < reduce ? begin + segment : reduce;
  const T* x = in + row * reduce;
  typename R::State s = R::identity();
  std::int64_t r = begin + lane;
  for (; r + 96 < end; r += 128) {  // four loads in flight per lane
    const T v0 = x[r], v1 = x[r + 32], v2 = x[r + 64], v3 = x[r + 96];
    s = R::combine(s, R::make(v0, r));
    s = R::combine(s, R::make(v1, r + 32));
    s = R::combine(s, R::make(v2, r + 64));
    s = R::combine(s, R::make(v3, r + 96));
  }
  for (; r < end; r += 32) s = R::combine(s, R::make(x[r], r));
  s = warp_combine<R>(s);
  if (lane == 0) {
    if (splits == 1) R::write(spec, row, s);
    else partial[warp] = s;
  }
}

// partial (rows, splits) -> out (rows,): a warp per row.
template <typename R>
__global__ void __launch_bounds__(kReduceThreads)
    finish_rows_kernel(const typename R::State* partial, std::int64_t rows, int splits, ReduceSpec spec) {
  const int lane = threadIdx.x % 32;
  const std::int64_t row = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= rows) return;
  typename R::State s = R::identity();
  for (int k = lane; k < splits; k += 32) s = R::combine(s, partial[row * splits + k]);
  s = warp_combine<R>(s);
  if (lane == 0) R::write(spec, row, s);
}

// in (outer, reduce, inner): thread t is (split, o, j) with j fastest, so a warp reads 32
// neighbouring columns of one row at a time.
template <typename T, typename R>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_columns_kernel(const T* in, std::int64_t outer, std::int64_t reduce, std::int64_t inner,
                          std::int64_t segment, int splits, typename R::State* partial, ReduceSpec spec) {
  const std::int64_t outputs = outer * inner, total = outputs * splits;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t output = t % outputs, split = t / outputs;
    const std::int64_t o = output / inner, j = output % inner;
    const std::int64_t begin = split * segment;
    const std::int64_t end = begin + segment < reduce ? begin + segment : reduce;
    const T* x = in + o * reduce * inner + j;
    typename R::State s = R::identity();
    for (std::int64_t r = begin; r < end; ++r) s = R::combine(s, R::make(x[r * inner], r));
    if (splits == 1) R::write(spec, output, s);
    else partial[t] = s;
  }
}

// partial (splits, outer * inner) -> out (outer * inner,), combining splits in order.
template <typename R>
__global__ void __launch_bounds__(kReduceThreads)
    finish_columns_kernel(const typename R::State* partial, std::int64_t outputs, int splits, ReduceSpec spec) {
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < outputs;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    typename R::State s = R::identity();
    for (int k = 0; k < splits; ++k) s = R::combine(s, partial[k * outputs + t]);
    R::write(spec, t, s);
  }
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

unsigned blocks_for(std::int64_t threads, std::int64_t cap) {
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(ceil_div(threads, kReduceThreads), cap)));
}

template <typename T, typename R>
void run_reduce(const T* in, std::int64_t outer, std::int64_t reduce, std::int64_t inner, const ReduceSpec& spec,
                cudaStream_t stream) {
  using State = typename R::State;
  const std::int64_t multiprocessors = current_multiprocessors();
  if (inner == 1) {
    // Enough warps to cover the GPU a few times over; each at least 2048 elements.
    const std::int64_t target_warps = multiprocessors * 32;
    std::int64_t splits = outer >= target_warps ? 1 : std::min(ceil_div(target_warps, outer), ceil_div(reduce, 2048));
    splits = std::max<std::int64_t>(1, std::min<std::int64_t>(splits, std::numeric_limits<int>::max()));
    const std::int64_t segment = ceil_div(reduce, splits);
    splits = ceil_div(reduce, segment);
    ScratchBuffer partial(splits > 1 ? static_cast<std::size_t>(outer * splits) * sizeof(State) : 0, stream);
    const std::int64_t warps = outer * splits;
    reduce_rows_kernel<T, R><<<blocks_for(warps * 32, std::numeric_limits<int>::max()), kReduceThreads, 0, stream>>>(
        in, outer, reduce, segment, static_cast<int>(splits), partial.as<State>(), spec);
    FERRY_LAUNCH_CHECK();
    if (splits > 1) {
      finish_rows_kernel<R><<<blocks_for(outer * 32, std::numeric_limits<int>::max()), kReduceThreads, 0, stream>>>(
          partial.as<State>(), outer, static_cast<int>(splits), spec);
      FERRY_LAUNCH_CHECK();
    }
    return;
  }
  // Columns: enough threads to fill the GPU; each at least 64 elements of its column.
  const std::int64_t outputs = outer * inner;
  const std::int64_t target_threads = multiprocessors * 2048;
  std::int64_t splits = outputs >= target_threads ? 1 : std::min(ceil_div(target_threads, outputs), ceil_div(reduce, 64));
  splits = std::max<std::int64_t>(1, splits);
  const std::int64_t segment = ceil_div(reduce, splits);
  splits = ceil_div(reduce, segment);
  ScratchBuffer partial(splits > 1 ? static_cast<std::size_t>(outputs * splits) * sizeof(State) : 0, stream);
  reduce_columns_kernel<T, R><<<blocks_for(outputs * splits, multiprocessors * 16), kReduceThreads, 0, stream>>>(
      in, outer, reduce, inner, segment, static_cast<int>(splits), partial.as<State>(), spec);
  FERRY_LAUNCH_CHECK();
  if (splits > 1) {
    finish_columns_kernel<R><<<blocks_for(outputs, multiprocessors * 16), kReduceThreads, 0, stream>>>(
        partial.as<State>(), outputs, static_cast<int>(splits), spec);
    FERRY_LAUNCH_CHECK();
  }
}

}  // namespace

void launch_reduce(ReduceOp op, const KernelTensor& out, const KernelTensor& in, std::int64_t outer,
                   std::int64_t reduce, std::int64_t inner, cudaStream_t stream) {
  if (outer * inner == 0) return;
  const bool want_index = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
  const bool is_sum = op == ReduceOp::Sum || op == ReduceOp::Mean;
  if (reduce == 0) {
    FERRY_CHECK(is_sum || op == ReduceOp::Prod, InvalidArgument,
                "Cannot take max/min/argmax/argmin over an empty dimension");
    launch_fill(out, op == ReduceOp::Mean ? std::nan("") : op == ReduceOp::Prod ? 1.0 : 0.0, stream);
    return;
  }
  // Results are written in the input's dtype (int64 for arg ops); another output dtype goes through a
  // temporary and a conversion, as the cpu's cast would.
  const DType wanted = want_index ? DType::Int64 : in.dtype;
  if (out.dtype != wanted) {
    ScratchBuffer buffer(static_cast<std::size_t>(outer * inner) * element_size(wanted), stream);
    const KernelTensor temporary = contiguous_view(buffer.data(), wanted, out);
    launch_reduce(op, temporary, in, outer, reduce, inner, stream);
    launch_unary(UnaryOp::Copy, out, temporary, stream);
    return;
  }
  ReduceSpec spec;
  spec.out = out.data;
  spec.mean = op == ReduceOp::Mean;
  spec.scale = 1.0 / static_cast<double>(reduce);
  spec.want_index = want_index;
  dispatch_dtype(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.data);
    if (is_sum) run_reduce<T, SumReducer<T>>(x, outer, reduce, inner, spec, stream);
    else if (op == ReduceOp::Prod) run_reduce<T, ProdReducer<T>>(x, outer, reduce, inner, spec, stream);
    else if (op == ReduceOp::Max || op == ReduceOp::ArgMax) run_reduce<T, ExtremumReducer<T, true>>(x, outer, reduce, inner, spec, stream);
    else run_reduce<T, ExtremumReducer<T, false>>(x, outer, reduce, inner, spec, stream);
  });
}

}  // namespace ferry::cuda
