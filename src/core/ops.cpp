// ops.cpp — the tensor ops of ferry/ops.h: check devices, shapes and dtypes, pick the result dtype,
// dispatch one backend kernel, and record the backward formula when an input requires grad.
#include "ferry/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/factories.h"
#include "ferry/ledger.h"
#include "ferry/profile.h"
#include "internal.h"

namespace ferry {

using autograd::needs_grad;
using autograd::record;
using autograd::reduce_to_shape;
using Grads = std::vector<Tensor>;

// --- checks -------------------------------------------------------------------------------------

int normalize_dim(int dim, int ndim, const char* op) {
  const int lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  FERRY_CHECK(dim >= lo && dim <= hi, InvalidArgument, op, ": dimension out of range (expected to be in range of [",
              lo, ", ", hi, "], but got ", dim, ")");
  return dim < 0 ? dim + std::max(ndim, 1) : dim;
}

namespace {
// Bytes per second assumed for a move between two devices in hints: a loaded profile's measured rate
// (ferry/profile.h), else the sim link's setting, else the sheet's PCIe figure (16 GB/s).
double assumed_link_rate(Device a, Device b) {
  if (const std::optional<double> measured = measured_link_rate(b, a)) return *measured;  // b moves to a
  if (a.type == DeviceType::Sim || b.type == DeviceType::Sim) {
    const double rate = sim_link_bandwidth();
    return rate > 0 ? rate : 16e9;
  }
  return 16e9;
}

std::string move_hint(const Tensor& first, const Tensor& other) {
  const double bytes = static_cast<double>(other.nbytes());
  const double rate = assumed_link_rate(first.device(), other.device());
  const double ms = bytes / rate * 1e3;
  return detail::concat("\nHint: move the operand first with the portable `other = other.to(x.device())` (",
                        static_cast<long long>(bytes), " bytes ", other.device().str(), " -> ",
                        first.device().str(), ", about ", ms, " ms at ", rate / 1e9,
                        " GB/s). Better: create it on that device, and keep data resident across steps.");
}
}  // namespace

void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    if (t->device() != first->device()) {
      throw DeviceMismatch(detail::concat(
          "Expected all tensors to be on the same device, but found at least two devices, ", first->device().str(),
          " and ", t->device().str(), "! (in ", op, ")", move_hint(*first, *t)));
    }
  }
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    FERRY_CHECK(da == db || da == 1 || db == 1, ShapeMismatch, "The size of tensor a (", da,
                ") must match the size of tensor b (", db, ") at non-singleton dimension ", i, " (in ", op,
                ": shapes ", shape_str(a), " and ", shape_str(b), ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

void synchronize(Device device, const char* reason) { detail::host_sync(device, reason); }

DType result_type(const Tensor& a, const Tensor& b) {
  if ((a.dim() == 0) == (b.dim() == 0)) return promote_types(a.dtype(), b.dtype());
  return a.dim() == 0 ? promote_with_zero_dim(b.dtype(), a.dtype()) : promote_with_zero_dim(a.dtype(), b.dtype());
}

// --- elementwise --------------------------------------------------------------------------------

namespace detail {
// Whether `scalar` is a whole number that integer dtype `dtype` holds (no wrap when the kernel converts it).
bool holds_whole(DType dtype, double scalar) {
  if (std::floor(scalar) != scalar) return false;  // also NaN; +-inf is caught by the range below
  switch (dtype) {
    case DType::Int64: return scalar >= -0x1p63 && scalar < 0x1p63;
    case DType::Int32: return scalar >= -2147483648.0 && scalar <= 2147483647.0;
    case DType::UInt8: return scalar >= 0 && scalar <= 255;
    default: return false;
  }
}
}  // namespace detail

namespace {
bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le ||
         op == BinaryOp::Gt || op == BinaryOp::Ge;
}

Tensor binary_forward(BinaryOp op, const Tensor& a_in, const Tensor& b_in, const char* name) {
  check_same_device(name, {&a_in, &b_in});
  const Shape shape = broadcast_shapes(name, a_in.shape(), b_in.shape());
  DType compute = result_type(a_in, b_in);
  if (op == BinaryOp::Div && !is_floating(compute)) compute = DType::Float32;
  if (op == BinaryOp::Pow && compute == DType::Bool) compute = DType::Int64;  // bool ** bool: 0 and 1 as integers
  const Tensor a = a_in.dtype() == compute ? a_in : a_in.detach().to(compute);
  const Tensor b = b_in.dtype() == compute ? b_in : b_in.detach().to(compute);
  Tensor out = make_tensor(shape, {.device = a.device(), .dtype = is_comparison(op) ? DType::Bool : compute});
  backend(out.device()).binary(op, detail::kernel_view(out), detail::kernel_broadcast(a, shape),
                               detail::kernel_broadcast(b, shape), detail::compute_stream(out.device()));
  return out;
}


// The dtype `tensor op scalar` computes in (the rule in ferry/ops.h): a floating tensor's own; an integer one's
// (bool counts as int64) when `scalar` is a whole number it holds and the op is not div; else float32. An integer
// to a whole negative power is refused, as PyTorch does (it would truncate to 0 for every base but 1 and -1).
DType scalar_compute_dtype(BinaryOp op, DType tensor, double scalar) {
  if (is_floating(tensor)) return tensor;
  const DType integral = tensor == DType::Bool ? DType::Int64 : tensor;
  if (op == BinaryOp::Div || !detail::holds_whole(integral, scalar)) return DType::Float32;
  FERRY_CHECK(op != BinaryOp::Pow || scalar >= 0, InvalidArgument, "pow: integers to negative integer powers are not "
              "allowed (", dtype_name(tensor), " tensor to the power ", scalar, "); convert the tensor to a floating "
              "dtype first, or write the exponent as a fraction");
  return integral;
}

// `compute`: scalar_compute_dtype of the scalar as the user wrote it (sub passes b's, then adds -b).
Tensor scalar_forward(BinaryOp op, const Tensor& a_in, double scalar, bool scalar_first, DType compute) {
  const Tensor a = a_in.dtype() == compute ? a_in : a_in.detach().to(compute);
  Tensor out = make_tensor(a.shape(), {.device = a.device(), .dtype = is_comparison(op) ? DType::Bool : compute});
  backend(out.device()).binary_scalar(op, detail::kernel_view(out), detail::kernel_view(a), scalar, scalar_first,
                                      detail::compute_stream(out.device()));
  return out;
}
Tensor scalar_forward(BinaryOp op, const Tensor& a, double scalar, bool scalar_first) {
  return scalar_forward(op, a, scalar, scalar_first, scalar_compute_dtype(op, a.dtype(), scalar));
}

// An input's gradient: `g` summed over the dims it was broadcast along, in the input's dtype when that is floating
// (as PyTorch casts it: float32 [3] * 0-d float64 gives the 0-d operand a float64 gradient).
Tensor grad_for(const Tensor& g, const Shape& shape, DType dtype) {
  Tensor reduced = reduce_to_shape(g, shape);
  return is_floating(dtype) && reduced.dtype() != dtype ? reduced.to(dtype) : reduced;
}
Tensor grad_for(const Tensor& g, const Tensor& input) { return grad_for(g, input.shape(), input.dtype()); }

Tensor unary_forward(UnaryOp op, const Tensor& a_in, bool needs_float) {
  // The bool kernels know logic, not arithmetic: these would hand the input back unchanged (PyTorch refuses them).
  if (a_in.dtype() == DType::Bool) {
    FERRY_CHECK(op != UnaryOp::Neg, InvalidArgument, "neg: negation, the `-` operator, on a bool tensor is not "
                "supported. If you are trying to invert a mask, use logical_not() instead");
    FERRY_CHECK(op != UnaryOp::Abs && op != UnaryOp::Relu && op != UnaryOp::Square, InvalidArgument,
                op == UnaryOp::Abs ? "abs" : op == UnaryOp::Relu ? "relu" : "square",
                ": not implemented for bool tensors; convert first (x.to(DType::Int64) or DType::Float32)");
  }
  const Tensor a = (needs_float && !is_floating(a_in.dtype())) ? a_in.detach().to(DType::Float32) : a_in;
  Tensor out = make_tensor(a.shape(), {.device = a.device(), .dtype = op == UnaryOp::LogicalNot ? DType::Bool : a.dtype()});
  backend(out.device()).unary(op, detail::kernel_view(out), detail::kernel_view(a), detail::compute_stream(out.device()));
  return out;
}
}  // namespace

