// ferry/trace.h — the ledger's transfers, syncs, collectives, phases and steps as Chrome trace-event JSON, the format
// Perfetto (ui.perfetto.dev) and chrome://tracing open. Not here: adding them up (ferry/report.h).
#pragma once

#include <string>

#include "ferry/phase.h"

namespace ferry {

// {"traceEvents": [...], "displayTimeUnit": "ms"}: one complete event ("ph": "X") per record, with
// "ts" and "dur" in microseconds on the ledger's clock, plus metadata events ("ph": "M") that name
// the tracks. Tracks: one process per device ("cpu", "sim:0", "cuda:0", with a process "steps" for
// ferry::Step first), one thread per kind within it: "phase: transfer", "phase: compute",
// "phase: sync", "copies host->device", "copies device->host", "copies device->device",
// "copies host->host", "host syncs", "collectives". A crossing sits on its accelerator's track (the source's for
// device->device). Event "args":
//   copies: bytes, direction, pinned, blocking, label, step, source, target, bytes_per_second
//   syncs:  reason, device, step
//   phases: kind, label, step, exact, device
//   collectives (launch to completion): op, backend, algorithm, bytes, world_size, host_wait_ms, label, step
//   steps:  step
std::string chrome_trace_json(const LedgerSnapshot& snapshot);
std::string chrome_trace_json();  // of everything recorded so far (ledger_snapshot())

// Writes chrome_trace_json() to `path`; throws IoError when the file cannot be written.
void write_chrome_trace(const std::string& path);
void write_chrome_trace(const std::string& path, const LedgerSnapshot& snapshot);

}  // namespace ferry
