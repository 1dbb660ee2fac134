// host_kernels.cpp — elementwise, reduction, GEMM, indexing, loss, im2col and pooling kernels over
// host memory. Contiguous runs take tight loops the compiler vectorises; OpenMP splits large work.
#include "host_kernels.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "../core/int_pow.h"
#include "../core/philox.h"
#include "blas_threads.h"
#include "dispatch.h"
#include "half_convert.h"
#include "max_pool_2x2.h"
#include "strided.h"
#include "vec_math.h"

namespace ferry::cpu {

namespace {

template <typename T>
T* at(const KernelTensor& t, std::int64_t offset) {
  return static_cast<T*>(t.data) + offset;
}

// --- elementwise functors -------------------------------------------------------------------------

// Inlined into loops whose op is a constant (see with_unary_op), so the switch folds away and a contiguous
// float loop vectorises: exp, erf and sigmoid through vec_math.h's branch-free versions.
template <typename T>
[[gnu::always_inline]] inline T apply_unary(UnaryOp op, T x) {
  if constexpr (std::is_same_v<T, bool>) {
    switch (op) {
      case UnaryOp::LogicalNot: return !x;
      default: return x;
    }
  } else {
    if constexpr (std::is_integral_v<T>) {  // exact in the integer type (two's complement wrap), as on cuda
      using U = std::make_unsigned_t<T>;
      switch (op) {
        case UnaryOp::Neg: return static_cast<T>(U(0) - static_cast<U>(x));
        case UnaryOp::Abs: return x < 0 ? static_cast<T>(U(0) - static_cast<U>(x)) : x;
        case UnaryOp::Sign: return static_cast<T>((x > 0) - (x < 0));
        case UnaryOp::Relu: return x < 0 ? T(0) : x;
        case UnaryOp::Square: return static_cast<T>(static_cast<U>(x) * static_cast<U>(x));
        case UnaryOp::Floor: case UnaryOp::Ceil: case UnaryOp::Round: case UnaryOp::Trunc: return x;  // exact
        default: break;
      }
    }
    using F = std::conditional_t<std::is_floating_point_v<T>, T, double>;
    const F v = static_cast<F>(x);
    switch (op) {
      case UnaryOp::Copy: return x;
      case UnaryOp::Neg: return static_cast<T>(-v);
      case UnaryOp::Exp: return static_cast<T>(exp_of(v));
      case UnaryOp::Log: return static_cast<T>(std::log(v));
      case UnaryOp::Sqrt: return static_cast<T>(std::sqrt(v));
      case UnaryOp::Rsqrt: return static_cast<T>(F(1) / std::sqrt(v));
      case UnaryOp::Abs: return static_cast<T>(v < 0 ? -v : v);
      case UnaryOp::Sign: return static_cast<T>((v > 0) - (v < 0));
      case UnaryOp::Relu: return v < 0 ? T(0) : x;  // NaN stays NaN, as in PyTorch
      case UnaryOp::Sigmoid: return static_cast<T>(sigmoid_of(v));
      case UnaryOp::Tanh: return static_cast<T>(tanh_of(v));
      case UnaryOp::Square: return static_cast<T>(v * v);
      case UnaryOp::Reciprocal: return static_cast<T>(F(1) / v);
      case UnaryOp::LogicalNot: return static_cast<T>(v == 0);
      case UnaryOp::Erf: return static_cast<T>(erf_of(v));
      case UnaryOp::Sin: return static_cast<T>(std::sin(v));
      case UnaryOp::Cos: return static_cast<T>(std::cos(v));
      case UnaryOp::Log1p: return static_cast<T>(std::log1p(v));
      case UnaryOp::Expm1: return static_cast<T>(std::expm1(v));
      case UnaryOp::Floor: return static_cast<T>(std::floor(v));
      case UnaryOp::Ceil: return static_cast<T>(std::ceil(v));
      case UnaryOp::Round: return static_cast<T>(std::rint(v));  // the default rounding mode: ties to even
      case UnaryOp::Trunc: return static_cast<T>(std::trunc(v));
    }
    return x;
  }
}

// Calls body(std::integral_constant<BinaryOp, op>{}), as with_unary_op.
template <typename Body>
void with_binary_op(BinaryOp op, Body&& body) {
  switch (op) {
#define FERRY_BINARY_CASE(name) \
  case BinaryOp::name: return body(std::integral_constant<BinaryOp, BinaryOp::name>{});
    FERRY_BINARY_CASE(Add) FERRY_BINARY_CASE(Sub) FERRY_BINARY_CASE(Mul) FERRY_BINARY_CASE(Div)
    FERRY_BINARY_CASE(Pow) FERRY_BINARY_CASE(Maximum) FERRY_BINARY_CASE(Minimum) FERRY_BINARY_CASE(Eq)
    FERRY_BINARY_CASE(Ne) FERRY_BINARY_CASE(Lt) FERRY_BINARY_CASE(Le) FERRY_BINARY_CASE(Gt) FERRY_BINARY_CASE(Ge)
    FERRY_BINARY_CASE(ReluBackward) FERRY_BINARY_CASE(ThresholdMask) FERRY_BINARY_CASE(AddRelu)
#undef FERRY_BINARY_CASE
  }
}

// Calls body(std::integral_constant<UnaryOp, op>{}): the op becomes a compile-time constant in the body.
template <typename Body>
void with_unary_op(UnaryOp op, Body&& body) {
  switch (op) {
#define FERRY_UNARY_CASE(name) \
  case UnaryOp::name: return body(std::integral_constant<UnaryOp, UnaryOp::name>{});
    FERRY_UNARY_CASE(Copy) FERRY_UNARY_CASE(Neg) FERRY_UNARY_CASE(Exp) FERRY_UNARY_CASE(Log)
    FERRY_UNARY_CASE(Sqrt) FERRY_UNARY_CASE(Rsqrt) FERRY_UNARY_CASE(Abs) FERRY_UNARY_CASE(Sign)
    FERRY_UNARY_CASE(Relu) FERRY_UNARY_CASE(Sigmoid) FERRY_UNARY_CASE(Tanh) FERRY_UNARY_CASE(Square)
    FERRY_UNARY_CASE(Reciprocal) FERRY_UNARY_CASE(LogicalNot) FERRY_UNARY_CASE(Erf) FERRY_UNARY_CASE(Sin)
    FERRY_UNARY_CASE(Cos) FERRY_UNARY_CASE(Log1p) FERRY_UNARY_CASE(Expm1) FERRY_UNARY_CASE(Floor)
    FERRY_UNARY_CASE(Ceil) FERRY_UNARY_CASE(Round) FERRY_UNARY_CASE(Trunc)
#undef FERRY_UNARY_CASE
  }
}

template <typename T>
[[gnu::always_inline]] inline auto apply_binary(BinaryOp op, T a, T b) {
  using F = std::conditional_t<std::is_floating_point_v<T>, T, double>;
  if constexpr (std::is_same_v<T, bool>) {
    switch (op) {
      case BinaryOp::Add: case BinaryOp::Maximum: return static_cast<double>(a || b);
      case BinaryOp::Mul: case BinaryOp::Minimum: return static_cast<double>(a && b);
      case BinaryOp::Eq: return static_cast<double>(a == b);
      case BinaryOp::Ne: return static_cast<double>(a != b);
      case BinaryOp::Lt: return static_cast<double>(a < b);
      case BinaryOp::Le: return static_cast<double>(a <= b);
      case BinaryOp::Gt: return static_cast<double>(a > b);
      case BinaryOp::Ge: return static_cast<double>(a >= b);
      default: return static_cast<double>(a);
    }
  } else {
    switch (op) {
      case BinaryOp::Add: return static_cast<F>(a + b);
      case BinaryOp::Sub: return static_cast<F>(a - b);
      case BinaryOp::Mul: return static_cast<F>(a * b);
      case BinaryOp::Div:
        if constexpr (std::is_floating_point_v<T>) return a / b;
        else return b == 0 ? F(0) : static_cast<F>(a) / static_cast<F>(b);
      case BinaryOp::Pow: return static_cast<F>(std::pow(static_cast<F>(a), static_cast<F>(b)));
      case BinaryOp::Maximum: return static_cast<F>((a != a || a > b) ? a : b);
      case BinaryOp::Minimum: return static_cast<F>((a != a || a < b) ? a : b);
      case BinaryOp::Eq: return static_cast<F>(a == b);
      case BinaryOp::Ne: return static_cast<F>(a != b);
      case BinaryOp::Lt: return static_cast<F>(a < b);
      case BinaryOp::Le: return static_cast<F>(a <= b);
      case BinaryOp::Gt: return static_cast<F>(a > b);
      case BinaryOp::Ge: return static_cast<F>(a >= b);
      case BinaryOp::ReluBackward: return static_cast<F>(b <= 0 ? T(0) : a);
      case BinaryOp::ThresholdMask: return static_cast<F>(a > 0 ? b : T(0));
      case BinaryOp::AddRelu: {
        const F r = static_cast<F>(a + b);
        return r < 0 ? F(0) : r;  // NaN stays NaN, as relu does
      }
    }
    return static_cast<F>(a);
  }
}

// To bool: != 0 (NaN is true). Floating to integer truncates through int64 (as the CUDA backend and PyTorch
// do: -1.5 -> uint8 is 255), so a negative value into an unsigned type wraps instead of being undefined; NaN
// and values beyond int64 give int64's minimum, what x86's conversion gives, instead of undefined behaviour.
// The 16-bit storage types convert through float (a float64 into float16 rounds twice, as PyTorch's does).
template <typename T>
constexpr bool kStorageOnly = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

template <typename Out, typename T>
Out cast_to(T v) {
  if constexpr (kStorageOnly<T>) {
    return cast_to<Out>(static_cast<float>(v));
  } else if constexpr (kStorageOnly<Out>) {
    return Out(cast_to<float>(v));
  } else if constexpr (std::is_same_v<Out, bool>) {
    return v != T(0);
  } else if constexpr (std::is_integral_v<Out> && std::is_floating_point_v<T>) {
    constexpr T kLimit = T(9223372036854775807.0);  // 2^63
    const std::int64_t whole = (v > -kLimit && v < kLimit) ? static_cast<std::int64_t>(v)
                                                          : std::numeric_limits<std::int64_t>::min();
    return static_cast<Out>(whole);
  } else {
    return static_cast<Out>(v);
  }
}

// One binary op's value in the output dtype. Integer inputs into an integer output stay integers where the
// op's result is one (add, sub, mul and pow wrapping as two's complement, max, min, the masks): exact beyond 2^53,
// as on cuda; the rest (div) goes through double.
template <typename O, typename T>
[[gnu::always_inline]] inline O binary_value(BinaryOp op, T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && std::is_integral_v<O> &&
                !std::is_same_v<O, bool>) {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case BinaryOp::Add: return static_cast<O>(static_cast<T>(static_cast<U>(a) + static_cast<U>(b)));
      case BinaryOp::Sub: return static_cast<O>(static_cast<T>(static_cast<U>(a) - static_cast<U>(b)));
      case BinaryOp::Mul: return static_cast<O>(static_cast<T>(static_cast<U>(a) * static_cast<U>(b)));
      case BinaryOp::Pow: return static_cast<O>(ferry::detail::int_pow(a, b));
      case BinaryOp::Maximum: return static_cast<O>(a > b ? a : b);
      case BinaryOp::Minimum: return static_cast<O>(a < b ? a : b);
      case BinaryOp::ReluBackward: return static_cast<O>(b <= 0 ? T(0) : a);
      case BinaryOp::ThresholdMask: return static_cast<O>(a > 0 ? b : T(0));
      case BinaryOp::AddRelu: {
        const T r = static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
        if constexpr (std::is_signed_v<T>) return static_cast<O>(r < 0 ? T(0) : r);
        else return static_cast<O>(r);
      }
      default: break;
    }
  }
  return cast_to<O>(apply_binary(op, a, b));
}

