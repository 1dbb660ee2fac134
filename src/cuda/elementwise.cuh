// elementwise.cuh — the machinery the elementwise kernels share: value conversions that match the
// cpu reference, a vectorised path for contiguous operands (16-byte packs, loads issued before any
// store), and a strided path over up to 8 coalesced dims. Not here: the ops themselves (unary.cu,
// binary.cu, fill.cu).
//
// A "map" is a small struct of typed pointers plus the op. It answers four questions:
//   kVec                   elements per 16-byte pack (the widest operand decides)
//   load(p) / store(p, r)  read pack p of every input / compute and write pack p of the output
//   element(i)             the same for one element i of contiguous operands (the tail)
//   strided(off)           one element at element offsets off[k] of operand k (k = 0 is the output)
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "check.h"
#include "device_state.h"
#include "ferry/backend.h"
#include "ferry/error.h"
#include "launch_grid.h"

namespace ferry::cuda {

inline constexpr int kElementwiseThreads = 256;  // threads per block
inline constexpr int kPacksPerThread = 2;        // packs a thread loads before it stores (memory parallelism)

// --- dtype dispatch (host) -------------------------------------------------------------------------

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
void dispatch_dtype(DType dtype, F&& body) {
  switch (dtype) {
    case DType::Float32: body(TypeTag<float>{}); return;
    case DType::Float64: body(TypeTag<double>{}); return;
    case DType::Int32: body(TypeTag<std::int32_t>{}); return;
    case DType::Int64: body(TypeTag<std::int64_t>{}); return;
    case DType::UInt8: body(TypeTag<std::uint8_t>{}); return;
    case DType::Bool: body(TypeTag<bool>{}); return;
    case DType::Float16:
    case DType::BFloat16: throw_storage_only(dtype, "");
  }
  throw InternalError("cuda: unknown dtype in dispatch");
}

// Every dtype, the 16-bit storage types included: for the kernels that only move and convert values
// (conversions, fill, arange, random draws), through cast_to.
template <typename F>
void dispatch_with_storage(DType dtype, F&& body) {
  switch (dtype) {
    case DType::Float16: body(TypeTag<Float16>{}); return;
    case DType::BFloat16: body(TypeTag<BFloat16>{}); return;
    default: dispatch_dtype(dtype, static_cast<F&&>(body));
  }
}

template <typename F>
void dispatch_float(DType dtype, const char* op, F&& body) {
  switch (dtype) {
    case DType::Float32: body(TypeTag<float>{}); return;
    case DType::Float64: body(TypeTag<double>{}); return;
    default:
      if (is_storage_only(dtype)) throw_storage_only(dtype, op);
      throw DTypeMismatch(detail::concat(op, ": expected float32 or float64, got ", dtype_name(dtype)));
  }
}

// --- conversions (host and device), as the cpu does them -------------------------------------------

// To bool: != 0 (NaN is true). Floating to integer truncates through int64, so out-of-range values
// wrap the way the cpu's conversions do on x86 instead of saturating; NaN and values beyond int64 give
// int64's minimum, as on the cpu (the GPU's own conversion would give 0 for NaN and clamp the others).
// The 16-bit storage types convert through float (a float64 into float16 rounds twice, as on the cpu).
template <typename T>
inline constexpr bool kStorageOnly = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

template <typename O, typename T>
__host__ __device__ __forceinline__ O cast_to(T v) {
  if constexpr (kStorageOnly<T>) {
    return cast_to<O>(static_cast<float>(v));
  } else if constexpr (kStorageOnly<O>) {
    return O(cast_to<float>(v));
  } else if constexpr (std::is_same_v<O, bool>) {
    return v != T(0);
  } else if constexpr (std::is_integral_v<O> && std::is_floating_point_v<T>) {
    constexpr T kLimit = T(9223372036854775807.0);  // 2^63
    const long long whole = (v > -kLimit && v < kLimit) ? static_cast<long long>(v) : (-9223372036854775807LL - 1);
    return static_cast<O>(whole);
  } else {
    return static_cast<O>(v);
  }
}

// --- packs ----------------------------------------------------------------------------------------

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename... Ts>
constexpr int vector_width() {  // elements per 16-byte access of the widest type
  constexpr std::size_t widest = std::max({sizeof(Ts)...});
  return static_cast<int>(16 / widest);
}

// One input operand of a map: a tensor read element by element, one element broadcast to all
// (stride 0 everywhere), or an immediate value (ptr == nullptr).
template <typename T>
struct Input {
  const T* ptr = nullptr;
  bool broadcast = false;
  T value{};

