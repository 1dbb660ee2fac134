// tensor.cpp — Tensor's shape bookkeeping, views, moves and value access.
// The ops live in ops.cpp; the one door for crossings in transfer.cpp.
#include "ferry/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <ostream>
#include <sstream>

#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "internal.h"

namespace ferry {

std::string shape_str(const Shape& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::int64_t shape_numel(const Shape& shape) {
  for (std::int64_t d : shape)
    FERRY_CHECK(d >= 0, InvalidArgument, "Expected non-negative sizes, got shape ", shape_str(shape));
  for (std::int64_t d : shape)
    if (d == 0) return 0;  // an empty tensor, however large its other dims
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<std::int64_t>::max() / d)
      throw InvalidArgument("Shape " + shape_str(shape) + " has more elements than fit in int64");
    n *= d;
  }
  return n;
}

std::vector<std::int64_t> contiguous_strides(const Shape& shape) {
  std::vector<std::int64_t> strides(shape.size());
  std::int64_t s = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    // An empty tensor's other sizes can multiply past int64 ([0, 2^62, 4], from a checkpoint file, say).
    if (d > 0 && __builtin_mul_overflow(s, std::max<std::int64_t>(shape[d], 1), &s))
      throw InvalidArgument("Shape " + shape_str(shape) + " has sizes whose product overflows int64: its strides "
                            "cannot be represented");
  }
  return strides;
}

// --- Storage ------------------------------------------------------------------------------------

Storage::Storage(std::size_t nbytes, Device device, bool pinned, bool copy_order)
    : nbytes_(nbytes), device_(device), pinned_(pinned) {
  if (nbytes == 0) return;
  if (pinned) {
    FERRY_CHECK(device.is_cpu(), InvalidArgument, "Pinned memory is host memory; asked for it on ", device.str());
    // cudaHostAlloc and the pinned cache's event queries are refused inside a capture (and end it on a real card).
    detail::check_not_capturing("Allocating pinned host memory");
    data_ = backend(DeviceType::CUDA).allocate_pinned(nbytes);
  } else if (copy_order) {
    data_ = backend(device).allocate_for_copy(nbytes, device.index);
  } else {
    data_ = backend(device).allocate(nbytes, device.index);
  }
}

Storage::~Storage() {
  if (!data_) return;
  if (pinned_) backend(DeviceType::CUDA).deallocate_pinned(data_);
  else backend(device_).deallocate(data_, nbytes_, device_.index);
}

// --- construction -------------------------------------------------------------------------------

namespace {
Tensor fresh_tensor(const Shape& shape, const TensorOptions& options, bool copy_order) {
  const std::int64_t n = shape_numel(shape);
  FERRY_CHECK(static_cast<int>(shape.size()) <= kMaxDims, InvalidArgument, "Tensors have at most ", kMaxDims,
              " dims, got shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<std::size_t>(n) * element_size(options.dtype),
                                            options.device, options.pinned, copy_order);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype;
  impl->requires_grad = options.requires_grad;
  return Tensor(std::move(impl));
}
}  // namespace

Tensor make_tensor(const Shape& shape, const TensorOptions& options) { return fresh_tensor(shape, options, false); }

namespace detail {
Tensor make_tensor_for_copy(const Shape& shape, const TensorOptions& options) {
  return fresh_tensor(shape, options, true);
}
}  // namespace detail

