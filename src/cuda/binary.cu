// binary.cu — ops of two operands on the GPU: binary (with broadcasting by stride 0), binary_scalar
// (one operand an immediate value) and where (three operands), matching the cpu reference value for
// value. Not here: unary ops and dtype conversion (unary.cu).
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "../core/int_pow.h"
#include "elementwise.cuh"
#include "kernels.h"

namespace ferry::cuda {

namespace {

bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le || op == BinaryOp::Gt ||
         op == BinaryOp::Ge;
}

// The cpu's apply_binary followed by its cast to the output type. Integers add, subtract and
// multiply and pow in their own (wrapping) arithmetic; division goes through double as on the cpu.
template <typename O, typename T>
__device__ __forceinline__ O binary_value(BinaryOp op, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    bool r;
    switch (op) {
      case BinaryOp::Add: case BinaryOp::Maximum: r = a || b; break;
      case BinaryOp::Mul: case BinaryOp::Minimum: r = a && b; break;
      case BinaryOp::Eq: r = a == b; break;
      case BinaryOp::Ne: r = a != b; break;
      case BinaryOp::Lt: r = a < b; break;
      case BinaryOp::Le: r = a <= b; break;
      case BinaryOp::Gt: r = a > b; break;
      case BinaryOp::Ge: r = a >= b; break;
      default: r = a; break;
    }
    return cast_to<O>(r);
  } else if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case BinaryOp::Add: return cast_to<O>(a + b);
      case BinaryOp::Sub: return cast_to<O>(a - b);
      case BinaryOp::Mul: return cast_to<O>(a * b);
      case BinaryOp::Div: return cast_to<O>(a / b);
      case BinaryOp::Pow: return cast_to<O>(pow(a, b));
      case BinaryOp::Maximum: return cast_to<O>((a != a || a > b) ? a : b);  // NaN wins
      case BinaryOp::Minimum: return cast_to<O>((a != a || a < b) ? a : b);
      case BinaryOp::Eq: return cast_to<O>(a == b);
      case BinaryOp::Ne: return cast_to<O>(a != b);
      case BinaryOp::Lt: return cast_to<O>(a < b);
      case BinaryOp::Le: return cast_to<O>(a <= b);
      case BinaryOp::Gt: return cast_to<O>(a > b);
      case BinaryOp::Ge: return cast_to<O>(a >= b);
      case BinaryOp::ReluBackward: return cast_to<O>(b <= 0 ? T(0) : a);
      case BinaryOp::ThresholdMask: return cast_to<O>(a > 0 ? b : T(0));
      case BinaryOp::AddRelu: {
        const T r = a + b;
        return cast_to<O>(r < 0 ? T(0) : r);  // NaN stays NaN, as relu does
      }
    }
    return cast_to<O>(a);
  } else {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case BinaryOp::Add: return cast_to<O>(static_cast<T>(static_cast<U>(a) + static_cast<U>(b)));
      case BinaryOp::Sub: return cast_to<O>(static_cast<T>(static_cast<U>(a) - static_cast<U>(b)));
      case BinaryOp::Mul: return cast_to<O>(static_cast<T>(static_cast<U>(a) * static_cast<U>(b)));
      case BinaryOp::Div:
        return b == 0 ? cast_to<O>(0.0) : cast_to<O>(static_cast<double>(a) / static_cast<double>(b));
      case BinaryOp::Pow: return cast_to<O>(ferry::detail::int_pow(a, b));  // exact, wrapping, as the cpu
      case BinaryOp::Maximum: return cast_to<O>(a > b ? a : b);
      case BinaryOp::Minimum: return cast_to<O>(a < b ? a : b);
      case BinaryOp::Eq: return cast_to<O>(a == b);
      case BinaryOp::Ne: return cast_to<O>(a != b);
      case BinaryOp::Lt: return cast_to<O>(a < b);
      case BinaryOp::Le: return cast_to<O>(a <= b);
      case BinaryOp::Gt: return cast_to<O>(a > b);
      case BinaryOp::Ge: return cast_to<O>(a >= b);
      case BinaryOp::ReluBackward: return cast_to<O>(b <= 0 ? T(0) : a);
      case BinaryOp::ThresholdMask: return cast_to<O>(a > 0 ? b : T(0));
      case BinaryOp::AddRelu: {
        const T r = static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
        if constexpr (std::is_unsigned_v<T>) return cast_to<O>(r);  // never below 0
        else return cast_to<O>(r < 0 ? T(0) : r);
      }
    }
    return cast_to<O>(a);
  }
}

template <int kOp, typename O, typename T>
struct BinaryFn {
  BinaryOp op;
  __device__ __forceinline__ O operator()(T a, T b) const {
    return binary_value<O, T>(kOp >= 0 ? static_cast<BinaryOp>(kOp) : op, a, b);
  }
};

template <typename O, typename T, typename Fn>
struct BinaryMap {
  static constexpr int kVec = vector_width<O, T>();
  struct Loaded {
    Pack<T, kVec> a, b;
  };
  O* out;
  Input<T> a, b;
  Fn fn;