  template <int V>
  __device__ __forceinline__ Pack<T, V> pack(std::int64_t p) const {
    if (ptr && !broadcast) return reinterpret_cast<const Pack<T, V>*>(ptr)[p];
    const T v = ptr ? *ptr : value;
    Pack<T, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = v;
    return r;
  }
  __device__ __forceinline__ T at(std::int64_t i) const { return ptr ? (broadcast ? *ptr : ptr[i]) : value; }
  __device__ __forceinline__ T at_offset(std::int64_t offset) const { return ptr ? ptr[offset] : value; }
};

// --- layouts (host) -------------------------------------------------------------------------------

// Is every dim of size > 1 at stride 0 (one value broadcast)?
inline bool is_broadcast_scalar(const KernelTensor& t) {
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] != 1 && t.strides[d] != 0) return false;
  }
  return true;
}

inline bool is_aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// An input for the vectorised path: dense (same contiguous layout as the output) or broadcast. Returns
// false when the operand needs the strided path.
template <typename T, int V>
bool vector_input(const KernelTensor& t, Input<T>& input) {
  input.ptr = static_cast<const T*>(t.data);
  if (t.is_contiguous()) {
    input.broadcast = false;
    return is_aligned(t.data, sizeof(T) * V);
  }
  input.broadcast = is_broadcast_scalar(t);
  return input.broadcast;
}

// A view of `data` with the shape of `like`, contiguous, of `dtype`.
inline KernelTensor contiguous_view(void* data, DType dtype, const KernelTensor& like) {
  KernelTensor k;
  k.data = data;
  k.dtype = dtype;
  k.ndim = like.ndim;
  std::int64_t stride = 1;
  for (int d = like.ndim - 1; d >= 0; --d) {
    k.shape[d] = like.shape[d];
    k.strides[d] = stride;
    stride *= std::max<std::int64_t>(like.shape[d], 1);
  }
  return k;
}

// --- strided offsets ------------------------------------------------------------------------------

template <int N>
struct StridedOffsets {
  int ndim = 0;
  std::int64_t sizes[kMaxDims] = {};       // elements per dim, innermost dim first
  std::int64_t strides[N][kMaxDims] = {};  // elements, operand k, innermost dim first

  template <typename Index>
  __device__ __forceinline__ void offsets(Index linear, std::int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      const Index size = static_cast<Index>(sizes[d]);
      const Index next = linear / size;
      const std::int64_t i = static_cast<std::int64_t>(linear - next * size);
      linear = next;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
  }
};

// Drop size-1 dims of `shape_of`, then merge neighbours every operand walks as one (so a
// contiguous or broadcast run costs one division per element instead of one per dim).
template <int N>
StridedOffsets<N> make_strided_offsets(const KernelTensor& shape_of, const KernelTensor* const (&operands)[N]) {
  int kept = 0;
  std::int64_t size[kMaxDims];
  std::int64_t stride[N][kMaxDims];
  for (int d = 0; d < shape_of.ndim; ++d) {
    if (shape_of.shape[d] == 1) continue;
    size[kept] = shape_of.shape[d];
    for (int k = 0; k < N; ++k) stride[k][kept] = operands[k]->strides[d];
    ++kept;
  }
  StridedOffsets<N> s;
  for (int d = kept - 1; d >= 0; --d) {  // innermost first
    bool merge = s.ndim > 0;
    for (int k = 0; k < N && merge; ++k) merge = stride[k][d] == s.strides[k][s.ndim - 1] * s.sizes[s.ndim - 1];
    if (merge) {
      s.sizes[s.ndim - 1] *= size[d];
    } else {
      s.sizes[s.ndim] = size[d];
      for (int k = 0; k < N; ++k) s.strides[k][s.ndim] = stride[k][d];
      ++s.ndim;
    }
  }
  return s;
}

// --- kernels --------------------------------------------------------------------------------------