// The common fast case: out = f(a, b) over contiguous float runs, op chosen outside the loop.
template <typename T, typename F>
void binary_runs(const KernelTensor& out, const KernelTensor& a, const KernelTensor& b, F f) {
  const auto s = coalesce<3>(out, {&out, &a, &b});
  strided_for<3>(s, [&](std::int64_t n, auto off, auto st) {
    T* o = at<T>(out, off[0]);
    const T* x = at<const T>(a, off[1]);
    const T* y = at<const T>(b, off[2]);
    if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
      const T yv = *y;
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
    } else {
      for (std::int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]], y[i * st[2]]);
    }
  });
}

template <typename T>
bool binary_fast(BinaryOp op, const KernelTensor& out, const KernelTensor& a, const KernelTensor& b) {
  switch (op) {
    case BinaryOp::Add: binary_runs<T>(out, a, b, [](T x, T y) { return x + y; }); return true;
    case BinaryOp::Sub: binary_runs<T>(out, a, b, [](T x, T y) { return x - y; }); return true;
    case BinaryOp::Mul: binary_runs<T>(out, a, b, [](T x, T y) { return x * y; }); return true;
    case BinaryOp::Div: binary_runs<T>(out, a, b, [](T x, T y) { return x / y; }); return true;
    case BinaryOp::ReluBackward: binary_runs<T>(out, a, b, [](T g, T x) { return x <= 0 ? T(0) : g; }); return true;
    case BinaryOp::AddRelu:
      binary_runs<T>(out, a, b, [](T x, T y) {
        const T r = x + y;
        return r < 0 ? T(0) : r;
      });
      return true;
    default: return false;
  }
}

}  // namespace

