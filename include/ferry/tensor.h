// ferry/tensor.h — Tensor: a shape, a dtype and strides over storage that lives on one device.
// Not here: the ops (ferry/ops.h), factories (ferry/factories.h), gradients (ferry/autograd.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ferry/device.h"
#include "ferry/dtype.h"

namespace ferry {

using Shape = std::vector<std::int64_t>;  // elements per dim, outermost first

std::string shape_str(const Shape& shape);  // "[2, 3]"
std::int64_t shape_numel(const Shape& shape);  // throws InvalidArgument on negative dims or overflow

struct TensorOptions {
  Device device = kCPU;
  DType dtype = DType::Float32;
  bool requires_grad = false;
  bool pinned = false;  // host tensors only: page-locked memory for fast async copies
};

namespace detail {
struct ReadyEvent;  // src/core/ready_event.h
}

namespace autograd {
struct Node;
struct GradHooks;  // register_hook() and retain_grad() of one tensor (ferry/autograd.h)
}

// A block of bytes on one device, freed through its backend when the last tensor lets go.
class Storage {
 public:
  // copy_order: the first writer is a host->device copy (Backend::allocate_for_copy).
  Storage(std::size_t nbytes, Device device, bool pinned = false, bool copy_order = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }  // bytes
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }
  // Bumped by every in-place write into this memory, through any view or alias of it: autograd compares it with
  // what it saw when it saved a tensor for backward (PyTorch's version counter, shared by a base and its views).
  std::uint64_t version() const { return version_; }
  void bump_version() { ++version_; }
  // On an accelerator, an event recorded right after the work that computed these bytes (a loss marks its value
  // so: detail::mark_ready); a blocking read of them waits for that event, not for all the work queued after it.
  // Null when there is none.
  const std::shared_ptr<detail::ReadyEvent>& ready_event() const { return ready_event_; }
  void set_ready_event(std::shared_ptr<detail::ReadyEvent> ready) { ready_event_ = std::move(ready); }

 private:
  std::uint64_t version_ = 0;
  std::shared_ptr<detail::ReadyEvent> ready_event_;
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  Device device_;
  bool pinned_ = false;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  std::vector<std::int64_t> strides;  // elements
  std::int64_t offset = 0;            // elements from the start of storage
  DType dtype = DType::Float32;
  // autograd
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  int output_index = 0;
  // A view of a tensor autograd tracks, made under NoGradGuard (so not recorded): writing into it with grad mode
  // on would change the tracked tensor behind autograd's back, and is refused (as PyTorch does).
  bool view_made_without_grad = false;
  std::shared_ptr<autograd::GradHooks> hooks;  // null unless register_hook() or retain_grad() was called
  std::uint64_t version = 0;  // bumped by in-place writes into this tensor (its storage's version() too)
  void bump_version() {
    ++version;
    if (storage) storage->bump_version();
  }
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  std::int64_t size(int dim) const;  // negative dims count from the end
  int dim() const;
  const std::vector<std::int64_t>& strides() const;
  std::int64_t offset() const;
  DType dtype() const;
  Device device() const;
  std::int64_t numel() const;
  std::size_t element_size() const;
  std::size_t nbytes() const;  // numel * element_size: the bytes a move of this tensor carries
  bool is_contiguous() const;
  bool is_pinned() const;
  const std::shared_ptr<Storage>& storage() const;
  void* data_ptr() const;  // address of element 0 (device memory for cuda and sim)
  template <typename T> T* data() const { return static_cast<T*>(data_ptr()); }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // --- views: share storage, never copy ----------------------------------------------------------
  // One dim may be -1. A view needs strides that allow it (PyTorch's rule: each new dim lies within one run of
  // memory-contiguous old dims; any contiguous tensor qualifies), else InvalidArgument: use reshape().
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;   // a view when view() could make one, else a contiguous copy
  Tensor transpose(int dim0, int dim1) const;
  Tensor t() const;  // transpose(0, 1) of a 2-d tensor; 0-d and 1-d as they are; >2-d: InvalidArgument (PyTorch)
  Tensor permute(const std::vector<int>& dims) const;
  Tensor narrow(int dim, std::int64_t start, std::int64_t length) const;
  Tensor slice(int dim, std::int64_t start, std::int64_t end) const;  // [start, end), negatives wrap
  Tensor select(int dim, std::int64_t index) const;                   // drops `dim`
  Tensor unsqueeze(int dim) const;
  Tensor squeeze(int dim) const;
  Tensor expand(const Shape& shape) const;  // broadcast by stride 0
  Tensor flatten(int start_dim = 0, int end_dim = -1) const;
  Tensor contiguous() const;  // itself when already contiguous
  Tensor clone() const;