namespace {
// alpha * b in the dtype a <op> b computes in (PyTorch's: int64 - uint8 * 2 stays int64; uint8 - uint8 * 3 wraps in
// uint8), so that the product never widens the result. A fractional alpha with an integer result is refused: it
// would be truncated (PyTorch's rule).
Tensor scaled_by_alpha(const Tensor& a, const Tensor& b, double alpha, const char* op) {
  check_same_device(op, {&a, &b});
  const DType compute = result_type(a, b);
  FERRY_CHECK(is_floating(compute) || (compute != DType::Bool && alpha == std::trunc(alpha)), InvalidArgument, op,
              ": for integral input tensors, argument alpha must not be a floating point number (alpha ", alpha,
              ", operands ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()), "); bool operands take only alpha 1");
  return scalar_forward(BinaryOp::Mul, b.detach(), alpha, false, compute);
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out;
  if (alpha == 1) {
    out = binary_forward(BinaryOp::Add, a, b, "add");
  } else {
    autograd::NoGradGuard no_grad;
    out = binary_forward(BinaryOp::Add, a, scaled_by_alpha(a, b, alpha, "add"), "add");
  }
  if (needs_grad({&a, &b})) {
    record("add", {a, b}, out, [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype(),
                                 alpha](const Tensor& g) {
      return Grads{grad_for(g, sa, ta), grad_for(alpha == 1 ? g : mul(g, alpha), sb, tb)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  FERRY_CHECK(a.dtype() != DType::Bool && b.dtype() != DType::Bool, InvalidArgument,
              "sub: subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a "
              "mask, use logical_not(); for the difference of two masks, ne(a, b)");
  Tensor out;
  if (alpha == 1) {
    out = binary_forward(BinaryOp::Sub, a, b, "sub");
  } else {
    autograd::NoGradGuard no_grad;
    out = binary_forward(BinaryOp::Sub, a, scaled_by_alpha(a, b, alpha, "sub"), "sub");
  }
  if (needs_grad({&a, &b})) {
    record("sub", {a, b}, out, [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype(),
                                 alpha](const Tensor& g) {
      return Grads{grad_for(g, sa, ta), grad_for(mul(g, -alpha), sb, tb)};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Mul, a, b, "mul");
  if (needs_grad({&a, &b})) {
    record("mul", {a, b}, out, [a = a.detach(), b = b.detach()](const Tensor& g) {
      return Grads{grad_for(mul(g, b), a), grad_for(mul(g, a), b)};
    }, autograd::Saved::Inputs);
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Div, a, b, "div");
  if (needs_grad({&a, &b})) {
    record("div", {a, b}, out, [a = a.detach(), b = b.detach()](const Tensor& g) {
      Tensor ga = div(g, b);
      return Grads{grad_for(ga, a), grad_for(neg(mul(ga, div(a, b))), b)};
    }, autograd::Saved::Inputs);
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Pow, a, b, "pow");
  if (needs_grad({&a, &b})) {
    record("pow", {a, b}, out, [a = a.detach(), b = b.detach(), o = out.detach()](const Tensor& g) {
      // Masked as PyTorch does: d/da is 0 where b == 0 (not 0 * a^-1 = NaN at a = 0); d/db is 0 where a == 0 and
      // b >= 0 (not 0 * log 0 = NaN).
      const Tensor zero = zeros({}, {.device = g.device(), .dtype = g.dtype()});
      Tensor ga = mul(g, where(eq(b, 0.0), zero, mul(b, pow(a, sub(b, 1.0)))));
      const Tensor log_term = mul(o, log(a));
      Tensor gb = mul(g, where(eq(a, 0.0), where(ge(b, 0.0), zero, log_term), log_term));
      return Grads{grad_for(ga, a), grad_for(gb, b)};
    }, autograd::Saved::InputsAndOutput);
  }
  return out;
}

namespace {
Tensor extremum(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  Tensor out = binary_forward(op, a, b, name);
  if (needs_grad({&a, &b})) {
    record(name, {a, b}, out, [a = a.detach(), b = b.detach(), op](const Tensor& g) {
      // The larger (smaller) operand takes the gradient, ties share it evenly, and where a NaN makes every
      // comparison false both take it whole: PyTorch's where(a == b, g / 2, g).masked_fill_(a < b, 0) (a > b for b).
      const Tensor a_loses = op == BinaryOp::Maximum ? lt(a, b) : gt(a, b);
      const Tensor b_loses = op == BinaryOp::Maximum ? gt(a, b) : lt(a, b);
      const Tensor half = where(eq(a, b), mul(g, 0.5), g);
      const Tensor zero = zeros({}, {.device = g.device(), .dtype = g.dtype()});
      return Grads{grad_for(where(a_loses, zero, half), a), grad_for(where(b_loses, zero, half), b)};
    }, autograd::Saved::Inputs);
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Maximum, a, b, "maximum"); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Minimum, a, b, "minimum"); }

Tensor add(const Tensor& a, double b) {
  Tensor out = scalar_forward(BinaryOp::Add, a, b, false);
  if (needs_grad({&a})) record("add_scalar", {a}, out, [](const Tensor& g) { return Grads{g}; });
  return out;
}
Tensor sub(const Tensor& a, double b) {
  // a + (-b), in the dtype b itself chooses: uint8 - 1.0 stays uint8 (the kernel's -1 wraps to 255, and so does the
  // sum, as uint8 arithmetic does).
  Tensor out = scalar_forward(BinaryOp::Add, a, -b, false, scalar_compute_dtype(BinaryOp::Sub, a.dtype(), b));
  if (needs_grad({&a})) record("add_scalar", {a}, out, [](const Tensor& g) { return Grads{g}; });
  return out;
}
Tensor mul(const Tensor& a, double b) {
  Tensor out = scalar_forward(BinaryOp::Mul, a, b, false);
  if (needs_grad({&a})) record("mul_scalar", {a}, out, [b](const Tensor& g) { return Grads{mul(g, b)}; });
  return out;
}
Tensor div(const Tensor& a, double b) {
  Tensor out = scalar_forward(BinaryOp::Div, a, b, false);
  if (needs_grad({&a})) record("div_scalar", {a}, out, [b](const Tensor& g) { return Grads{div(g, b)}; });
  return out;
}
Tensor rsub(const Tensor& a, double b) {
  Tensor out = scalar_forward(BinaryOp::Sub, a, b, true);
  if (needs_grad({&a})) record("rsub", {a}, out, [](const Tensor& g) { return Grads{neg(g)}; });
  return out;
}
Tensor rdiv(const Tensor& a, double b) {
  Tensor out = scalar_forward(BinaryOp::Div, a, b, true);
  if (needs_grad({&a})) {
    record("rdiv", {a}, out, [a = a.detach(), o = out.detach()](const Tensor& g) {
      return Grads{neg(div(mul(g, o), a))};
    }, autograd::Saved::InputsAndOutput);
  }
  return out;
}
Tensor pow(const Tensor& a, double exponent) {
  // x^0.5 and x^-0.5 as PyTorch computes them, sqrt and rsqrt: NaN at -inf, where std::pow gives inf and 0.
  Tensor out = exponent == 0.5 && is_floating(a.dtype())    ? unary_forward(UnaryOp::Sqrt, a, true)
               : exponent == -0.5 && is_floating(a.dtype()) ? unary_forward(UnaryOp::Rsqrt, a, true)
                                                            : scalar_forward(BinaryOp::Pow, a, exponent, false);
  if (needs_grad({&a})) {
    record("pow_scalar", {a}, out, [a = a.detach(), exponent](const Tensor& g) {
      if (exponent == 0) return Grads{zeros_like(g)};  // as PyTorch: not 0 * a^-1 = NaN at a = 0
      return Grads{mul(g, mul(pow(a, exponent - 1), exponent))};
    }, autograd::Saved::Inputs);
  }
  return out;
}

Tensor neg(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Neg, a, false);
  if (needs_grad({&a})) record("neg", {a}, out, [](const Tensor& g) { return Grads{neg(g)}; });
  return out;
}
Tensor exp(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Exp, a, true);
  if (needs_grad({&a})) record("exp", {a}, out, [o = out.detach()](const Tensor& g) { return Grads{mul(g, o)}; },
      autograd::Saved::Output);
  return out;
}
Tensor log(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Log, a, true);
  if (needs_grad({&a})) record("log", {a}, out, [a = a.detach()](const Tensor& g) { return Grads{div(g, a)}; },
      autograd::Saved::Inputs);
  return out;
}
Tensor sqrt(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Sqrt, a, true);
  if (needs_grad({&a}))
    record("sqrt", {a}, out, [o = out.detach()](const Tensor& g) { return Grads{div(g, mul(o, 2.0))}; },
        autograd::Saved::Output);
  return out;
}
Tensor rsqrt(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Rsqrt, a, true);
  if (needs_grad({&a}))
    record("rsqrt", {a}, out, [o = out.detach()](const Tensor& g) { return Grads{mul(g, mul(pow(o, 3.0), -0.5))}; },
        autograd::Saved::Output);
  return out;
}
Tensor abs(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Abs, a, false);
  if (needs_grad({&a})) record("abs", {a}, out, [a = a.detach()](const Tensor& g) { return Grads{mul(g, sign(a))}; },
      autograd::Saved::Inputs);
  return out;
}
Tensor sign(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Sign, a, false);
  if (needs_grad({&a})) record("sign", {a}, out, [](const Tensor& g) { return Grads{zeros_like(g)}; });
  return out;
}
Tensor relu(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Relu, a, false);
  if (needs_grad({&a})) {
    record("relu", {a}, out, [o = out.detach()](const Tensor& g) {
      Tensor grad = make_tensor(g.shape(), {.device = g.device(), .dtype = g.dtype()});
      backend(g.device()).binary(BinaryOp::ReluBackward, detail::kernel_view(grad), detail::kernel_view(g),
                                 detail::kernel_view(o), detail::compute_stream(g.device()));
      return Grads{grad};
    }, autograd::Saved::Output);
  }
  return out;
}
Tensor sigmoid(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Sigmoid, a, true);
  if (needs_grad({&a}))
    record("sigmoid", {a}, out, [o = out.detach()](const Tensor& g) { return Grads{mul(g, mul(o, rsub(o, 1.0)))}; },
        autograd::Saved::Output);
  return out;
}
Tensor tanh(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Tanh, a, true);
  if (needs_grad({&a}))
    record("tanh", {a}, out, [o = out.detach()](const Tensor& g) { return Grads{mul(g, rsub(square(o), 1.0))}; },
        autograd::Saved::Output);
  return out;
}
Tensor erf(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Erf, a, true);
  if (needs_grad({&a})) {
    record("erf", {a}, out, [a = a.detach()](const Tensor& g) {  // d/da erf(a) = 2/sqrt(pi) exp(-a^2)
      return Grads{mul(g, mul(exp(neg(square(a))), 2.0 / std::sqrt(M_PI)))};
    }, autograd::Saved::Inputs);
  }
  return out;
}
Tensor sin(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Sin, a, true);
  if (needs_grad({&a}))
    record("sin", {a}, out, [a = a.detach()](const Tensor& g) { return Grads{mul(g, cos(a))}; },
        autograd::Saved::Inputs);
  return out;
}
Tensor cos(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Cos, a, true);
  if (needs_grad({&a}))
    record("cos", {a}, out, [a = a.detach()](const Tensor& g) { return Grads{neg(mul(g, sin(a)))}; },
        autograd::Saved::Inputs);
  return out;
}
Tensor log1p(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Log1p, a, true);
  if (needs_grad({&a}))
    record("log1p", {a}, out, [a = a.detach()](const Tensor& g) { return Grads{div(g, add(a, 1.0))}; },
        autograd::Saved::Inputs);
  return out;
}
Tensor expm1(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Expm1, a, true);
  if (needs_grad({&a}))  // d/da (e^a - 1) = e^a = out + 1
    record("expm1", {a}, out, [o = out.detach()](const Tensor& g) { return Grads{mul(g, add(o, 1.0))}; },
        autograd::Saved::Output);
  return out;
}

