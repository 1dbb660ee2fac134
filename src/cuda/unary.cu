// unary.cu — unary ops (neg, exp, ..., logical_not) on the GPU, matching the cpu reference value for
// value; UnaryOp::Copy is a device-to-device memcpy or a conversion (convert.cu). Not here: ops of two
// operands (binary.cu).
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "elementwise.cuh"
#include "kernels.h"

namespace ferry::cuda {

namespace {

// Ops that integers compute in double (exp, log, ...): launch_unary runs them as convert to float64,
// the float64 op, convert back, which is the cpu's arithmetic, so integer kernels stay small.
bool is_transcendental(UnaryOp op) {
  return op == UnaryOp::Exp || op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt ||
         op == UnaryOp::Sigmoid || op == UnaryOp::Tanh || op == UnaryOp::Reciprocal || op == UnaryOp::Erf ||
         op == UnaryOp::Sin || op == UnaryOp::Cos || op == UnaryOp::Log1p || op == UnaryOp::Expm1;
}

// The cpu's apply_unary: integers exact in their own type (two's complement wrap: -INT64_MIN is INT64_MIN, and
// 2^53 + 1 stays odd), floats in their own type.
template <typename T>
__device__ __forceinline__ T unary_value(UnaryOp op, T x) {
  if constexpr (std::is_same_v<T, bool>) {
    return op == UnaryOp::LogicalNot ? !x : x;
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    bool negative = false;  // uint8 never is (and nvcc warns on the comparison)
    if constexpr (std::is_signed_v<T>) negative = x < 0;
    switch (op) {
      case UnaryOp::Neg: return static_cast<T>(U(0) - static_cast<U>(x));
      case UnaryOp::Abs: return negative ? static_cast<T>(U(0) - static_cast<U>(x)) : x;
      case UnaryOp::Sign: return static_cast<T>(static_cast<int>(x > 0) - static_cast<int>(negative));
      case UnaryOp::Relu: return negative ? T(0) : x;
      case UnaryOp::Square: return static_cast<T>(static_cast<U>(x) * static_cast<U>(x));
      case UnaryOp::LogicalNot: return static_cast<T>(x == 0);
      default: return x;  // Copy, Floor, Ceil, Round, Trunc; transcendental ops never get here (is_transcendental)
    }
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
      case UnaryOp::Relu: return v < 0 ? T(0) : x;  // NaN stays NaN, as in PyTorch
      case UnaryOp::Sigmoid: return cast_to<T>(F(1) / (F(1) + exp(-v)));
      case UnaryOp::Tanh: return cast_to<T>(tanh(v));
      case UnaryOp::Square: return cast_to<T>(v * v);
      case UnaryOp::Reciprocal: return cast_to<T>(F(1) / v);
      case UnaryOp::LogicalNot: return static_cast<T>(v == 0);
      case UnaryOp::Erf: return cast_to<T>(erf(v));
      case UnaryOp::Sin: return cast_to<T>(sin(v));
      case UnaryOp::Cos: return cast_to<T>(cos(v));
      case UnaryOp::Log1p: return cast_to<T>(log1p(v));
      case UnaryOp::Expm1: return cast_to<T>(expm1(v));
      case UnaryOp::Floor: return cast_to<T>(floor(v));
      case UnaryOp::Ceil: return cast_to<T>(ceil(v));
      case UnaryOp::Round: return cast_to<T>(rint(v));  // ties to even, as the cpu's std::rint
      case UnaryOp::Trunc: return cast_to<T>(trunc(v));
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
      FERRY_UNARY_CASE(Erf)
      FERRY_UNARY_CASE(Sin)
      FERRY_UNARY_CASE(Cos)
      FERRY_UNARY_CASE(Log1p)
      FERRY_UNARY_CASE(Expm1)
      FERRY_UNARY_CASE(Floor)
      FERRY_UNARY_CASE(Ceil)
      FERRY_UNARY_CASE(Round)
      FERRY_UNARY_CASE(Trunc)
#undef FERRY_UNARY_CASE
    }
    throw InternalError("cuda unary: an op without a float32 kernel");
  } else {
    run_unary_map<O, T>(out, in, UnaryFn<-1, O, T>{op}, stream);
  }
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
    launch_convert(out, in, stream);
    return;
  }
  // The result has the input's dtype, or bool (what the cpu writes); anything else goes through a
  // temporary of the input's dtype and a conversion.
  if (out.dtype != in.dtype && out.dtype != DType::Bool) {
    ScratchBuffer buffer(static_cast<std::size_t>(out.numel()) * element_size(in.dtype), stream);
    const KernelTensor temporary = contiguous_view(buffer.data(), in.dtype, out);
    launch_unary(op, temporary, in, stream);
    launch_convert(out, temporary, stream);
    return;
  }
  const bool integral = in.dtype == DType::Int32 || in.dtype == DType::Int64 || in.dtype == DType::UInt8;
  if (integral && is_transcendental(op)) {
    const std::size_t n = static_cast<std::size_t>(out.numel());
    ScratchBuffer wide_buffer(n * sizeof(double), stream);
    const KernelTensor wide = contiguous_view(wide_buffer.data(), DType::Float64, out);
    launch_convert(wide, in, stream);
    launch_unary(op, wide, wide, stream);
    if (out.dtype == in.dtype) {
      launch_convert(out, wide, stream);
    } else {  // bool of the integer result, as the cpu casts it
      ScratchBuffer narrow_buffer(n * element_size(in.dtype), stream);
      const KernelTensor narrow = contiguous_view(narrow_buffer.data(), in.dtype, out);
      launch_convert(narrow, wide, stream);
      launch_convert(out, narrow, stream);
    }
    return;
  }
  dispatch_dtype(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (out.dtype == DType::Bool) run_unary<bool, T>(op, out, in, stream);
    else run_unary<T, T>(op, out, in, stream);
  });
}

}  // namespace ferry::cuda
