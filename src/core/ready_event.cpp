// ready_event.cpp — ready events (ready_event.h): made, recorded and kept with the tensor's storage; their events
// reused through a free list per device (a mark is made every training step).
#include "ready_event.h"

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "environment.h"
#include "ferry/backend.h"
#include "ferry/readback.h"
#include "internal.h"

namespace ferry::detail {

namespace {
struct FreeEvents {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::vector<void*>> by_device;  // (device type, index) -> idle events
};

FreeEvents& free_events() {
  static auto* events = new FreeEvents();  // never destroyed: storages may let go of their marks at exit
  return *events;
}

std::pair<int, int> key_of(Device device) { return {static_cast<int>(device.type), device.index}; }

// Per device type: its backend gave no event when asked (sim: its work is done as it is called). Learnt at the
// first mark, so that the marks after it (one a training step) skip the free list's lock.
std::atomic<bool>& gives_no_events(DeviceType type) {
  static std::array<std::atomic<bool>, kDeviceTypeCount> flags{};
  return flags[static_cast<std::size_t>(type)];
}

// An idle event of `device`'s, or a new one; null on a device without events.
void* take_event(Device device) {
  if (gives_no_events(device.type).load(std::memory_order_relaxed)) return nullptr;
  {
    FreeEvents& free = free_events();
    std::lock_guard lock(free.mutex);
    std::vector<void*>& idle = free.by_device[key_of(device)];
    if (!idle.empty()) {
      void* event = idle.back();
      idle.pop_back();
      return event;
    }
  }
  void* event = backend(device).create_event(device.index);
  if (!event) gives_no_events(device.type).store(true, std::memory_order_relaxed);
  return event;
}

}  // namespace

ReadyEvent::~ReadyEvent() {
  if (!event) return;
  FreeEvents& free = free_events();
  try {
    std::lock_guard lock(free.mutex);
    free.by_device[key_of(device)].push_back(event);
  } catch (...) {  // out of host memory: the event is destroyed instead
    backend(device).destroy_event(event, device.index);
  }
}

void mark_ready(const Tensor& t) {
  if (!t.defined() || t.device().is_cpu() || !ready_events_enabled()) return;
  const Device device = t.device();
  void* event = take_event(device);
  if (!event) return;
  const std::shared_ptr<Storage>& storage = t.impl()->storage;
  auto ready = std::make_shared<ReadyEvent>(device, event, storage->version());
  Backend& be = backend(device);
  be.record_event(event, be.compute_stream(device.index));
  if (capture_active()) keep_with_capture(ready);
  storage->set_ready_event(std::move(ready));
}

const ReadyEvent* ready_event_for_read(const Tensor& t) {
  if (!t.defined() || !t.impl()->storage) return nullptr;
  const Storage& storage = *t.impl()->storage;
  const ReadyEvent* ready = storage.ready_event().get();
  return ready && ready->version == storage.version() ? ready : nullptr;
}

}  // namespace ferry::detail

namespace ferry {

bool ready_events_enabled() {
  static const bool enabled = detail::environment_switch("FERRY_READY_EVENTS", true);
  return enabled;
}

}  // namespace ferry
