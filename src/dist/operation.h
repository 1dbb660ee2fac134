// operation.h — the in-flight state behind a Work (progress, completion, ledger record) and the engine that drives
// a group's collectives in launch order. Not here: how a backend moves bytes (mpi_/nccl_process_group.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/dist/process_group.h"

namespace ferry::dist {

class ProgressEngine;

struct Work::Operation {
  virtual ~Operation() = default;

  // Advance without blocking; true once the bytes have all arrived.
  virtual bool progress() = 0;
  // Once, after progress() said true: copy staged results back, divide for Avg.
  virtual void finish() {}
  // After a timeout: stop what can be stopped (NCCL aborts its communicator).
  virtual void abort() noexcept {}

  // Filled by the group at launch.
  std::string op;     // "all_reduce", ...
  std::string label;  // "gradient bucket 0", or ""
  std::string backend;
  std::string algorithm;  // CollectiveRecord::algorithm
  Device device;
  std::int64_t bytes = 0;  // payload, bytes
  int rank = 0, world_size = 1;
  double timeout_s = kDefaultTimeoutSeconds;
  double start_ms = 0;     // ledger clock
  double wait_ms = 0;      // host blocked in wait()
  double waiting_since_ms = -1;  // ledger clock when wait() began; -1 while nobody waits
  bool host_sync = false;  // completion is a host wait on a device (NCCL): recorded as a sync
  bool done = false;
  std::shared_ptr<ProgressEngine> engine;

  std::string description() const;  // "all_reduce (gradient bucket 0, 1.2 MB)"
};

// The collectives of one group, in launch order. Polling advances each (an MPI ring moves its next
// step only when polled, and a peer may be waiting on an earlier collective than the one being waited
// on), finishes the completed ones in order and records them in the ledger.
class ProgressEngine {
 public:
  void add(std::shared_ptr<Work::Operation> operation);
  void poll_all();
  bool idle() const { return in_flight_.empty(); }
  // Every collective in flight, failed: keep their buffers alive (the runtime may still write them).
  void abandon() noexcept;
  // At a group's end: polls until every collective is done or `timeout_s` seconds have passed, and says whether
  // none is left in flight. A poll that fails ends it (that collective is then abandoned). Never throws.
  bool drain(double timeout_s) noexcept;

 private:
  std::vector<std::shared_ptr<Work::Operation>> in_flight_;
};

// Whether a waiting rank should give its core away between polls: more ranks than cores on this host,
// or Open MPI says so (mpi_yield_when_idle under --oversubscribe).
bool should_yield_while_waiting(int local_size);
void set_local_size_for_waiting(int local_size);

}  // namespace ferry::dist
