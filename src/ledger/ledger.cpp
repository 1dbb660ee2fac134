// ledger.cpp — the thread-safe record of crossings and syncs, the sync policy and the step budgets.
#include "ferry/ledger.h"

#include <cstdio>

#include "ferry/error.h"

namespace ferry {

namespace {
thread_local SyncPolicy t_sync_policy = SyncPolicy::Allow;
}

std::string_view direction_name(Direction direction) {
  switch (direction) {
    case Direction::HostToDevice: return "host->device";
    case Direction::DeviceToHost: return "device->host";
    case Direction::DeviceToDevice: return "device->device";
    case Direction::HostToHost: return "host->host";
  }
  return "?";
}

SyncPolicyGuard::SyncPolicyGuard(SyncPolicy policy) : previous_(t_sync_policy) { t_sync_policy = policy; }
SyncPolicyGuard::~SyncPolicyGuard() { t_sync_policy = previous_; }
SyncPolicy current_sync_policy() { return t_sync_policy; }

Ledger::Ledger() : epoch_(std::chrono::steady_clock::now()) {}

Ledger& Ledger::global() {
  static Ledger ledger;
  return ledger;
}

double Ledger::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - epoch_).count();
}

void Ledger::set_enabled(bool enabled) {
  std::lock_guard lock(mutex_);
  enabled_ = enabled;
}
bool Ledger::enabled() const {
  std::lock_guard lock(mutex_);
  return enabled_;
}

void Ledger::clear() {
  std::lock_guard lock(mutex_);
  transfers_.clear();
  syncs_.clear();
  collectives_.clear();
  totals_ = {};
  step_syncs_ = step_h2d_bytes_ = step_d2h_bytes_ = 0;
}

void Ledger::begin_step(std::int64_t step) {
  std::lock_guard lock(mutex_);
  step_ = step;
  step_syncs_ = step_h2d_bytes_ = step_d2h_bytes_ = 0;
}
void Ledger::end_step() {
  std::lock_guard lock(mutex_);
  step_ = -1;
}
std::int64_t Ledger::current_step() const {
  std::lock_guard lock(mutex_);
  return step_;
}
void Ledger::set_budget(const StepBudget& budget) {
  std::lock_guard lock(mutex_);
  budget_ = budget;
}

void Ledger::record_transfer(TransferRecord record) {
  std::lock_guard lock(mutex_);
  if (!enabled_) return;
  record.step = step_;
  if (record.direction == Direction::HostToDevice) {
    totals_.bytes_host_to_device += record.bytes;
    step_h2d_bytes_ += record.bytes;
  } else if (record.direction == Direction::DeviceToHost) {
    totals_.bytes_device_to_host += record.bytes;
    step_d2h_bytes_ += record.bytes;
  } else if (record.direction == Direction::DeviceToDevice) {
    totals_.bytes_device_to_device += record.bytes;
  }
  totals_.transfers += 1;
  totals_.transfer_ms += record.duration_ms;
  const bool in_step = step_ >= 0;
  const bool over_h2d = in_step && budget_.max_host_to_device_bytes >= 0 &&
                        step_h2d_bytes_ > budget_.max_host_to_device_bytes;
  const bool over_d2h = in_step && budget_.max_device_to_host_bytes >= 0 &&
                        step_d2h_bytes_ > budget_.max_device_to_host_bytes;
  if (!over_h2d && !over_d2h) {
    transfers_.push_back(std::move(record));
    return;
  }
  // Over a budget: the copy happened and stays recorded. The error names the step, the bytes, the budget, and the
  // copy that went over as a user finds it in the code ("4 bytes cpu -> sim:0 from pageable memory, blocking,
  // label 'to()'").
  const std::string last_copy = detail::concat(
      "; the last copy: ", record.bytes, " bytes ", record.source.str(), " -> ", record.target.str(),
      record.pinned ? " from pinned memory" : "",
      record.direction == Direction::HostToDevice && !record.pinned ? " from pageable memory" : "",
      record.blocking ? ", blocking" : ", non-blocking", ", label '", detail::printable(record.label), "'");
  transfers_.push_back(std::move(record));
  if (over_h2d)
    throw SyncPolicyViolation(detail::concat("Step ", step_, " moved ", step_h2d_bytes_,
                                             " bytes host->device, over its budget of ",
                                             budget_.max_host_to_device_bytes, " bytes", last_copy,
                                             ". Keep the data resident on the device, or raise the budget"));
  throw SyncPolicyViolation(detail::concat("Step ", step_, " moved ", step_d2h_bytes_,
                                           " bytes device->host, over its budget of ",
                                           budget_.max_device_to_host_bytes, " bytes", last_copy,
                                           ". Read values back only at log steps, or raise the budget"));
}

void Ledger::check_sync_allowed(Device device, const std::string& reason) {
  switch (t_sync_policy) {
    case SyncPolicy::Allow: break;
    case SyncPolicy::Warn:
      std::fprintf(stderr, "ferry: warning: host sync on %s (%s) while the sync policy is 'warn'\n",
                   device.str().c_str(), reason.c_str());
      break;
    case SyncPolicy::Error:
      throw SyncPolicyViolation(detail::concat(
          "Host sync on ", device.str(), " (", reason,
          ") is forbidden by the current sync policy 'error'. Read values back only at log steps, "
          "or widen the policy with ferry::SyncPolicyGuard(SyncPolicy::Allow)"));
  }
  std::lock_guard lock(mutex_);
  // A disabled ledger counts nothing, so it holds no budget either (the sync policy above still applies).
  if (enabled_ && step_ >= 0 && budget_.max_syncs >= 0 && step_syncs_ + 1 > budget_.max_syncs) {
    throw SyncPolicyViolation(detail::concat("Step ", step_, " asked for host sync number ", step_syncs_ + 1,
                                             " (", reason, " on ", device.str(), "), over its budget of ",
                                             budget_.max_syncs, " per step"));
  }
}

void Ledger::record_sync(SyncRecord record) {
  std::lock_guard lock(mutex_);
  if (!enabled_) return;
  record.step = step_;
  totals_.syncs += 1;
  totals_.sync_ms += record.duration_ms;
  step_syncs_ += 1;
  syncs_.push_back(std::move(record));
}

void Ledger::record_collective(CollectiveRecord record) {
  std::lock_guard lock(mutex_);
  if (!enabled_) return;
  record.step = step_;
  totals_.collectives += 1;
  totals_.collective_bytes += record.bytes;
  totals_.collective_ms += record.duration_ms;
  totals_.collective_wait_ms += record.wait_ms;
  collectives_.push_back(std::move(record));
}

std::vector<TransferRecord> Ledger::transfers() const {
  std::lock_guard lock(mutex_);
  return transfers_;
}
std::vector<SyncRecord> Ledger::syncs() const {
  std::lock_guard lock(mutex_);
  return syncs_;
}
std::vector<CollectiveRecord> Ledger::collectives() const {
  std::lock_guard lock(mutex_);
  return collectives_;
}
Ledger::Totals Ledger::totals() const {
  std::lock_guard lock(mutex_);
  return totals_;
}

}  // namespace ferry