// --- fill / arange / random -----------------------------------------------------------------------

void HostKernels::fill(const KernelTensor& out, double value, const Stream&) {
  dispatch_with_storage(out.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const T v = cast_to<T>(value);
    const auto s = coalesce<1>(out, {&out});
    strided_for<1>(s, [&](std::int64_t n, auto off, auto st) {
      T* o = at<T>(out, off[0]);
      if (st[0] == 1) {
        for (std::int64_t i = 0; i < n; ++i) o[i] = v;
      } else {
        for (std::int64_t i = 0; i < n; ++i) o[i * st[0]] = v;
      }
    });
  });
}

void HostKernels::arange(const KernelTensor& out, double start, double step, const Stream&) {
  dispatch_with_storage(out.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    T* o = out.ptr<T>();
    const std::int64_t n = out.numel();
    for (std::int64_t i = 0; i < n; ++i) o[i * out.strides[0]] = cast_to<T>(start + static_cast<double>(i) * step);
  });
}

void HostKernels::random(const KernelTensor& out, RandomKind kind, double low, double high, std::uint64_t seed,
                         std::uint64_t offset, const Stream&) {
  FERRY_ASSERT(out.is_contiguous(), "random() writes contiguous tensors");
  const std::int64_t n = out.numel();
  dispatch_with_storage(out.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    T* o = out.ptr<T>();
    // Integer draws: [low, high) with high > low (checked by randint); the other kinds have no range.
    const std::uint64_t range = kind == RandomKind::Integer && high > low ? static_cast<std::uint64_t>(high - low) : 0;
    parallel_for(n, 16, [&](std::int64_t i) {
      const auto u = static_cast<std::uint64_t>(i);
      double v;
      switch (kind) {
        case RandomKind::Uniform: v = low + (high - low) * detail::philox_uniform(seed, offset, u); break;
        case RandomKind::Normal: v = low + high * detail::philox_normal(seed, offset, u); break;
        default: v = low + static_cast<double>(detail::philox_below(seed, offset, u, range)); break;
      }
      o[i] = cast_to<T>(v);
    });
  });
}

// --- unary / binary / where -----------------------------------------------------------------------

void HostKernels::unary(UnaryOp op, const KernelTensor& out, const KernelTensor& in, const Stream&) {
  if (op == UnaryOp::Copy) {
    dispatch_with_storage(out.dtype, [&](auto tag_O) {
    using O = typename decltype(tag_O)::type;
      dispatch_with_storage(in.dtype, [&](auto tag_I) {
    using I = typename decltype(tag_I)::type;
        const auto s = coalesce<2>(out, {&out, &in});
        strided_for<2>(s, [&](std::int64_t n, auto off, auto st) {
          O* o = at<O>(out, off[0]);
          const I* x = at<const I>(in, off[1]);
          if constexpr (std::is_same_v<O, I>) {
            if (st[0] == 1 && st[1] == 1) {
              std::memcpy(o, x, static_cast<std::size_t>(n) * sizeof(O));
              return;
            }
          }
          if constexpr (std::is_same_v<O, Float16> && std::is_same_v<I, float>) {
            if (st[0] == 1 && st[1] == 1) return narrow_to_half(o, x, n);
          }
          if constexpr (std::is_same_v<O, float> && std::is_same_v<I, Float16>) {
            if (st[0] == 1 && st[1] == 1) return widen_from_half(o, x, n);
          }
          for (std::int64_t i = 0; i < n; ++i) o[i * st[0]] = cast_to<O>(x[i * st[1]]);
        });
      });
    });
    return;
  }
  dispatch(in.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const auto s = coalesce<2>(out, {&out, &in});
    strided_for<2>(s, [&](std::int64_t n, auto off, auto st) {
      const T* x = at<const T>(in, off[1]);
      if (out.dtype == DType::Bool) {
        bool* o = at<bool>(out, off[0]);
        for (std::int64_t i = 0; i < n; ++i) o[i * st[0]] = cast_to<bool>(apply_unary(op, x[i * st[1]]));
        return;
      }
      T* o = at<T>(out, off[0]);
      with_unary_op(op, [&](auto op_c) {
        if (st[0] == 1 && st[1] == 1) {
          for (std::int64_t i = 0; i < n; ++i) o[i] = apply_unary<T>(op_c, x[i]);
        } else {
          for (std::int64_t i = 0; i < n; ++i) o[i * st[0]] = apply_unary<T>(op_c, x[i * st[1]]);
        }
      });
    });
  });
}

void HostKernels::binary(BinaryOp op, const KernelTensor& out, const KernelTensor& a, const KernelTensor& b,
                         const Stream&) {
  dispatch(a.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    if constexpr (std::is_floating_point_v<T>) {
      if (out.dtype == a.dtype && binary_fast<T>(op, out, a, b)) return;
    }
    dispatch(out.dtype, [&](auto tag_O) {
    using O = typename decltype(tag_O)::type;
      const auto s = coalesce<3>(out, {&out, &a, &b});
      strided_for<3>(s, [&](std::int64_t n, auto off, auto st) {
        O* o = at<O>(out, off[0]);
        const T* x = at<const T>(a, off[1]);
        const T* y = at<const T>(b, off[2]);
        if constexpr (std::is_floating_point_v<T> && (std::is_same_v<O, T> || std::is_same_v<O, bool>)) {
          if (st[0] == 1 && st[1] == 1 && st[2] == 1) {  // the op a constant in a tight loop (comparisons, pow, ...)
            with_binary_op(op, [&](auto op_c) {
              for (std::int64_t i = 0; i < n; ++i) o[i] = binary_value<O>(op_c, x[i], y[i]);
            });
            return;
          }
        }
        for (std::int64_t i = 0; i < n; ++i) o[i * st[0]] = binary_value<O>(op, x[i * st[1]], y[i * st[2]]);
      });
    });
  });
}

