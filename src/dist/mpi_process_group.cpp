// mpi_process_group.cpp — the MPI backend: start/end, a pipelined ring all-reduce on non-blocking messages, MPI's
// non-blocking collectives, device tensors staged via host memory. Not here: waiting, ledger, checks (process_group.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <exception>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "../core/internal.h"
#include "backends.h"
#include "half_sum.h"
#include "ferry/backend.h"
#include "ferry/ledger.h"
#include "operation.h"

namespace ferry::dist {

#ifdef FERRY_HAVE_MPI

namespace comm_check {
void check_status(int mpi_status, const char* call, const char* file, int line) {
  if (mpi_status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(mpi_status, text, &length);
  int error_class = 0;
  MPI_Error_class(mpi_status, &error_class);
  throw_comm_error("MPI", fmt::format("{} ({})", error_class, std::string(text, static_cast<std::size_t>(length))),
                   call, file, line);
}
}  // namespace comm_check

namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::UInt8:
    case DType::Bool: return MPI_UINT8_T;
    case DType::Float16:
    case DType::BFloat16: return MPI_UINT16_T;  // their bits; a reduction of them uses ferry's own op (half_sum)
  }
  return MPI_BYTE;
}

int mpi_count(const char* op, std::int64_t elements) {
  FERRY_CHECK(elements <= INT_MAX, InvalidArgument, op, "(): ", elements,
              " elements is more than MPI's count limit of 2^31 - 1 per collective; split the tensor");
  return static_cast<int>(elements);
}

// The host memory MPI reads and writes for a tensor: the tensor itself on cpu; otherwise a host copy
// (page-locked for cuda) that crosses the link through ferry's door, so the ledger sees both crossings.
struct HostView {
  Tensor tensor;  // the caller's
  Tensor host;    // what MPI touches
  bool staged() const { return !host.is_same(tensor); }
  void* data() const { return host.data_ptr(); }
};

HostView host_view(const Tensor& tensor, bool copy_in, const char* label) {
  HostView view{tensor, tensor};
  if (tensor.device().is_cpu()) return view;
  view.host = make_tensor(tensor.shape(), {.device = kCPU, .dtype = tensor.dtype(),
                                           .pinned = tensor.device().is_cuda() && is_available(DeviceType::CUDA)});
  if (copy_in) ferry::detail::copy_between(view.host, tensor, false, label);
  return view;
}

void copy_back(const HostView& view, const char* label) {
  if (view.staged()) ferry::detail::copy_between(view.tensor, view.host, false, label);
}

void scale_for_avg(const HostView& view, ReduceOp op, int world_size) {
  if (op != ReduceOp::Avg || world_size == 1) return;
  Tensor host = view.host;
  if (!is_storage_only(host.dtype())) {
    host.mul_(1.0 / world_size);
    return;
  }
  // A 16-bit sum is divided in float32 and rounded once more, as PyTorch's x.div_(n) on a bfloat16 tensor does.
  host.copy_(host.to(DType::Float32).mul_(1.0 / world_size));
}

// MPI_Op functions for the 16-bit sums: MPI knows the buffers as uint16 (their bits), ferry adds them as numbers.
template <typename T>
void mpi_half_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  detail::add_into_half(static_cast<T*>(inout), static_cast<const T*>(in), *length);
}

// One non-blocking MPI call (Iallreduce, Ibcast, Iallgather, Ireduce_scatter_block, Ibarrier).
struct RequestOperation final : Work::Operation {
  MPI_Request request = MPI_REQUEST_NULL;
  HostView result;         // copied back to the device when done
  bool has_result = false;
  ReduceOp reduce = ReduceOp::Sum;
  HostView input;          // kept alive while MPI reads it

