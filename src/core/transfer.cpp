// transfer.cpp — the one door (DESIGN.md invariant 5): every copy between devices and every host
// sync passes here, is timed on the host clock and is written to the ledger.
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "ferry/ledger.h"
#include "internal.h"
#include "ready_event.h"

namespace ferry::detail {

namespace {
Direction direction_of(Device source, Device target) {
  if (source.is_cpu() && target.is_cpu()) return Direction::HostToHost;
  if (source.is_cpu()) return Direction::HostToDevice;
  if (target.is_cpu()) return Direction::DeviceToHost;
  return Direction::DeviceToDevice;
}

// A capture records device work only: a crossing cannot be part of it (ferry/graph.h). Checked before anything
// is allocated for the copy, so nothing made outside the capture is freed inside it.
void refuse_in_capture(Device source, Device target, const char* label) {
  if (capture_active())
    check_not_capturing(concat("A copy from ", source.str(), " to ", target.str(), " (", label, ")").c_str());
}

// Blocking device->host copies up to this size run on the compute stream (copy_bytes below).
constexpr std::size_t kSmallReadBytes = std::size_t{64} << 10;

// Copy contiguous bytes between two devices. Accelerators of different types meet in host memory.
// fresh_destination (host->device only): dst was allocated for this copy in the copy stream's order
// (make_tensor_for_copy), so nothing queued on the compute stream can touch it and the copy need not wait.
// ready (device->host only): the source's ready event (ready_event.h), which a small blocking read waits for
// instead of the compute stream's whole queue.
void copy_bytes(void* dst, Device target, const void* src, Device source, std::size_t bytes, bool pinned,
                bool non_blocking, const char* label, bool fresh_destination = false,
                const ReadyEvent* ready = nullptr) {
  if (bytes == 0) return;
  if (!source.is_cpu() && !target.is_cpu() && source.type != target.type) {
    Tensor staging = make_tensor({static_cast<std::int64_t>(bytes)}, {.device = kCPU, .dtype = DType::UInt8});
    copy_bytes(staging.data_ptr(), kCPU, src, source, bytes, false, false, label);
    copy_bytes(dst, target, staging.data_ptr(), kCPU, bytes, false, false, label);
    return;
  }
  Ledger& ledger = Ledger::global();
  const Direction direction = direction_of(source, target);
  // A blocking copy back to the host waits for the device's queued work: that is a host sync.
  const bool is_sync = direction == Direction::DeviceToHost && !non_blocking;
  if (is_sync) ledger.check_sync_allowed(source, label);
  // non_blocking with pageable host memory: the driver stages it, and the host waits for that.
  const bool pageable_async = non_blocking && !pinned && direction != Direction::DeviceToDevice;
  if (pageable_async) {
    if (current_sync_policy() == SyncPolicy::Error)
      throw SyncPolicyViolation(concat("A non_blocking copy (", label, ") from pageable host memory is really ",
                                       "blocking; pin the host tensor first (pin_memory())"));
    if (current_sync_policy() == SyncPolicy::Warn)
      std::fprintf(stderr, "ferry: warning: a non_blocking copy (%s) from pageable host memory is really blocking; "
                   "pin the host tensor first (pin_memory())\n", label);
  }
  const Device accelerator = source.is_cpu() ? target : source;
  Backend& be = backend(accelerator);
  const double start = ledger.now_ms();
  // A small blocking read back to the host (item(), a logged value) goes on the compute stream itself: the
  // host waits for that stream's queued work either way, and the copy stream would add an event record and
  // a stream wait (two driver calls, a few microseconds on every loss.item()).
  const bool small_read = is_sync && bytes <= kSmallReadBytes;
  const Stream stream = small_read ? be.compute_stream(accelerator.index) : be.copy_stream(accelerator.index);
  // The copy stream first waits for work queued on the compute stream (the data may still be being
  // computed, or the destination still read by queued kernels, or allocated in the compute stream's
  // order): an event, not a host wait. A host->device copy into a fresh destination waits for nothing,
  // so it runs beside the step that is computing (prefetch) instead of after it.
  if (!fresh_destination && !small_read) be.stream_wait(stream, be.compute_stream(accelerator.index));
  if (small_read && ready) {
    // The value's own event: the work queued after it (a backward pass, an update) runs on while the host reads,
    // and this returns with the bytes on the host.
    be.read_when_ready(dst, src, bytes, ready->event, accelerator.index);
  } else {
    try {
      be.copy(dst, target, src, source, bytes, stream, pinned, non_blocking);
    } catch (...) {
      // Part of the copy may be queued: let it finish before the caller frees the buffers it reads and writes.
      try {
        be.synchronize(stream);
      } catch (...) {
      }
      throw;
    }
    // A non-blocking copy: later compute work waits for it (on the device), so it sees the data (to a device), and
    // nothing it queues frees or overwrites the source before the copy has read it (from a device).
    if (!non_blocking) {
      be.synchronize(stream);
    } else {
      if (!target.is_cpu()) be.stream_wait(be.compute_stream(target.index), stream);
      if (!source.is_cpu() && source != target) be.stream_wait(be.compute_stream(source.index), stream);
    }
  }
  const double duration = ledger.now_ms() - start;
  TransferRecord record;
  record.direction = direction;
  record.source = source;
  record.target = target;
  record.bytes = static_cast<std::int64_t>(bytes);
  record.pinned = pinned;
  record.blocking = !non_blocking;  // as asked; pinned = false beside it tells a pageable one (really blocking)
  record.start_ms = start;
  record.duration_ms = duration;
  record.label = label;
  // The sync first: a byte budget checked in record_transfer may throw, and the host has waited either way.
  if (is_sync) ledger.record_sync({.device = source, .reason = label, .start_ms = start, .duration_ms = duration});
  ledger.record_transfer(record);
}
}  // namespace

Tensor transfer(const Tensor& src_in, Device target, bool non_blocking, const char* label) {
  refuse_in_capture(src_in.device(), target, label);
  Tensor src = src_in.contiguous();
  // A non_blocking copy into the host needs pinned memory to be truly asynchronous: transfer() pins its result.
  // sim has no page-locked memory (that needs the CUDA driver) and copies as it is called, so its result counts
  // as pinned: the ledger records what a card would.
  const bool pin_target = target.is_cpu() && non_blocking && is_available(DeviceType::CUDA) && src.device().is_cuda();
  const bool pinned_as_a_card_would = target.is_cpu() && non_blocking && src.device().type == DeviceType::Sim;
  const bool host_to_device = src.device().is_cpu() && !target.is_cpu();
  Tensor out = host_to_device ? make_tensor_for_copy(src.shape(), {.device = target, .dtype = src.dtype()})
                              : make_tensor(src.shape(), {.device = target, .dtype = src.dtype(), .pinned = pin_target});
  const bool pinned = src.is_pinned() || out.is_pinned() || pinned_as_a_card_would;
  copy_bytes(out.data_ptr(), target, src.data_ptr(), src.device(), src.nbytes(), pinned, non_blocking, label,
             host_to_device, target.is_cpu() ? ready_event_for_read(src) : nullptr);
  return out;
}

Tensor host_copy(const Tensor& t, const char* label) {
  Tensor src = t.contiguous();
  if (src.device().is_cpu()) return src;
  return transfer(src, kCPU, false, label);
}

void copy_between(const Tensor& dst, const Tensor& src, bool non_blocking, const char* label) {
  FERRY_ASSERT(dst.is_contiguous() && src.is_contiguous() && dst.nbytes() == src.nbytes());
  refuse_in_capture(src.device(), dst.device(), label);
  copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), src.nbytes(),
             src.is_pinned() || dst.is_pinned(), non_blocking, label);
}

void recorded_sync(Device device, const std::string& reason, const std::function<void()>& wait) {
  if (capture_active()) check_not_capturing(concat("A host sync (", reason, ")").c_str());
  Ledger& ledger = Ledger::global();
  ledger.check_sync_allowed(device, reason);
  const double start = ledger.now_ms();
  wait();
  ledger.record_sync({.device = device, .reason = reason, .start_ms = start, .duration_ms = ledger.now_ms() - start});
}

void host_sync(Device device, const char* reason) {
  if (device.is_cpu()) return;
  recorded_sync(device, reason, [&] { backend(device).synchronize_device(device.index); });
}

}  // namespace ferry::detail