void HostKernels::binary_scalar(BinaryOp op, const KernelTensor& out, const KernelTensor& a, double scalar,
                                bool scalar_first, const Stream&) {
  dispatch(a.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const T c = cast_to<T>(scalar);
    dispatch(out.dtype, [&](auto tag_O) {
    using O = typename decltype(tag_O)::type;
      const auto s = coalesce<2>(out, {&out, &a});
      strided_for<2>(s, [&](std::int64_t n, auto off, auto st) {
        O* o = at<O>(out, off[0]);
        const T* x = at<const T>(a, off[1]);
        if constexpr (std::is_floating_point_v<T> && std::is_same_v<O, T>) {
          if (st[0] == 1 && st[1] == 1 && !scalar_first) {
            if (op == BinaryOp::Mul) {
#pragma omp simd
              for (std::int64_t i = 0; i < n; ++i) o[i] = x[i] * c;
              return;
            }
            if (op == BinaryOp::Add) {
#pragma omp simd
              for (std::int64_t i = 0; i < n; ++i) o[i] = x[i] + c;
              return;
            }
          }
        }
        if constexpr (std::is_floating_point_v<T> && (std::is_same_v<O, T> || std::is_same_v<O, bool>)) {
          if (st[0] == 1 && st[1] == 1) {  // the op a constant in a tight loop (division, comparisons, ...)
            with_binary_op(op, [&](auto op_c) {
              if (scalar_first) {
                for (std::int64_t i = 0; i < n; ++i) o[i] = binary_value<O>(op_c, c, x[i]);
              } else {
                for (std::int64_t i = 0; i < n; ++i) o[i] = binary_value<O>(op_c, x[i], c);
              }
            });
            return;
          }
        }
        if (scalar_first) {
          for (std::int64_t i = 0; i < n; ++i) o[i * st[0]] = binary_value<O>(op, c, x[i * st[1]]);
        } else {
          for (std::int64_t i = 0; i < n; ++i) o[i * st[0]] = binary_value<O>(op, x[i * st[1]], c);
        }
      });
    });
  });
}

void HostKernels::where(const KernelTensor& out, const KernelTensor& cond, const KernelTensor& a,
                        const KernelTensor& b, const Stream&) {
  dispatch(out.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const auto s = coalesce<4>(out, {&out, &cond, &a, &b});
    strided_for<4>(s, [&](std::int64_t n, auto off, auto st) {
      T* o = at<T>(out, off[0]);
      const bool* c = at<const bool>(cond, off[1]);
      const T* x = at<const T>(a, off[2]);
      const T* y = at<const T>(b, off[3]);
      // Contiguous runs with one side a scalar or not (masked_fill, clamp, where's own backward) take loops of
      // constant strides that vectorise: both sides read (a select, not a branch), the condition's bytes read as
      // bytes (GCC vectorises no loop that loads a bool); any other layout the general loop.
      const auto run = [&]<int SX, int SY>() {
        const auto* flag = reinterpret_cast<const unsigned char*>(c);
#pragma omp simd
        for (std::int64_t i = 0; i < n; ++i) {
          const T if_true = x[i * SX], if_false = y[i * SY];
          o[i] = flag[i] != 0 ? if_true : if_false;
        }
      };
      if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) run.template operator()<1, 1>();
      else if (st[0] == 1 && st[1] == 1 && st[2] == 0 && st[3] == 1) run.template operator()<0, 1>();
      else if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 0) run.template operator()<1, 0>();
      else for (std::int64_t i = 0; i < n; ++i) o[i * st[0]] = c[i * st[1]] ? x[i * st[2]] : y[i * st[3]];
    });
  });
}

// --- reductions -----------------------------------------------------------------------------------

void HostKernels::reduce(ReduceOp op, const KernelTensor& out, const KernelTensor& in, std::int64_t outer,
                         std::int64_t reduce, std::int64_t inner, const Stream&) {
  dispatch(in.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const T* x = in.ptr<const T>();
    if (op == ReduceOp::Sum || op == ReduceOp::Mean) {
      dispatch(out.dtype, [&](auto tag_O) {
    using O = typename decltype(tag_O)::type;
        O* o = out.ptr<O>();
        const double scale = (op == ReduceOp::Mean && reduce > 0) ? 1.0 / static_cast<double>(reduce) : 1.0;
        if constexpr (std::is_integral_v<T> && std::is_integral_v<O> && !std::is_same_v<O, bool>) {
          if (op == ReduceOp::Sum) {  // integers summed as integers (int64, wrapping): exact beyond 2^53, as on cuda
            parallel_for(outer * inner, reduce, [&](std::int64_t flat) {
              const std::int64_t i = flat / inner, j = flat % inner;
              std::uint64_t acc = 0;
              for (std::int64_t r = 0; r < reduce; ++r) {
                acc += static_cast<std::uint64_t>(static_cast<std::int64_t>(x[(i * reduce + r) * inner + j]));
              }
              o[flat] = static_cast<O>(static_cast<std::int64_t>(acc));
            });
            return;
          }
        }
        if (inner == 1) {
          parallel_for(outer, reduce, [&](std::int64_t i) {
            const T* row = x + i * reduce;
            double acc = 0;
#pragma omp simd reduction(+ : acc)
            for (std::int64_t r = 0; r < reduce; ++r) acc += static_cast<double>(row[r]);
            o[i] = cast_to<O>(op == ReduceOp::Mean ? (reduce ? acc * scale : NAN) : acc);
          });
        } else {
          parallel_for(outer, reduce * inner, [&](std::int64_t i) {
            std::vector<double> acc(static_cast<std::size_t>(inner), 0.0);
            for (std::int64_t r = 0; r < reduce; ++r) {
              const T* row = x + (i * reduce + r) * inner;
              for (std::int64_t j = 0; j < inner; ++j) acc[j] += static_cast<double>(row[j]);
            }
            for (std::int64_t j = 0; j < inner; ++j)
              o[i * inner + j] = cast_to<O>(op == ReduceOp::Mean ? (reduce ? acc[j] * scale : NAN) : acc[j]);
          });
        }
      });
      return;
    }
    if (op == ReduceOp::Prod) {  // left to right, in double (integers: int64, wrapping), as PyTorch's cpu prod
      dispatch(out.dtype, [&](auto tag_O) {
        using O = typename decltype(tag_O)::type;
        O* o = out.ptr<O>();
        parallel_for(outer * inner, reduce, [&](std::int64_t flat) {
          const T* base = x + flat / inner * reduce * inner + flat % inner;
          if constexpr (std::is_integral_v<T> && std::is_integral_v<O> && !std::is_same_v<O, bool>) {
            std::uint64_t acc = 1;
            for (std::int64_t r = 0; r < reduce; ++r) {
              acc *= static_cast<std::uint64_t>(static_cast<std::int64_t>(base[r * inner]));
            }
            o[flat] = static_cast<O>(static_cast<std::int64_t>(acc));
          } else {
            double acc = 1;
            for (std::int64_t r = 0; r < reduce; ++r) acc *= static_cast<double>(base[r * inner]);
            o[flat] = cast_to<O>(acc);
          }
        });
      });
      return;
    }
    // max / min / argmax / argmin: NaN wins, as in PyTorch; the first index among ties.
    const bool want_max = op == ReduceOp::Max || op == ReduceOp::ArgMax;
    const bool want_index = op == ReduceOp::ArgMax || op == ReduceOp::ArgMin;
    parallel_for(outer * inner, reduce, [&](std::int64_t flat) {
      const std::int64_t i = flat / inner, j = flat % inner;
      const T* base = x + i * reduce * inner + j;
      T best = base[0];
      std::int64_t best_index = 0;
      for (std::int64_t r = 1; r < reduce; ++r) {
        const T v = base[r * inner];
        if (best != best) break;  // NaN already
        if (v != v || (want_max ? v > best : v < best)) {
          best = v;
          best_index = r;
        }
      }
      if (want_index) out.ptr<std::int64_t>()[flat] = best_index;
      else out.ptr<T>()[flat] = best;
    });
  });
}

