// ferry/ops.h — the tensor ops. Each checks devices, shapes and dtypes before dispatch
// (DESIGN.md invariant 4) and records history for autograd when an operand requires grad.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "ferry/tensor.h"

namespace ferry {

// --- elementwise, with NumPy broadcasting ---------------------------------------------------------
// Two tensors: the result dtype is PyTorch's torch.result_type (see result_type below); div of integers gives
// float32 (true division); pow of integers stays integer, exact and wrapping (a negative exponent gives
// 1 / base^|e| truncated: 0 unless the base is 1 or -1).
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
// int64, bool * 2.5 -> float32. div of an integer or bool tensor gives float32; pow by a whole exponent keeps the
// integer dtype (exact; a negative whole exponent is an InvalidArgument), by a fraction gives float32. Comparisons
// compute in that dtype and give bool.
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
Tensor erf(const Tensor& a);  // the error function, 2/sqrt(pi) * integral of exp(-t^2) from 0 to a
Tensor square(const Tensor& a);
Tensor sin(const Tensor& a);  // radians
Tensor cos(const Tensor& a);
Tensor log1p(const Tensor& a);  // log(1 + a), accurate for small a (log(1 + 1e-10) in float32 is 0; log1p is 1e-10)
Tensor expm1(const Tensor& a);  // e^a - 1, accurate for small a
// Rounding to a whole number, in a's dtype (integers pass unchanged, exactly; bool is refused, as PyTorch). round
// takes ties to the even neighbour (round(0.5) = 0, round(1.5) = 2, round(-2.5) = -2), as torch.round and
// NumPy. Their gradient is zero everywhere, as PyTorch's.
Tensor floor(const Tensor& a);
Tensor ceil(const Tensor& a);
Tensor round(const Tensor& a);
Tensor trunc(const Tensor& a);  // toward zero
// The ops above that take a floating input (exp, log, sqrt, rsqrt, sigmoid, tanh, erf, sin, cos, log1p, expm1) give
// float32 for an integer or bool one, as PyTorch.

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
// Product over dims (all when empty), in double (integers and bools: int64, wrapping); of nothing, 1. Its gradient
// is the product of the other elements, zeros included (no division by 0), as PyTorch's.
Tensor prod(const Tensor& a, std::vector<int> dims = {}, bool keepdim = false);
Tensor var(const Tensor& a, std::vector<int> dims = {}, bool unbiased = true, bool keepdim = false);
Tensor max(const Tensor& a);  // over all elements
Tensor min(const Tensor& a);
std::pair<Tensor, Tensor> max(const Tensor& a, int dim, bool keepdim = false);  // values, int64 indices
std::pair<Tensor, Tensor> min(const Tensor& a, int dim, bool keepdim = false);
Tensor argmax(const Tensor& a, int dim, bool keepdim = false);
Tensor argmin(const Tensor& a, int dim, bool keepdim = false);
// The largest (smallest) value over several dims (all when empty), without indices: torch.amax / torch.amin. Equal
// elements share the gradient evenly (max(a, dim) gives it all to the one its index names).
Tensor amax(const Tensor& a, const std::vector<int>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, const std::vector<int>& dims = {}, bool keepdim = false);

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
// torch.gather: out (index's shape) [.., j, ..] = a[.., index[.., j, ..], ..] along dim, elsewhere the same
// position. index: int64 (or int32), a's number of dims, no larger than a in the other dims. Its backward adds
// each gradient back where its element was picked (scatter_add).
Tensor gather(const Tensor& a, int dim, const Tensor& index);
// torch.scatter_add: a copy of self with src[.., j, ..] added at self[.., index[.., j, ..], ..] along dim (repeated
// indices add up). index no larger than src in any dim, nor than self in the dims other than dim; src's dtype
// is self's. Under deterministic_algorithms() the sums are added in the cpu's order on every device.
Tensor scatter_add(const Tensor& self, int dim, const Tensor& index, const Tensor& src);
// torch.index_add: a copy of self with alpha * source's slices added at the positions `index` names along dim:
// out.select(dim, index[i]) += alpha * source.select(dim, i) (repeated indices add up). index: 1-d int64 (or int32)
// of source.size(dim) entries in [0, self.size(dim)); source has self's shape elsewhere and self's dtype. Composed
// of scatter_add, whose determinism it shares; differentiable in self and source.
Tensor index_add(const Tensor& self, int dim, const Tensor& index, const Tensor& source, double alpha = 1);
// torch.cumsum: running sums along dim, out[.., j, ..] = a[.., 0, ..] + ... + a[.., j, ..]. Summed in order in
// double (integers: int64); integer and bool inputs give int64, as PyTorch's.
Tensor cumsum(const Tensor& a, int dim);
// Sorting along dim, stable (equal values keep their order), NaN counted larger than every number (last ascending,
// first descending), as PyTorch's sort(stable=True). Values and int64 indices; the values' gradient goes back to
// where each came from.
std::pair<Tensor, Tensor> sort(const Tensor& a, int dim = -1, bool descending = false);
Tensor argsort(const Tensor& a, int dim = -1, bool descending = false);  // sort's indices alone
// The k largest (smallest) along dim, in order, with their int64 indices (ties: the earlier first).
std::pair<Tensor, Tensor> topk(const Tensor& a, std::int64_t k, int dim = -1, bool largest = true);
// torch.multinomial: num_samples int64 indices per row of `probs` (1-d (n) -> (num_samples); 2-d (rows, n) ->
// (rows, num_samples)), index i drawn with probability probs[i] / sum(probs), from ferry's generator on probs'
// device (the same seed draws the same indices on every device) and with no host read. With replacement: a
// cumulative sum against uniform draws (each draw compared with every running sum: rows x num_samples x n bools). Without: the Gumbel top-k (the k largest of log p - log(-log u)), which
// draws as sequential sampling without replacement does; num_samples <= n. Weights must be >= 0 and finite, and a
// row must not be all zero (PyTorch checks this on the device and raises; here such a row gives index 0, or
// zero-weight indices last without replacement).
Tensor multinomial(const Tensor& probs, std::int64_t num_samples, bool replacement = false);
// Selection by a mask, whose result size depends on the values: each reads that size to the host (one recorded
// device->host copy and sync; not allowed inside a graph capture), as PyTorch's do.
// The elements of a (broadcast with mask) where mask (bool) is true, in row-major order, 1-d. Differentiable.
Tensor masked_select(const Tensor& a, const Tensor& mask);
// The coordinates of a's nonzero elements (NaN counts as nonzero), row-major order: int64 (count, a.dim()).
Tensor nonzero(const Tensor& a);
Tensor cat(const std::vector<Tensor>& tensors, int dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int dim = 0);

// --- composed ops: built from the ops above on the input's device, so they run on every backend and autograd
// differentiates the composition. No host sync unless the comment says so. ------------------------------------
// Each element limited to [min, max] (either bound may be absent; min > max gives max everywhere, as PyTorch). NaN
// stays NaN. The gradient flows where min <= a <= max. An integer tensor keeps its dtype when the bounds are whole.
Tensor clamp(const Tensor& a, std::optional<double> min, std::optional<double> max = std::nullopt);
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);  // value where mask (bool, broadcast to a)
Tensor isnan(const Tensor& a);     // -> bool
Tensor isinf(const Tensor& a);     // -> bool (+inf and -inf)
Tensor isfinite(const Tensor& a);  // -> bool: neither NaN nor inf
Tensor logical_and(const Tensor& a, const Tensor& b);  // -> bool; nonzero counts as true
Tensor logical_or(const Tensor& a, const Tensor& b);
// Standard deviation: sqrt(var(...)); unbiased divides by n - 1.
Tensor std(const Tensor& a, std::vector<int> dims = {}, bool unbiased = true, bool keepdim = false);
Tensor norm(const Tensor& a, std::vector<int> dims = {}, bool keepdim = false);  // the 2-norm: sqrt(sum(a^2))
Tensor all(const Tensor& a, std::vector<int> dims = {}, bool keepdim = false);   // -> bool: every element nonzero
Tensor any(const Tensor& a, std::vector<int> dims = {}, bool keepdim = false);   // -> bool: some element nonzero
// PyTorch's isclose: |a - b| <= atol + rtol * |b|, elementwise -> bool; an inf is close only to itself, NaN to
// nothing (to NaN too with equal_nan). allclose is all of it as a host bool: a sync on accelerators.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
// Views of `a` along dim (no copy): chunk gives at most `chunks` pieces of ceil(size / chunks) (the last smaller);
// split gives pieces of split_size (the last smaller).
std::vector<Tensor> chunk(const Tensor& a, std::int64_t chunks, int dim = 0);
std::vector<Tensor> split(const Tensor& a, std::int64_t split_size, int dim = 0);
// a tiled repeats[i] times along dim i (repeats may have more dims than a: leading ones are added). A copy.
Tensor repeat(const Tensor& a, const Shape& repeats);
Tensor flip(const Tensor& a, const std::vector<int>& dims);  // reversed along each of dims. A copy, as PyTorch's
// The lower (upper) triangle of each matrix in the last two dims (a: >= 2 dims), the rest zero: tril keeps
// a[.., i, j] where j - i <= diagonal, triu where j - i >= diagonal (diagonal 0: the main diagonal, > 0 above
// it, < 0 below). A copy; the gradient flows to the kept elements. Attention's causal mask is
// triu(ones(L, L, bool), 1).
Tensor tril(const Tensor& a, std::int64_t diagonal = 0);
Tensor triu(const Tensor& a, std::int64_t diagonal = 0);
// (n) int64 class indices -> (n, num_classes) int64 rows of 0 and 1 (any leading shape: a new last dim).
// num_classes -1 means max(labels) + 1 (a host sync on accelerators). On cpu, a label outside [0, num_classes) is
// an InvalidArgument; on an accelerator checking would cost a sync, so such a label gives a row of zeros.
Tensor one_hot(const Tensor& labels, std::int64_t num_classes = -1);
Tensor dot(const Tensor& a, const Tensor& b);    // (k) . (k) -> 0-d
Tensor outer(const Tensor& a, const Tensor& b);  // (n) x (m) -> (n, m)

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