  bool progress() override {
    int flag = 0;
    FERRY_COMM_CHECK(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }
  void finish() override {
    if (!has_result) return;
    scale_for_avg(result, reduce, world_size);
    copy_back(result, "mpi staging (back)");
  }
};

template <typename T>
void add_into(void* destination, const void* source, std::int64_t count) {
  T* d = static_cast<T*>(destination);
  const T* s = static_cast<const T*>(source);
  for (std::int64_t i = 0; i < count; ++i) d[i] += s[i];
}

void add_into(DType dtype, void* destination, const void* source, std::int64_t count) {
  switch (dtype) {
    case DType::Float32: add_into<float>(destination, source, count); break;
    case DType::Float64: add_into<double>(destination, source, count); break;
    case DType::Int32: add_into<std::int32_t>(destination, source, count); break;
    case DType::Int64: add_into<std::int64_t>(destination, source, count); break;
    case DType::UInt8: add_into<std::uint8_t>(destination, source, count); break;
    case DType::Float16:
      detail::add_into_half(static_cast<Float16*>(destination), static_cast<const Float16*>(source), count);
      break;
    case DType::BFloat16:
      detail::add_into_half(static_cast<BFloat16*>(destination), static_cast<const BFloat16*>(source), count);
      break;
    case DType::Bool: FERRY_ASSERT(false, "bool tensors are not reduced");
  }
}

// A receive that learns the message's size before any byte lands: MPI_Improbe matches the message, MPI_Imrecv takes
// it only when it is the size this rank expects. A receive simply posted for fewer bytes than the peer sends is not
// safe: Open MPI's single-copy path writes the whole message on, past the buffer (measured: 19000 floats past a
// 1000-float receive), so ranks whose tensors differ in size corrupted each other's heap. Costs one probe per
// message and no extra message; the bytes still land straight in the buffer.
struct CheckedReceive {
  void* into = nullptr;
  std::int64_t count = 0;  // elements expected
  int source = 0, tag = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  bool matched = false;
};

// Advances `receive` a step without blocking; true once its bytes are in. A message of another size throws
// ShapeMismatch naming both sizes (the collective cannot go on: the ranks called it with different tensors).
bool progress_receive(CheckedReceive& receive, const Work::Operation& op, DType dtype, MPI_Comm comm) {
  const MPI_Datatype type = mpi_type(dtype);
  if (!receive.matched) {
    int found = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    FERRY_COMM_CHECK(MPI_Improbe(receive.source, receive.tag, comm, &found, &message, &status));
    if (!found) return false;
    int bytes = 0;
    FERRY_COMM_CHECK(MPI_Get_count(&status, MPI_BYTE, &bytes));
    const std::int64_t expected = receive.count * static_cast<std::int64_t>(element_size(dtype));
    if (bytes != expected) {
      // Take the message into a buffer of its own size first: the peer's send completes, nothing overflows.
      std::vector<char> drained(static_cast<std::size_t>(std::max(bytes, 1)));
      FERRY_COMM_CHECK(MPI_Mrecv(drained.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE));
      throw ShapeMismatch(fmt::format(
          "{}: rank {} sent {} bytes where {} were expected on rank {} of {} ({} {} elements): do the ranks' tensors "
          "have the same shape and dtype? Every rank must call the same collectives in the same order with the same "
          "tensors.",
          op.description(), receive.source, bytes, expected, op.rank, op.world_size, receive.count,
          dtype_name(dtype)));
    }
    FERRY_COMM_CHECK(MPI_Imrecv(receive.into, static_cast<int>(receive.count), type, &message, &receive.request));
    receive.matched = true;
  }
  int done = 0;
  FERRY_COMM_CHECK(MPI_Test(&receive.request, &done, MPI_STATUS_IGNORE));
  return done != 0;
}

// What the all-reduces ferry builds from MPI's point-to-point messages share: the buffer (staged for a device
// tensor), the messages' tag base, and the end (Avg divides, a staged result goes back to the device).
struct PointToPointAllReduce : Work::Operation {
  HostView view;
  ReduceOp reduce = ReduceOp::Sum;
  MPI_Comm comm = MPI_COMM_NULL;
  int tag = 0;  // this collective's tag base; + step
  DType dtype = DType::Float32;