// --- GEMM -----------------------------------------------------------------------------------------

namespace {

// One row-major GEMM, C (m, n) = alpha op(A) op(B) + beta C, on the calling thread.
template <typename T>
void gemm_one(const Backend::GemmArgs& g, const T* a, const T* b, T* c, std::int64_t m, std::int64_t n) {
  const auto ta = g.trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = g.trans_b ? CblasTrans : CblasNoTrans;
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(g.k),
                static_cast<float>(g.alpha), a, static_cast<int>(g.lda), b, static_cast<int>(g.ldb),
                static_cast<float>(g.beta), c, static_cast<int>(g.ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(g.k), g.alpha, a,
                static_cast<int>(g.lda), b, static_cast<int>(g.ldb), g.beta, c, static_cast<int>(g.ldc));
  }
}

// The GEMMs over ferry's OpenMP threads, each running single-threaded OpenBLAS (blas_threads.h): a batch is
// split by matrices; one large matrix by blocks of C's columns (or rows, when it is taller than wide), so
// that every thread packs only its share of B (or A). Small problems run on the calling thread.
template <typename T>
void gemm_parallel(const Backend::GemmArgs& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  // Inside a parallel region (a caller's per-sample loop) the caller owns OpenBLAS's setting: no guard there,
  // whose set/restore would race between the region's threads.
  const bool nested = omp_in_parallel();
  std::optional<SingleThreadedBlas> single;
  if (!nested) single.emplace();
  const int threads = nested ? 1 : omp_get_max_threads();
  // ~10 us of one core: below, one thread where OpenMP's threads spin between loops (16x that where they sleep:
  // waking them costs more than the GEMM, parallel_cost.h)
  constexpr std::int64_t kMinMultiplyAdds = std::int64_t{1} << 18;
  const std::int64_t work = g.batch * g.m * g.n * g.k;
  if (threads < 2 || work < 2 * kMinMultiplyAdds * host_parallel_work_scale()) {
    for (std::int64_t i = 0; i < g.batch; ++i)
      gemm_one(g, a + i * g.stride_a, b + i * g.stride_b, c + i * g.stride_c, g.m, g.n);
    return;
  }
  if (g.batch >= threads) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < g.batch; ++i)
      gemm_one(g, a + i * g.stride_a, b + i * g.stride_b, c + i * g.stride_c, g.m, g.n);
    return;
  }
  // Few matrices, each split into `threads` blocks (multiples of 16 columns / 8 rows, OpenBLAS's tile sizes).
  const bool by_columns = g.n >= g.m;
  const std::int64_t extent = by_columns ? g.n : g.m, align = by_columns ? 16 : 8;
  const std::int64_t block = std::max<std::int64_t>(align, (extent + threads - 1) / threads + align - 1) / align * align;
  const std::int64_t blocks = (extent + block - 1) / block;
#pragma omp parallel for schedule(static) collapse(2)
  for (std::int64_t i = 0; i < g.batch; ++i) {
    for (std::int64_t j = 0; j < blocks; ++j) {
      const std::int64_t first = j * block, count = std::min(block, extent - first);
      const T* ai = a + i * g.stride_a;
      const T* bi = b + i * g.stride_b;
      T* ci = c + i * g.stride_c;
      if (by_columns)  // C[:, first:first+count] = op(A) op(B)[:, first:first+count]
        gemm_one(g, ai, bi + (g.trans_b ? first * g.ldb : first), ci + first, g.m, count);
      else  // C[first:first+count, :] = op(A)[first:first+count, :] op(B)
        gemm_one(g, ai + (g.trans_a ? first : first * g.lda), bi, ci + first * g.ldc, count, g.n);
    }
  }
}

}  // namespace

void HostKernels::gemm(const GemmArgs& g, const Stream&) {
  if (g.dtype == DType::Float32) gemm_parallel<float>(g);
  else if (g.dtype == DType::Float64) gemm_parallel<double>(g);
  else throw DTypeMismatch(detail::concat("gemm: expected float32 or float64, got ", dtype_name(g.dtype)));
}

// --- indexing -------------------------------------------------------------------------------------

namespace {
// a + b in T, integers wrapping as two's complement (no signed overflow), as cuda's atomics and adds do
template <typename T>
T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

void check_indices(const KernelTensor& index, std::int64_t limit, const char* op) {
  const auto* idx = index.ptr<const std::int64_t>();
  for (std::int64_t j = 0; j < index.numel(); ++j) {
    FERRY_CHECK(idx[j] >= 0 && idx[j] < limit, InvalidArgument, op, ": index ", idx[j],
                " is out of bounds for dimension with size ", limit);
  }
}
}  // namespace

void HostKernels::index_select(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index,
                               std::int64_t outer, std::int64_t n_in, std::int64_t inner, const Stream&) {
  check_indices(index, n_in, "index_select");
  const auto* idx = index.ptr<const std::int64_t>();
  const std::int64_t n_out = index.numel();
  const std::size_t row_bytes = static_cast<std::size_t>(inner) * element_size(in.dtype);
  const auto* src = static_cast<const char*>(in.data);
  auto* dst = static_cast<char*>(out.data);
  parallel_for(outer * n_out, inner, [&](std::int64_t flat) {
    const std::int64_t o = flat / n_out, j = flat % n_out;
    std::memcpy(dst + static_cast<std::size_t>(flat) * row_bytes,
                src + static_cast<std::size_t>(o * n_in + idx[j]) * row_bytes, row_bytes);
  });
}

