// ferry/graph.h — device work captured once and replayed with one call: CUDA graphs on cuda (hundreds of
// kernel launches become one), recorded host calls on sim (so the rules below are testable without a GPU).
// Not here: the training step built on it (ferry/step_graph.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/device.h"

namespace ferry {

// Whether `device` can capture work: cuda and sim can; cpu cannot (its kernels run as they are called).
bool graph_capture_supported(Device device);
// The device this thread is capturing on, if any.
std::optional<Device> capturing_device();

// One captured sequence of work on one device's compute stream.
//
// capture(body) runs `body` once with the compute stream recording instead of computing: nothing is
// computed until replay(). Memory the body allocates belongs to the graph and keeps its address on every
// replay, so tensors the body leaves alive (its outputs) show each replay's values; inputs are tensors made
// before the capture and refilled in place (copy_) before each replay. The body must not sync with the host
// (item(), cpu(), synchronize()), copy between devices, draw random numbers, or free memory allocated before
// the capture (release such tensors first): each throws GraphCaptureError naming it, and the device stays
// usable. Host code in the body runs once, at capture; only device work is replayed.
class Graph {
 public:
  explicit Graph(Device device);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void capture(const std::function<void()>& body);
  // Enqueue the captured work on the compute stream; asynchronous, like any kernel.
  void replay();
  bool captured() const { return handle_ != nullptr; }
  std::int64_t operations() const { return operations_; }  // kernels and memory operations recorded
  // The operations by kind in the backend's words ("112 kernels, 30 allocations, ..."), or empty.
  std::string composition() const;
  std::int64_t replays() const { return replays_; }
  Device device() const { return device_; }

 private:
  Device device_;
  void* handle_ = nullptr;
  std::int64_t operations_ = 0;
  std::int64_t replays_ = 0;
  // What the graph's nodes refer to and must outlive them: the ready events its losses record (core/ready_event.h).
  // Declared last, so destroyed after ~Graph has destroyed the graph.
  std::vector<std::shared_ptr<const void>> kept_;
};

}  // namespace ferry
