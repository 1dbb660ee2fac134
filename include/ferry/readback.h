// ferry/readback.h — a device value on its way to the host without a stall: the copy is queued behind the work
// that computes the value (into pinned memory on cuda), and the host waits only when it reads, for that copy
// alone, while work queued after it keeps the device busy. ferry train logs its loss this way: the value of
// step k is read once step k+1 is queued. Not here: blocking reads (Tensor::item(), cpu()).
#pragma once

#include <string>

#include "ferry/tensor.h"

namespace ferry {

// Whether a loss reduced to one number marks its value on an accelerator, so that a blocking read of it (item(),
// cpu()) waits for the loss's own kernels and not for the backward pass queued after them (docs/devices-and-moves.md).
// On unless FERRY_READY_EVENTS=0: a switch, read once; any other value throws InvalidArgument naming it.
bool ready_events_enabled();

class PendingRead {
 public:
  PendingRead() = default;
  // Queues the copy of `value` to the host; `label` names the read in the ledger ("logged loss").
  PendingRead(const Tensor& value, std::string label);
  ~PendingRead();
  PendingRead(PendingRead&& other) noexcept;
  PendingRead& operator=(PendingRead&& other) noexcept;
  PendingRead(const PendingRead&) = delete;
  PendingRead& operator=(const PendingRead&) = delete;

  bool pending() const { return host_.defined(); }
  // The host waits for this copy (a sync, recorded with the label; policy-checked) and takes the values, in
  // host memory; the read is then no longer pending.
  Tensor wait();

 private:
  void release() noexcept;

  Tensor host_;
  Device device_;
  void* event_ = nullptr;  // marks the copy's end on the device's copy stream (null on cpu and sim)
  std::string label_;
  bool sync_at_wait_ = false;  // an accelerator's read: wait() is a host sync (recorded even on sim)
};

}  // namespace ferry