void HostKernels::index_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index,
                            std::int64_t outer, std::int64_t n_out, std::int64_t inner, const Stream&) {
  check_indices(index, n_out, "index_add");
  const auto* idx = index.ptr<const std::int64_t>();
  const std::int64_t n_src = index.numel();
  dispatch(out.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    if constexpr (!std::is_same_v<T, bool>) {
      T* o = out.ptr<T>();
      const T* s = src.ptr<const T>();
      parallel_for(outer, n_src * inner, [&](std::int64_t i) {  // rows of one outer slice may repeat: serial within
        for (std::int64_t j = 0; j < n_src; ++j) {
          T* dst = o + (i * n_out + idx[j]) * inner;
          const T* from = s + (i * n_src + j) * inner;
          for (std::int64_t k = 0; k < inner; ++k) dst[k] = wrap_add(dst[k], from[k]);
        }
      });
    }
  });
}

void HostKernels::gather(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
                         std::int64_t n_in, std::int64_t inner, const Stream&) {
  check_indices(index, n_in, "gather");
  const auto* idx = index.ptr<const std::int64_t>();
  const std::int64_t n_out = outer > 0 && inner > 0 ? index.numel() / (outer * inner) : 0;
  // Elements are moved, never interpreted: an unsigned word of their size.
  const auto run = [&](auto word) {
    using W = decltype(word);
    const W* src = static_cast<const W*>(in.data);
    W* dst = static_cast<W*>(out.data);
    parallel_for(outer * n_out, inner, [&](std::int64_t row) {  // row = o * n_out + j
      const std::int64_t base = row / n_out * n_in * inner;
      for (std::int64_t i = 0; i < inner; ++i) {
        const std::int64_t t = row * inner + i;
        dst[t] = src[base + idx[t] * inner + i];
      }
    });
  };
  switch (element_size(in.dtype)) {
    case 8: run(std::uint64_t{}); break;
    case 4: run(std::uint32_t{}); break;
    case 2: run(std::uint16_t{}); break;
    default: run(std::uint8_t{}); break;
  }
}

void HostKernels::scatter_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index,
                              std::int64_t outer, std::int64_t n_out, std::int64_t inner, const Stream&) {
  check_indices(index, n_out, "scatter_add");
  const auto* idx = index.ptr<const std::int64_t>();
  const std::int64_t n_src = outer > 0 && inner > 0 ? index.numel() / (outer * inner) : 0;
  dispatch(out.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    if constexpr (!std::is_same_v<T, bool>) {
      T* o = out.ptr<T>();
      const T* s = src.ptr<const T>();
      // One outer slice per task: its rows may add into the same place, so j runs in order within it.
      parallel_for(outer, n_src * inner, [&](std::int64_t slice) {
        for (std::int64_t j = 0; j < n_src; ++j) {
          for (std::int64_t i = 0; i < inner; ++i) {
            const std::int64_t t = (slice * n_src + j) * inner + i;
            T& sum = o[(slice * n_out + idx[t]) * inner + i];
            sum = wrap_add(sum, s[t]);
          }
        }
      });
    }
  });
}

void HostKernels::cumsum(const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t n,
                         std::int64_t inner, const Stream&) {
  dispatch(out.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    if constexpr (!std::is_same_v<T, bool>) {  // the op layer sums bools as int64
      T* o = out.ptr<T>();
      const T* x = in.ptr<const T>();
      using Acc = std::conditional_t<std::is_floating_point_v<T>, double, std::int64_t>;  // as PyTorch's cpu cumsum
      parallel_for(outer * inner, n, [&](std::int64_t column) {
        const std::int64_t at = (column / inner) * n * inner + column % inner;
        Acc sum = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          sum = wrap_add(sum, static_cast<Acc>(x[at + j * inner]));
          o[at + j * inner] = static_cast<T>(sum);
        }
      });
    }
  });
}

void HostKernels::argsort(const KernelTensor& indices, const KernelTensor& in, std::int64_t rows, std::int64_t n,
                          bool descending, const Stream&) {
  dispatch(in.dtype, [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const T* keys = in.ptr<const T>();
    std::int64_t* out = indices.ptr<std::int64_t>();
    parallel_for(rows, n * 16, [&](std::int64_t row) {
      const T* key = keys + row * n;
      std::int64_t* order = out + row * n;
      for (std::int64_t j = 0; j < n; ++j) order[j] = j;
      // x strictly before y; NaN is the largest value (after every number ascending, first descending)
      const auto before = [&](std::int64_t x, std::int64_t y) {
        const T a = key[x], b = key[y];
        if constexpr (std::is_floating_point_v<T>) {
          const bool a_nan = std::isnan(a), b_nan = std::isnan(b);
          return descending ? (a > b || (a_nan && !b_nan)) : (a < b || (b_nan && !a_nan));
        } else {
          return descending ? a > b : a < b;
        }
      };
      std::stable_sort(order, order + n, before);
    });
  });
}

// --- cross-entropy --------------------------------------------------------------------------------

void HostKernels::cross_entropy(const KernelTensor& loss_rows, const KernelTensor& grad, const KernelTensor& logits,
                                const KernelTensor& target, double grad_scale, const Stream&) {
  const std::int64_t rows = logits.shape[0], classes = logits.shape[1];
  const auto* t = target.ptr<const std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    FERRY_CHECK(t[r] >= 0 && t[r] < classes, InvalidArgument, "cross_entropy: target ", t[r], " at row ", r,
                " is out of bounds for ", classes, " classes",
                t[r] < 0 ? detail::concat(" (to skip the rows marked ", t[r], ", pass {.ignore_index = ", t[r], "})")
                         : std::string());
  }
  // Each row: its max, then e^(x - max) once per class in the dtype (vec_math.h's exp_f32 in float, so the loop
  // vectorises, as softmax's) summed in double; the gradient reuses those e^(x - max), written into the gradient's
  // row first and scaled by 1 / sum there.
  dispatch_float(logits.dtype, "cross_entropy", [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const T* x = logits.ptr<const T>();
    T* loss = loss_rows.ptr<T>();
    T* g = grad.data ? grad.ptr<T>() : nullptr;
    parallel_for(rows, classes * 4, [&](std::int64_t r) {
      const T* row = x + r * classes;
      T top = row[0];  // a NaN anywhere makes the row's e^(x - max), so its loss and gradient, NaN
#pragma omp simd reduction(max : top)
      for (std::int64_t c = 1; c < classes; ++c) top = row[c] > top ? row[c] : top;
      double total = 0;
      if (g) {
        T* grow = g + r * classes;
#pragma omp simd reduction(+ : total)
        for (std::int64_t c = 0; c < classes; ++c) {
          const T e = exp_of(row[c] - top);
          grow[c] = e;
          total += static_cast<double>(e);
        }
        const double e_target = static_cast<double>(grow[t[r]]);
        const double scale = grad_scale / total;
#pragma omp simd
        for (std::int64_t c = 0; c < classes; ++c) grow[c] = static_cast<T>(static_cast<double>(grow[c]) * scale);
        grow[t[r]] = static_cast<T>((e_target / total - 1.0) * grad_scale);
      } else {
#pragma omp simd reduction(+ : total)
        for (std::int64_t c = 0; c < classes; ++c) total += static_cast<double>(exp_of(row[c] - top));
      }
      const double log_sum = std::log(total) + static_cast<double>(top);
      loss[r] = static_cast<T>(log_sum - static_cast<double>(row[t[r]]));
    });
  });
}

