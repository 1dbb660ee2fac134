// nccl.cpp — the part of NCCL ferry uses, emulated on the host for tests (see emulator.h): communicators made
// collectively over MPI, and all-reduce, broadcast, all-gather and reduce-scatter enqueued on a stream of the
// emulated card (they run, as MPI collectives on the communicator's own MPI communicator, when the stream is
// flushed, or are recorded into a graph while it is captured). Each function is the ferry_emu_ twin of the NCCL
// function of the same name (include/nccl.h renames them). Device memory is host memory here, so MPI reads and
// writes the buffers directly.
//
// NCCL's rules kept: one card per rank ("Duplicate GPU detected", ncclInvalidUsage: a card is the host and the
// current device index at init, as every process emulates the same cards); nranks/rank/root/datatype/op
// checked (ncclInvalidArgument); count 0 does nothing; in place allowed (recvbuff == sendbuff for all-reduce
// and broadcast, at this rank's slice for all-gather and reduce-scatter); avg pre-multiplies floating inputs
// by 1/nranks and divides integer sums, as NCCL's kernels do; half and bfloat16 are summed in float32 and rounded
// back after each addition; an aborted communicator's queued collectives do
// nothing. Not modelled: the types and ops ferry does not use (fp8, 32/64-bit unsigned,
// int8; prod, min, max: refused with ncclInvalidArgument), groups, ncclCommInitRankConfig and the rest of the
// API; counts over 2^31 - 1 (MPI's int count: refused); a communicator spans MPI_COMM_WORLD (or one rank).
// Waiting: a collective is posted (a non-blocking MPI collective) when its stream is flushed up to it and stays
// in flight there until every peer has joined (ferry::emu::finish_later): an event query says
// cudaErrorNotReady meanwhile, as a real card's kernel spins while the host goes on, so ferry's own timeout
// fires when a peer stalls or dies, and its ncclCommAbort ends the collective. Failures: a collective that MPI
// fails, or that some peer does not join within FERRY_EMU_NCCL_TIMEOUT_S seconds (default 300) while the host
// still waits for it (a synchronize), aborts the process with a message.
//
// Threads: the collectives are posted and polled on whichever thread flushes the stream (ferry: the thread that
// waits on or polls the collective's event, its main thread); MPI is started MPI_THREAD_SERIALIZED by ferry, so
// that thread must not call MPI concurrently with another. The emulator's lock is held while work runs, so two
// emulated collectives' MPI calls never overlap; a post from a thread other than MPI's main one, under a thread
// level below MPI_THREAD_SERIALIZED, aborts.
#include <mpi.h>
#include <nccl.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "emulator.h"
#include "ferry/half.h"

namespace {

// The id's first bytes: an id ncclGetUniqueId did not make (all zero, say: never broadcast) is refused.
constexpr char kIdMagic[] = "ferry-emu-nccl";

struct CommState {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1, device = 0;
  bool aborted = false;  // queued collectives do nothing
  ncclResult_t async_error = ncclSuccess;
  // The staging buffers of collectives in flight when the communicator was aborted: MPI may still write them.
  std::vector<std::shared_ptr<void>> orphans;
  ~CommState() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (mpi != MPI_COMM_NULL && initialized && !finalized) MPI_Comm_free(&mpi);
  }
};

}  // namespace

// The handle ncclComm_t points to (nccl.h declares the struct only). Queued work holds the state, so a
// communicator destroyed with collectives still queued keeps its MPI communicator until they have run.
struct ncclComm {
  std::shared_ptr<CommState> state;
};

