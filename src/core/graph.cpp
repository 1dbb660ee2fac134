// graph.cpp — capture and replay (ferry/graph.h): the thread's capture state, which the one door for copies
// and syncs (transfer.cpp) and the random generator check, and the calls into the device's backend.
#include "ferry/graph.h"

#include "ferry/backend.h"
#include "ferry/error.h"
#include "internal.h"
#include "ready_event.h"

namespace ferry {

namespace {
thread_local std::optional<Device> t_capturing;
// What the capture in progress on this thread must keep alive with its graph (ready_event.h).
thread_local std::vector<std::shared_ptr<const void>>* t_capture_kept = nullptr;
}

bool graph_capture_supported(Device device) {
  if (device.is_cpu() || !is_available(device.type)) return false;
  return backend(device).graph_supported(device.index);
}

std::optional<Device> capturing_device() { return t_capturing; }

namespace detail {
bool capture_active() { return t_capturing.has_value(); }

void keep_with_capture(std::shared_ptr<const void> kept) {
  if (t_capture_kept) t_capture_kept->push_back(std::move(kept));
}

void check_not_capturing(const char* what) {
  if (!t_capturing) return;
  throw GraphCaptureError(concat(what, " inside a graph capture on ", t_capturing->str(),
                                 ": a captured graph replays device work only, so this cannot be part of it; do it "
                                 "before the capture or after a replay"));
}
}  // namespace detail

Graph::Graph(Device device) : device_(device) {
  FERRY_CHECK(graph_capture_supported(device), NotSupported, device.str(),
              " cannot capture graphs: its kernels run as they are called (graphs need cuda, or sim to try them)");
}

Graph::~Graph() {
  if (handle_) backend(device_).destroy_graph(handle_, device_.index);
}

void Graph::capture(const std::function<void()>& body) {
  FERRY_CHECK(!captured(), InvalidArgument, "This graph on ", device_.str(), " is captured already (",
              operations_, " operations); make a new Graph for other work");
  FERRY_CHECK(!t_capturing, GraphCaptureError, "A graph capture on ", device_.str(), " cannot start inside another on ",
              t_capturing->str());
  Backend& be = backend(device_);
  be.begin_capture(device_.index);
  std::vector<std::shared_ptr<const void>> kept;  // dropped only once what was recorded is gone
  t_capturing = device_;
  t_capture_kept = &kept;
  try {
    body();
  } catch (...) {
    t_capturing.reset();
    t_capture_kept = nullptr;
    try {  // close the capture and drop what it recorded; the body's error is the one to report
      std::int64_t ignored = 0;
      be.destroy_graph(be.end_capture(device_.index, &ignored), device_.index);
    } catch (...) {
    }
    throw;
  }
  t_capturing.reset();
  t_capture_kept = nullptr;
  handle_ = be.end_capture(device_.index, &operations_);
  kept_ = std::move(kept);
}

void Graph::replay() {
  FERRY_CHECK(captured(), InvalidArgument, "replay() of a graph on ", device_.str(), " that was never captured");
  detail::check_not_capturing("Replaying a graph");
  backend(device_).replay_graph(handle_, device_.index);
  ++replays_;
}

std::string Graph::composition() const {
  return captured() ? backend(device_).describe_graph(handle_, device_.index) : std::string();
}

}  // namespace ferry