// --- im2col / col2im ------------------------------------------------------------------------------

void HostKernels::im2col(const KernelTensor& columns, const KernelTensor& image, const Conv2dShape& s,
                         const Stream&) {
  dispatch_float(image.dtype, "im2col", [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const T* img = image.ptr<const T>();
    T* col = columns.ptr<T>();
    const std::int64_t oh = s.out_h(), ow = s.out_w();
    const std::int64_t rows = s.in_channels * s.kernel_h * s.kernel_w;
    // Stride 1, no dilation, output as wide as the input (a 'same' convolution: 3x3 with padding 1): a row of
    // the columns is the input plane shifted by (dy, dx), so one contiguous copy of the plane, then zeros where
    // the shift crosses the border. Small images (the CNNs' 14x14 and 7x7) would otherwise pay per-row overhead.
    const bool shifted_plane = s.stride_h == 1 && s.stride_w == 1 && s.dilation_h == 1 && s.dilation_w == 1 &&
                               ow == s.width;
    parallel_for(rows, oh * ow, [&](std::int64_t row) {
      const std::int64_t kw = row % s.kernel_w, kh = (row / s.kernel_w) % s.kernel_h, c = row / (s.kernel_w * s.kernel_h);
      T* dst = col + row * oh * ow;
      const T* plane = img + c * s.height * s.width;
      if (shifted_plane) {
        const std::int64_t dy = kh - s.pad_h, dx = kw - s.pad_w;
        const std::int64_t y_lo = std::clamp<std::int64_t>(-dy, 0, oh), y_hi = std::clamp<std::int64_t>(s.height - dy, y_lo, oh);
        const std::int64_t x_lo = std::clamp<std::int64_t>(-dx, 0, ow), x_hi = std::clamp<std::int64_t>(s.width - dx, x_lo, ow);
        std::fill(dst, dst + y_lo * ow, T(0));
        std::fill(dst + y_hi * ow, dst + oh * ow, T(0));
        if (y_lo == y_hi) return;
        if (x_lo < x_hi) {  // out[i] = in[i + dy * W + dx] for i from (y_lo, x_lo) to (y_hi - 1, x_hi)
          const std::int64_t first = y_lo * ow + x_lo, last = (y_hi - 1) * ow + x_hi;
          std::memcpy(dst + first, plane + first + dy * s.width + dx, static_cast<std::size_t>(last - first) * sizeof(T));
        }
        for (std::int64_t y = y_lo; y < y_hi; ++y) {  // the border columns the shift brought in from neighbours
          T* out_row = dst + y * ow;
          for (std::int64_t x = 0; x < std::min(x_lo, x_hi); ++x) out_row[x] = T(0);
          for (std::int64_t x = std::max(x_hi, x_lo); x < ow; ++x) out_row[x] = T(0);
          if (x_lo >= x_hi) std::fill(out_row, out_row + ow, T(0));
        }
        return;
      }
      for (std::int64_t y = 0; y < oh; ++y) {
        const std::int64_t iy = y * s.stride_h - s.pad_h + kh * s.dilation_h;
        T* out_row = dst + y * ow;
        if (iy < 0 || iy >= s.height) {
          for (std::int64_t x = 0; x < ow; ++x) out_row[x] = T(0);
          continue;
        }
        const T* in_row = plane + iy * s.width;
        const std::int64_t x_offset = kw * s.dilation_w - s.pad_w;
        if (s.stride_w == 1) {  // a zero head, one contiguous run of the input row, a zero tail
          const std::int64_t lo = std::clamp<std::int64_t>(-x_offset, 0, ow);
          const std::int64_t hi = std::clamp<std::int64_t>(s.width - x_offset, lo, ow);
          std::fill(out_row, out_row + lo, T(0));
          std::copy(in_row + lo + x_offset, in_row + hi + x_offset, out_row + lo);
          std::fill(out_row + hi, out_row + ow, T(0));
        } else {
          for (std::int64_t x = 0; x < ow; ++x) {
            const std::int64_t ix = x * s.stride_w + x_offset;
            out_row[x] = (ix >= 0 && ix < s.width) ? in_row[ix] : T(0);
          }
        }
      }
    });
  });
}

void HostKernels::col2im(const KernelTensor& image, const KernelTensor& columns, const Conv2dShape& s,
                         const Stream&) {
  dispatch_float(image.dtype, "col2im", [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    T* img = image.ptr<T>();
    const T* col = columns.ptr<const T>();
    const std::int64_t oh = s.out_h(), ow = s.out_w();
    parallel_for(s.in_channels, s.kernel_h * s.kernel_w * oh * ow, [&](std::int64_t c) {  // channels are disjoint
      T* plane = img + c * s.height * s.width;
      for (std::int64_t i = 0; i < s.height * s.width; ++i) plane[i] = T(0);
      for (std::int64_t kh = 0; kh < s.kernel_h; ++kh) {
        for (std::int64_t kw = 0; kw < s.kernel_w; ++kw) {
          const T* src = col + ((c * s.kernel_h + kh) * s.kernel_w + kw) * oh * ow;
          const std::int64_t x_offset = kw * s.dilation_w - s.pad_w;
          // stride 1: the output columns whose input column lies inside the row, one contiguous run
          const std::int64_t lo = std::clamp<std::int64_t>(-x_offset, 0, ow);
          const std::int64_t hi = std::clamp<std::int64_t>(s.width - x_offset, lo, ow);
          for (std::int64_t y = 0; y < oh; ++y) {
            const std::int64_t iy = y * s.stride_h - s.pad_h + kh * s.dilation_h;
            if (iy < 0 || iy >= s.height) continue;
            T* row = plane + iy * s.width;
            const T* src_row = src + y * ow;
            if (s.stride_w == 1) {
#pragma omp simd
              for (std::int64_t x = lo; x < hi; ++x) row[x + x_offset] += src_row[x];
              continue;
            }
            for (std::int64_t x = 0; x < ow; ++x) {
              const std::int64_t ix = x * s.stride_w + x_offset;
              if (ix >= 0 && ix < s.width) row[ix] += src_row[x];
            }
          }
        }
      }
    });
  });
}