namespace {
// floor, ceil, round, trunc: a step function, whose gradient is zero wherever it exists (PyTorch's choice too).
Tensor rounding(UnaryOp op, const char* name, const Tensor& a) {
  FERRY_CHECK(a.dtype() != DType::Bool, InvalidArgument, name, ": not implemented for bool tensors; convert first "
              "(x.to(DType::Float32))");
  Tensor out = unary_forward(op, a, false);
  if (needs_grad({&a})) record(name, {a}, out, [](const Tensor& g) { return Grads{zeros_like(g)}; });
  return out;
}
}  // namespace
Tensor floor(const Tensor& a) { return rounding(UnaryOp::Floor, "floor", a); }
Tensor ceil(const Tensor& a) { return rounding(UnaryOp::Ceil, "ceil", a); }
Tensor round(const Tensor& a) { return rounding(UnaryOp::Round, "round", a); }
Tensor trunc(const Tensor& a) { return rounding(UnaryOp::Trunc, "trunc", a); }

Tensor square(const Tensor& a) {
  Tensor out = unary_forward(UnaryOp::Square, a, false);
  if (needs_grad({&a}))
    record("square", {a}, out, [a = a.detach()](const Tensor& g) { return Grads{mul(g, mul(a, 2.0))}; },
        autograd::Saved::Inputs);
  return out;
}

