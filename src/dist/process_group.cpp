// process_group.cpp — what the backends share: checks before dispatch, Work's bounded wait, the progress engine,
// ledger records, backend choice. Not here: MPI itself (mpi_process_group.cpp), NCCL itself (nccl_process_group.cpp).
#include "ferry/dist/process_group.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "backends.h"
#include "check.h"
#include "ferry/ledger.h"
#include "ferry/units.h"
#include "operation.h"

namespace ferry::dist {

std::string_view reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "avg"; }

std::string_view comm_backend_name(CommBackend backend) {
  switch (backend) {
    case CommBackend::Auto: return "auto";
    case CommBackend::MPI: return "mpi";
    case CommBackend::NCCL: return "nccl";
  }
  return "?";
}

CommBackend parse_comm_backend(std::string_view text) {
  if (text == "auto") return CommBackend::Auto;
  if (text == "mpi") return CommBackend::MPI;
  if (text == "nccl") return CommBackend::NCCL;
  throw InvalidArgument(ferry::detail::concat("Unknown communication backend '", text, "': expected auto, mpi or nccl"));
}

bool mpi_built() {
#ifdef FERRY_HAVE_MPI
  return true;
#else
  return false;
#endif
}

bool nccl_built() {
#ifdef FERRY_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

namespace {
int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (!value || !*value) return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  return end && *end == '\0' ? static_cast<int>(parsed) : fallback;
}
}  // namespace

LaunchInfo launch_info() {
  LaunchInfo info;
  // Open MPI's names first, then the PMI names MPICH and Slurm use.
  info.rank = env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", 0));
  info.world_size = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 1));
  info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", info.rank));
  info.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("MPI_LOCALNRANKS", info.world_size));
  return info;
}

// --- rank text and the status check ---------------------------------------------------------------

namespace comm_check {
namespace {
int g_rank = -1, g_world_size = 0;
}
std::string rank_text() {
  return g_rank < 0 ? std::string("rank ? (MPI not started)") : fmt::format("rank {} of {}", g_rank, g_world_size);
}
void set_rank_text(int rank, int world_size) {
  g_rank = rank;
  g_world_size = world_size;
}
void throw_comm_error(const char* library, const std::string& what, const char* call, const char* file, int line) {
  throw BackendError(fmt::format("{} error {} in {} at {}:{} on {}. If a peer rank died, this rank stops too.",
                                 library, what, call, file, line, rank_text()));
}
}  // namespace comm_check

// --- operations, the engine, waiting ----------------------------------------------------------------

std::string Work::Operation::description() const {
  std::string inside = label;
  if (bytes > 0) inside += (inside.empty() ? "" : ", ") + format_bytes(static_cast<double>(bytes));
  return inside.empty() ? op : fmt::format("{} ({})", op, inside);
}

namespace {
// Decided once when a group starts (set_local_size_for_waiting), not on every wait: the core count comes from
// sysfs (std::thread::hardware_concurrency opens /sys/devices/system/cpu/online), which cost ~8 us a wait and
// halved the all-reduce rate at 64 KiB (docs/distributed.md).
bool g_yield_while_waiting = false;

// A completed operation's ledger records: the collective, and the host wait when it was one on a device.
void complete(Work::Operation& op) {
  Ledger& ledger = Ledger::global();
  const double now = ledger.now_ms();
  const double waiting_since_ms = op.waiting_since_ms;
  if (waiting_since_ms >= 0) op.wait_ms += now - waiting_since_ms;
  op.done = true;
  CollectiveRecord record;
  record.op = op.op;
  record.backend = op.backend;
  record.algorithm = op.algorithm;
  record.device = op.device;
  record.bytes = op.bytes;
  record.world_size = op.world_size;
  record.start_ms = op.start_ms;
  record.duration_ms = now - op.start_ms;
  record.wait_ms = op.wait_ms;
  record.label = op.label;
  ledger.record_collective(std::move(record));
  if (op.host_sync && waiting_since_ms >= 0) {
    ledger.record_sync({.device = op.device, .reason = "wait(" + op.op + ")", .start_ms = waiting_since_ms,
                        .duration_ms = now - waiting_since_ms});
  }
}

// Operations the runtime may still write into after a failure: never freed.
std::vector<std::shared_ptr<Work::Operation>>& abandoned() {
  static auto* list = new std::vector<std::shared_ptr<Work::Operation>>();
  return *list;
}
}  // namespace

bool should_yield_while_waiting(int local_size) {
  const char* yield = std::getenv("OMPI_MCA_mpi_yield_when_idle");
  if (yield && std::string(yield) == "1") return true;
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 0 && static_cast<unsigned>(local_size) > cores;
}
void set_local_size_for_waiting(int local_size) { g_yield_while_waiting = should_yield_while_waiting(local_size); }