// --- pooling --------------------------------------------------------------------------------------

void HostKernels::max_pool2d(const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& in,
                             const Pool2dShape& s, const Stream&) {
  dispatch_float(in.dtype, "max_pool2d", [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const std::int64_t oh = s.out_h(), ow = s.out_w();
    const T* x = in.ptr<const T>();
    T* o = out.ptr<T>();
    std::int64_t* arg = argmax.ptr<std::int64_t>();
    // PyTorch's rule: the first maximum in window order wins; the first NaN wins over everything after it.
    auto better = [](T v, T best) { return (best == best) & ((v > best) | (v != v)); };
    if (s.kernel_h == 2 && s.kernel_w == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 && s.pad_w == 0) {
      // The CNNs' 2x2/2 pooling, a row at a time (max_pool_2x2.h). A row holding a NaN is redone in window
      // order, where the first NaN wins.
      parallel_for(s.planes, oh * ow * 4, [&](std::int64_t p) {
        const std::int64_t width = s.width;
        const T* plane = x + p * s.height * width;
        T* op = o + p * oh * ow;
        std::int64_t* ap = arg + p * oh * ow;
        for (std::int64_t y = 0; y < oh; ++y) {
          const T* top = plane + 2 * y * width;
          T* out_row = op + y * ow;
          std::int64_t* arg_row = ap + y * ow;
          const std::int64_t base = 2 * y * width;
          if (max_pool_2x2_row(top, top + width, out_row, arg_row, ow, base, width)) {
            max_pool_2x2_row_in_window_order(top, top + width, out_row, arg_row, ow, base, width);
          }
        }
      });
      return;
    }
    parallel_for(s.planes, oh * ow * s.kernel_h * s.kernel_w, [&](std::int64_t p) {
      const T* plane = x + p * s.height * s.width;
      for (std::int64_t y = 0; y < oh; ++y) {
        for (std::int64_t xo = 0; xo < ow; ++xo) {
          T best = -std::numeric_limits<T>::infinity();
          std::int64_t best_index = -1;
          for (std::int64_t kh = 0; kh < s.kernel_h; ++kh) {
            const std::int64_t iy = y * s.stride_h - s.pad_h + kh;
            if (iy < 0 || iy >= s.height) continue;
            for (std::int64_t kw = 0; kw < s.kernel_w; ++kw) {
              const std::int64_t ix = xo * s.stride_w - s.pad_w + kw;
              if (ix < 0 || ix >= s.width) continue;
              const T v = plane[iy * s.width + ix];
              if (best_index < 0 || better(v, best)) {
                best = v;
                best_index = iy * s.width + ix;
              }
            }
          }
          o[(p * oh + y) * ow + xo] = best;
          arg[(p * oh + y) * ow + xo] = best_index;
        }
      }
    });
  });
}

void HostKernels::max_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out,
                                      const KernelTensor& argmax, const Pool2dShape& s, const Stream&) {
  dispatch_float(grad_in.dtype, "max_pool2d_backward", [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const std::int64_t oh = s.out_h(), ow = s.out_w(), plane = s.height * s.width;
    T* gi = grad_in.ptr<T>();
    const T* go = grad_out.ptr<const T>();
    const std::int64_t* arg = argmax.ptr<const std::int64_t>();
    parallel_for(s.planes, plane + oh * ow, [&](std::int64_t p) {
      T* dst = gi + p * plane;
      for (std::int64_t i = 0; i < plane; ++i) dst[i] = T(0);
      for (std::int64_t i = 0; i < oh * ow; ++i) {
        const std::int64_t a = arg[p * oh * ow + i];
        if (a >= 0) dst[a] += go[p * oh * ow + i];
      }
    });
  });
}

void HostKernels::avg_pool2d(const KernelTensor& out, const KernelTensor& in, const Pool2dShape& s, const Stream&) {
  dispatch_float(in.dtype, "avg_pool2d", [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const std::int64_t oh = s.out_h(), ow = s.out_w();
    const T* x = in.ptr<const T>();
    T* o = out.ptr<T>();
    const T scale = T(1) / static_cast<T>(s.kernel_h * s.kernel_w);
    parallel_for(s.planes, oh * ow * s.kernel_h * s.kernel_w, [&](std::int64_t p) {
      const T* plane = x + p * s.height * s.width;
      for (std::int64_t y = 0; y < oh; ++y) {
        for (std::int64_t xo = 0; xo < ow; ++xo) {
          T total = 0;
          for (std::int64_t kh = 0; kh < s.kernel_h; ++kh) {
            const std::int64_t iy = y * s.stride_h - s.pad_h + kh;
            if (iy < 0 || iy >= s.height) continue;
            for (std::int64_t kw = 0; kw < s.kernel_w; ++kw) {
              const std::int64_t ix = xo * s.stride_w - s.pad_w + kw;
              if (ix >= 0 && ix < s.width) total += plane[iy * s.width + ix];
            }
          }
          o[(p * oh + y) * ow + xo] = total * scale;
        }
      }
    });
  });
}

void HostKernels::avg_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out,
                                      const Pool2dShape& s, const Stream&) {
  dispatch_float(grad_in.dtype, "avg_pool2d_backward", [&](auto tag_T) {
    using T = typename decltype(tag_T)::type;
    const std::int64_t oh = s.out_h(), ow = s.out_w(), plane = s.height * s.width;
    T* gi = grad_in.ptr<T>();
    const T* go = grad_out.ptr<const T>();
    const T scale = T(1) / static_cast<T>(s.kernel_h * s.kernel_w);
    parallel_for(s.planes, plane + oh * ow * s.kernel_h * s.kernel_w, [&](std::int64_t p) {
      T* dst = gi + p * plane;
      for (std::int64_t i = 0; i < plane; ++i) dst[i] = T(0);
      for (std::int64_t y = 0; y < oh; ++y) {
        for (std::int64_t xo = 0; xo < ow; ++xo) {
          const T g = go[(p * oh + y) * ow + xo] * scale;
          for (std::int64_t kh = 0; kh < s.kernel_h; ++kh) {
            const std::int64_t iy = y * s.stride_h - s.pad_h + kh;
            if (iy < 0 || iy >= s.height) continue;
            for (std::int64_t kw = 0; kw < s.kernel_w; ++kw) {
              const std::int64_t ix = xo * s.stride_w - s.pad_w + kw;
              if (ix >= 0 && ix < s.width) dst[iy * s.width + ix] += g;
            }
          }
        }
      }
    });
  });
}

}  // namespace ferry::cpu
