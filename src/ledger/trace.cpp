// trace.cpp — writes the ledger and the phase log as Chrome trace-event JSON (ts and dur in us).
// Not here: any arithmetic on the records beyond unit conversion (report.cpp).
#include "ferry/trace.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "ferry/error.h"

namespace ferry {

namespace {

using Json = nlohmann::ordered_json;

// Track (thread) ids within a device's process, in display order.
enum Track : int {
  kPhaseTransfer = 1, kPhaseCompute, kPhaseSync,
  kCopiesHostToDevice, kCopiesDeviceToHost, kCopiesDeviceToDevice, kCopiesHostToHost,
  kHostSyncs, kCollectives,
};
const char* track_name(int track) {
  switch (track) {
    case kPhaseTransfer: return "phase: transfer";
    case kPhaseCompute: return "phase: compute";
    case kPhaseSync: return "phase: sync";
    case kCopiesHostToDevice: return "copies host->device";
    case kCopiesDeviceToHost: return "copies device->host";
    case kCopiesDeviceToDevice: return "copies device->device";
    case kCopiesHostToHost: return "copies host->host";
    case kHostSyncs: return "host syncs";
    case kCollectives: return "collectives";
  }
  return "?";
}
int phase_track(PhaseKind kind) {
  switch (kind) {
    case PhaseKind::Transfer: return kPhaseTransfer;
    case PhaseKind::Compute: return kPhaseCompute;
    case PhaseKind::Sync: return kPhaseSync;
  }
  return kPhaseCompute;
}
int copy_track(Direction direction) {
  switch (direction) {
    case Direction::HostToDevice: return kCopiesHostToDevice;
    case Direction::DeviceToHost: return kCopiesDeviceToHost;
    case Direction::DeviceToDevice: return kCopiesDeviceToDevice;
    case Direction::HostToHost: return kCopiesHostToHost;
  }
  return kCopiesHostToHost;
}

// The device whose process a crossing is drawn in: the accelerator end.
Device copy_device(const TransferRecord& t) {
  if (!t.source.is_cpu()) return t.source;
  return t.target;
}

constexpr int kStepsPid = 1;  // process of ferry::Step records; devices follow

class Tracks {
 public:
  int pid(Device device) {
    const auto key = std::pair{static_cast<int>(device.type), device.index};
    auto it = devices_.find(key);
    if (it != devices_.end()) return it->second.first;
    const int pid = kStepsPid + 1 + static_cast<int>(devices_.size());
    devices_.emplace(key, std::pair{pid, device.str()});
    return pid;
  }
  void use(int pid, int tid) { used_.emplace(pid, tid); }

  // Metadata events naming every process and thread that holds an event.
  void name_tracks(Json& events, bool has_steps) const {
    auto meta = [&events](const char* name, int pid, int tid, Json args) {
      Json event{{"name", name}, {"ph", "M"}, {"pid", pid}};
      if (tid >= 0) event["tid"] = tid;
      event["args"] = std::move(args);
      events.push_back(std::move(event));
    };
    if (has_steps) {
      meta("process_name", kStepsPid, -1, {{"name", "steps"}});
      meta("process_sort_index", kStepsPid, -1, {{"sort_index", 0}});
      meta("thread_name", kStepsPid, 1, {{"name", "ferry::Step"}});
    }
    // Devices sorted by (type, index) so that cpu comes first whatever order they appeared in.
    for (const auto& [key, value] : devices_) {
      const auto& [pid, name] = value;
      meta("process_name", pid, -1, {{"name", name}});
      meta("process_sort_index", pid, -1, {{"sort_index", 1 + key.first * 64 + key.second}});
    }
    for (const auto& [pid, tid] : used_) {
      if (pid == kStepsPid) continue;
      meta("thread_name", pid, tid, {{"name", track_name(tid)}});
      meta("thread_sort_index", pid, tid, {{"sort_index", tid}});
    }
  }