void ProgressEngine::add(std::shared_ptr<Work::Operation> operation) { in_flight_.push_back(std::move(operation)); }

void ProgressEngine::poll_all() {
  try {
    // In launch order: an earlier collective may be what a peer is waiting on.
    for (std::size_t i = 0; i < in_flight_.size();) {
      Work::Operation& op = *in_flight_[i];
      if (op.progress()) {
        std::shared_ptr<Work::Operation> finished = in_flight_[i];
        in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
        finished->finish();
        complete(*finished);
      } else {
        ++i;
      }
    }
  } catch (...) {
    abandon();
    throw;
  }
}

void ProgressEngine::abandon() noexcept {
  for (auto& op : in_flight_) {
    op->abort();
    abandoned().push_back(op);
  }
  in_flight_.clear();
}

bool ProgressEngine::drain(double timeout_s) noexcept {
  try {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!idle() && std::chrono::steady_clock::now() < deadline) poll_all();
  } catch (...) {  // poll_all abandoned what was in flight
  }
  return idle();
}

Work::Work(std::shared_ptr<Operation> operation) : operation_(std::move(operation)) {}

bool Work::completed() const { return !operation_ || operation_->done; }

bool Work::poll() {
  if (completed()) return true;
  operation_->engine->poll_all();
  return operation_->done;
}

void Work::wait(double timeout_s) {
  if (completed()) return;
  Operation& op = *operation_;
  const double limit = timeout_s < 0 ? op.timeout_s : timeout_s;
  Ledger& ledger = Ledger::global();
  if (op.host_sync) ledger.check_sync_allowed(op.device, "wait(" + op.op + ")");
  using Clock = std::chrono::steady_clock;
  const auto begin = Clock::now();
  const auto deadline = begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  const bool yield = g_yield_while_waiting;
  op.waiting_since_ms = ledger.now_ms();  // complete() adds the wait to the ledger record
  constexpr std::int64_t kSpinPolls = 2000;  // polls before the wait gives its core away or naps
  for (std::int64_t polls = 0;; ++polls) {
    op.engine->poll_all();
    if (op.done) return;
    // While spinning, the clock is read every 64th poll only: read on every poll it took 8 % of a 1 MiB
    // all-reduce's profile on 2 ranks, time the loop did not spend driving MPI's progress.
    if (polls < kSpinPolls && polls % 64 != 63) continue;
    const auto now = Clock::now();
    if (now >= deadline) {
      op.engine->abandon();
      const double waited_s = std::chrono::duration<double>(now - begin).count();
      throw CollectiveTimeout(fmt::format(
          "Collective timed out: {} on {} did not complete within {:.0f} s ({} backend, waited {:.1f} s). A peer "
          "rank died, stalled, or did not call the same collective; this rank stops.",
          op.description(), comm_check::rank_text(), limit, op.backend, waited_s));
    }
    // Spin briefly (latency), then give the core away when ranks outnumber cores, or nap once the wait
    // is long (another rank is clearly behind).
    if (polls < kSpinPolls) continue;
    if (yield) {
      std::this_thread::yield();
    } else if (now - begin > std::chrono::milliseconds(20)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// --- the group: checks, then dispatch ---------------------------------------------------------------

ProcessGroup::ProcessGroup(int rank, int world_size, int local_rank, int local_size, Device device, double timeout_s)
    : rank_(rank), world_size_(world_size), local_rank_(local_rank), local_size_(local_size), device_(device),
      timeout_s_(timeout_s) {
  FERRY_CHECK(timeout_s > 0, InvalidArgument, "The collective timeout must be > 0 seconds, got ", timeout_s);
}

void ProcessGroup::set_timeout(double seconds) {
  FERRY_CHECK(seconds > 0, InvalidArgument, "The collective timeout must be > 0 seconds, got ", seconds);
  timeout_s_ = seconds;
}

void ProcessGroup::check_tensor(const char* op, const char* what, const Tensor& tensor) const {
  FERRY_CHECK(tensor.defined(), InvalidArgument, op, "(): the ", what, " tensor is undefined");
  FERRY_CHECK(tensor.device() == device_, DeviceMismatch, op, "(): the ", what, " tensor is on ",
              tensor.device().str(), " but this process group communicates ", device_.str(),
              " tensors; move it first (", what, ".to(group.device()))");
  FERRY_CHECK(tensor.is_contiguous(), InvalidArgument, op, "(): the ", what, " tensor (shape ",
              shape_str(tensor.shape()), ") must be contiguous; call .contiguous() first");
}

namespace {
void check_reducible(const char* op, const Tensor& tensor, ReduceOp reduce) {
  FERRY_CHECK(tensor.dtype() != DType::Bool, InvalidArgument, op, "(): cannot reduce bool tensors; use uint8");
  FERRY_CHECK(reduce != ReduceOp::Avg || is_floating(tensor.dtype()), InvalidArgument, op,
              "(): avg needs a floating dtype, got ", dtype_name(tensor.dtype()), "; use sum");
}
}  // namespace

Work ProcessGroup::all_reduce_async(const Tensor& tensor, ReduceOp op, const std::string& label) {
  check_tensor("all_reduce", "input", tensor);
  check_reducible("all_reduce", tensor, op);
  return do_all_reduce(tensor, op, label);
}

Work ProcessGroup::broadcast_async(const Tensor& tensor, int root, const std::string& label) {
  check_tensor("broadcast", "input", tensor);
  FERRY_CHECK(root >= 0 && root < world_size_, InvalidArgument, "broadcast(): root rank ", root,
              " is outside 0..", world_size_ - 1);
  return do_broadcast(tensor, root, label);
}

Work ProcessGroup::all_gather_async(const Tensor& output, const Tensor& input, const std::string& label) {
  check_tensor("all_gather", "input", input);
  check_tensor("all_gather", "output", output);
  FERRY_CHECK(output.dtype() == input.dtype(), DTypeMismatch, "all_gather(): output is ", dtype_name(output.dtype()),
              ", input is ", dtype_name(input.dtype()));
  FERRY_CHECK(output.numel() == input.numel() * world_size_, ShapeMismatch, "all_gather(): expected an output of ",
              world_size_, " x ", input.numel(), " = ", input.numel() * world_size_, " elements (world size x input), got ",
              output.numel(), " (shape ", shape_str(output.shape()), ")");
  return do_all_gather(output, input, label);
}

Work ProcessGroup::reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op,
                                        const std::string& label) {
  check_tensor("reduce_scatter", "input", input);
  check_tensor("reduce_scatter", "output", output);
  check_reducible("reduce_scatter", input, op);
  FERRY_CHECK(output.dtype() == input.dtype(), DTypeMismatch, "reduce_scatter(): output is ",
              dtype_name(output.dtype()), ", input is ", dtype_name(input.dtype()));
  FERRY_CHECK(input.numel() == output.numel() * world_size_, ShapeMismatch, "reduce_scatter(): expected an input of ",
              world_size_, " x ", output.numel(), " = ", output.numel() * world_size_,
              " elements (world size x output), got ", input.numel(), " (shape ", shape_str(input.shape()), ")");
  return do_reduce_scatter(output, input, op, label);
}

Work ProcessGroup::barrier_async() { return do_barrier(); }

void ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op, const std::string& label) {
  all_reduce_async(tensor, op, label).wait();
}
void ProcessGroup::broadcast(const Tensor& tensor, int root, const std::string& label) {
  broadcast_async(tensor, root, label).wait();
}
void ProcessGroup::all_gather(const Tensor& output, const Tensor& input, const std::string& label) {
  all_gather_async(output, input, label).wait();
}
void ProcessGroup::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, const std::string& label) {
  reduce_scatter_async(output, input, op, label).wait();
}
void ProcessGroup::barrier() { barrier_async().wait(); }

