// ferry/ledger.h — the record of every host<->device crossing and every host sync (invariant 5),
// with the step and phase each happened in, and the policy that can forbid syncs.
// Not here: reports and predictions (ferry/report.h, ferry/cost_model.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/device.h"

namespace ferry {

enum class Direction : std::uint8_t { HostToDevice, DeviceToHost, DeviceToDevice, HostToHost };
std::string_view direction_name(Direction direction);  // "host->device", ...

struct TransferRecord {
  Direction direction = Direction::HostToDevice;
  Device source, target;
  std::int64_t bytes = 0;
  bool pinned = false;     // host side page-locked
  bool blocking = true;    // asked as blocking (non_blocking = false); a non_blocking copy with pinned = false
                           // (pageable host memory) made the host wait too: reports count it as pageable_non_blocking
  double start_ms = 0;     // since the ledger's epoch (host clock)
  double duration_ms = 0;  // host-measured: the whole copy when blocking, the enqueue when not
  std::int64_t step = -1;  // training step, -1 outside steps
  std::string label;
};

struct SyncRecord {
  Device device;
  std::string reason;      // "item()", "cpu()", "synchronize()", "blocking copy", ...
  double start_ms = 0;
  double duration_ms = 0;  // how long the host waited
  std::int64_t step = -1;
};

// One collective of a data-parallel job (ferry/dist/process_group.h): what it carried and how long the
// host saw it take. Launch to completion includes time hidden behind other work (backward); wait_ms is
// the part the host sat blocked in wait().
struct CollectiveRecord {
  std::string op;          // "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"
  std::string backend;     // "mpi", "nccl"
  std::string algorithm;   // how the bytes moved: "ring", "recursive doubling", "MPI_Iallreduce", ..., "NCCL"
  Device device;           // where the tensor lives (mpi stages non-host tensors through host memory)
  std::int64_t bytes = 0;  // payload on this rank: the tensor's bytes (all_gather/reduce_scatter: the larger side)
  int world_size = 1;      // ranks taking part
  double start_ms = 0;     // launch, since the ledger's epoch (host clock)
  double duration_ms = 0;  // launch to completion as seen by the host
  double wait_ms = 0;      // of which the host was blocked in wait()
  std::int64_t step = -1;
  std::string label;       // "gradient bucket 0", ...
};

// What may happen at a host sync, or at a non_blocking copy from pageable memory.
enum class SyncPolicy : std::uint8_t { Allow, Warn, Error };

// Scoped, thread-local: while alive, syncs on this thread follow `policy`.
class SyncPolicyGuard {
 public:
  explicit SyncPolicyGuard(SyncPolicy policy);
  ~SyncPolicyGuard();
  SyncPolicyGuard(const SyncPolicyGuard&) = delete;
  SyncPolicyGuard& operator=(const SyncPolicyGuard&) = delete;

 private:
  SyncPolicy previous_;
};
SyncPolicy current_sync_policy();

// Per-step limits; a step that exceeds one throws SyncPolicyViolation at the crossing that broke it.
struct StepBudget {
  std::int64_t max_syncs = -1;                 // -1 = no limit
  std::int64_t max_host_to_device_bytes = -1;  // bytes; -1 = no limit
  std::int64_t max_device_to_host_bytes = -1;
};

class Ledger {
 public:
  static Ledger& global();

  void record_transfer(TransferRecord record);
  // Checks the sync policy first (throws SyncPolicyViolation under Error), then records.
  void check_sync_allowed(Device device, const std::string& reason);
  void record_sync(SyncRecord record);
  void record_collective(CollectiveRecord record);

  void set_enabled(bool enabled);  // records nothing while disabled (counters too) and checks no budget
  bool enabled() const;
  void clear();
  double now_ms() const;  // host clock since the epoch

  // Steps: records between begin_step(n) and end_step() carry step n.
  void begin_step(std::int64_t step);
  void end_step();
  std::int64_t current_step() const;
  void set_budget(const StepBudget& budget);

  std::vector<TransferRecord> transfers() const;
  std::vector<SyncRecord> syncs() const;
  std::vector<CollectiveRecord> collectives() const;

  struct Totals {
    std::int64_t transfers = 0, syncs = 0;
    std::int64_t bytes_host_to_device = 0, bytes_device_to_host = 0, bytes_device_to_device = 0;
    double transfer_ms = 0, sync_ms = 0;
    std::int64_t collectives = 0, collective_bytes = 0;  // collective_bytes: payload summed (bytes)
    double collective_ms = 0, collective_wait_ms = 0;    // launch to completion; host blocked in wait()
  };
  Totals totals() const;

 private:
  Ledger();
  mutable std::mutex mutex_;
  bool enabled_ = true;
  std::chrono::steady_clock::time_point epoch_;
  std::int64_t step_ = -1;
  StepBudget budget_;
  std::int64_t step_syncs_ = 0, step_h2d_bytes_ = 0, step_d2h_bytes_ = 0;
  std::vector<TransferRecord> transfers_;
  std::vector<SyncRecord> syncs_;
  std::vector<CollectiveRecord> collectives_;
  Totals totals_;
};

}  // namespace ferry
