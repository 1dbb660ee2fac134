// internal.h — helpers shared by the op implementations; not part of the public API.
#pragma once

#include <functional>
#include <string>

#include "ferry/backend.h"
#include "ferry/error.h"
#include "ferry/tensor.h"

namespace ferry::detail {

// The tensor as a kernel sees it.
KernelTensor kernel_view(const Tensor& t);
// kernel_view(t), or null data for an undefined tensor: an optional operand (no bias, a gradient not wanted).
KernelTensor kernel_view_or_null(const Tensor& t);
// A fresh contiguous tensor on an accelerator whose first writer is a host->device copy: allocated in the
// copy stream's order (Backend::allocate_for_copy), so that copy waits for nothing on the compute stream.
Tensor make_tensor_for_copy(const Shape& shape, const TensorOptions& options);
// The tensor broadcast (stride 0) to `shape` (right-aligned).
KernelTensor kernel_broadcast(const Tensor& t, const Shape& shape);
// A 0-element or flat view: shape (numel,) over contiguous memory.
KernelTensor kernel_flat(const Tensor& t);

inline Stream compute_stream(Device device) { return backend(device).compute_stream(device.index); }

// The one door: every copy between two devices passes here and is written to the ledger.
// `label` names who asked ("to()", "item()", "cpu()", "print", "checkpoint", ...).
Tensor transfer(const Tensor& src, Device target, bool non_blocking, const char* label);
// `t`'s values on the host: `t` itself (made contiguous) on the cpu, else one blocking device->host copy through
// transfer() (a sync, recorded with `label`).
Tensor host_copy(const Tensor& t, const char* label);
// Copy src's bytes into dst (same shape, dtype, both contiguous; any two devices).
void copy_between(const Tensor& dst, const Tensor& src, bool non_blocking, const char* label);
// Host waits for `device`; recorded as a sync with `reason` (policy-checked first).
void host_sync(Device device, const char* reason);
// The one way a host wait is made: refused inside a capture, checked against the sync policy and budget, then
// `wait()` timed and recorded in the ledger with `reason`. host_sync and PendingRead::wait go through it.
void recorded_sync(Device device, const std::string& reason, const std::function<void()>& wait);
// Whether this thread is capturing a graph (ferry/graph.h): a cheap test for hot paths.
bool capture_active();
// Throws GraphCaptureError when this thread is capturing a graph: `what` cannot be captured. Callers that
// compose `what` test capture_active() first, so no message is built on the way of an ordinary copy or sync.
void check_not_capturing(const char* what);

// Whether `scalar` is a whole number that integer dtype `dtype` holds (no wrap when a kernel converts it).
bool holds_whole(DType dtype, double scalar);

}  // namespace ferry::detail