  void finish() override {
    scale_for_avg(view, reduce, world_size);
    copy_back(view, "mpi staging (back)");
  }
};

// Ring all-reduce (the algorithm NCCL uses for large messages): the buffer is cut into N segments;
// N-1 steps of reduce-scatter leave rank r with the full sum of segment r+1, N-1 steps of all-gather
// pass the sums around. Each rank sends 2(N-1)/N of the buffer in all, the minimum. Within a step,
// segments travel in pieces so the sum of one piece overlaps the transfer of the next.
struct RingAllReduce final : PointToPointAllReduce {
  static constexpr const char* kAlgorithm = "ring";
  static constexpr std::int64_t kPieceBytes = 1 << 20;  // bytes per message

  std::vector<std::int64_t> segment;      // N + 1 boundaries, elements
  Tensor scratch;                         // (largest segment) incoming partial sums, host
  int step = 0;                           // 0 .. 2(N-1)
  bool posted = false;
  std::vector<CheckedReceive> receives;  // in the order the peer sends them: matched one after the other
  std::vector<MPI_Request> sends;
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces;  // (offset in segment, count) per receive
  std::vector<char> received;

  void start(std::int64_t count) {
    const int n = world_size;
    segment.resize(static_cast<std::size_t>(n) + 1);
    for (int i = 0; i <= n; ++i) segment[static_cast<std::size_t>(i)] = count * i / n;
    std::int64_t largest = 0;
    for (int i = 0; i < n; ++i) largest = std::max(largest, segment[i + 1] - segment[i]);
    scratch = make_tensor({largest}, {.device = kCPU, .dtype = dtype});
  }

  std::int64_t element() const { return static_cast<std::int64_t>(element_size(dtype)); }  // bytes

  char* at(std::int64_t element_index) const {
    return static_cast<char*>(view.data()) + element_index * element();
  }

  void post() {
    const int n = world_size, r = rank;
    const bool reducing = step < n - 1;
    const int s = reducing ? step : step - (n - 1);
    const int send_segment = ((reducing ? r - s : r + 1 - s) % n + n) % n;
    const int receive_segment = ((reducing ? r - s - 1 : r - s) % n + n) % n;
    const int right = (r + 1) % n, left = (r - 1 + n) % n;
    const std::int64_t piece = std::max<std::int64_t>(1, kPieceBytes / element());
    const MPI_Datatype type = mpi_type(dtype);
    receives.clear();
    sends.clear();
    pieces.clear();
    const std::int64_t receive_begin = segment[receive_segment], receive_length = segment[receive_segment + 1] - receive_begin;
    for (std::int64_t offset = 0; offset < receive_length; offset += piece) {
      const std::int64_t count = std::min(piece, receive_length - offset);
      void* into = reducing ? static_cast<char*>(scratch.data_ptr()) + offset * element()
                            : at(receive_begin + offset);
      receives.push_back({.into = into, .count = count, .source = left, .tag = tag + step});
      pieces.emplace_back(offset, count);
    }
    const std::int64_t send_begin = segment[send_segment], send_length = segment[send_segment + 1] - send_begin;
    for (std::int64_t offset = 0; offset < send_length; offset += piece) {
      const std::int64_t count = std::min(piece, send_length - offset);
      sends.push_back(MPI_REQUEST_NULL);
      FERRY_COMM_CHECK(MPI_Isend(at(send_begin + offset), static_cast<int>(count), type, right, tag + step, comm,
                                 &sends.back()));
    }
    received.assign(receives.size(), 0);
    posted = true;
  }