// --- choosing a backend -----------------------------------------------------------------------------

std::unique_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options) {
  FERRY_CHECK(mpi_built(), NotSupported,
              "Distributed training needs MPI, but this ferry was built without MPI: install Open MPI "
              "(apt-get install libopenmpi-dev openmpi-bin) and rebuild");
  FERRY_CHECK(options.timeout_s > 0, InvalidArgument, "The collective timeout must be > 0 seconds, got ",
              options.timeout_s);
  start_mpi();
  CommBackend backend = options.backend;
  const bool cuda = options.device.is_cuda();
  if (backend == CommBackend::NCCL) {
    FERRY_CHECK(cuda, InvalidArgument, "The nccl backend communicates cuda tensors only, but the device is ",
                options.device.str(), "; use the mpi backend (or auto)");
    FERRY_CHECK(nccl_built(), NotSupported,
                "The nccl backend is not in this build (it needs the CUDA backend and libnccl); use the mpi backend");
  }
  if (backend != CommBackend::MPI && cuda) {
    const std::string shared = ranks_sharing_a_device(options.device);
    if (backend == CommBackend::NCCL) {
      FERRY_CHECK(shared.empty(), InvalidArgument, "NCCL needs one GPU per rank, but ", shared,
                  "; use the mpi backend to stage through host memory, or start fewer ranks per host");
    } else {
      backend = nccl_built() && shared.empty() ? CommBackend::NCCL : CommBackend::MPI;
    }
  }
  if (backend == CommBackend::Auto) backend = CommBackend::MPI;
  std::unique_ptr<ProcessGroup> group =
      backend == CommBackend::NCCL ? make_nccl_process_group(options) : make_mpi_process_group(options);
  set_local_size_for_waiting(group->local_size());
  return group;
}

}  // namespace ferry::dist