Tensor make_view(const Tensor& base, const Shape& shape, const std::vector<std::int64_t>& strides,
                 std::int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

// --- accessors ----------------------------------------------------------------------------------

#define FERRY_DEFINED() FERRY_CHECK(impl_ != nullptr, InvalidArgument, "Tensor is undefined (default-constructed)")

namespace {
// A dim of a tensor that has one to index (size, narrow, select...): a 0-d tensor has none (PyTorch's message).
int indexed_dim(int d, int ndim, const char* op) {
  FERRY_CHECK(ndim > 0, InvalidArgument, op, ": dimension specified as ", d, " but the tensor has no dimensions (0-d)");
  return normalize_dim(d, ndim, op);
}
}  // namespace

const Shape& Tensor::shape() const { FERRY_DEFINED(); return impl_->shape; }
int Tensor::dim() const { return static_cast<int>(shape().size()); }
std::int64_t Tensor::size(int d) const { return shape()[indexed_dim(d, dim(), "size")]; }
const std::vector<std::int64_t>& Tensor::strides() const { FERRY_DEFINED(); return impl_->strides; }
std::int64_t Tensor::offset() const { FERRY_DEFINED(); return impl_->offset; }
DType Tensor::dtype() const { FERRY_DEFINED(); return impl_->dtype; }
Device Tensor::device() const { FERRY_DEFINED(); return impl_->storage->device(); }
std::int64_t Tensor::numel() const { return shape_numel(shape()); }
std::size_t Tensor::element_size() const { return ferry::element_size(dtype()); }
std::size_t Tensor::nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
bool Tensor::is_pinned() const { FERRY_DEFINED(); return impl_->storage->pinned(); }
const std::shared_ptr<Storage>& Tensor::storage() const { FERRY_DEFINED(); return impl_->storage; }
void* Tensor::data_ptr() const {
  FERRY_DEFINED();
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * static_cast<std::int64_t>(element_size());
}

bool Tensor::is_contiguous() const {
  // No element to place: contiguous whatever the strides (as in PyTorch). contiguous_strides() gives an empty
  // tensor's other dims strides as if its zero sizes were 1, which the loop below would not accept.
  if (numel() == 0) return true;
  const Shape& s = shape();
  std::int64_t expected = 1;
  for (int d = dim() - 1; d >= 0; --d) {
    if (s[d] != 1 && impl_->strides[d] != expected) return false;
    expected *= s[d];
  }
  return true;
}

// --- views --------------------------------------------------------------------------------------

namespace {
Shape infer_shape(const Shape& requested, std::int64_t numel, const Shape& from) {
  Shape shape = requested;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      FERRY_CHECK(infer < 0, InvalidArgument, "Only one dimension can be inferred (-1), got ", shape_str(requested));
      infer = static_cast<int>(i);
    } else {
      FERRY_CHECK(shape[i] >= 0, InvalidArgument, "Invalid shape dimension ", shape[i], " in ", shape_str(requested));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    FERRY_CHECK(known != 0 && numel % known == 0, ShapeMismatch, "Shape ", shape_str(requested),
                " is invalid for input of size ", numel);
    shape[infer] = numel / known;
  }
  FERRY_CHECK(shape_numel(shape) == numel, ShapeMismatch, "Shape ", shape_str(requested),
              " is invalid for input of size ", numel, " (shape ", shape_str(from), ")");
  return shape;
}

// Differentiable view: the gradient of a view is the gradient reshaped/placed back.
Tensor record_view(const Tensor& base, Tensor view, const char* name,
                   std::function<std::vector<Tensor>(const Tensor&)> backward) {
  view.impl()->version = base.impl()->version;
  view.impl()->view_made_without_grad =
      base.impl()->view_made_without_grad || (!autograd::grad_enabled() && base.requires_grad());
  if (autograd::needs_grad({&base})) autograd::record(name, {base}, view, std::move(backward));
  return view;
}
}  // namespace

namespace {
// The strides that show `old_shape`/`old_strides` memory as `new_shape` without a copy, or nothing when one new dim
// would span two memory chunks (PyTorch's computeStride). A chunk is a run of old dims that are contiguous with
// each other (stride[d-1] == stride[d] * size[d]); new dims must tile each chunk exactly, innermost first.
std::optional<std::vector<std::int64_t>> view_strides(const Shape& old_shape, const std::vector<std::int64_t>& old_strides,
                                                      const Shape& new_shape) {
  if (old_shape.empty() || shape_numel(old_shape) == 0) return contiguous_strides(new_shape);  // any layout will do
  std::vector<std::int64_t> strides(new_shape.size(), 1);
  int view_d = static_cast<int>(new_shape.size()) - 1;
  std::int64_t chunk_base_stride = old_strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (int d = static_cast<int>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    const bool chunk_ends = d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (d > 0) {
      chunk_base_stride = old_strides[d - 1];
      tensor_numel = view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}
}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), this->shape());
  std::optional<std::vector<std::int64_t>> strides =
      is_contiguous() ? contiguous_strides(shape) : view_strides(this->shape(), this->strides(), shape);
  FERRY_CHECK(strides.has_value(), InvalidArgument, "view size is not compatible with input tensor's size and stride "
              "(at least one dimension spans across two contiguous subspaces): shape ", shape_str(this->shape()),
              " with strides ", shape_str(this->strides()), " cannot be seen as ", shape_str(shape),
              ". Use .reshape(...) instead (it copies when it must)");
  Shape from = this->shape();
  return record_view(*this, make_view(*this, shape, *strides, offset()), "view",
                     [from](const Tensor& g) { return std::vector<Tensor>{g.reshape(from)}; });
}