  bool progress() override {
    const int n = world_size;
    while (step < 2 * (n - 1)) {
      if (!posted) post();
      const bool reducing = step < n - 1;
      const int receive_segment = ((reducing ? rank - step - 1 : rank - (step - (n - 1))) % n + n) % n;
      bool all_received = true, unmatched_before = false;
      for (std::size_t i = 0; i < receives.size(); ++i) {
        if (received[i]) continue;
        // Pieces share a tag: a probe matches the earliest, so piece i is probed only once i - 1 is matched.
        if (unmatched_before || !progress_receive(receives[i], *this, dtype, comm)) {
          all_received = false;
          unmatched_before = unmatched_before || !receives[i].matched;
          continue;
        }
        received[i] = 1;
        if (reducing) {
          const auto [offset, count] = pieces[i];
          add_into(dtype, at(segment[receive_segment] + offset),
                   static_cast<char*>(scratch.data_ptr()) + offset * element(), count);
        }
      }
      int sent = 1;
      if (!sends.empty()) {
        FERRY_COMM_CHECK(MPI_Testall(static_cast<int>(sends.size()), sends.data(), &sent, MPI_STATUSES_IGNORE));
      }
      if (!all_received || !sent) return false;
      ++step;
      posted = false;
    }
    return true;
  }
};

// Recursive doubling (the textbook small-message all-reduce, among those MPI libraries pick from), for a power-of-two
// number of ranks: in step k each rank swaps its whole buffer with rank ^ 2^k and adds what it got, so
// log2(N) exchanges leave the sum everywhere. A small all-reduce is bound by message latency, and this
// takes log2(N) round trips where the ring takes 2(N-1), and none of the schedule MPI's non-blocking
// MPI_Iallreduce builds on every call (16 KiB on 2 ranks: 9.8 us through it, 6.6 us this way;
// docs/distributed.md). Partners add the same two partial sums in either order, which IEEE addition makes
// bit-identical: replicas agree.
struct DoublingAllReduce final : PointToPointAllReduce {
  static constexpr const char* kAlgorithm = "recursive doubling";
  std::int64_t count = 0;        // elements
  Tensor scratch;                // (count) the partner's partial sum, host
  int distance = 1;              // 2^step: the partner is rank ^ distance
  int step = 0;
  bool posted = false, received = false, sent = false;
  CheckedReceive receive;
  MPI_Request send = MPI_REQUEST_NULL;

  bool progress() override {
    while (distance < world_size) {
      const int partner = rank ^ distance;
      if (!posted) {
        receive = {.into = scratch.data_ptr(), .count = count, .source = partner, .tag = tag + step};
        FERRY_COMM_CHECK(MPI_Isend(view.data(), static_cast<int>(count), mpi_type(dtype), partner, tag + step, comm,
                                   &send));
        posted = true;
        received = sent = false;
      }
      if (!received) received = progress_receive(receive, *this, dtype, comm);
      if (!sent) {
        int flag = 0;
        FERRY_COMM_CHECK(MPI_Test(&send, &flag, MPI_STATUS_IGNORE));
        sent = flag != 0;
      }
      if (!received || !sent) return false;
      add_into(dtype, view.data(), scratch.data_ptr(), count);  // after the send: it read the buffer
      distance *= 2;
      ++step;
      posted = false;
    }
    return true;
  }
};

class MpiProcessGroup final : public ProcessGroup {
 public:
  // Below this many bytes an all-reduce is latency-bound: recursive doubling (or MPI's own, for a number of
  // ranks that is not a power of two) beats a ring.
  static constexpr std::int64_t kRingMinBytes = 64 * 1024;
  static constexpr int kTagStride = 8192;  // tags per collective: one per ring step (N <= 4096)