Tensor eq(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Eq, a, b, "eq"); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Ne, a, b, "ne"); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Lt, a, b, "lt"); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Le, a, b, "le"); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Gt, a, b, "gt"); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_forward(BinaryOp::Ge, a, b, "ge"); }
Tensor eq(const Tensor& a, double b) { return scalar_forward(BinaryOp::Eq, a, b, false); }
Tensor ne(const Tensor& a, double b) { return scalar_forward(BinaryOp::Ne, a, b, false); }
Tensor lt(const Tensor& a, double b) { return scalar_forward(BinaryOp::Lt, a, b, false); }
Tensor le(const Tensor& a, double b) { return scalar_forward(BinaryOp::Le, a, b, false); }
Tensor gt(const Tensor& a, double b) { return scalar_forward(BinaryOp::Gt, a, b, false); }
Tensor ge(const Tensor& a, double b) { return scalar_forward(BinaryOp::Ge, a, b, false); }
Tensor logical_not(const Tensor& a) { return unary_forward(UnaryOp::LogicalNot, a, false); }

Tensor where(const Tensor& condition, const Tensor& a_in, const Tensor& b_in) {
  check_same_device("where", {&condition, &a_in, &b_in});
  FERRY_CHECK(condition.dtype() == DType::Bool, DTypeMismatch,
              "where expected condition to be a boolean tensor, but got a tensor with dtype ",
              dtype_name(condition.dtype()));
  const Shape shape = broadcast_shapes("where", broadcast_shapes("where", condition.shape(), a_in.shape()), b_in.shape());
  const DType dtype = result_type(a_in, b_in);
  const Tensor a = a_in.detach().to(dtype), b = b_in.detach().to(dtype), c = condition.detach();
  Tensor out = make_tensor(shape, {.device = a.device(), .dtype = dtype});
  backend(out.device()).where(detail::kernel_view(out), detail::kernel_broadcast(c, shape),
                              detail::kernel_broadcast(a, shape), detail::kernel_broadcast(b, shape),
                              detail::compute_stream(out.device()));
  if (needs_grad({&a_in, &b_in})) {
    // Only the sides that want a gradient get one: masked_fill's fill is a constant, and its gradient would be a
    // pass over the whole tensor and a sum of it.
    record("where", {a_in, b_in}, out, [c, sa = a_in.shape(), sb = b_in.shape(), ta = a_in.dtype(), tb = b_in.dtype(),
                                         ra = a_in.requires_grad(), rb = b_in.requires_grad()](const Tensor& g) {
      Tensor zero = zeros({}, {.device = g.device(), .dtype = g.dtype()});
      return Grads{ra ? grad_for(where(c, g, zero), sa, ta) : Tensor(),
                   rb ? grad_for(where(c, zero, g), sb, tb) : Tensor()};
    });
  }
  return out;
}

// --- reductions ---------------------------------------------------------------------------------

namespace {
struct ReducePlan {
  Tensor input;  // contiguous, laid out (outer, reduce, inner)
  std::int64_t outer = 1, reduce = 1, inner = 1;
  Shape out_shape;       // without kept dims
  Shape keepdim_shape;   // with reduced dims as 1
};

ReducePlan plan_reduce(const Tensor& a, std::vector<int> dims, const char* op) {
  const int nd = a.dim();
  if (dims.empty()) {
    dims.resize(nd);
    std::iota(dims.begin(), dims.end(), 0);
  }
  std::vector<bool> reduced(std::max(nd, 1), false);
  for (int& d : dims) {
    d = normalize_dim(d, nd, op);
    FERRY_CHECK(!(nd > 0 && reduced[d]), InvalidArgument, op, ": dim ", d, " appears more than once");
    if (nd > 0) reduced[d] = true;
  }
  ReducePlan plan;
  for (int d = 0; d < nd; ++d) {
    plan.keepdim_shape.push_back(reduced[d] ? 1 : a.shape()[d]);
    if (!reduced[d]) plan.out_shape.push_back(a.shape()[d]);
  }
  // Reduced dims form one block [first, last]? Then no permute is needed.
  int first = nd, last = -1;
  for (int d = 0; d < nd; ++d) if (reduced[d]) { first = std::min(first, d); last = d; }
  bool block = true;
  for (int d = first; d <= last; ++d) block = block && reduced[d];
  if (block) {
    plan.input = a.detach().contiguous();
    for (int d = 0; d < nd; ++d) {
      if (d < first) plan.outer *= a.shape()[d];
      else if (d <= last) plan.reduce *= a.shape()[d];
      else plan.inner *= a.shape()[d];
    }
  } else {
    std::vector<int> order;
    for (int d = 0; d < nd; ++d) if (!reduced[d]) { order.push_back(d); plan.outer *= a.shape()[d]; }
    for (int d = 0; d < nd; ++d) if (reduced[d]) { order.push_back(d); plan.reduce *= a.shape()[d]; }
    plan.input = a.detach().permute(order).contiguous();
  }
  return plan;
}

Tensor reduce_forward(ReduceOp op, const ReducePlan& plan, DType out_dtype, bool keepdim) {
  const Tensor& in = plan.input;
  Tensor out = make_tensor(keepdim ? plan.keepdim_shape : plan.out_shape, {.device = in.device(), .dtype = out_dtype});
  const bool of_nothing_defined = op == ReduceOp::Sum || op == ReduceOp::Mean || op == ReduceOp::Prod;
  FERRY_CHECK(plan.reduce > 0 || of_nothing_defined, InvalidArgument,
              "Cannot take max/min/argmax/argmin over an empty dimension");
  backend(in.device()).reduce(op, detail::kernel_view(out), detail::kernel_view(in), plan.outer, plan.reduce,
                              plan.inner, detail::compute_stream(in.device()));
  return out;
}
}  // namespace