  // --- moves (DESIGN.md invariant 3: never mutate; already there = an alias, no copy) -----------
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor to(DType dtype) const;
  Tensor cpu() const { return to(kCPU); }
  Tensor cuda(int index = 0) const;
  Tensor pin_memory() const;  // a page-locked host copy (cpu tensors; needs a cuda device)

  // --- values (host syncs on accelerators; written to the ledger) -------------------------------
  // The host waits for the work queued before the read; for a loss's value on cuda, only for the loss's own
  // kernels (docs/devices-and-moves.md, "loss.item() waits for the loss, not for the step").
  template <typename T = double> T item() const;
  template <typename T> std::vector<T> to_vector() const;
  std::string str() const;  // PyTorch-like printing

  // --- autograd ----------------------------------------------------------------------------------
  bool requires_grad() const;
  Tensor& requires_grad_(bool enabled = true);
  Tensor grad() const;               // undefined until backward() reaches this leaf
  void set_grad(const Tensor& grad) const;  // same shape, dtype and device, or undefined (to clear)
  // Gradient needed unless scalar. The graph is freed as backward walks it, unless retain_graph: then a second
  // backward() through it works (PyTorch's retain_graph=True).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;             // same storage, no history
  bool is_leaf() const;
  // A tensor made by an op (not a leaf) keeps the gradient backward computes for it in .grad, accumulating over
  // backward calls as a leaf's does (PyTorch's retain_grad(); a no-op on a leaf).
  void retain_grad() const;
  bool retains_grad() const;
  // Calls `hook(grad)` each backward, once backward has the whole gradient with respect to this tensor: before it
  // reaches .grad (a leaf) or flows on to the op that made it. A hook that returns a Tensor (same shape, dtype and
  // device) replaces the gradient; one that returns void only reads it. Hooks run in the order registered, on the
  // thread running backward, with grad mode off (PyTorch's Tensor::register_hook). Returns a handle for remove_hook.
  template <typename Hook>
  unsigned register_hook(Hook&& hook) const {
    if constexpr (std::is_void_v<std::invoke_result_t<Hook&, const Tensor&>>) {
      return add_grad_hook([h = std::forward<Hook>(hook)](const Tensor& grad) mutable {
        h(grad);
        return Tensor();
      });
    } else {
      return add_grad_hook(std::function<Tensor(const Tensor&)>(std::forward<Hook>(hook)));
    }
  }
  void remove_hook(unsigned handle) const;  // a handle already removed (or another tensor's) throws InvalidArgument

  // --- in place (no history; bumps the version) --------------------------------------------------
  // PyTorch's rules, checked: a tensor that requires grad is written only under autograd::NoGradGuard (a leaf:
  // InvalidArgument; one in a recorded graph: NotSupported, as ferry would not record the write and the gradient
  // would be wrong); an expand()ed view (stride 0) only by fill_; a source that partly overlaps the written memory
  // is an InvalidArgument (clone() it first). An integer tensor keeps its dtype: mul_(1.5) is a DTypeMismatch.
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0); }
  Tensor& copy_(const Tensor& src, bool non_blocking = false);  // same shape (broadcast ok); any device
  Tensor& add_(const Tensor& other, double alpha = 1);  // this += alpha * other (other broadcasts to this shape)
  Tensor& sub_(const Tensor& other, double alpha = 1);  // this -= alpha * other
  Tensor& mul_(const Tensor& other);
  Tensor& div_(const Tensor& other);  // floating tensors (true division)
  Tensor& add_(double scalar);
  Tensor& mul_(double scalar);
  Tensor& div_(double scalar);  // floating tensors

 private:
  unsigned add_grad_hook(std::function<Tensor(const Tensor&)> hook) const;
  std::shared_ptr<TensorImpl> impl_;
};

template <> std::vector<bool> Tensor::to_vector<bool>() const;  // std::vector<bool> packs bits

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// Make a tensor that owns fresh (uninitialised) storage on options.device.
Tensor make_tensor(const Shape& shape, const TensorOptions& options);
// A view over existing storage.
Tensor make_view(const Tensor& base, const Shape& shape, const std::vector<std::int64_t>& strides,
                 std::int64_t offset);
std::vector<std::int64_t> contiguous_strides(const Shape& shape);

}  // namespace ferry