// Contiguous operands: thread t of block b handles packs b*(threads*kPacksPerThread) + t + u*threads;
// block 0 also does the last n % kVec elements.
template <typename Map>
__global__ void __launch_bounds__(kElementwiseThreads) contiguous_kernel(Map map, std::int64_t n) {
  constexpr int V = Map::kVec;
  const std::int64_t packs = n / V;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * (kElementwiseThreads * kPacksPerThread) + threadIdx.x;
  typename Map::Loaded loaded[kPacksPerThread];
#pragma unroll
  for (int u = 0; u < kPacksPerThread; ++u) {
    const std::int64_t p = first + u * kElementwiseThreads;
    if (p < packs) loaded[u] = map.load(p);
  }
#pragma unroll
  for (int u = 0; u < kPacksPerThread; ++u) {
    const std::int64_t p = first + u * kElementwiseThreads;
    if (p < packs) map.store(p, loaded[u]);
  }
  if (blockIdx.x == 0) {
    const std::int64_t i = packs * V + threadIdx.x;
    if (i < n) map.element(i);
  }
}

// Any strides: one element per thread per step of a grid-stride loop. Index is 32-bit when the
// element count allows (integer division is the cost here).
template <int N, typename Index, typename Map>
__global__ void __launch_bounds__(kElementwiseThreads) strided_kernel(Map map, StridedOffsets<N> offsets, Index n) {
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    std::int64_t off[N];
    offsets.offsets(i, off);
    map.strided(off);
  }
}

template <typename Map>
void launch_contiguous(const Map& map, std::int64_t n, cudaStream_t stream) {
  const std::int64_t packs = n / Map::kVec;
  constexpr std::int64_t per_block = kElementwiseThreads * kPacksPerThread;
  const std::int64_t blocks = std::max<std::int64_t>(1, (packs + per_block - 1) / per_block);
  contiguous_kernel<<<static_cast<unsigned>(blocks), kElementwiseThreads, 0, stream>>>(map, n);
  FERRY_LAUNCH_CHECK();
}

template <int N, typename Map>
void launch_strided(const Map& map, const KernelTensor* const (&operands)[N], std::int64_t n, cudaStream_t stream) {
  const StridedOffsets<N> offsets = make_strided_offsets<N>(*operands[0], operands);
  const std::int64_t blocks = grid_stride_blocks(n, kElementwiseThreads);
  if (n + blocks * kElementwiseThreads < (std::int64_t{1} << 32)) {
    strided_kernel<N, std::uint32_t><<<static_cast<unsigned>(blocks), kElementwiseThreads, 0, stream>>>(
        map, offsets, static_cast<std::uint32_t>(n));
  } else {
    strided_kernel<N, std::uint64_t><<<static_cast<unsigned>(blocks), kElementwiseThreads, 0, stream>>>(
        map, offsets, static_cast<std::uint64_t>(n));
  }
  FERRY_LAUNCH_CHECK();
}

// --- one input, one output (unary ops and conversions) ----------------------------------------------

template <typename O, typename I, typename Fn>
struct UnaryMap {
  static constexpr int kVec = vector_width<O, I>();
  struct Loaded {
    Pack<I, kVec> in;
  };
  O* out;
  Input<I> in;
  Fn fn;

  __device__ __forceinline__ Loaded load(std::int64_t p) const { return {in.template pack<kVec>(p)}; }
  __device__ __forceinline__ void store(std::int64_t p, const Loaded& r) const {
    Pack<O, kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = fn(r.in.v[j]);
    reinterpret_cast<Pack<O, kVec>*>(out)[p] = o;
  }
  __device__ __forceinline__ void element(std::int64_t i) const { out[i] = fn(in.at(i)); }
  __device__ __forceinline__ void strided(const std::int64_t (&off)[2]) const { out[off[0]] = fn(in.at_offset(off[1])); }
};

// out = fn(in), vectorised when both are contiguous (or `in` is one broadcast value) and aligned.
template <typename O, typename I, typename Fn>
void run_unary_map(const KernelTensor& out, const KernelTensor& in, Fn fn, cudaStream_t stream) {
  using Map = UnaryMap<O, I, Fn>;
  Map map{static_cast<O*>(out.data), Input<I>{}, fn};
  const std::int64_t n = out.numel();
  if (out.is_contiguous() && is_aligned(out.data, sizeof(O) * Map::kVec) && vector_input<I, Map::kVec>(in, map.in)) {
    launch_contiguous(map, n, stream);
    return;
  }
  map.in = Input<I>{static_cast<const I*>(in.data), false, I{}};
  const KernelTensor* operands[2] = {&out, &in};
  launch_strided<2>(map, operands, n, stream);
}

}  // namespace ferry::cuda