Tensor sum(const Tensor& a, std::vector<int> dims, bool keepdim) {
  ReducePlan plan = plan_reduce(a, dims, "sum");
  const DType dtype = is_floating(a.dtype()) ? a.dtype() : DType::Int64;
  Tensor input = plan.input.dtype() == dtype ? plan.input : plan.input.to(dtype);
  plan.input = input;
  Tensor out = reduce_forward(ReduceOp::Sum, plan, dtype, keepdim);
  if (needs_grad({&a})) {
    record("sum", {a}, out, [shape = a.shape(), kd = plan.keepdim_shape](const Tensor& g) {
      return Grads{g.reshape(kd).expand(shape)};
    });
  }
  return out;
}

Tensor prod(const Tensor& a, std::vector<int> dims, bool keepdim) {
  ReducePlan plan = plan_reduce(a, dims, "prod");
  const DType dtype = is_floating(a.dtype()) ? a.dtype() : DType::Int64;  // as sum: integers multiply as int64
  if (plan.input.dtype() != dtype) plan.input = plan.input.to(dtype);
  Tensor out = reduce_forward(ReduceOp::Prod, plan, dtype, keepdim);
  if (needs_grad({&a})) {
    // d prod / d x_k is the product of the others. PyTorch's rule, without dividing by zero: prod / x_k in a slice
    // with no zero; in a slice with one zero, the product of the rest at the zero and 0 elsewhere; 0 with two zeros.
    record("prod", {a}, out, [x = a.detach(), dims, kd = plan.keepdim_shape](const Tensor& g) {
      const TensorOptions like{.device = x.device(), .dtype = x.dtype()};
      const Tensor is_zero = eq(x, 0.0);
      const Tensor zeros_in_slice = sum(is_zero, dims, true);
      const Tensor safe = where(is_zero, scalar_tensor(1.0, like), x);
      const Tensor rest = prod(safe, dims, true);  // the product of the slice's nonzero elements
      const Tensor factor = where(eq(zeros_in_slice, 0.0), div(rest, safe),
                                  where(logical_and(is_zero, eq(zeros_in_slice, 1.0)), rest, scalar_tensor(0.0, like)));
      return Grads{mul(factor, g.reshape(kd))};
    }, autograd::Saved::Inputs);
  }
  return out;
}

Tensor mean(const Tensor& a, std::vector<int> dims, bool keepdim) {
  FERRY_CHECK(is_floating(a.dtype()), InvalidArgument, "mean(): expected a floating point input, got ",
              dtype_name(a.dtype()));
  ReducePlan plan = plan_reduce(a, dims, "mean");
  Tensor out = reduce_forward(ReduceOp::Mean, plan, a.dtype(), keepdim);
  if (needs_grad({&a})) {
    record("mean", {a}, out, [shape = a.shape(), kd = plan.keepdim_shape, n = plan.reduce](const Tensor& g) {
      return Grads{div(g.reshape(kd), static_cast<double>(n)).expand(shape)};
    });
  }
  return out;
}

Tensor var(const Tensor& a, std::vector<int> dims, bool unbiased, bool keepdim) {
  const ReducePlan plan = plan_reduce(a, dims, "var");
  const Tensor centered = sub(a, mean(a, dims, true));
  const double n = static_cast<double>(plan.reduce);
  return div(sum(square(centered), dims, keepdim), unbiased ? std::max(n - 1, 0.0) : n);
}

namespace {
// The maximum of each slice along `dim` (keepdim), as a constant (no history: softmax and logsumexp do not depend
// on the shift, so its gradient would only add rounding). softmax's is the max as it is, so a slice holding +inf,
// or all -inf, is NaN throughout (inf - inf), as PyTorch's; logsumexp's (`finite_only`) is 0 where the max is not
// finite, so a slice of all -inf gives -inf and one holding +inf gives +inf, as PyTorch's logsumexp.
Tensor softmax_shift(const Tensor& a, int dim, bool finite_only = false) {
  autograd::NoGradGuard no_grad;
  if (a.size(dim) == 0) {  // nothing to shift: softmax of an empty slice is empty, its logsumexp -inf (PyTorch's)
    return zeros({}, {.device = a.device(), .dtype = a.dtype()});
  }
  const Tensor top = reduce_forward(ReduceOp::Max, plan_reduce(a, {dim}, "softmax"), a.dtype(), true);  // no argmax
  if (!finite_only) return top;
  return where(eq(abs(top), INFINITY), zeros({}, {.device = a.device(), .dtype = a.dtype()}), top);
}

int softmax_dim(const Tensor& a, int dim, const char* op) {
  FERRY_CHECK(is_floating(a.dtype()), DTypeMismatch, op, ": expected a floating point input, got ",
              dtype_name(a.dtype()));
  FERRY_CHECK(a.dim() > 0, ShapeMismatch, op, ": expected at least one dimension, got a 0-d tensor");
  return normalize_dim(dim, a.dim(), op);
}

// softmax (log_softmax when `log`) along the last dim as the backend's one kernel each way
// (Backend::softmax_forward), one autograd node; undefined where the backend has none for the dtype, `d` is not
// the last dim or the tensor is empty: the caller composes it then.
Tensor library_softmax(const Tensor& a, int d, bool log) {
  const Device device = a.device();
  if (d != a.dim() - 1 || a.numel() == 0 || !backend(device).softmax_library(a.dtype(), device.index)) {
    return Tensor();
  }
  const std::int64_t n = a.size(d), rows = a.numel() / n;
  const Tensor x = a.detach().contiguous();
  Tensor out = make_tensor(a.shape(), {.device = device, .dtype = a.dtype()});
  backend(device).softmax_forward(detail::kernel_view(out), detail::kernel_view(x), rows, n, log,
                                  detail::compute_stream(device));
  if (needs_grad({&a})) {
    record(log ? "log_softmax" : "softmax", {a}, out, [y = out.detach(), rows, n, log](const Tensor& g) {
      const Tensor grad = g.contiguous();
      Tensor dx = make_tensor(y.shape(), {.device = y.device(), .dtype = y.dtype()});
      backend(y.device()).softmax_backward(detail::kernel_view(dx), detail::kernel_view(grad), detail::kernel_view(y),
                                           rows, n, log, detail::compute_stream(y.device()));
      return Grads{dx};
    }, autograd::Saved::Output);
  }
  return out;
}
}  // namespace

// softmax and log_softmax along the last dim are one backend kernel each way where the backend has one (cpu, sim
// and cuda for float32 and float64); otherwise composed forward, but each still one node for autograd, with the
// closed-form backward of three or four ops in place of the dozen the composition's own nodes would run.
Tensor softmax(const Tensor& a, int dim) {
  const int d = softmax_dim(a, dim, "softmax");
  if (Tensor fused = library_softmax(a, d, false); fused.defined()) return fused;
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    const Tensor e = exp(sub(a, softmax_shift(a, d)));
    out = div(e, sum(e, {d}, true));
  }
  if (needs_grad({&a})) {
    record("softmax", {a}, out, [y = out.detach(), d](const Tensor& g) {  // y (g - sum(g y))
      return Grads{mul(y, sub(g, sum(mul(g, y), {d}, true)))};
    }, autograd::Saved::Output);
  }
  return out;
}

