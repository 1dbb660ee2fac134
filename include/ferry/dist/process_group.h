// ferry/dist/process_group.h — the ranks of a job and their collectives, every wait bounded: MPI (host memory,
// device tensors staged), NCCL (cuda). Not here: buckets (ddp.h), batch slicing (sampler.h), launching (mpirun).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/device.h"
#include "ferry/error.h"
#include "ferry/tensor.h"

namespace ferry::dist {

// Avg = Sum / world_size (floating dtypes only). float16 and bfloat16 are summed in float32 pair by pair and rounded
// back after each addition (as NCCL does), so a sum over N ranks carries N - 1 roundings.
enum class ReduceOp : std::uint8_t { Sum, Avg };
std::string_view reduce_op_name(ReduceOp op);     // "sum", "avg"

// Which engine moves the bytes. Auto: NCCL for cuda tensors when every rank has a GPU of its own and
// NCCL is built in; MPI otherwise (cuda tensors then cross to pinned host buffers and back).
enum class CommBackend : std::uint8_t { Auto, MPI, NCCL };
std::string_view comm_backend_name(CommBackend backend);  // "auto", "mpi", "nccl"
CommBackend parse_comm_backend(std::string_view text);    // throws InvalidArgument listing the choices

// A collective that did not complete before its deadline: a peer rank died, stalled, or never called it.
class CollectiveTimeout : public BackendError {
  using BackendError::BackendError;
};

bool mpi_built();   // this ferry was built with MPI (FERRY_HAVE_MPI)
bool nccl_built();  // this ferry was built with NCCL (FERRY_HAVE_NCCL)

inline constexpr double kDefaultTimeoutSeconds = 60;  // s, per wait

// A collective in flight, returned by the *_async calls; copies share it. A default Work is complete.
// Until it completes, the tensors it was given must not be read or written.
class Work {
 public:
  struct Operation;  // a backend's in-flight state (src/dist/operation.h)

  Work() = default;
  explicit Work(std::shared_ptr<Operation> operation);

  // Drives every collective in flight on the group a step further (MPI moves bytes only while polled)
  // and says whether this one is done. Never blocks; throws BackendError when the runtime fails.
  bool poll();
  // Blocks until the collective completes: results are then in place (copied back to the device when
  // staged; divided by world_size for Avg). Throws CollectiveTimeout after `timeout_s` seconds (< 0: the
  // group's timeout) naming the op, the rank and the seconds waited; the job cannot continue after that.
  void wait(double timeout_s = -1);
  bool completed() const;

 private:
  std::shared_ptr<Operation> operation_;
};

struct ProcessGroupOptions {
  CommBackend backend = CommBackend::Auto;
  Device device = kCPU;                       // where the tensors of its collectives live
  double timeout_s = kDefaultTimeoutSeconds;  // s, the deadline of every wait() that names none
};

// Every rank of the job (MPI_COMM_WORLD). All ranks must call the same collectives in the same order
// with tensors of the same shape and dtype; tensors are contiguous and on device(). Results are in place.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }              // 0 .. world_size - 1
  int world_size() const { return world_size_; }  // N
  int local_rank() const { return local_rank_; }  // rank among the ranks on this host
  int local_size() const { return local_size_; }  // ranks on this host
  Device device() const { return device_; }
  double timeout_s() const { return timeout_s_; }
  void set_timeout(double seconds);  // > 0
  virtual CommBackend backend() const = 0;

  // tensor = op over every rank's tensor.
  Work all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::Sum, const std::string& label = "");
  // tensor = root's tensor.
  Work broadcast_async(const Tensor& tensor, int root = 0, const std::string& label = "");
  // output (world_size x n elements) = every rank's input (n elements) in rank order.
  Work all_gather_async(const Tensor& output, const Tensor& input, const std::string& label = "");
  // input (world_size x n elements); output (n elements) = op over every rank's slice [rank n, (rank+1) n).
  Work reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum,
                            const std::string& label = "");
  Work barrier_async();

  // The same, waiting with the group's timeout.
  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum, const std::string& label = "");
  void broadcast(const Tensor& tensor, int root = 0, const std::string& label = "");
  void all_gather(const Tensor& output, const Tensor& input, const std::string& label = "");
  void reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum,
                      const std::string& label = "");
  void barrier();

 protected:
  ProcessGroup(int rank, int world_size, int local_rank, int local_size, Device device, double timeout_s);
  // Arguments are checked before these are called.
  virtual Work do_all_reduce(const Tensor& tensor, ReduceOp op, const std::string& label) = 0;
  virtual Work do_broadcast(const Tensor& tensor, int root, const std::string& label) = 0;
  virtual Work do_all_gather(const Tensor& output, const Tensor& input, const std::string& label) = 0;
  virtual Work do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op,
                                 const std::string& label) = 0;
  virtual Work do_barrier() = 0;

 private:
  void check_tensor(const char* op, const char* what, const Tensor& tensor) const;
  int rank_, world_size_, local_rank_, local_size_;
  Device device_;
  double timeout_s_;
};

// Starts MPI once per process (errors returned, not fatal) and makes the group of every rank of the job.
// Under mpirun -np N: N ranks; run alone: world size 1. Throws NotSupported when ferry was built without
// MPI, InvalidArgument when the backend cannot serve the device (nccl for cpu, nccl with two ranks on
// one GPU), BackendError when the runtime fails.
std::unique_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});
// The rank and size of the job as the launcher set them (OMPI_COMM_WORLD_*, PMI_*), before MPI starts:
// {0, 1} outside a launcher. For choosing a device or thread count before init_process_group.
struct LaunchInfo {
  int rank = 0, world_size = 1, local_rank = 0, local_size = 1;
};
LaunchInfo launch_info();
bool is_initialized();  // MPI started by ferry (or by the program) and not yet finalized
// Ends MPI after a clean run. After an error, do not call it: exit non-zero and let mpirun stop the rest.
void finalize();

}  // namespace ferry::dist
