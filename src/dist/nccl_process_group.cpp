// nccl_process_group.cpp — (FERRY_HAVE_NCCL) NCCL for cuda tensors: unique id broadcast over MPI, a stream of its
// own, completion polled on an event, abort on timeout. Not here: MPI's start, waiting, the ledger (process_group.cpp).
#ifdef FERRY_HAVE_NCCL

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <exception>

#include "backends.h"
#include "ferry/backend.h"
#include "ferry/ledger.h"
#include "operation.h"

namespace ferry::dist {

namespace comm_check {
void check_status(ncclResult_t status, const char* call, const char* file, int line) {
  if (status == ncclSuccess || status == ncclInProgress) return;
  throw_comm_error("NCCL", fmt::format("{} ({})", static_cast<int>(status), ncclGetErrorString(status)), call, file,
                   line);
}
// CUDA calls of this file report through the same door (a cudaError_t is not an MPI int).
void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw_comm_error("CUDA", fmt::format("{} ({})", static_cast<int>(status), cudaGetErrorString(status)), call, file,
                   line);
}
}  // namespace comm_check

#define FERRY_COMM_CUDA_CHECK(call) ::ferry::dist::comm_check::check_cuda((call), #call, __FILE__, __LINE__)

namespace {
// The group's device current while its events are made and recorded (an event belongs to the device current at
// its creation; recorded on another device's stream it is an invalid resource handle), whichever device the
// calling thread had; put back after.
class OnDevice {
 public:
  explicit OnDevice(int index) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != index) FERRY_COMM_CUDA_CHECK(cudaSetDevice(index));
  }
  ~OnDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = -1;
};

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::UInt8:
    case DType::Bool: return ncclUint8;
    case DType::Float16: return ncclFloat16;  // NCCL sums these in float32 and rounds at each hop
    case DType::BFloat16: return ncclBfloat16;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Avg ? ncclAvg : ncclSum; }

// The communicator, shared by the group and its operations: aborted once, by whoever meets a failure.
struct SharedComm {
  ncclComm_t handle = nullptr;
  void abort() noexcept {
    if (handle) ncclCommAbort(handle);  // kernels waiting on a dead peer return; the communicator is gone
    handle = nullptr;
  }
};

// One NCCL call on the group's stream, done when the event recorded after it has passed.
struct NcclOperation final : Work::Operation {
  cudaEvent_t done_event = nullptr;
  std::shared_ptr<SharedComm> comm;
  Tensor keep_alive[2];  // the tensors the kernels read and write