Tensor log_softmax(const Tensor& a, int dim) {
  const int d = softmax_dim(a, dim, "log_softmax");
  if (Tensor fused = library_softmax(a, d, true); fused.defined()) return fused;
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    const Tensor shifted = sub(a, softmax_shift(a, d));
    out = sub(shifted, log(sum(exp(shifted), {d}, true)));
  }
  if (needs_grad({&a})) {
    record("log_softmax", {a}, out, [y = out.detach(), d](const Tensor& g) {  // g - exp(y) sum(g)
      return Grads{sub(g, mul(exp(y), sum(g, {d}, true)))};
    }, autograd::Saved::Output);
  }
  return out;
}

Tensor logsumexp(const Tensor& a, int dim, bool keepdim) {
  const int d = softmax_dim(a, dim, "logsumexp");
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    const Tensor top = softmax_shift(a, d, true);
    out = add(log(sum(exp(sub(a, top)), {d}, true)), top);
  }
  if (needs_grad({&a})) {  // g e^(a - out): 0 beside an infinite result, where the composition's e^a / sum is NaN
    record("logsumexp", {a}, out, [a = a.detach(), o = out.detach()](const Tensor& g) {
      return Grads{mul(g, exp(sub(a, o)))};
    }, autograd::Saved::InputsAndOutput);
  }
  return keepdim ? out : out.squeeze(d);
}

namespace {
Tensor extremum_all(ReduceOp op, const Tensor& a, const char* name) {
  FERRY_CHECK(a.numel() > 0, InvalidArgument, name, "(): cannot reduce an empty tensor");
  ReducePlan plan = plan_reduce(a, {}, name);
  Tensor out = reduce_forward(op, plan, a.dtype(), false);
  if (needs_grad({&a})) {
    record(name, {a}, out, [a = a.detach(), o = out.detach()](const Tensor& g) {
      // Ties share the gradient evenly; a NaN result gives it to the NaNs (PyTorch's evenly_distribute_backward).
      const Tensor mask = logical_or(eq(a, o), logical_and(isnan(a), isnan(o))).to(g.dtype());
      return Grads{mul(div(mask, sum(mask)), g)};
    }, autograd::Saved::InputsAndOutput);
  }
  return out;
}

std::pair<Tensor, Tensor> extremum_dim(ReduceOp value_op, ReduceOp index_op, const Tensor& a, int dim, bool keepdim,
                                       const char* name) {
  ReducePlan plan = plan_reduce(a, {dim}, name);
  Tensor values, indices;
  {
    autograd::NoGradGuard no_grad;
    values = reduce_forward(value_op, plan, a.dtype(), keepdim);
    indices = reduce_forward(index_op, plan, DType::Int64, keepdim);
  }
  if (needs_grad({&a})) {
    const int d = normalize_dim(dim, a.dim(), name);
    record(name, {a}, values, [shape = a.shape(), kd = plan.keepdim_shape, idx = indices, d](const Tensor& g) {
      Tensor positions = arange(0, static_cast<double>(shape[d]), 1, {.device = g.device(), .dtype = DType::Int64});
      Shape pos_shape(shape.size(), 1);
      pos_shape[d] = shape[d];
      Tensor onehot = eq(positions.reshape(pos_shape), idx.reshape(kd)).to(g.dtype());
      return Grads{mul(onehot, g.reshape(kd))};
    });
  }
  return {values, indices};
}

// amax / amin: the extremum over several dims; the gradient is shared evenly by the elements equal to it.
Tensor extremum_dims(ReduceOp op, const Tensor& a, const std::vector<int>& dims, bool keepdim, const char* name) {
  ReducePlan plan = plan_reduce(a, dims, name);
  FERRY_CHECK(plan.reduce > 0, InvalidArgument, name, "(): expected a non-empty reduction, but the input ",
              shape_str(a.shape()), " has no elements along the reduced dims (a max of nothing is undefined)");
  Tensor out = reduce_forward(op, plan, a.dtype(), keepdim);
  if (needs_grad({&a})) {
    std::vector<int> reduced(dims);  // normalized (plan_reduce has checked them); none listed: every dim
    for (int& d : reduced) d = normalize_dim(d, a.dim(), name);
    if (dims.empty()) for (int d = 0; d < a.dim(); ++d) reduced.push_back(d);
    record(name, {a}, out, [a = a.detach(), o = out.detach(), kd = plan.keepdim_shape, reduced](const Tensor& g) {
      Tensor mask = eq(a, o.reshape(kd)).to(g.dtype());  // ties share the gradient evenly, as torch's amax
      return Grads{mul(div(mask, sum(mask, reduced, true)), g.reshape(kd))};
    }, autograd::Saved::InputsAndOutput);
  }
  return out;
}
}  // namespace

Tensor amax(const Tensor& a, const std::vector<int>& dims, bool keepdim) {
  return extremum_dims(ReduceOp::Max, a, dims, keepdim, "amax");
}
Tensor amin(const Tensor& a, const std::vector<int>& dims, bool keepdim) {
  return extremum_dims(ReduceOp::Min, a, dims, keepdim, "amin");
}

Tensor max(const Tensor& a) { return extremum_all(ReduceOp::Max, a, "max"); }
Tensor min(const Tensor& a) { return extremum_all(ReduceOp::Min, a, "min"); }
std::pair<Tensor, Tensor> max(const Tensor& a, int dim, bool keepdim) {
  return extremum_dim(ReduceOp::Max, ReduceOp::ArgMax, a, dim, keepdim, "max");
}
std::pair<Tensor, Tensor> min(const Tensor& a, int dim, bool keepdim) {
  return extremum_dim(ReduceOp::Min, ReduceOp::ArgMin, a, dim, keepdim, "min");
}
Tensor argmax(const Tensor& a, int dim, bool keepdim) {
  return reduce_forward(ReduceOp::ArgMax, plan_reduce(a, {dim}, "argmax"), DType::Int64, keepdim);
}
Tensor argmin(const Tensor& a, int dim, bool keepdim) {
  return reduce_forward(ReduceOp::ArgMin, plan_reduce(a, {dim}, "argmin"), DType::Int64, keepdim);
}

// --- linear algebra -----------------------------------------------------------------------------