Tensor Tensor::reshape(const Shape& requested) const {
  // A view whenever the strides allow one (as PyTorch: a transposed (3, 4) reshaped to (4, 3, 1) shares memory),
  // else a contiguous copy.
  if (is_contiguous()) return view(requested);
  const Shape shape = infer_shape(requested, numel(), this->shape());
  if (view_strides(this->shape(), this->strides(), shape)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::t() const {
  FERRY_CHECK(dim() <= 2, InvalidArgument, "t() expects a tensor with <= 2 dimensions, but self is ", dim(),
              "D (shape ", shape_str(shape()), "); use transpose(dim0, dim1) or permute()");
  return dim() < 2 ? *this : transpose(0, 1);  // a 0-d or 1-d tensor as it is (PyTorch)
}

Tensor Tensor::transpose(int dim0, int dim1) const {
  if (dim() == 0) {  // dims 0 and -1 of a 0-d tensor: itself, as in PyTorch
    normalize_dim(dim0, 0, "transpose");
    normalize_dim(dim1, 0, "transpose");
    return *this;
  }
  std::vector<int> order(dim());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[normalize_dim(dim0, dim(), "transpose")], order[normalize_dim(dim1, dim(), "transpose")]);
  return permute(order);
}

Tensor Tensor::permute(const std::vector<int>& dims) const {
  FERRY_CHECK(static_cast<int>(dims.size()) == dim(), InvalidArgument, "permute: expected ", dim(),
              " dims, got ", dims.size());
  Shape shape(dims.size());
  std::vector<std::int64_t> strides(dims.size());
  std::vector<int> inverse(dims.size(), -1);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const int d = normalize_dim(dims[i], dim(), "permute");
    FERRY_CHECK(inverse[d] < 0, InvalidArgument, "permute: dim ", d, " repeated");
    inverse[d] = static_cast<int>(i);
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
  }
  return record_view(*this, make_view(*this, shape, strides, offset()), "permute",
                     [inverse](const Tensor& g) { return std::vector<Tensor>{g.permute(inverse)}; });
}

Tensor Tensor::narrow(int d, std::int64_t start, std::int64_t length) const {
  d = indexed_dim(d, dim(), "narrow");
  const std::int64_t n = shape()[d];
  FERRY_CHECK(start >= -n && start <= n, InvalidArgument, "narrow: start ", start, " is out of range for dim ", d,
              " of size ", n, " (expected to be in range of [", -n, ", ", n, "])");
  if (start < 0) start += n;  // as PyTorch: counted from the end
  FERRY_CHECK(length >= 0 && start + length <= n, InvalidArgument, "narrow: [", start, ", ", start + length,
              ") is out of range for dim ", d, " of size ", n);
  Shape shape = this->shape();
  shape[d] = length;
  Shape from = this->shape();
  Tensor view = record_view(*this, make_view(*this, shape, strides(), offset() + start * strides()[d]), "narrow",
                            [from, d, start, length](const Tensor& g) {
                              Tensor full_grad = zeros(from, {.device = g.device(), .dtype = g.dtype()});
                              full_grad.narrow(d, start, length).copy_(g);
                              return std::vector<Tensor>{full_grad};
                            });
  // The engine adds a slice's gradient in place where the input is not a leaf (autograd::Node::Slice).
  if (view.impl()->grad_fn) view.impl()->grad_fn->slice = autograd::Node::Slice{std::move(from), d, start, length};
  return view;
}

Tensor Tensor::slice(int d, std::int64_t start, std::int64_t end) const {
  d = indexed_dim(d, dim(), "slice");
  const std::int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<std::int64_t>(start, 0, n);
  end = std::clamp<std::int64_t>(end, start, n);
  return narrow(d, start, end - start);
}