 private:
  std::map<std::pair<int, int>, std::pair<int, std::string>> devices_;  // (type, index) -> (pid, name)
  std::set<std::pair<int, int>> used_;
};

Json complete_event(const std::string& name, const char* category, double start_ms, double duration_ms, int pid,
                    int tid, Json args) {
  return Json{{"name", name},
              {"cat", category},
              {"ph", "X"},
              {"ts", start_ms * 1e3},                      // us
              {"dur", std::max(0.0, duration_ms) * 1e3},  // us
              {"pid", pid},
              {"tid", tid},
              {"args", std::move(args)}};
}

}  // namespace

std::string chrome_trace_json(const LedgerSnapshot& snapshot) {
  Tracks tracks;
  Json events = Json::array();
  for (const StepRecord& s : snapshot.steps) {
    events.push_back(complete_event("step " + std::to_string(s.step), "step", s.start_ms, s.duration_ms, kStepsPid, 1,
                                    {{"step", s.step}}));
  }
  for (const PhaseRecord& p : snapshot.phases) {
    const int pid = tracks.pid(p.device), tid = phase_track(p.kind);
    tracks.use(pid, tid);
    const std::string name = p.label.empty() ? std::string(phase_kind_name(p.kind)) : p.label;
    events.push_back(complete_event(name, "phase", p.start_ms, p.duration_ms, pid, tid,
                                    {{"kind", std::string(phase_kind_name(p.kind))},
                                     {"label", p.label},
                                     {"step", p.step},
                                     {"exact", p.exact},
                                     {"device", p.device.str()}}));
  }
  for (const TransferRecord& t : snapshot.transfers) {
    const int pid = tracks.pid(copy_device(t)), tid = copy_track(t.direction);
    tracks.use(pid, tid);
    const double rate = t.duration_ms > 0 ? static_cast<double>(t.bytes) / (t.duration_ms / 1e3) : 0.0;  // bytes/s
    events.push_back(complete_event(t.label.empty() ? "copy" : t.label, "transfer", t.start_ms, t.duration_ms, pid,
                                    tid,
                                    {{"bytes", t.bytes},
                                     {"direction", std::string(direction_name(t.direction))},
                                     {"pinned", t.pinned},
                                     {"blocking", t.blocking},
                                     {"label", t.label},
                                     {"step", t.step},
                                     {"source", t.source.str()},
                                     {"target", t.target.str()},
                                     {"bytes_per_second", rate}}));
  }
  for (const SyncRecord& s : snapshot.syncs) {
    const int pid = tracks.pid(s.device);
    tracks.use(pid, kHostSyncs);
    events.push_back(complete_event(s.reason.empty() ? "sync" : s.reason, "sync", s.start_ms, s.duration_ms, pid,
                                    kHostSyncs,
                                    {{"reason", s.reason}, {"device", s.device.str()}, {"step", s.step}}));
  }
  for (const CollectiveRecord& c : snapshot.collectives) {  // launch to completion; wait_ms of it blocked the host
    const int pid = tracks.pid(c.device);
    tracks.use(pid, kCollectives);
    events.push_back(complete_event(c.label.empty() ? c.op : c.op + ": " + c.label, "collective", c.start_ms,
                                    c.duration_ms, pid, kCollectives,
                                    {{"op", c.op},
                                     {"backend", c.backend},
                                     {"algorithm", c.algorithm},
                                     {"bytes", c.bytes},
                                     {"world_size", c.world_size},
                                     {"host_wait_ms", c.wait_ms},
                                     {"label", c.label},
                                     {"step", c.step}}));
  }
  tracks.name_tracks(events, !snapshot.steps.empty());
  Json trace;
  trace["traceEvents"] = std::move(events);
  trace["displayTimeUnit"] = "ms";
  trace["otherData"] = {{"generator", "ferry ledger"}, {"clock", "host steady clock since the ledger's epoch"}};
  return trace.dump();
}

std::string chrome_trace_json() { return chrome_trace_json(ledger_snapshot()); }

void write_chrome_trace(const std::string& path) { write_chrome_trace(path, ledger_snapshot()); }

void write_chrome_trace(const std::string& path, const LedgerSnapshot& snapshot) {
  const std::string text = chrome_trace_json(snapshot);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  FERRY_CHECK(out.good(), IoError, "Cannot open '", path, "' to write the trace");
  out << text << '\n';
  out.close();
  FERRY_CHECK(!out.fail(), IoError, "Writing the trace to '", path, "' failed (disk full?)");
}

}  // namespace ferry