namespace {
// A 2-d operand as GEMM wants it: row-major with a leading dimension, possibly transposed.
struct GemmOperand {
  Tensor storage;  // keeps the memory alive
  bool transposed = false;
  std::int64_t ld = 0;
};
GemmOperand gemm_operand(const Tensor& t) {
  const auto& st = t.strides();
  const std::int64_t rows = t.size(0), cols = t.size(1);
  if ((st[1] == 1 || cols == 1) && st[0] >= std::max<std::int64_t>(cols, 1)) return {t, false, st[0]};
  if ((st[0] == 1 || rows == 1) && st[1] >= std::max<std::int64_t>(rows, 1)) return {t, true, st[1]};
  Tensor c = t.contiguous();
  return {c, false, std::max<std::int64_t>(cols, 1)};
}

Tensor mm_forward(const Tensor& a, const Tensor& b) {
  const std::int64_t n = a.size(0), k = a.size(1), m = b.size(1);
  Tensor out = make_tensor({n, m}, {.device = a.device(), .dtype = a.dtype()});
  if (out.numel() == 0) return out;
  if (k == 0) return out.fill_(0);
  const GemmOperand ga = gemm_operand(a), gb = gemm_operand(b);
  Backend::GemmArgs args;
  args.trans_a = ga.transposed;
  args.trans_b = gb.transposed;
  args.m = n; args.n = m; args.k = k;
  args.a = ga.storage.data_ptr(); args.lda = ga.ld;
  args.b = gb.storage.data_ptr(); args.ldb = gb.ld;
  args.c = out.data_ptr(); args.ldc = m;
  args.dtype = a.dtype();
  backend(a.device()).gemm(args, detail::compute_stream(a.device()));
  return out;
}

// A (batch, rows, cols) operand: each matrix as gemm_operand takes it, the matrices `batch_stride` elements
// apart (0 for a batch of one, or an expanded batch dim). Transposed views (bmm's backward, k^T in attention)
// go to the GEMM as they are, without a copy; other layouts are copied to contiguous first.
struct BatchedGemmOperand {
  GemmOperand matrix;
  std::int64_t batch_stride = 0;
};
BatchedGemmOperand batched_gemm_operand(const Tensor& t) {
  const auto& st = t.strides();
  const std::int64_t rows = t.size(1), cols = t.size(2);
  const std::int64_t batch_stride = t.size(0) == 1 ? 0 : st[0];
  if (batch_stride >= 0) {  // each matrix by gemm_operand's rule
    if ((st[2] == 1 || cols == 1) && st[1] >= std::max<std::int64_t>(cols, 1)) return {{t, false, st[1]}, batch_stride};
    if ((st[1] == 1 || rows == 1) && st[2] >= std::max<std::int64_t>(rows, 1)) return {{t, true, st[2]}, batch_stride};
  }
  const Tensor c = t.contiguous();
  return {{c, false, std::max<std::int64_t>(cols, 1)}, rows * cols};
}

Tensor bmm_forward(const Tensor& a, const Tensor& b) {
  const std::int64_t batch = a.size(0), n = a.size(1), k = a.size(2), m = b.size(2);
  Tensor out = make_tensor({batch, n, m}, {.device = a.device(), .dtype = a.dtype()});
  if (out.numel() == 0) return out;
  if (k == 0) return out.fill_(0);
  const BatchedGemmOperand ga = batched_gemm_operand(a), gb = batched_gemm_operand(b);
  Backend::GemmArgs args;
  args.trans_a = ga.matrix.transposed;
  args.trans_b = gb.matrix.transposed;
  args.m = n; args.n = m; args.k = k;
  args.a = ga.matrix.storage.data_ptr(); args.lda = ga.matrix.ld; args.stride_a = ga.batch_stride;
  args.b = gb.matrix.storage.data_ptr(); args.ldb = gb.matrix.ld; args.stride_b = gb.batch_stride;
  args.c = out.data_ptr(); args.ldc = m; args.stride_c = n * m;
  args.batch = batch;
  args.dtype = a.dtype();
  backend(a.device()).gemm(args, detail::compute_stream(a.device()));
  return out;
}

void check_matmul_dtypes(const Tensor& a, const Tensor& b, const char* op) {
  FERRY_CHECK(a.dtype() == b.dtype(), DTypeMismatch, op, ": expected both operands to have the same dtype, got ",
              dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  FERRY_CHECK(is_floating(a.dtype()), DTypeMismatch, op, ": expected float32 or float64 operands, got ",
              dtype_name(a.dtype()));
  if (is_storage_only(a.dtype())) throw_storage_only(a.dtype(), op);
}
}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_same_device("bmm", {&a, &b});
  check_matmul_dtypes(a, b, "bmm");
  FERRY_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1), ShapeMismatch,
              "bmm: expected (B, n, k) and (B, k, m), got ", shape_str(a.shape()), " and ", shape_str(b.shape()));
  Tensor out = bmm_forward(a, b);
  if (needs_grad({&a, &b})) {
    record("bmm", {a, b}, out, [a = a.detach(), b = b.detach()](const Tensor& g) {
      return Grads{bmm(g, b.transpose(1, 2)), bmm(a.transpose(1, 2), g)};
    }, autograd::Saved::Inputs);
  }
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_same_device("matmul", {&a, &b});
  check_matmul_dtypes(a, b, "matmul");
  FERRY_CHECK(a.dim() >= 1 && b.dim() >= 1, ShapeMismatch, "matmul: both arguments need at least 1 dim, got ",
              shape_str(a.shape()), " and ", shape_str(b.shape()));
  if (a.dim() == 1 && b.dim() == 1) {  // (k) @ (k): the 0-d dot product, as (1, k) @ (k, 1)
    FERRY_CHECK(a.size(0) == b.size(0), ShapeMismatch, "inconsistent tensor size, expected tensor [", a.size(0),
                "] and src [", b.size(0), "] to have the same number of elements, but got ", a.size(0), " and ",
                b.size(0), " elements respectively (in matmul)");
    return matmul(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
  }
  if (a.dim() == 1) return matmul(a.unsqueeze(0), b).squeeze(-2);
  if (b.dim() == 1) return matmul(a, b.unsqueeze(1)).squeeze(-1);
  FERRY_CHECK(a.size(-1) == b.size(-2), ShapeMismatch, "mat1 and mat2 shapes cannot be multiplied (",
              a.size(-2), "x", a.size(-1), " and ", b.size(-2), "x", b.size(-1), ") (in matmul: shapes ",
              shape_str(a.shape()), " and ", shape_str(b.shape()), ")");
  if (a.dim() == 2 && b.dim() == 2) {
    Tensor out = mm_forward(a, b);
    if (needs_grad({&a, &b})) {
      record("mm", {a, b}, out, [a = a.detach(), b = b.detach(), ra = a.requires_grad(), rb = b.requires_grad()](const Tensor& g) {
        return Grads{ra ? matmul(g, b.t()) : Tensor(), rb ? matmul(a.t(), g) : Tensor()};
      }, autograd::Saved::Inputs);
    }
    return out;
  }
  if (b.dim() == 2) {  // (..., n, k) @ (k, m): fold the batch into rows
    Shape out_shape = a.shape();
    out_shape.back() = b.size(1);
    return matmul(a.reshape({-1, a.size(-1)}), b).reshape(out_shape);
  }
  // Broadcast the batch dims, then one batched GEMM.
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes("matmul", batch_a, batch_b);
  Shape sa = batch, sb = batch;
  sa.push_back(a.size(-2)); sa.push_back(a.size(-1));
  sb.push_back(b.size(-2)); sb.push_back(b.size(-1));
  const std::int64_t nb = shape_numel(batch);
  Tensor out = bmm(a.expand(sa).reshape({nb, a.size(-2), a.size(-1)}), b.expand(sb).reshape({nb, b.size(-2), b.size(-1)}));
  Shape out_shape = batch;
  out_shape.push_back(a.size(-2));
  out_shape.push_back(b.size(-1));
  return out.reshape(out_shape);
}