Tensor Tensor::select(int d, std::int64_t index) const {
  d = indexed_dim(d, dim(), "select");
  const std::int64_t n = shape()[d];
  if (index < 0) index += n;
  FERRY_CHECK(index >= 0 && index < n, InvalidArgument, "select: index ", index, " is out of range for dim ", d,
              " of size ", n);
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::unsqueeze(int d) const {
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Shape shape = this->shape();
  std::vector<std::int64_t> strides = this->strides();
  const std::int64_t stride = d < dim() ? strides[d] * shape[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  Shape from = this->shape();
  return record_view(*this, make_view(*this, shape, strides, offset()), "unsqueeze",
                     [from](const Tensor& g) { return std::vector<Tensor>{g.reshape(from)}; });
}

Tensor Tensor::squeeze(int d) const {
  d = normalize_dim(d, dim(), "squeeze");
  if (dim() == 0 || shape()[d] != 1) return *this;
  Shape shape = this->shape();
  std::vector<std::int64_t> strides = this->strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  Shape from = this->shape();
  return record_view(*this, make_view(*this, shape, strides, offset()), "squeeze",
                     [from](const Tensor& g) { return std::vector<Tensor>{g.reshape(from)}; });
}

Tensor Tensor::expand(const Shape& target) const {
  const int nd = static_cast<int>(target.size());
  FERRY_CHECK(nd >= dim(), ShapeMismatch, "expand: cannot expand shape ", shape_str(shape()), " to ",
              shape_str(target));
  Shape shape(nd);
  std::vector<std::int64_t> strides(nd, 0);
  for (int i = 0; i < nd; ++i) {
    const int src = i - (nd - dim());
    const std::int64_t want = target[i];
    FERRY_CHECK(want >= -1, InvalidArgument, "expand: the expanded size ", want, " (dim ", i, " of ",
                shape_str(target), ") is negative; sizes are >= 0, or -1 to keep a dim as it is");
    if (src < 0) {
      FERRY_CHECK(want >= 0, InvalidArgument, "expand: the expanded size of the tensor (-1) isn't allowed in a "
                  "leading, non-existing dimension ", i, " (of ", shape_str(target), ")");
      shape[i] = want;
      continue;
    }
    const std::int64_t have = this->shape()[src];
    FERRY_CHECK(have == want || have == 1 || want == -1, ShapeMismatch, "expand: cannot expand shape ",
                shape_str(this->shape()), " to ", shape_str(target));
    shape[i] = want == -1 ? have : want;
    strides[i] = (have == shape[i]) ? this->strides()[src] : 0;
  }
  Shape from = this->shape();
  return record_view(*this, make_view(*this, shape, strides, offset()), "expand",
                     [from](const Tensor& g) { return std::vector<Tensor>{autograd::reduce_to_shape(g, from)}; });
}

Tensor Tensor::flatten(int start_dim, int end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = normalize_dim(start_dim, dim(), "flatten");
  end_dim = normalize_dim(end_dim, dim(), "flatten");
  FERRY_CHECK(start_dim <= end_dim, InvalidArgument, "flatten() has invalid args: start_dim (", start_dim,
              ") cannot come after end_dim (", end_dim, ")");
  Shape shape;
  for (int d = 0; d < start_dim; ++d) shape.push_back(this->shape()[d]);
  std::int64_t n = 1;
  for (int d = start_dim; d <= end_dim; ++d) n *= this->shape()[d];
  shape.push_back(n);
  for (int d = end_dim + 1; d < dim(); ++d) shape.push_back(this->shape()[d]);
  return reshape(shape);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = make_tensor(shape(), {.device = device(), .dtype = dtype()});
  {
    autograd::NoGradGuard no_grad;
    out.copy_(*this);
  }
  if (autograd::needs_grad({this})) {
    autograd::record("clone", {*this}, out, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  }
  return out;
}

// --- moves --------------------------------------------------------------------------------------

Tensor Tensor::to(Device target, bool non_blocking) const {
  if (target == device()) return *this;  // invariant 3: already there = alias, no ledger entry
  Tensor out = detail::transfer(*this, target, non_blocking, target.is_cpu() ? "cpu()" : "to()");
  if (autograd::needs_grad({this})) {
    const Device source = device();
    autograd::record("to", {*this}, out, [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
  }
  return out;
}

Tensor Tensor::cuda(int index) const { return to(Device(DeviceType::CUDA, index)); }

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = make_tensor(shape(), {.device = device(), .dtype = target});
  backend(device()).unary(UnaryOp::Copy, detail::kernel_view(out), detail::kernel_view(*this),
                          detail::compute_stream(device()));
  if (is_floating(target) && is_floating(dtype()) && autograd::needs_grad({this})) {
    const DType source = dtype();
    autograd::record("to_dtype", {*this}, out, [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
  }
  return out;
}

Tensor Tensor::pin_memory() const {
  FERRY_CHECK(device().is_cpu(), InvalidArgument, "pin_memory(): only cpu tensors can be pinned, this one is on ",
              device().str());
  if (is_pinned()) return *this;
  detail::check_not_capturing("pin_memory()");  // host work, and a pinned allocation (refused in a capture)
  Tensor out = make_tensor(shape(), {.device = kCPU, .dtype = dtype(), .pinned = true});
  Tensor src = contiguous();
  std::memcpy(out.data_ptr(), src.data_ptr(), nbytes());
  return out;
}

// --- writing in place -------------------------------------------------------------------------------

namespace {
// The element range [first, last] of storage a tensor covers, when its elements are a permutation of one dense
// block (PyTorch's "non-overlapping and dense"); nullopt otherwise (a gap, a stride 0, an empty tensor): too hard
// to compare, as PyTorch also leaves it.
std::optional<std::pair<std::int64_t, std::int64_t>> dense_range(const Tensor& t) {
  if (t.numel() == 0) return std::nullopt;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (|stride|, size) of each dim with size > 1
  std::int64_t first = t.offset(), last = t.offset();
  for (int d = 0; d < t.dim(); ++d) {
    const std::int64_t size = t.shape()[static_cast<std::size_t>(d)], stride = t.strides()[static_cast<std::size_t>(d)];
    if (size == 1) continue;
    if (stride == 0) return std::nullopt;
    (stride > 0 ? last : first) += stride * (size - 1);
    dims.emplace_back(stride > 0 ? stride : -stride, size);
  }
  std::sort(dims.begin(), dims.end());
  std::int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return std::nullopt;
    expected *= size;
  }
  return std::make_pair(first, last);
}

// PyTorch's rules for an op that writes `self` in place (autograd's leaf check, at::assert_no_internal_overlap and
// at::assert_no_partial_overlap), so that no in-place op computes a wrong value or a wrong gradient without a word.
void check_in_place(const Tensor& self, const char* op, std::initializer_list<const Tensor*> sources,
                    bool allow_internal_overlap = false) {
  // ferry records no history for an in-place op: on a tensor autograd tracks, the gradient would be wrong.
  if (autograd::grad_enabled() && self.requires_grad()) {
    if (self.is_leaf()) {
      throw InvalidArgument(detail::concat(op, ": a leaf tensor that requires grad is being used in an in-place "
                                           "operation; do it under ferry::autograd::NoGradGuard (as an optimizer "
                                           "does) or on a detach()ed tensor"));
    }
    throw NotSupported(detail::concat(op, ": in-place operations on a tensor autograd records (made by an op from "
                                      "tensors that require grad) are not supported: ferry would not record it, and "
                                      "the gradient would be wrong. Write the out-of-place form (x = x * 3) or "
                                      "work on x.detach()"));
  }
  FERRY_CHECK(!autograd::grad_enabled() || !self.impl()->view_made_without_grad, InvalidArgument, op,
              ": a view was created in no_grad mode (under NoGradGuard) and is being modified in place with grad mode "
              "enabled: autograd would not see the change to the tensor it tracks. Write under NoGradGuard too, or "
              "make the view with grad mode on");
  // One element written through several indices: an expand()ed view. (fill_ writes one value: allowed.)
  if (!allow_internal_overlap) {
    for (int d = 0; d < self.dim(); ++d) {
      FERRY_CHECK(self.shape()[static_cast<std::size_t>(d)] <= 1 || self.strides()[static_cast<std::size_t>(d)] != 0,
                  InvalidArgument, op, ": unsupported operation: more than one element of the written-to tensor "
                  "refers to a single memory location (dim ", d, " has stride 0, as after expand()). Please clone() "
                  "the tensor before performing the operation");
    }
  }
  // A source that shares some, not all, of the written memory would be read after parts of it were written.
  const auto written = dense_range(self);
  if (!written) return;
  for (const Tensor* source : sources) {
    if (source->device() != self.device() || source->impl()->storage != self.impl()->storage) continue;
    const auto read = dense_range(*source);
    if (!read || read->second < written->first || written->second < read->first) continue;
    const bool same_view = source->offset() == self.offset() && source->strides() == self.strides() &&
                           source->shape() == self.shape();
    FERRY_CHECK(same_view, InvalidArgument, op, ": unsupported operation: some elements of the input tensor and the "
                "written-to tensor refer to a single memory location. Please clone() the tensor before performing "
                "the operation");
  }
}
}  // namespace

Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) {
  check_in_place(*this, "copy_", {&src});
  Tensor source = src;
  if (source.shape() != shape()) source = source.expand(shape());
  if (source.device() != device()) {
    if (device().is_cpu() && non_blocking && is_pinned() && is_contiguous() && source.dtype() == dtype()) {
      // Straight into this pinned tensor, asynchronously: the caller syncs before reading it (as in PyTorch).
      detail::copy_between(*this, source.contiguous(), true, "copy_()");
      impl_->bump_version();
      return *this;
    }
    // Otherwise the data lands in a temporary first; into host memory the copy below reads it at once, so that
    // crossing must have finished: non_blocking is only honoured towards a device (its streams keep the order).
    Tensor moved = detail::transfer(source.contiguous(), device(), non_blocking && !device().is_cpu(), "copy_()");
    source = moved;
  }
  backend(device()).unary(UnaryOp::Copy, detail::kernel_view(*this), detail::kernel_view(source),
                          detail::compute_stream(device()));
  impl_->bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_in_place(*this, "fill_", {}, /*allow_internal_overlap=*/true);
  backend(device()).fill(detail::kernel_view(*this), value, detail::compute_stream(device()));
  impl_->bump_version();
  return *this;
}

namespace {
// self = self <op> other, in self's dtype. PyTorch's in-place rule: the result type of (self, other) must cast to
// self's dtype within its kind (bool < integer < floating); `other` is then converted, so the kernel reads both in
// self's dtype. Div of an integer tensor gives a float (true division), so it is refused there as PyTorch does.
void check_result_fits(const Tensor& self, BinaryOp op, DType other, const char* name) {
  const auto kind = [](DType t) { return t == DType::Bool ? 0 : is_floating(t) ? 2 : 1; };
  DType result = promote_types(self.dtype(), other);
  if (op == BinaryOp::Div && !is_floating(result)) result = DType::Float32;
  FERRY_CHECK(kind(result) <= kind(self.dtype()), DTypeMismatch, name, ": result type ", dtype_name(result),
              " can't be cast to the desired output type ", dtype_name(self.dtype()));
}

void binary_in_place(Tensor& self, BinaryOp op, const Tensor& other, const char* name) {
  check_same_device(name, {&self, &other});
  check_in_place(self, name, {&other});
  check_result_fits(self, op, other.dtype(), name);
  const Shape out_shape = broadcast_shapes(name, self.shape(), other.shape());
  FERRY_CHECK(out_shape == self.shape(), ShapeMismatch, name, ": output with shape ", shape_str(self.shape()),
              " doesn't match the broadcast shape ", shape_str(out_shape), " (of ", shape_str(self.shape()), " and ",
              shape_str(other.shape()), "): an in-place op cannot grow the tensor it writes");
  Tensor b = other.dtype() == self.dtype() ? other : other.to(self.dtype());
  if (b.shape() != self.shape()) b = b.expand(self.shape());
  backend(self.device()).binary(op, detail::kernel_view(self), detail::kernel_view(self), detail::kernel_view(b),
                                detail::compute_stream(self.device()));
  self.impl()->bump_version();
}

// self = op(self, scalar) in self's dtype; the callers have checked that the result fits it.
void scalar_in_place(Tensor& self, BinaryOp op, double scalar) {
  backend(self.device()).binary_scalar(op, detail::kernel_view(self), detail::kernel_view(self), scalar, false,
                                       detail::compute_stream(self.device()));
  self.impl()->bump_version();
}
}  // namespace

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  FERRY_CHECK(is_floating(dtype()) || alpha == std::trunc(alpha), InvalidArgument, "add_: alpha ", alpha,
              " is not a whole number, and this tensor is ", dtype_name(dtype()),
              ": for integral tensors alpha must not be a floating point number (it would round to ",
              static_cast<std::int64_t>(alpha), ")");
  if (alpha == 1) {
    binary_in_place(*this, BinaryOp::Add, other, "add_");
    return *this;
  }
  check_same_device("add_", {this, &other});
  check_in_place(*this, "add_", {&other});
  check_result_fits(*this, BinaryOp::Add, other.dtype(), "add_");
  // alpha * other in this tensor's dtype (uint8 - uint8 wraps, as PyTorch's), then added.
  const Tensor b = other.dtype() == dtype() ? other : other.to(dtype());
  Tensor scaled = make_tensor(b.shape(), {.device = device(), .dtype = dtype()});
  backend(device()).binary_scalar(BinaryOp::Mul, detail::kernel_view(scaled), detail::kernel_view(b), alpha, false,
                                  detail::compute_stream(device()));
  binary_in_place(*this, BinaryOp::Add, scaled, "add_");
  return *this;
}

Tensor& Tensor::sub_(const Tensor& other, double alpha) {
  FERRY_CHECK(dtype() != DType::Bool, InvalidArgument, "sub_: subtraction, the `-` operator, with a bool tensor is "
              "not supported. If you are trying to invert a mask, use logical_not() instead");
  return add_(other, -alpha);
}

Tensor& Tensor::mul_(const Tensor& other) {
  binary_in_place(*this, BinaryOp::Mul, other, "mul_");
  return *this;
}

Tensor& Tensor::div_(const Tensor& other) {
  binary_in_place(*this, BinaryOp::Div, other, "div_");
  return *this;
}

Tensor& Tensor::add_(double scalar) {
  check_in_place(*this, "add_", {});
  FERRY_CHECK(is_floating(dtype()) || std::nearbyint(scalar) == scalar, DTypeMismatch, "add_: result type Float "
              "can't be cast to the desired output type ", dtype_name(dtype()), " (the scalar ", scalar,
              " is not whole)");
  FERRY_CHECK(dtype() != DType::Bool, DTypeMismatch, "add_: a number added to a bool tensor in place would not stay "
              "a bool; use logical ops, or .to(DType::Int64) first");
  scalar_in_place(*this, BinaryOp::Add, scalar);
  return *this;
}

Tensor& Tensor::div_(double scalar) {
  check_in_place(*this, "div_", {});
  FERRY_CHECK(is_floating(dtype()), DTypeMismatch, "div_: result type Float can't be cast to the desired output type ",
              dtype_name(dtype()), " (true division of an integer tensor gives floats)");
  scalar_in_place(*this, BinaryOp::Div, scalar);
  return *this;
}

Tensor& Tensor::mul_(double scalar) {
  check_in_place(*this, "mul_", {});
  // As add_: an integer tensor keeps its dtype, so a scalar it cannot hold (1.5) would be truncated.
  FERRY_CHECK(is_floating(dtype()) || std::nearbyint(scalar) == scalar, DTypeMismatch, "mul_: result type Float can't "
              "be cast to the desired output type ", dtype_name(dtype()), " (the scalar ", scalar, " is not whole)");
  FERRY_CHECK(dtype() != DType::Bool, DTypeMismatch, "mul_: result type Long can't be cast to the desired output type "
              "Bool (a number times a bool tensor; use logical ops, or .to(DType::Int64) first)");
  scalar_in_place(*this, BinaryOp::Mul, scalar);
  return *this;
}

// --- values -------------------------------------------------------------------------------------

template <typename T>
T Tensor::item() const {
  FERRY_CHECK(numel() == 1, InvalidArgument, "item(): a Tensor with ", numel(),
              " elements cannot be converted to a scalar (shape ", shape_str(shape()), ")");
  const Tensor host = detail::host_copy(*this, "item()");
  if (is_storage_only(host.dtype())) return host.to(DType::Float32).item<T>();  // exact: every 16-bit value is a float
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (host.dtype() == DType::Float32 || host.dtype() == DType::Float64) {  // the conversion op's NaN and range rules
      const Tensor converted = host.to(dtype_of<T>());
      return *converted.data<T>();
    }
  }
  const void* p = host.data_ptr();  // one element in host memory: converted here, with no tensor op
  switch (host.dtype()) {
    case DType::Float32: return static_cast<T>(*static_cast<const float*>(p));
    case DType::Float64: return static_cast<T>(*static_cast<const double*>(p));
    case DType::Int32: return static_cast<T>(*static_cast<const std::int32_t*>(p));
    case DType::Int64: return static_cast<T>(*static_cast<const std::int64_t*>(p));
    case DType::UInt8: return static_cast<T>(*static_cast<const std::uint8_t*>(p));
    case DType::Bool: return static_cast<T>(*static_cast<const bool*>(p));
    case DType::Float16:
    case DType::BFloat16: break;  // converted above
  }
  throw InternalError("item(): unknown dtype");
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = detail::host_copy(*this, "to_vector()");
  if (host.dtype() != dtype_of<T>()) host = host.to(dtype_of<T>());
  host = host.contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  const std::vector<std::uint8_t> bytes = to(DType::Bool).to(DType::UInt8).to_vector<std::uint8_t>();
  return std::vector<bool>(bytes.begin(), bytes.end());
}

#define FERRY_INSTANTIATE_VALUES(T) \
  template T Tensor::item<T>() const; \
  template std::vector<T> Tensor::to_vector<T>() const;
FERRY_INSTANTIATE_VALUES(float)
FERRY_INSTANTIATE_VALUES(double)
FERRY_INSTANTIATE_VALUES(std::int32_t)
FERRY_INSTANTIATE_VALUES(std::int64_t)
FERRY_INSTANTIATE_VALUES(std::uint8_t)
template bool Tensor::item<bool>() const;
template std::vector<Float16> Tensor::to_vector<Float16>() const;
template std::vector<BFloat16> Tensor::to_vector<BFloat16>() const;


// --- autograd accessors -------------------------------------------------------------------------

bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }
Tensor& Tensor::requires_grad_(bool enabled) {
  FERRY_DEFINED();
  FERRY_CHECK(!enabled || is_floating(dtype()), InvalidArgument,
              "Only floating point tensors can require gradients, got ", dtype_name(dtype()));
  FERRY_CHECK(enabled || !impl_->grad_fn, InvalidArgument,
              "requires_grad_(false): you can only change requires_grad flags of leaf variables; this tensor is the "
              "output of '", impl_->grad_fn->name, "'. Use detach() for a tensor outside the graph");
  impl_->requires_grad = enabled;
  return *this;
}
Tensor Tensor::grad() const {
  FERRY_DEFINED();
  return impl_->grad ? Tensor(impl_->grad) : Tensor();
}
void Tensor::set_grad(const Tensor& grad) const {
  FERRY_DEFINED();
  // PyTorch's checks on an assigned .grad: an optimizer would otherwise broadcast or convert it without a word.
  if (grad.defined()) {
    FERRY_CHECK(grad.device() == device(), DeviceMismatch, "set_grad: assigned grad is on ", grad.device().str(),
                ", the tensor on ", device().str());
    FERRY_CHECK(grad.dtype() == dtype(), DTypeMismatch, "set_grad: assigned grad has data of a different type (",
                dtype_name(grad.dtype()), ") than the tensor (", dtype_name(dtype()), ")");
    FERRY_CHECK(grad.shape() == shape(), ShapeMismatch, "set_grad: assigned grad has data of a different size (",
                shape_str(grad.shape()), ") than the tensor (", shape_str(shape()), ")");
  }
  impl_->grad = grad.defined() ? grad.impl_ptr() : nullptr;
}
bool Tensor::is_leaf() const { return impl_ && impl_->grad_fn == nullptr; }
Tensor Tensor::detach() const {
  Tensor out = make_view(*this, shape(), strides(), offset());
  return out;
}
void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  FERRY_DEFINED();
  autograd::run_backward(*this, gradient, retain_graph);
}

