// ferry/phase.h — phases and steps for the ledger: a training loop wraps its parts in scoped timers
// (transfer | compute | sync), host-timed, and its steps in ferry::Step; both land beside the ledger.
// Not here: the crossings and syncs themselves (ferry/ledger.h), or what they add up to (ferry/report.h).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/device.h"
#include "ferry/ledger.h"

namespace ferry {

// The three parts of a training step the Golden Rule talks about.
enum class PhaseKind : std::uint8_t { Transfer, Compute, Sync };
std::string_view phase_kind_name(PhaseKind kind);  // "transfer", "compute", "sync"

// How a phase is timed.
//   Host  — the host clock at the phase's start and end. On an asynchronous device (cuda) a compute
//           phase then measures the enqueueing of kernels; their run time shows up at the next sync.
//   Exact — the device is synchronised at the phase's start and end, so the phase holds its own
//           work. Each of those syncs goes through the one door and is written to the ledger with
//           the reason kExactTimingReason; reports count them apart from the loop's own syncs.
//           Use it to measure, not in production loops: it removes all overlap.
enum class PhaseTiming : std::uint8_t { Host, Exact };
inline constexpr const char* kExactTimingReason = "exact phase timing";

struct PhaseRecord {
  PhaseKind kind = PhaseKind::Compute;
  Device device = kCPU;    // the device the phase works for
  std::string label = {};  // what the loop called it: "batch to device", "forward+backward", ...
  double start_ms = 0;     // since the ledger's epoch (Ledger::now_ms)
  double duration_ms = 0;  // host clock
  std::int64_t step = -1;  // the ledger's step when the phase began, -1 outside steps
  bool exact = false;      // timed with PhaseTiming::Exact
};

// A training step's wall time, recorded by ferry::Step.
struct StepRecord {
  std::int64_t step = -1;
  double start_ms = 0;     // since the ledger's epoch
  double duration_ms = 0;  // host clock, begin to end
};

// Where phases and steps are kept: one process-wide log beside Ledger::global(), on its clock.
// Thread-safe. Records nothing while the ledger is disabled (Ledger::set_enabled(false)).
class PhaseLog {
 public:
  static PhaseLog& global();
  void record_phase(PhaseRecord record);
  void record_step(StepRecord record);
  std::vector<PhaseRecord> phases() const;
  std::vector<StepRecord> steps() const;
  void clear();

 private:
  PhaseLog() = default;
  mutable std::mutex mutex_;
  std::vector<PhaseRecord> phases_;
  std::vector<StepRecord> steps_;
};

// A scoped phase: begins at construction, ends (and is recorded) at end() or destruction.
//   { ferry::Phase copy(ferry::PhaseKind::Transfer, device, "batch"); batch = host_batch.to(device); }
//   { ferry::Phase compute(ferry::PhaseKind::Compute, device); loss = step(model, batch); }
//   { ferry::Phase sync(ferry::PhaseKind::Sync, device, "log"); value = loss.item(); }
// Phases of one thread should follow each other, not nest; phases on different threads may overlap
// (a loader thread copying while the main thread computes) and the report measures that overlap.
class Phase {
 public:
  // Under PhaseTiming::Exact the constructor synchronises `device` first, and throws what a host sync
  // throws there (SyncPolicyViolation under SyncPolicy::Error).
  explicit Phase(PhaseKind kind, Device device = kCPU, std::string label = {},
                 PhaseTiming timing = PhaseTiming::Host);
  ~Phase();  // calls end(); a failing exact-timing sync here is dropped (destructors do not throw)
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

  // Ends the phase now and records it; later calls do nothing. Under Exact, synchronises first.
  void end();
  double elapsed_ms() const;  // so far, or the recorded duration once ended

 private:
  void finish(bool may_throw);
  PhaseRecord record_;
  PhaseTiming timing_;
  bool ended_ = false;
};
using PhaseTimer = Phase;

// A scoped training step: Ledger::begin_step(step) at construction, end_step() at destruction, and
// the step's wall time written to the PhaseLog, so reports know each step's length exactly.
class Step {
 public:
  explicit Step(std::int64_t step);
  ~Step();
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

 private:
  StepRecord record_;
};

// Everything the ledger and the phase log hold, copied at one moment (for reports and traces).
struct LedgerSnapshot {
  std::vector<TransferRecord> transfers;
  std::vector<SyncRecord> syncs;
  std::vector<PhaseRecord> phases;
  std::vector<StepRecord> steps;
  std::vector<CollectiveRecord> collectives;
};
LedgerSnapshot ledger_snapshot();

// Clears the ledger's records and counters and the phase log, for a fresh measurement.
void clear_ledger_records();

}  // namespace ferry
