// unary.cu — unary ops (neg, exp, ..., logical_not) and dtype conversion (UnaryOp::Copy) on the GPU,
// matching the cpu reference value for value. Not here: ops of two operands (binary.cu).
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "elementwise.cuh"
#include "kernels.h"

namespace ferry::cuda {

namespace {

// The cpu's apply_unary: integers compute in double, floats in their own type.
template <typename T>
__device__ __forceinline__ T unary_value(UnaryOp op, T x) {
  if constexpr (std::is_same_v<T, bool>) {
    return op == UnaryOp::LogicalNot ? !x : x;
  } else {
    using F = std::conditional_t<std::is_floating_point_v<T>, T, double>;
    const F v = static_cast<F>(x);
    switch (op) {
      case UnaryOp::Copy: return x;
      case UnaryOp::Neg: return cast_to<T>(-v);
      case UnaryOp::Exp: return cast_to<T>(exp(v));
      case UnaryOp::Log: return cast_to<T>(log(v));
      case UnaryOp::Sqrt: return cast_to<T>(sqrt(v));
      case UnaryOp::Rsqrt: return cast_to<T>(F(1) / sqrt(v));
      case UnaryOp::Abs: return cast_to<T>(v < 0 ? -v : v);
      case UnaryOp::Sign: return static_cast<T>((v > 0) - (v < 0));
      case UnaryOp::Relu: return v > 0 ? x : T(0);
      case UnaryOp::Sigmoid: return cast_to<T>(F(1) / (F(1) + exp(-v)));
      case UnaryOp::Tanh: return cast_to<T>(tanh(v));
      case UnaryOp::Square: return cast_to<T>(v * v);
      case UnaryOp::Reciprocal: return cast_to<T>(F(1) / v);
      case UnaryOp::LogicalNot: return static_cast<T>(v == 0);
    }
    return x;
  }
}

// op known at compile time (kOp >= 0) or chosen at run time (kOp < 0).
template <int kOp, typename O, typename I>
struct UnaryFn {
  UnaryOp op;
  __device__ __forceinline__ O operator()(I x) const {
    const UnaryOp chosen = kOp >= 0 ? static_cast<UnaryOp>(kOp) : op;
    return cast_to<O>(unary_value<I>(chosen, x));
  }
};

// Dtype conversion: the value cast as the cpu casts it.
template <typename O, typename I>
struct ConvertFn {
  __device__ __forceinline__ O operator()(I x) const { return cast_to<O>(x); }
};

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

// float32 gets one kernel per op (the op folds away); other dtypes share a kernel with a switch.
template <typename O, typename T>
void run_unary(UnaryOp op, const KernelTensor& out, const KernelTensor& in, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<O, float>) {
    switch (op) {
#define FERRY_UNARY_CASE(name) \
  case UnaryOp::name: run_unary_map<O, T>(out, in, UnaryFn<static_cast<int>(UnaryOp::name), O, T>{op}, stream); return;
      FERRY_UNARY_CASE(Copy)
      FERRY_UNARY_CASE(Neg)
      FERRY_UNARY_CASE(Exp)
      FERRY_UNARY_CASE(Log)
      FERRY_UNARY_CASE(Sqrt)
      FERRY_UNARY_CASE(Rsqrt)
      FERRY_UNARY_CASE(Abs)
      FERRY_UNARY_CASE(Sign)
      FERRY_UNARY_CASE(Relu)
      FERRY_UNARY_CASE(Sigmoid)
      FERRY_UNARY_CASE(Tanh)
      FERRY_UNARY_CASE(Square)
      FERRY_UNARY_CASE(Reciprocal)
      FERRY_UNARY_CASE(LogicalNot)
#undef FERRY_UNARY_CASE
    }
  }
  run_unary_map<O, T>(out, in, UnaryFn<-1, O, T>{op}, stream);
}

void convert(const KernelTensor& out, const KernelTensor& in, cudaStream_t stream) {
  dispatch_dtype(out.dtype, [&](auto out_tag) {
    using O = typename decltype(out_tag)::type;
    dispatch_dtype(in.dtype, [&](auto in_tag) {
      using I = typename decltype(in_tag)::type;
      run_unary_map<O, I>(out, in, ConvertFn<O, I>{}, stream);
    });
  });
}

}  // namespace

void launch_unary(UnaryOp op, const KernelTensor& out, const KernelTensor& in, cudaStream_t stream) {
  if (out.numel() == 0) return;
  if (op == UnaryOp::Copy) {
    if (out.dtype == in.dtype && out.is_contiguous() && in.is_contiguous()) {
      if (out.data != in.data) {
        FERRY_CUDA_CHECK(cudaMemcpyAsync(out.data, in.data, static_cast<std::size_t>(out.numel()) * element_size(out.dtype),
                                         cudaMemcpyDeviceToDevice, stream));
      }
      return;
    }
    convert(out, in, stream);
    return;
  }
  // The result has the input's dtype, or bool (what the cpu writes); anything else goes through a
  // temporary of the input's dtype and a conversion.
  if (out.dtype != in.dtype && out.dtype != DType::Bool) {
    ScratchBuffer buffer(static_cast<std::size_t>(out.numel()) * element_size(in.dtype), stream);
    const KernelTensor temporary = contiguous_view(buffer.data(), in.dtype, out);
    launch_unary(op, temporary, in, stream);
    convert(out, temporary, stream);
    return;
  }
  dispatch_dtype(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (out.dtype == DType::Bool) run_unary<bool, T>(op, out, in, stream);
    else run_unary<T, T>(op, out, in, stream);
  });
}

}  // namespace ferry::cuda