  MpiProcessGroup(MPI_Comm comm, int rank, int world_size, int local_rank, int local_size, Device device,
                  double timeout_s)
      : ProcessGroup(rank, world_size, local_rank, local_size, device, timeout_s), comm_(comm),
        engine_(std::make_shared<ProgressEngine>()) {
    void* value = nullptr;
    int found = 0;
    FERRY_COMM_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &found));
    const int tag_upper_bound = found ? *static_cast<int*>(value) : 32767;
    ring_tags_ = std::max(1, tag_upper_bound / kTagStride - 1);
    FERRY_CHECK(world_size <= kTagStride / 2, InvalidArgument, "The mpi backend supports at most ", kTagStride / 2,
                " ranks, got ", world_size);
    FERRY_COMM_CHECK(MPI_Op_create(&mpi_half_sum<Float16>, 1, &float16_sum_));
    FERRY_COMM_CHECK(MPI_Op_create(&mpi_half_sum<BFloat16>, 1, &bfloat16_sum_));
  }

  ~MpiProcessGroup() override {
    if (std::uncaught_exceptions() > 0) {  // failing: peers may be gone; free nothing MPI may still touch
      engine_->abandon();
      return;
    }
    // Collectives nobody waited for still own buffers MPI writes: let them finish (bounded), then free.
    if (!engine_->drain(timeout_s())) {
      engine_->abandon();
      return;  // never free a communicator with traffic in flight
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&comm_);
    MPI_Op_free(&float16_sum_);
    MPI_Op_free(&bfloat16_sum_);
  }

  CommBackend backend() const override { return CommBackend::MPI; }

 protected:
  Work do_all_reduce(const Tensor& tensor, ReduceOp op, const std::string& label) override {
    const std::int64_t count = tensor.numel();
    const auto bytes = static_cast<std::int64_t>(tensor.nbytes());
    if (world_size() > 1 && bytes >= kRingMinBytes && count >= world_size()) {
      auto ring = point_to_point<RingAllReduce>(tensor, op, label);
      ring->start(count);
      return launch(ring);
    }
    const bool power_of_two = (world_size() & (world_size() - 1)) == 0;
    if (world_size() > 1 && power_of_two && count > 0) {
      auto doubling = point_to_point<DoublingAllReduce>(tensor, op, label);
      doubling->count = count;
      doubling->scratch = make_tensor({count}, {.device = kCPU, .dtype = tensor.dtype()});
      return launch(doubling);
    }
    auto request = std::make_shared<RequestOperation>();
    request->result = host_view(tensor, true, "mpi staging (all_reduce)");
    request->has_result = true;
    request->reduce = op;
    fill(*request, "all_reduce", "MPI_Iallreduce", label, bytes);
    FERRY_COMM_CHECK(MPI_Iallreduce(MPI_IN_PLACE, request->result.data(), mpi_count("all_reduce", count),
                                    mpi_type(tensor.dtype()), sum_op(tensor.dtype()), comm_, &request->request));
    return launch(request);
  }

  Work do_broadcast(const Tensor& tensor, int root, const std::string& label) override {
    auto request = std::make_shared<RequestOperation>();
    request->result = host_view(tensor, rank() == root, "mpi staging (broadcast)");
    request->has_result = rank() != root;
    fill(*request, "broadcast", "MPI_Ibcast", label, static_cast<std::int64_t>(tensor.nbytes()));
    FERRY_COMM_CHECK(MPI_Ibcast(request->result.data(), mpi_count("broadcast", tensor.numel()),
                                mpi_type(tensor.dtype()), root, comm_, &request->request));
    return launch(request);
  }

  Work do_all_gather(const Tensor& output, const Tensor& input, const std::string& label) override {
    auto request = std::make_shared<RequestOperation>();
    request->input = host_view(input, true, "mpi staging (all_gather)");
    request->result = host_view(output, false, "mpi staging (all_gather)");
    request->has_result = true;
    fill(*request, "all_gather", "MPI_Iallgather", label, static_cast<std::int64_t>(output.nbytes()));
    const int count = mpi_count("all_gather", input.numel());
    const MPI_Datatype type = mpi_type(input.dtype());
    FERRY_COMM_CHECK(MPI_Iallgather(request->input.data(), count, type, request->result.data(), count, type, comm_,
                                    &request->request));
    return launch(request);
  }

  Work do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, const std::string& label) override {
    auto request = std::make_shared<RequestOperation>();
    request->input = host_view(input, true, "mpi staging (reduce_scatter)");
    request->result = host_view(output, false, "mpi staging (reduce_scatter)");
    request->has_result = true;
    request->reduce = op;
    fill(*request, "reduce_scatter", "MPI_Ireduce_scatter_block", label, static_cast<std::int64_t>(input.nbytes()));
    FERRY_COMM_CHECK(MPI_Ireduce_scatter_block(request->input.data(), request->result.data(),
                                               mpi_count("reduce_scatter", output.numel()), mpi_type(input.dtype()),
                                               sum_op(input.dtype()), comm_, &request->request));
    return launch(request);
  }

  Work do_barrier() override {
    auto request = std::make_shared<RequestOperation>();
    fill(*request, "barrier", "MPI_Ibarrier", "", 0);
    FERRY_COMM_CHECK(MPI_Ibarrier(comm_, &request->request));
    return launch(request);
  }

 private:
  // MPI's sum, or ferry's for the 16-bit types (MPI has none for them).
  MPI_Op sum_op(DType dtype) const {
    return dtype == DType::Float16 ? float16_sum_ : dtype == DType::BFloat16 ? bfloat16_sum_ : MPI_SUM;
  }

  // An all-reduce of `tensor` made of point-to-point messages, its shared fields set; the tag base (+ its step)
  // follows the same sequence on every rank, since collectives are launched in the same order.
  template <typename AllReduce>
  std::shared_ptr<AllReduce> point_to_point(const Tensor& tensor, ReduceOp op, const std::string& label) {
    auto all_reduce = std::make_shared<AllReduce>();
    all_reduce->view = host_view(tensor, true, "mpi staging (all_reduce)");
    all_reduce->reduce = op;
    all_reduce->comm = comm_;
    all_reduce->dtype = tensor.dtype();
    all_reduce->tag = static_cast<int>(ring_sequence_++ % ring_tags_) * kTagStride;
    fill(*all_reduce, "all_reduce", AllReduce::kAlgorithm, label, static_cast<std::int64_t>(tensor.nbytes()));
    return all_reduce;
  }

  void fill(Work::Operation& op, const char* name, const char* algorithm, const std::string& label,
            std::int64_t bytes) {
    op.op = name;
    op.algorithm = algorithm;
    op.label = label;
    op.backend = "mpi";
    op.device = device();
    op.bytes = bytes;
    op.rank = rank();
    op.world_size = world_size();
    op.timeout_s = timeout_s();
    op.start_ms = Ledger::global().now_ms();
    op.engine = engine_;
  }

  Work launch(std::shared_ptr<Work::Operation> op) {
    engine_->add(op);
    engine_->poll_all();  // post the first messages now
    return Work(std::move(op));
  }

  MPI_Comm comm_;
  MPI_Op float16_sum_ = MPI_OP_NULL, bfloat16_sum_ = MPI_OP_NULL;
  std::shared_ptr<ProgressEngine> engine_;
  std::int64_t ring_sequence_ = 0;  // the same on every rank: collectives are launched in the same order
  std::int64_t ring_tags_ = 1;  // point-to-point all-reduces with distinct tags before they repeat
};

}  // namespace