  ~NcclOperation() override {
    if (done_event) cudaEventDestroy(done_event);
  }
  bool progress() override {
    const cudaError_t status = cudaEventQuery(done_event);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) FERRY_COMM_CUDA_CHECK(status);
    ncclResult_t async_error = ncclSuccess;
    if (!comm->handle) return false;  // aborted: the wait runs into its timeout
    FERRY_COMM_CHECK(ncclCommGetAsyncError(comm->handle, &async_error));
    FERRY_COMM_CHECK(async_error);
    return false;
  }
  void abort() noexcept override { comm->abort(); }
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(int rank, int world_size, int local_rank, int local_size, Device device, double timeout_s)
      : ProcessGroup(rank, world_size, local_rank, local_size, device, timeout_s),
        engine_(std::make_shared<ProgressEngine>()), comm_(std::make_shared<SharedComm>()) {
    FERRY_COMM_CUDA_CHECK(cudaSetDevice(device.index));
    // Rank 0 draws the id; MPI carries it to the others (bounded like every wait).
    ncclUniqueId id{};
    if (rank == 0) FERRY_COMM_CHECK(ncclGetUniqueId(&id));
    MPI_Request request = MPI_REQUEST_NULL;
    FERRY_COMM_CHECK(MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD, &request));
    wait_mpi_request(request, "broadcast (NCCL unique id)", timeout_s);
    FERRY_COMM_CHECK(ncclCommInitRank(&comm_->handle, world_size, id, rank));
    FERRY_COMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  ~NcclProcessGroup() override {
    if (std::uncaught_exceptions() > 0) {  // failing: peers may be gone
      engine_->abandon();
      comm_->abort();
      return;
    }
    if (!engine_->drain(timeout_s())) {
      engine_->abandon();
      comm_->abort();
    } else if (comm_->handle) {
      ncclCommDestroy(comm_->handle);
      comm_->handle = nullptr;
    }
    cudaStreamDestroy(stream_);
  }

  CommBackend backend() const override { return CommBackend::NCCL; }

 protected:
  Work do_all_reduce(const Tensor& tensor, ReduceOp op, const std::string& label) override {
    return run("all_reduce", label, static_cast<std::int64_t>(tensor.nbytes()), tensor, Tensor(), [&] {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<std::size_t>(tensor.numel()),
                           nccl_type(tensor.dtype()), nccl_op(op), comm_->handle, stream_);
    });
  }
  Work do_broadcast(const Tensor& tensor, int root, const std::string& label) override {
    return run("broadcast", label, static_cast<std::int64_t>(tensor.nbytes()), tensor, Tensor(), [&] {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<std::size_t>(tensor.numel()),
                           nccl_type(tensor.dtype()), root, comm_->handle, stream_);
    });
  }
  Work do_all_gather(const Tensor& output, const Tensor& input, const std::string& label) override {
    return run("all_gather", label, static_cast<std::int64_t>(output.nbytes()), output, input, [&] {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<std::size_t>(input.numel()),
                           nccl_type(input.dtype()), comm_->handle, stream_);
    });
  }
  Work do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, const std::string& label) override {
    return run("reduce_scatter", label, static_cast<std::int64_t>(input.nbytes()), output, input, [&] {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<std::size_t>(output.numel()),
                               nccl_type(input.dtype()), nccl_op(op), comm_->handle, stream_);
    });
  }
  Work do_barrier() override {
    // One float summed across the ranks: every rank's stream has reached this point.
    if (!barrier_token_.defined()) barrier_token_ = make_tensor({1}, {.device = device()});
    Tensor token = barrier_token_;
    return run("barrier", "", 0, token, Tensor(), [&] {
      return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm_->handle, stream_);
    });
  }

 private:
  template <typename Call>
  Work run(const char* name, const std::string& label, std::int64_t bytes, const Tensor& a, const Tensor& b,
           Call&& call) {
    FERRY_CHECK(comm_->handle != nullptr, BackendError, "The NCCL communicator was aborted after an earlier failure on ",
                comm_check::rank_text());
    auto op = std::make_shared<NcclOperation>();
    op->op = name;
    op->label = label;
    op->backend = "nccl";
    op->algorithm = "NCCL";  // NCCL picks ring or tree itself
    op->device = device();
    op->bytes = bytes;
    op->rank = rank();
    op->world_size = world_size();
    op->timeout_s = timeout_s();
    op->start_ms = Ledger::global().now_ms();
    op->host_sync = true;  // wait() blocks the host until the device has finished
    op->engine = engine_;
    op->comm = comm_;
    op->keep_alive[0] = a;
    op->keep_alive[1] = b;
    // The comm stream starts after the work queued so far on the compute stream (the gradients): an event,
    // no host wait. The compute stream does not wait for the collective: the rest of backward runs beside
    // it (DDP's overlap). What reads the result comes after wait(), which returns once the collective's
    // event has passed, so it is ordered after it on any stream.
    Backend& be = ferry::backend(device());
    const auto compute = static_cast<cudaStream_t>(be.compute_stream(device().index).handle);
    const OnDevice on_device(device().index);
    cudaEvent_t ready = nullptr;
    FERRY_COMM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    FERRY_COMM_CUDA_CHECK(cudaEventRecord(ready, compute));
    FERRY_COMM_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);
    // Made before the call: once NCCL has the buffers, nothing may throw before the engine holds them alive.
    FERRY_COMM_CUDA_CHECK(cudaEventCreateWithFlags(&op->done_event, cudaEventDisableTiming));
    FERRY_COMM_CHECK(call());
    FERRY_COMM_CUDA_CHECK(cudaEventRecord(op->done_event, stream_));
    engine_->add(op);
    return Work(std::move(op));
  }

  std::shared_ptr<ProgressEngine> engine_;
  std::shared_ptr<SharedComm> comm_;
  cudaStream_t stream_ = nullptr;
  Tensor barrier_token_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_process_group(const ProcessGroupOptions& options) {
  int rank = 0, size = 1;
  FERRY_COMM_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  FERRY_COMM_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  const LocalRanks local = local_ranks();
  return std::make_unique<NcclProcessGroup>(rank, size, local.rank, local.size, options.device, options.timeout_s);
}

}  // namespace ferry::dist

#endif  // FERRY_HAVE_NCCL