namespace {

std::mutex g_mutex;  // guards the set of live handles
std::unordered_set<ncclComm*> g_comms;

std::shared_ptr<CommState> find(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return comm && g_comms.count(comm) ? comm->state : nullptr;
}

// Why a call failed, on stderr, when NCCL_DEBUG is set (as NCCL says: "run with NCCL_DEBUG=WARN for details").
void warn(const char* format, const std::string& a = "", const std::string& b = "") {
  static const bool enabled = std::getenv("NCCL_DEBUG") != nullptr;
  if (!enabled) return;
  std::fprintf(stderr, "ferry emulated NCCL WARN ");
  std::fprintf(stderr, format, a.c_str(), b.c_str());
  std::fprintf(stderr, "\n");
}

[[noreturn]] void die(const CommState& c, const char* op, const std::string& why) {
  std::fprintf(stderr, "ferry emulated NCCL: %s on rank %d of %d: %s. Aborting (a real card would hang).\n", op,
               c.rank, c.size, why.c_str());
  std::fflush(stderr);
  std::abort();
}

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

double timeout_s() {
  static const double seconds = [] {
    const char* text = std::getenv("FERRY_EMU_NCCL_TIMEOUT_S");
    const double value = text ? std::atof(text) : 0;
    return value > 0 ? value : 300.0;
  }();
  return seconds;
}

// --- types --------------------------------------------------------------------------------------------

struct TypeInfo {
  MPI_Datatype mpi = MPI_DATATYPE_NULL;
  std::size_t bytes = 0;
  bool floating = false;
};

bool type_info(ncclDataType_t type, TypeInfo& info) {
  switch (type) {
    case ncclFloat32: info = {MPI_FLOAT, 4, true}; return true;
    case ncclFloat64: info = {MPI_DOUBLE, 8, true}; return true;
    case ncclInt32: info = {MPI_INT32_T, 4, false}; return true;
    case ncclInt64: info = {MPI_INT64_T, 8, false}; return true;
    case ncclUint8: info = {MPI_UINT8_T, 1, false}; return true;
    case ncclFloat16:
    case ncclBfloat16: info = {MPI_UINT16_T, 2, true}; return true;  // their bits; summed by sum_op's own op
    default: return false;
  }
}

template <typename Fn>
void with_type(ncclDataType_t type, Fn&& fn) {
  switch (type) {
    case ncclFloat32: fn(float{}); break;
    case ncclFloat64: fn(double{}); break;
    case ncclInt32: fn(std::int32_t{}); break;
    case ncclInt64: fn(std::int64_t{}); break;
    case ncclUint8: fn(std::uint8_t{}); break;
    default: break;
  }
}

// The 16-bit types as numbers: widened to float32, rounded back to nearest even (ferry/half.h).
template <typename Fn>
void with_half_type(ncclDataType_t type, Fn&& fn) {
  if (type == ncclFloat16) fn(ferry::Float16{});
  if (type == ncclBfloat16) fn(ferry::BFloat16{});
}

template <typename T>
void half_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

// MPI's sum for the type, or the emulator's own op for the 16-bit types (made once, after MPI_Init).
MPI_Op sum_op(ncclDataType_t type) {
  static MPI_Op float16 = MPI_OP_NULL, bfloat16 = MPI_OP_NULL;
  if (type != ncclFloat16 && type != ncclBfloat16) return MPI_SUM;
  if (float16 == MPI_OP_NULL) {
    MPI_Op_create(&half_sum<ferry::Float16>, 1, &float16);
    MPI_Op_create(&half_sum<ferry::BFloat16>, 1, &bfloat16);
  }
  return type == ncclFloat16 ? float16 : bfloat16;
}

// ncclAvg on floating types: each input times 1/nranks, then summed (NCCL's pre-multiplied sum).
std::vector<unsigned char> premultiplied(const void* data, std::size_t count, ncclDataType_t type, int size) {
  std::vector<unsigned char> out;
  with_half_type(type, [&](auto zero) {
    using T = decltype(zero);
    out.resize(count * sizeof(T));
    const T* in = static_cast<const T*>(data);
    T* o = reinterpret_cast<T*>(out.data());
    const float scale = 1.0f / static_cast<float>(size);
    for (std::size_t i = 0; i < count; ++i) o[i] = T(static_cast<float>(in[i]) * scale);
  });
  with_type(type, [&](auto zero) {
    using T = decltype(zero);
    out.resize(count * sizeof(T));
    const T* in = static_cast<const T*>(data);
    T* o = reinterpret_cast<T*>(out.data());
    const T scale = T(1) / static_cast<T>(size);
    for (std::size_t i = 0; i < count; ++i) o[i] = in[i] * scale;
  });
  return out;
}

// ncclAvg on integer types: the sum divided by nranks.
void divide(void* data, std::size_t count, ncclDataType_t type, int size) {
  with_type(type, [&](auto zero) {
    using T = decltype(zero);
    T* d = static_cast<T*>(data);
    for (std::size_t i = 0; i < count; ++i) d[i] = static_cast<T>(d[i] / static_cast<T>(size));
  });
}

// --- running a collective ----------------------------------------------------------------------------

// The bytes a collective works in, apart from the caller's buffers: its input is copied in when it starts (as
// NCCL's kernel reads it then) and its result copied out when it is done (finish), so that an aborted collective
// never writes the caller's memory, which may be freed by then.
using Staging = std::vector<unsigned char>;
std::shared_ptr<Staging> staged(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  return std::make_shared<Staging>(p, p + bytes);
}

// Posts a non-blocking MPI collective and leaves it in flight on its stream (ferry::emu::finish_later) until MPI
// says it is done; then `finish` runs (the copy out, a division). `hold` (the staging MPI reads and writes) is kept
// alive until then. On a communicator that has been aborted it is done at once, having written nothing, as NCCL's
// kernels return on abort with their results undefined (the staging is kept: MPI may still write it). A
// collective some peer never joins aborts the process after FERRY_EMU_NCCL_TIMEOUT_S, while a synchronize waits
// for it or ferry keeps querying it.
template <typename Post>
void run_mpi(const std::shared_ptr<CommState>& c, const char* op, Post&& post, std::function<void()> finish,
             std::shared_ptr<void> hold) {
  int level = MPI_THREAD_SINGLE, main_thread = 0;
  MPI_Query_thread(&level);
  MPI_Is_thread_main(&main_thread);
  if (level < MPI_THREAD_SERIALIZED && !main_thread) {
    die(*c, op, "run on a thread other than MPI's main one, under a thread level below MPI_THREAD_SERIALIZED");
  }
  auto request = std::make_shared<MPI_Request>(MPI_REQUEST_NULL);
  if (const int status = post(request.get()); status != MPI_SUCCESS) die(*c, op, "MPI failed to start it");
  const auto begin = std::chrono::steady_clock::now();
  ferry::emu::finish_later([c, op, request, finish = std::move(finish), hold = std::move(hold), begin] {
    if (c->aborted) {
      c->orphans.push_back(hold);
      return true;
    }
    int done = 0;
    if (MPI_Test(request.get(), &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) die(*c, op, "MPI failed it");
    if (done) {
      if (finish) finish();
      return true;
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (waited > timeout_s()) {
      die(*c, op, "not joined by every rank within " + std::to_string(timeout_s()) + " s (FERRY_EMU_NCCL_TIMEOUT_S)");
    }
    sched_yield();  // ranks often outnumber cores in tests
    return false;
  });
}

// The checks every collective makes before enqueueing; ncclSuccess to go on.
ncclResult_t check_collective(const char* op, ncclComm_t comm, std::shared_ptr<CommState>& state,
                              ncclDataType_t type, TypeInfo& info, const void* sendbuff, const void* recvbuff,
                              std::size_t count) {
  state = find(comm);
  if (!state) {
    warn("%s: invalid communicator (null or destroyed)%s", op);
    return ncclInvalidArgument;
  }
  if (state->aborted) {
    warn("%s: the communicator was aborted%s", op);
    return ncclInvalidUsage;
  }
  if (!type_info(type, info)) {
    warn("%s: datatype %s not supported by the emulated NCCL", op, std::to_string(static_cast<int>(type)));
    return ncclInvalidArgument;
  }
  if (count > static_cast<std::size_t>(INT_MAX)) {
    warn("%s: count %s is over MPI's int count (a limit of the emulated NCCL)", op, std::to_string(count));
    return ncclInvalidArgument;
  }
  if (count > 0 && (!sendbuff || !recvbuff)) {
    warn("%s: null %s buffer", op, !sendbuff ? "send" : "receive");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

// Buffers the emulated card would fault on (host memory, or too short an allocation): a real NCCL's kernel reads
// them on the device, so they must be device memory of at least these many elements. Said on stderr always.
ncclResult_t check_buffers(const char* op, const void* sendbuff, std::size_t send_count, const void* recvbuff,
                           std::size_t recv_count, const TypeInfo& t) {
  const auto inside = [&](const void* p, std::size_t count, const char* what) {
    if (count == 0 || ferry::emu::device_range(p, count * t.bytes)) return true;
    std::fprintf(stderr, "emulated NCCL: %s: %s buffer %p (%zu bytes) is not inside one device allocation\n", op,
                 what, p, count * t.bytes);
    return false;
  };
  return inside(sendbuff, send_count, "send") && inside(recvbuff, recv_count, "receive") ? ncclSuccess
                                                                                        : ncclInvalidArgument;
}

ncclResult_t check_op(const char* op, ncclRedOp_t red) {
  if (red == ncclSum || red == ncclAvg) return ncclSuccess;
  warn("%s: reduction op %s not supported by the emulated NCCL (sum and avg are)", op,
       std::to_string(static_cast<int>(red)));
  return ncclInvalidArgument;
}

// Enqueues `work` on `stream`; ncclUnhandledCudaError if the runtime refused it (an invalid stream, a capture
// already invalidated), as NCCL reports a failed launch.
ncclResult_t enqueue(cudaStream_t stream, std::function<void()> work) {
  const cudaError_t before = cudaPeekAtLastError();
  ferry::emu::enqueue(stream, std::move(work));
  const cudaError_t after = cudaPeekAtLastError();
  if (after != cudaSuccess && after != before) {
    cudaGetLastError();
    ferry::emu::set_last_error(before);
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

}  // namespace

// === the API ======================================================================================

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return ncclInvalidArgument;
  std::memset(uniqueId->internal, 0, sizeof(uniqueId->internal));
  std::memcpy(uniqueId->internal, kIdMagic, sizeof(kIdMagic));
  std::random_device random;
  for (std::size_t i = sizeof(kIdMagic); i < sizeof(uniqueId->internal); ++i) {
    uniqueId->internal[i] = static_cast<char>(random());
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  if (!comm) return ncclInvalidArgument;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    warn("ncclCommInitRank: invalid rank %s of nranks %s", std::to_string(rank), std::to_string(nranks));
    return ncclInvalidArgument;
  }
  if (std::memcmp(commId.internal, kIdMagic, sizeof(kIdMagic)) != 0) {
    warn("ncclCommInitRank: the unique id was not made by ncclGetUniqueId%s%s");
    return ncclInvalidArgument;
  }
  if (!mpi_running()) {
    warn("ncclCommInitRank: the emulated NCCL bootstraps over MPI, which is not running%s%s");
    return ncclSystemError;
  }
  // The ranks of the communicator: this process alone, or every process of MPI_COMM_WORLD.
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (nranks != 1 && nranks != world_size) {
    warn("ncclCommInitRank: nranks %s: the emulated NCCL spans one rank or MPI_COMM_WORLD (%s ranks)",
         std::to_string(nranks), std::to_string(world_size));
    return ncclInvalidArgument;
  }
  MPI_Comm all = MPI_COMM_NULL;
  if (MPI_Comm_dup(nranks == 1 ? MPI_COMM_SELF : MPI_COMM_WORLD, &all) != MPI_SUCCESS) return ncclSystemError;
  MPI_Comm_set_errhandler(all, MPI_ERRORS_RETURN);

  // Every rank's view, on every rank: all decide alike whether the communicator can be made.
  struct Identity {
    int rank, nranks, device;
    char host[64];
    char id[NCCL_UNIQUE_ID_BYTES];
  };
  Identity mine{};
  mine.rank = rank;
  mine.nranks = nranks;
  cudaGetDevice(&mine.device);
  gethostname(mine.host, sizeof(mine.host) - 1);
  std::memcpy(mine.id, commId.internal, sizeof(mine.id));
  std::vector<Identity> everyone(static_cast<std::size_t>(nranks));
  if (MPI_Allgather(&mine, sizeof(Identity), MPI_BYTE, everyone.data(), sizeof(Identity), MPI_BYTE, all) !=
      MPI_SUCCESS) {
    MPI_Comm_free(&all);
    return ncclSystemError;
  }
  ncclResult_t result = ncclSuccess;
  std::vector<int> seen(static_cast<std::size_t>(nranks), -1);
  for (std::size_t i = 0; i < everyone.size() && result == ncclSuccess; ++i) {
    const Identity& other = everyone[i];
    if (other.nranks != nranks || std::memcmp(other.id, mine.id, sizeof(mine.id)) != 0) {
      warn("ncclCommInitRank: the ranks disagree on nranks or on the unique id%s%s");
      result = ncclInvalidArgument;
    } else if (seen[static_cast<std::size_t>(other.rank)] >= 0) {
      warn("ncclCommInitRank: rank %s requested twice%s", std::to_string(other.rank));
      result = ncclInvalidArgument;
    } else {
      seen[static_cast<std::size_t>(other.rank)] = static_cast<int>(i);
      for (std::size_t j = 0; j < i; ++j) {
        if (everyone[j].device == other.device && std::strncmp(everyone[j].host, other.host, sizeof(other.host)) == 0) {
          warn("ncclCommInitRank: Duplicate GPU detected : ranks %s both on CUDA device %s",
               std::to_string(everyone[j].rank) + " and " + std::to_string(other.rank),
               std::to_string(other.device) + " of host " + other.host);
          result = ncclInvalidUsage;
          break;
        }
      }
    }
  }
  if (result != ncclSuccess) {
    MPI_Comm_free(&all);
    return result;
  }
  // Ordered by NCCL rank, which need not be the MPI rank.
  auto state = std::make_shared<CommState>();
  if (MPI_Comm_split(all, 0, rank, &state->mpi) != MPI_SUCCESS) {
    MPI_Comm_free(&all);
    return ncclSystemError;
  }
  MPI_Comm_free(&all);
  MPI_Comm_set_errhandler(state->mpi, MPI_ERRORS_RETURN);
  state->rank = rank;
  state->size = nranks;
  state->device = mine.device;
  auto* handle = new ncclComm{std::move(state)};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_comms.insert(handle);
  }
  *comm = handle;
  return ncclSuccess;
}

namespace {
// An aborted communicator's state is kept to the end of the process: its collectives may still be posted in MPI,
// which has no way to cancel them, so its MPI communicator is never freed.
auto* const g_aborted = new std::vector<std::shared_ptr<CommState>>;  // never destroyed, on purpose

ncclResult_t release(ncclComm_t comm, bool abort) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!comm || !g_comms.count(comm)) return ncclInvalidArgument;
  if (abort) {
    comm->state->aborted = true;
    g_aborted->push_back(comm->state);
  }
  g_comms.erase(comm);
  delete comm;  // the MPI communicator goes with the last collective that holds it
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return comm ? release(comm, false) : ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return comm ? release(comm, true) : ncclSuccess; }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  const std::shared_ptr<CommState> state = find(comm);
  if (!state || !asyncError) return ncclInvalidArgument;
  *asyncError = state->async_error;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<CommState> c;
  TypeInfo t;
  if (ncclResult_t r = check_collective("ncclAllReduce", comm, c, datatype, t, sendbuff, recvbuff, count)) return r;
  if (ncclResult_t r = check_op("ncclAllReduce", op)) return r;
  if (ncclResult_t r = check_buffers("ncclAllReduce", sendbuff, count, recvbuff, count, t)) return r;
  if (count == 0) return ncclSuccess;
  return enqueue(stream, [=] {
    if (c->aborted) return;
    const bool scale_first = op == ncclAvg && t.floating;
    auto data = scale_first ? std::make_shared<Staging>(premultiplied(sendbuff, count, datatype, c->size))
                            : staged(sendbuff, count * t.bytes);
    run_mpi(
        c, "ncclAllReduce",
        [&](MPI_Request* r) {
          return MPI_Iallreduce(MPI_IN_PLACE, data->data(), static_cast<int>(count), t.mpi, sum_op(datatype), c->mpi,
                                r);
        },
        [=] {
          std::memcpy(recvbuff, data->data(), data->size());
          if (op == ncclAvg && !t.floating) divide(recvbuff, count, datatype, c->size);
        },
        data);
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<CommState> c;
  TypeInfo t;
  // Only the root's send buffer is read.
  const void* send = sendbuff ? sendbuff : recvbuff;
  if (ncclResult_t r = check_collective("ncclBroadcast", comm, c, datatype, t, send, recvbuff, count)) return r;
  if (root < 0 || root >= c->size) {
    warn("ncclBroadcast: root %s is not a rank of the communicator (%s ranks)", std::to_string(root),
         std::to_string(c->size));
    return ncclInvalidArgument;
  }
  if (c->rank == root && count > 0 && !sendbuff) {
    warn("ncclBroadcast: null send buffer on the root%s%s");
    return ncclInvalidArgument;
  }
  if (ncclResult_t r = check_buffers("ncclBroadcast", c->rank == root ? sendbuff : nullptr, c->rank == root ? count : 0,
                                     recvbuff, count, t))
    return r;
  if (count == 0) return ncclSuccess;
  return enqueue(stream, [=] {
    if (c->aborted) return;
    auto data = c->rank == root ? staged(sendbuff, count * t.bytes) : std::make_shared<Staging>(count * t.bytes);
    run_mpi(
        c, "ncclBroadcast",
        [&](MPI_Request* r) { return MPI_Ibcast(data->data(), static_cast<int>(count), t.mpi, root, c->mpi, r); },
        [=] { std::memcpy(recvbuff, data->data(), data->size()); }, data);
  });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<CommState> c;
  TypeInfo t;
  if (ncclResult_t r = check_collective("ncclAllGather", comm, c, datatype, t, sendbuff, recvbuff, sendcount)) return r;
  if (ncclResult_t r = check_buffers("ncclAllGather", sendbuff, sendcount, recvbuff,
                                     sendcount * static_cast<std::size_t>(c->size), t))
    return r;
  if (sendcount == 0) return ncclSuccess;
  return enqueue(stream, [=] {
    if (c->aborted) return;
    const std::size_t slice = sendcount * t.bytes;
    auto data = std::make_shared<Staging>(slice * static_cast<std::size_t>(c->size));
    std::memcpy(data->data() + static_cast<std::size_t>(c->rank) * slice, sendbuff, slice);  // may be in place
    const int n = static_cast<int>(sendcount);
    run_mpi(
        c, "ncclAllGather",
        [&](MPI_Request* r) { return MPI_Iallgather(MPI_IN_PLACE, n, t.mpi, data->data(), n, t.mpi, c->mpi, r); },
        [=] { std::memcpy(recvbuff, data->data(), data->size()); }, data);
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  std::shared_ptr<CommState> c;
  TypeInfo t;
  if (ncclResult_t r = check_collective("ncclReduceScatter", comm, c, datatype, t, sendbuff, recvbuff, recvcount)) {
    return r;
  }
  if (ncclResult_t r = check_op("ncclReduceScatter", op)) return r;
  if (ncclResult_t r = check_buffers("ncclReduceScatter", sendbuff, recvcount * static_cast<std::size_t>(c->size),
                                     recvbuff, recvcount, t))
    return r;
  if (recvcount == 0) return ncclSuccess;
  if (recvcount * static_cast<std::size_t>(c->size) > static_cast<std::size_t>(INT_MAX)) {
    warn("ncclReduceScatter: %s elements in all is over MPI's int count (a limit of the emulated NCCL)%s",
         std::to_string(recvcount * static_cast<std::size_t>(c->size)));
    return ncclInvalidArgument;
  }
  return enqueue(stream, [=] {
    if (c->aborted) return;
    const std::size_t total = recvcount * static_cast<std::size_t>(c->size);
    // The input may hold the output (in place): both are staged.
    struct Buffers {
      std::shared_ptr<Staging> input;
      Staging result;
    };
    auto b = std::make_shared<Buffers>();
    b->input = op == ncclAvg && t.floating ? std::make_shared<Staging>(premultiplied(sendbuff, total, datatype, c->size))
                                           : staged(sendbuff, total * t.bytes);
    b->result.resize(recvcount * t.bytes);
    run_mpi(
        c, "ncclReduceScatter",
        [&](MPI_Request* r) {
          return MPI_Ireduce_scatter_block(b->input->data(), b->result.data(), static_cast<int>(recvcount), t.mpi,
                                           sum_op(datatype), c->mpi, r);
        },
        [=] {
          std::memcpy(recvbuff, b->result.data(), b->result.size());
          if (op == ncclAvg && !t.floating) divide(recvbuff, recvcount, datatype, c->size);
        },
        b);
  });
}
