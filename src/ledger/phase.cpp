// phase.cpp — the phase log beside the ledger: scoped phase and step timers on the ledger's clock.
// Not here: adding the phases up (report.cpp) or drawing them (trace.cpp).
#include "ferry/phase.h"

#include <utility>

#include "ferry/ops.h"

namespace ferry {

std::string_view phase_kind_name(PhaseKind kind) {
  switch (kind) {
    case PhaseKind::Transfer: return "transfer";
    case PhaseKind::Compute: return "compute";
    case PhaseKind::Sync: return "sync";
  }
  return "?";
}

// ---- PhaseLog ------------------------------------------------------------------------------------

PhaseLog& PhaseLog::global() {
  static PhaseLog log;
  return log;
}

void PhaseLog::record_phase(PhaseRecord record) {
  if (!Ledger::global().enabled()) return;
  std::lock_guard lock(mutex_);
  phases_.push_back(std::move(record));
}

void PhaseLog::record_step(StepRecord record) {
  if (!Ledger::global().enabled()) return;
  std::lock_guard lock(mutex_);
  steps_.push_back(record);
}

std::vector<PhaseRecord> PhaseLog::phases() const {
  std::lock_guard lock(mutex_);
  return phases_;
}

std::vector<StepRecord> PhaseLog::steps() const {
  std::lock_guard lock(mutex_);
  return steps_;
}

void PhaseLog::clear() {
  std::lock_guard lock(mutex_);
  phases_.clear();
  steps_.clear();
}

// ---- Phase ---------------------------------------------------------------------------------------

Phase::Phase(PhaseKind kind, Device device, std::string label, PhaseTiming timing) : timing_(timing) {
  Ledger& ledger = Ledger::global();
  // Exact: whatever the device still has queued belongs to the phases before this one.
  if (timing_ == PhaseTiming::Exact) synchronize(device, kExactTimingReason);
  record_.kind = kind;
  record_.device = device;
  record_.label = std::move(label);
  record_.step = ledger.current_step();
  record_.exact = timing_ == PhaseTiming::Exact;
  record_.start_ms = ledger.now_ms();
}

Phase::~Phase() { finish(false); }

void Phase::end() { finish(true); }

void Phase::finish(bool may_throw) {
  if (ended_) return;
  ended_ = true;
  if (timing_ == PhaseTiming::Exact) {
    if (may_throw) {
      synchronize(record_.device, kExactTimingReason);
    } else {
      try {
        synchronize(record_.device, kExactTimingReason);
      } catch (...) {
        // A destructor must not throw; the phase is still recorded, with the time the host saw.
      }
    }
  }
  record_.duration_ms = Ledger::global().now_ms() - record_.start_ms;
  PhaseLog::global().record_phase(record_);
}

double Phase::elapsed_ms() const {
  return ended_ ? record_.duration_ms : Ledger::global().now_ms() - record_.start_ms;
}

// ---- Step ----------------------------------------------------------------------------------------

Step::Step(std::int64_t step) {
  Ledger& ledger = Ledger::global();
  ledger.begin_step(step);
  record_.step = step;
  record_.start_ms = ledger.now_ms();
}

Step::~Step() {
  Ledger& ledger = Ledger::global();
  record_.duration_ms = ledger.now_ms() - record_.start_ms;
  ledger.end_step();
  PhaseLog::global().record_step(record_);
}

// ---- snapshots -----------------------------------------------------------------------------------

LedgerSnapshot ledger_snapshot() {
  LedgerSnapshot snapshot;
  snapshot.transfers = Ledger::global().transfers();
  snapshot.syncs = Ledger::global().syncs();
  snapshot.phases = PhaseLog::global().phases();
  snapshot.steps = PhaseLog::global().steps();
  snapshot.collectives = Ledger::global().collectives();
  return snapshot;
}

void clear_ledger_records() {
  Ledger::global().clear();
  PhaseLog::global().clear();
}

}  // namespace ferry