// --- indexing and joining -----------------------------------------------------------------------

namespace {
// index_select's checked operands: a contiguous, the index int64 contiguous, the result's shape and the
// (outer, n_in, inner) view the kernels take.
struct IndexSelect {
  Tensor a, idx;
  Shape shape;
  std::int64_t outer = 1, n_in = 1, inner = 1;
};

IndexSelect prepare_index_select(const Tensor& a_in, int dim, const Tensor& index, const char* op) {
  check_same_device(op, {&a_in, &index});
  FERRY_CHECK(index.dtype() == DType::Int64 || index.dtype() == DType::Int32, DTypeMismatch,
              op, ": expected an int64 index, got ", dtype_name(index.dtype()));
  FERRY_CHECK(index.dim() <= 1, ShapeMismatch, op, ": expected a 1-d index, got shape ", shape_str(index.shape()));
  const int d = normalize_dim(dim, a_in.dim(), op);
  IndexSelect s;
  s.a = a_in.detach().contiguous();
  s.idx = index.to(DType::Int64).contiguous();
  s.shape = s.a.shape();
  if (s.a.dim() > 0) s.shape[d] = s.idx.numel();
  for (int i = 0; i < d; ++i) s.outer *= s.a.shape()[i];
  for (int i = d + 1; i < s.a.dim(); ++i) s.inner *= s.a.shape()[i];
  s.n_in = s.a.dim() > 0 ? s.a.shape()[d] : 1;
  return s;
}

void run_index_select(const Tensor& out, const IndexSelect& s) {
  backend(s.a.device()).index_select(detail::kernel_view(out), detail::kernel_view(s.a), detail::kernel_flat(s.idx),
                                     s.outer, s.n_in, s.inner, detail::compute_stream(s.a.device()));
}
}  // namespace

Tensor& index_select_out(Tensor& out, const Tensor& a_in, int dim, const Tensor& index) {
  const IndexSelect s = prepare_index_select(a_in, dim, index, "index_select_out");
  FERRY_CHECK(!needs_grad({&a_in}), InvalidArgument,
              "index_select_out: autograd does not record it; its input must not need a gradient");
  check_same_device("index_select_out", {&out, &a_in});
  FERRY_CHECK(out.shape() == s.shape && out.dtype() == s.a.dtype() && out.is_contiguous(), ShapeMismatch,
              "index_select_out: out must be a contiguous ", dtype_name(s.a.dtype()), " tensor of shape ",
              shape_str(s.shape), ", got ", dtype_name(out.dtype()), " ", shape_str(out.shape()),
              out.is_contiguous() ? "" : " (not contiguous)");
  run_index_select(out, s);
  out.impl()->bump_version();
  return out;
}

Tensor index_select(const Tensor& a_in, int dim, const Tensor& index) {
  const IndexSelect s = prepare_index_select(a_in, dim, index, "index_select");
  const Tensor& a = s.a;
  const Tensor& idx = s.idx;
  const std::int64_t outer = s.outer, n_in = s.n_in, inner = s.inner;
  Tensor out = make_tensor(s.shape, {.device = a.device(), .dtype = a.dtype()});
  run_index_select(out, s);
  if (needs_grad({&a_in})) {
    record("index_select", {a_in}, out, [shape = a.shape(), idx, outer, n_in, inner](const Tensor& g_in) {
      Tensor g = g_in.contiguous();
      Tensor grad = zeros(shape, {.device = g.device(), .dtype = g.dtype()});
      backend(g.device()).index_add(detail::kernel_view(grad), detail::kernel_view(g), detail::kernel_flat(idx), outer,
                                    n_in, inner, detail::compute_stream(g.device()));
      return Grads{grad};
    });
  }
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors, int dim) {
  FERRY_CHECK(!tensors.empty(), InvalidArgument, "cat: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  FERRY_CHECK(first.dim() > 0, InvalidArgument, "cat: zero-dimensional tensor (at position 0) cannot be concatenated; "
              "stack() them, or unsqueeze(0) each first");
  const int d = normalize_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[d] = 0;
  DType dtype = first.dtype();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check_same_device("cat", {&first, &t});
    FERRY_CHECK(t.dim() == first.dim(), ShapeMismatch, "cat: tensor ", i, " has ", t.dim(), " dims, tensor 0 has ",
                first.dim());
    for (int j = 0; j < t.dim(); ++j) {
      FERRY_CHECK(j == d || t.shape()[j] == first.shape()[j], ShapeMismatch, "cat: sizes of tensors must match except in dimension ",
                  d, ". Expected size ", first.shape()[j], " but got size ", t.shape()[j], " for tensor number ", i,
                  " in the list");
    }
    shape[d] += t.shape()[d];
    dtype = promote_types(dtype, t.dtype());
  }
  Tensor out = make_tensor(shape, {.device = first.device(), .dtype = dtype});
  std::int64_t offset = 0;
  std::vector<std::int64_t> sizes;
  {
    autograd::NoGradGuard no_grad;
    for (const Tensor& t : tensors) {
      out.narrow(d, offset, t.shape()[d]).copy_(t);
      sizes.push_back(t.shape()[d]);
      offset += t.shape()[d];
    }
  }
  if (needs_grad(tensors)) {
    std::vector<DType> dtypes;  // each input's: a gradient comes back in its input's dtype
    for (const Tensor& t : tensors) dtypes.push_back(t.dtype());
    record("cat", tensors, out, [d, sizes, dtypes](const Tensor& g) {
      Grads grads;
      std::int64_t at = 0;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const Tensor part = g.narrow(d, at, sizes[i]);
        grads.push_back(is_floating(dtypes[i]) && part.dtype() != dtypes[i] ? part.to(dtypes[i]) : part);
        at += sizes[i];
      }
      return grads;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int dim) {
  FERRY_CHECK(!tensors.empty(), InvalidArgument, "stack: expected a non-empty list of tensors");
  const int d = normalize_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    FERRY_CHECK(tensors[i].shape() == tensors[0].shape(), ShapeMismatch, "stack expects each tensor to be equal size, but got ",
                shape_str(tensors[0].shape()), " at entry 0 and ", shape_str(tensors[i].shape()), " at entry ", i);
    expanded.push_back(tensors[i].unsqueeze(d));
  }
  return cat(expanded, d);
}

}  // namespace ferry