namespace {
// The hooks of `impl`, made on first use; a tensor made by an op is then found by backward through its node.
autograd::GradHooks& hooks_of(TensorImpl& impl, const std::shared_ptr<TensorImpl>& owner) {
  if (!impl.hooks) impl.hooks = std::make_shared<autograd::GradHooks>();
  if (impl.grad_fn) impl.grad_fn->output = owner;
  return *impl.hooks;
}
}  // namespace

void Tensor::retain_grad() const {
  FERRY_DEFINED();
  FERRY_CHECK(requires_grad(), InvalidArgument,
              "retain_grad(): can't retain_grad on a tensor that has requires_grad = false");
  if (is_leaf()) return;  // a leaf keeps its gradient anyway
  hooks_of(*impl_, impl_).retains_grad = true;
}
bool Tensor::retains_grad() const { return impl_ && !is_leaf() && impl_->hooks && impl_->hooks->retains_grad; }

unsigned Tensor::add_grad_hook(std::function<Tensor(const Tensor&)> hook) const {
  FERRY_DEFINED();
  FERRY_CHECK(requires_grad(), InvalidArgument,
              "register_hook(): cannot register a hook on a tensor that doesn't require gradient");
  FERRY_CHECK(hook != nullptr, InvalidArgument, "register_hook(): the hook is empty");
  autograd::GradHooks& hooks = hooks_of(*impl_, impl_);
  const unsigned handle = hooks.next_handle++;
  hooks.entries.push_back({handle, std::move(hook)});
  return handle;
}
void Tensor::remove_hook(unsigned handle) const {
  FERRY_DEFINED();
  const std::size_t removed =
      impl_->hooks ? std::erase_if(impl_->hooks->entries, [handle](const auto& e) { return e.handle == handle; }) : 0;
  FERRY_CHECK(removed == 1, InvalidArgument, "remove_hook(): this tensor has no hook with handle ", handle,
              " (already removed, or registered on another tensor)");
}

}  // namespace ferry