  __device__ __forceinline__ Loaded load(std::int64_t p) const {
    return {a.template pack<kVec>(p), b.template pack<kVec>(p)};
  }
  __device__ __forceinline__ void store(std::int64_t p, const Loaded& r) const {
    Pack<O, kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = fn(r.a.v[j], r.b.v[j]);
    reinterpret_cast<Pack<O, kVec>*>(out)[p] = o;
  }
  __device__ __forceinline__ void element(std::int64_t i) const { out[i] = fn(a.at(i), b.at(i)); }
  __device__ __forceinline__ void strided(const std::int64_t (&off)[3]) const {
    out[off[0]] = fn(a.at_offset(off[1]), b.at_offset(off[2]));
  }
};

// An operand for the map: a tensor, or (when `tensor` is null) the immediate `value`.
template <typename T>
struct Operand {
  const KernelTensor* tensor = nullptr;
  T value{};
};

template <typename O, typename T, typename Fn>
void run_binary_map(const KernelTensor& out, Operand<T> a, Operand<T> b, Fn fn, cudaStream_t stream) {
  using Map = BinaryMap<O, T, Fn>;
  Map map{static_cast<O*>(out.data), Input<T>{nullptr, false, a.value}, Input<T>{nullptr, false, b.value}, fn};
  const std::int64_t n = out.numel();
  bool vectorise = out.is_contiguous() && is_aligned(out.data, sizeof(O) * Map::kVec);
  if (vectorise && a.tensor) vectorise = vector_input<T, Map::kVec>(*a.tensor, map.a);
  if (vectorise && b.tensor) vectorise = vector_input<T, Map::kVec>(*b.tensor, map.b);
  if (vectorise) {
    launch_contiguous(map, n, stream);
    return;
  }
  // An immediate walks like a broadcast operand: stride 0, and ptr == nullptr selects its value.
  KernelTensor immediate;
  immediate.ndim = out.ndim;
  map.a = Input<T>{a.tensor ? static_cast<const T*>(a.tensor->data) : nullptr, false, a.value};
  map.b = Input<T>{b.tensor ? static_cast<const T*>(b.tensor->data) : nullptr, false, b.value};
  const KernelTensor* operands[3] = {&out, a.tensor ? a.tensor : &immediate, b.tensor ? b.tensor : &immediate};
  launch_strided<3>(map, operands, n, stream);
}

// float32 gets one kernel per op; other dtypes share a kernel with a switch on the op.
template <typename O, typename T>
void run_binary(BinaryOp op, const KernelTensor& out, Operand<T> a, Operand<T> b, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr bool kToFloat = std::is_same_v<O, float>;
    switch (op) {
#define FERRY_BINARY_CASE(name, arithmetic)                                                                \
  case BinaryOp::name:                                                                                     \
    if constexpr (kToFloat == arithmetic) {                                                                \
      run_binary_map<O, T>(out, a, b, BinaryFn<static_cast<int>(BinaryOp::name), O, T>{op}, stream);       \
      return;                                                                                              \
    }                                                                                                      \
    break;
      FERRY_BINARY_CASE(Add, true)
      FERRY_BINARY_CASE(Sub, true)
      FERRY_BINARY_CASE(Mul, true)
      FERRY_BINARY_CASE(Div, true)
      FERRY_BINARY_CASE(Pow, true)
      FERRY_BINARY_CASE(Maximum, true)
      FERRY_BINARY_CASE(Minimum, true)
      FERRY_BINARY_CASE(ReluBackward, true)
      FERRY_BINARY_CASE(ThresholdMask, true)
      FERRY_BINARY_CASE(AddRelu, true)
      FERRY_BINARY_CASE(Eq, false)
      FERRY_BINARY_CASE(Ne, false)
      FERRY_BINARY_CASE(Lt, false)
      FERRY_BINARY_CASE(Le, false)
      FERRY_BINARY_CASE(Gt, false)
      FERRY_BINARY_CASE(Ge, false)
#undef FERRY_BINARY_CASE
    }
  }
  run_binary_map<O, T>(out, a, b, BinaryFn<-1, O, T>{op}, stream);
}

// Runs `body(out_view)` into `out` when out has `wanted` dtype, else into a temporary of that dtype
// which is then converted into `out` (the cpu writes any output dtype; the op layer asks for these two).
template <typename Body>
void with_output_dtype(const KernelTensor& out, DType wanted, cudaStream_t stream, Body&& body) {
  if (out.dtype == wanted) {
    body(out);
    return;
  }
  ScratchBuffer buffer(static_cast<std::size_t>(out.numel()) * element_size(wanted), stream);
  const KernelTensor temporary = contiguous_view(buffer.data(), wanted, out);
  body(temporary);
  launch_unary(UnaryOp::Copy, out, temporary, stream);
}

template <typename T>
struct WhereMap {
  static constexpr int kVec = vector_width<T>();
  struct Loaded {
    Pack<bool, kVec> cond;
    Pack<T, kVec> a, b;
  };
  T* out;
  Input<bool> cond;
  Input<T> a, b;

