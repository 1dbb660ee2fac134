// ready_event.h — "this value is computed": an event recorded on an accelerator's compute stream right after the
// kernels that wrote a tensor's bytes. A blocking read of the bytes (loss.item(), loss.cpu()) then waits for that
// event alone, while the backward pass and the update queued after the loss keep the device busy, instead of
// draining the whole queue and leaving the device idle until the host has launched the next step.
// The losses mark their reduced value (mark_ready); transfer.cpp reads through the mark (Backend::read_when_ready).
// Not here: the non-blocking read of a logged value (ferry/readback.h).
#pragma once

#include <cstdint>
#include <memory>

#include "ferry/device.h"
#include "ferry/tensor.h"

namespace ferry::detail {

struct ReadyEvent {
  ReadyEvent(Device device, void* event, std::uint64_t version) : device(device), event(event), version(version) {}
  ~ReadyEvent();  // the event goes back to its device's free list, for the next mark
  ReadyEvent(const ReadyEvent&) = delete;
  ReadyEvent& operator=(const ReadyEvent&) = delete;

  Device device;
  void* event = nullptr;       // Backend::create_event's handle
  std::uint64_t version = 0;   // the storage's version when recorded: an in-place write since makes the mark stale
};

// Records a ready event for `t`'s bytes on its device's compute stream, after the work queued so far, and keeps it
// in `t`'s storage. Inside a graph capture the record becomes a node of the graph (each replay records it at that
// point), and the graph keeps the event alive. Nothing on the cpu, on devices without events (sim), or when
// FERRY_READY_EVENTS=0 (ready_events_enabled() in ferry/readback.h: a switch, for measuring what the marks buy).
void mark_ready(const Tensor& t);

// The mark a blocking read of `t` may wait for instead of the device's whole queue: null when `t` has none, or when
// its storage has been written in place since the mark was made.
const ReadyEvent* ready_event_for_read(const Tensor& t);

// Inside a capture: `kept` lives as long as the graph being captured (its event is one of the graph's nodes).
// Outside a capture: nothing.
void keep_with_capture(std::shared_ptr<const void> kept);

}  // namespace ferry::detail
