// ferry/ops.h — the tensor ops. Each checks devices, shapes and dtypes before dispatch
// (DESIGN.md invariant 4) and records history for autograd when an operand requires grad.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "ferry/tensor.h"

namespace ferry {

// --- elementwise, with NumPy broadcasting ---------------------------------------------------------
// Two tensors: the result dtype is PyTorch's torch.result_type (see result_type below); div and pow of integers
// give float32.
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1);  // a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// Tensor with scalar (the C++ API cannot tell `x + 1` from `x + 1.0`, so the scalar's value decides): a floating
// tensor keeps its dtype; an integer tensor keeps its dtype when the scalar is a whole number within that dtype's
// range (int64 + 1.0 -> int64, uint8 - 1.0 -> uint8: the scalar as written), otherwise the result is float32
// (int64 * 2.5, int32 + 2^31, uint8 + -1.0), never a wrapped scalar. A bool tensor counts as int64: bool * 3.0 ->
// int64, bool * 2.5 -> float32. div and pow of an integer or bool tensor give float32. Comparisons compute in that
// dtype and give bool.
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
Tensor rsub(const Tensor& a, double b);  // b - a
Tensor rdiv(const Tensor& a, double b);  // b / a

Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor sign(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor square(const Tensor& a);

// comparisons -> bool
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor logical_not(const Tensor& a);
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);  // condition: bool, else DTypeMismatch

// --- reductions (dims empty = all dims) -----------------------------------------------------------
Tensor sum(const Tensor& a, std::vector<int> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, std::vector<int> dims = {}, bool keepdim = false);
Tensor var(const Tensor& a, std::vector<int> dims = {}, bool unbiased = true, bool keepdim = false);
Tensor max(const Tensor& a);  // over all elements
Tensor min(const Tensor& a);
std::pair<Tensor, Tensor> max(const Tensor& a, int dim, bool keepdim = false);  // values, int64 indices
std::pair<Tensor, Tensor> min(const Tensor& a, int dim, bool keepdim = false);
Tensor argmax(const Tensor& a, int dim, bool keepdim = false);
Tensor argmin(const Tensor& a, int dim, bool keepdim = false);

// --- softmax family (composed of max, sub, exp, sum and log on the input's device; autograd differentiates the
// composition). Floating inputs only (DTypeMismatch otherwise). Each subtracts the slice's maximum first, so large
// logits do not overflow. A slice of all -inf gives NaN (softmax, log_softmax) and -inf (logsumexp), as PyTorch.
Tensor softmax(const Tensor& a, int dim);      // exp(a) / sum(exp(a), dim): each slice along dim sums to 1
Tensor log_softmax(const Tensor& a, int dim);  // log(softmax(a, dim)), without forming softmax
Tensor logsumexp(const Tensor& a, int dim, bool keepdim = false);  // log(sum(exp(a), dim))

// --- linear algebra -------------------------------------------------------------------------------
// (n, k) @ (k, m); 1-d operands as vectors ((k) @ (k) is the 0-d dot product); >2-d: batched with broadcasting
// of the batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // (B, n, k) @ (B, k, m)

// --- indexing and joining -------------------------------------------------------------------------
Tensor index_select(const Tensor& a, int dim, const Tensor& index);  // index: int64 1-d
// The same gather into `out` (contiguous, of the result's shape, dtype and device), e.g. a step graph's input
// (ferry/step_graph.h). Not recorded by autograd: `a` must not need a gradient.
Tensor& index_select_out(Tensor& out, const Tensor& a, int dim, const Tensor& index);
Tensor cat(const std::vector<Tensor>& tensors, int dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int dim = 0);

// --- operators ------------------------------------------------------------------------------------
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(double a, const Tensor& b) { return rsub(b, a); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(double a, const Tensor& b) { return rdiv(b, a); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

// --- helpers for op authors -----------------------------------------------------------------------
// Throws DeviceMismatch (PyTorch's first line, then a fix hint with the move's cost) unless every
// defined tensor lives on one device.
void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors);
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// PyTorch's torch.result_type(a, b): promote_types, except that a 0-d operand beside a dimensioned one counts only
// when its category is higher (ferry/dtype.h promote_with_zero_dim): float32 [3] + 0-d float64 -> float32.
DType result_type(const Tensor& a, const Tensor& b);
int normalize_dim(int dim, int ndim, const char* op);
// Synchronize the device (host waits) and record the sync with its reason.
void synchronize(Device device, const char* reason = "synchronize()");

}  // namespace ferry