  __device__ __forceinline__ Loaded load(std::int64_t p) const {
    return {cond.template pack<kVec>(p), a.template pack<kVec>(p), b.template pack<kVec>(p)};
  }
  __device__ __forceinline__ void store(std::int64_t p, const Loaded& r) const {
    Pack<T, kVec> o;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o.v[j] = r.cond.v[j] ? r.a.v[j] : r.b.v[j];
    reinterpret_cast<Pack<T, kVec>*>(out)[p] = o;
  }
  __device__ __forceinline__ void element(std::int64_t i) const { out[i] = cond.at(i) ? a.at(i) : b.at(i); }
  __device__ __forceinline__ void strided(const std::int64_t (&off)[4]) const {
    out[off[0]] = cond.at_offset(off[1]) ? a.at_offset(off[2]) : b.at_offset(off[3]);
  }
};

}  // namespace

void launch_binary(BinaryOp op, const KernelTensor& out, const KernelTensor& a, const KernelTensor& b,
                   cudaStream_t stream) {
  if (out.numel() == 0) return;
  if (b.dtype != a.dtype) {  // the op layer promotes first; be safe when called directly
    ScratchBuffer buffer(static_cast<std::size_t>(out.numel()) * element_size(a.dtype), stream);
    const KernelTensor converted = contiguous_view(buffer.data(), a.dtype, out);
    launch_unary(UnaryOp::Copy, converted, b, stream);
    launch_binary(op, out, a, converted, stream);
    return;
  }
  const DType wanted = is_comparison(op) ? DType::Bool : a.dtype;
  with_output_dtype(out, wanted, stream, [&](const KernelTensor& result) {
    dispatch_dtype(a.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (is_comparison(op)) run_binary<bool, T>(op, result, Operand<T>{&a}, Operand<T>{&b}, stream);
      else run_binary<T, T>(op, result, Operand<T>{&a}, Operand<T>{&b}, stream);
    });
  });
}

void launch_binary_scalar(BinaryOp op, const KernelTensor& out, const KernelTensor& a, double scalar,
                          bool scalar_first, cudaStream_t stream) {
  if (out.numel() == 0) return;
  const DType wanted = is_comparison(op) ? DType::Bool : a.dtype;
  with_output_dtype(out, wanted, stream, [&](const KernelTensor& result) {
    dispatch_dtype(a.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const Operand<T> tensor{&a}, immediate{nullptr, cast_to<T>(scalar)};  // the cpu casts the scalar first
      const Operand<T> first = scalar_first ? immediate : tensor, second = scalar_first ? tensor : immediate;
      if (is_comparison(op)) run_binary<bool, T>(op, result, first, second, stream);
      else run_binary<T, T>(op, result, first, second, stream);
    });
  });
}

void launch_where(const KernelTensor& out, const KernelTensor& cond, const KernelTensor& a, const KernelTensor& b,
                  cudaStream_t stream) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  // The op layer hands over bool conditions and operands of the output's dtype; convert otherwise.
  if (cond.dtype != DType::Bool || a.dtype != out.dtype || b.dtype != out.dtype) {
    auto converted = [&](const KernelTensor& t, DType dtype, ScratchBuffer& buffer) {
      const KernelTensor view = contiguous_view(buffer.data(), dtype, out);
      launch_unary(UnaryOp::Copy, view, t, stream);
      return view;
    };
    ScratchBuffer cond_buffer(cond.dtype == DType::Bool ? 0 : static_cast<std::size_t>(n), stream);
    ScratchBuffer a_buffer(a.dtype == out.dtype ? 0 : static_cast<std::size_t>(n) * element_size(out.dtype), stream);
    ScratchBuffer b_buffer(b.dtype == out.dtype ? 0 : static_cast<std::size_t>(n) * element_size(out.dtype), stream);
    launch_where(out, cond.dtype == DType::Bool ? cond : converted(cond, DType::Bool, cond_buffer),
                 a.dtype == out.dtype ? a : converted(a, out.dtype, a_buffer),
                 b.dtype == out.dtype ? b : converted(b, out.dtype, b_buffer), stream);
    return;
  }
  dispatch_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Map = WhereMap<T>;
    Map map{static_cast<T*>(out.data), Input<bool>{}, Input<T>{}, Input<T>{}};
    const bool vectorise = out.is_contiguous() && is_aligned(out.data, sizeof(T) * Map::kVec) &&
                           vector_input<bool, Map::kVec>(cond, map.cond) && vector_input<T, Map::kVec>(a, map.a) &&
                           vector_input<T, Map::kVec>(b, map.b);
    if (vectorise) {
      launch_contiguous(map, n, stream);
      return;
    }
    map.cond = Input<bool>{static_cast<const bool*>(cond.data), false, false};
    map.a = Input<T>{static_cast<const T*>(a.data), false, T{}};
    map.b = Input<T>{static_cast<const T*>(b.data), false, T{}};
    const KernelTensor* operands[4] = {&out, &cond, &a, &b};
    launch_strided<4>(map, operands, n, stream);
  });
}

}  // namespace ferry::cuda