void start_mpi() {
  int finalized = 0;
  FERRY_COMM_CHECK(MPI_Finalized(&finalized));
  FERRY_CHECK(!finalized, InvalidArgument, "MPI was already finalized in this process; it cannot start again");
  int initialized = 0;
  FERRY_COMM_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    FERRY_COMM_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
  }
  // Errors come back as status codes (FERRY_COMM_CHECK turns them into exceptions) instead of aborting.
  FERRY_COMM_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  FERRY_COMM_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  FERRY_COMM_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  comm_check::set_rank_text(rank, size);
}

bool is_initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void finalize() {
  if (!is_initialized()) return;
  FERRY_COMM_CHECK(MPI_Finalize());
}

void wait_mpi_request(MPI_Request& request, const char* op, double timeout_s) {
  const auto begin = std::chrono::steady_clock::now();
  for (std::int64_t polls = 0;; ++polls) {
    int flag = 0;
    FERRY_COMM_CHECK(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
    if (flag) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (waited > timeout_s) {
      throw CollectiveTimeout(fmt::format("Collective timed out: {} on {} did not complete within {:.0f} s. A peer "
                                          "rank died, stalled, or did not call it; this rank stops.",
                                          op, comm_check::rank_text(), timeout_s));
    }
    if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

LocalRanks local_ranks() {
  MPI_Comm local = MPI_COMM_NULL;
  FERRY_COMM_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  LocalRanks ranks;
  FERRY_COMM_CHECK(MPI_Comm_rank(local, &ranks.rank));
  FERRY_COMM_CHECK(MPI_Comm_size(local, &ranks.size));
  MPI_Comm_free(&local);
  return ranks;
}

// Ranks on one host that use one physical GPU. GPUs are compared by PCI bus id, not by ordinal: with
// CUDA_VISIBLE_DEVICES set per rank every rank's GPU is cuda:0, yet each is a different card.
std::string ranks_sharing_a_device(Device device) {
  MPI_Comm local = MPI_COMM_NULL;
  FERRY_COMM_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  int local_size = 1, world_rank = 0;
  FERRY_COMM_CHECK(MPI_Comm_size(local, &local_size));
  FERRY_COMM_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  constexpr int kIdBytes = 64;  // a PCI bus id is 13 characters; a device name a few more
  struct Identity {
    int rank;
    char id[kIdBytes];
  };
  Identity mine{world_rank, {}};
  const std::string bus_id = ferry::backend(device).properties(device.index).bus_id;
  std::snprintf(mine.id, sizeof(mine.id), "%s", bus_id.empty() ? device.str().c_str() : bus_id.c_str());
  std::vector<Identity> all(static_cast<std::size_t>(local_size));
  MPI_Request request = MPI_REQUEST_NULL;
  FERRY_COMM_CHECK(MPI_Iallgather(&mine, sizeof(Identity), MPI_BYTE, all.data(), sizeof(Identity), MPI_BYTE, local,
                                  &request));
  wait_mpi_request(request, "all_gather (device identities)", kDefaultTimeoutSeconds);
  MPI_Comm_free(&local);
  std::map<std::string, int> first_rank_of;  // physical device -> first world rank using it
  for (const Identity& other : all) {
    const std::string id(other.id, strnlen(other.id, sizeof(other.id)));
    auto [it, inserted] = first_rank_of.emplace(id, other.rank);
    if (!inserted) {
      return fmt::format("ranks {} and {} on one host both use the GPU at {}", it->second, other.rank, id);
    }
  }
  return "";
}

std::unique_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options) {
  MPI_Comm comm = MPI_COMM_NULL;
  FERRY_COMM_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));  // its own tag space
  FERRY_COMM_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  FERRY_COMM_CHECK(MPI_Comm_rank(comm, &rank));
  FERRY_COMM_CHECK(MPI_Comm_size(comm, &size));
  const LocalRanks local = local_ranks();
  return std::make_unique<MpiProcessGroup>(comm, rank, size, local.rank, local.size, options.device,
                                           options.timeout_s);
}

#else  // no MPI in this build: init_process_group() refuses before reaching these.

void start_mpi() { throw NotSupported("ferry was built without MPI"); }
bool is_initialized() { return false; }
void finalize() {}
std::string ranks_sharing_a_device(Device) { return ""; }
std::unique_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions&) {
  throw NotSupported("ferry was built without MPI");
}

#endif  // FERRY_HAVE_MPI

#ifndef FERRY_HAVE_NCCL
std::unique_ptr<ProcessGroup> make_nccl_process_group(const ProcessGroupOptions&) {
  throw NotSupported("ferry was built without NCCL");
}
#endif

}  // namespace ferry::dist
