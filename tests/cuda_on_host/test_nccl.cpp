// test_nccl.cpp — the emulated NCCL (nccl.cpp): NCCL's argument checks, its collectives as stream work (and as
// graph nodes), the one-card-per-rank rule, and ferry's NCCL process group on cuda tensors. Alone these run at
// world size 1; cuda_on_host.nccl_two_ranks runs them under mpirun -np 2 with two cards (each rank on cuda:<rank>).
#ifdef FERRY_HAVE_NCCL

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "ferry/dist/process_group.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "ferry/tensor.h"

namespace {

// MPI (ferry starts it, MPI_THREAD_SERIALIZED) for the whole program; ended once, at its end.
class MpiEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { ferry::dist::finalize(); }
};
const auto* const g_mpi_environment = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

struct World {
  int rank = 0, size = 1;
};
World start() {
  ferry::dist::init_process_group({.backend = ferry::dist::CommBackend::MPI, .device = ferry::kCPU}).reset();
  World w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  return w;
}

// ncclCommInitRank on every rank, this one on cuda:`device`, with rank 0's unique id broadcast over MPI.
ncclResult_t init_comm(const World& w, int device, ncclComm_t* comm) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  ncclUniqueId id{};
  if (w.rank == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  return ncclCommInitRank(comm, w.size, id, w.rank);
}

// A communicator of every rank, each on cuda:<rank mod cards>.
ncclComm_t make_comm(const World& w) {
  int cards = 1;
  cudaGetDeviceCount(&cards);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(init_comm(w, w.rank % cards, &comm), ncclSuccess);
  return comm;
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> host_copy(const T* device, std::size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// ferry's NCCL process group of every rank, each on cuda:<rank>; null when the emulated cards are fewer than the ranks.
std::unique_ptr<ferry::dist::ProcessGroup> nccl_group(const World& w) {
  int cards = 1;
  cudaGetDeviceCount(&cards);
  if (w.size > cards) return nullptr;
  return ferry::dist::init_process_group({.backend = ferry::dist::CommBackend::NCCL,
                                          .device = ferry::Device(ferry::DeviceType::CUDA, w.rank), .timeout_s = 60});
}

TEST(EmulatedNccl, RefusesWhatNcclRefuses) {
  const World w = start();
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidArgument), "invalid argument (run with NCCL_DEBUG=WARN for details)");
  ncclUniqueId id{};
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, w.size, id, w.rank), ncclInvalidArgument);  // an id ncclGetUniqueId did not make
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_EQ(ncclCommInitRank(&comm, 1, id, 1), ncclInvalidArgument);  // rank outside 0..nranks-1
  EXPECT_EQ(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);  // this rank alone

  float* buffer = device_copy(std::vector<float>{1, 2, 3, 4});
  EXPECT_EQ(ncclAllReduce(buffer, buffer, 4, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buffer, buffer, 4, ncclUint32, ncclSum, comm, nullptr), ncclInvalidArgument);  // not emulated
  EXPECT_EQ(ncclAllReduce(buffer, buffer, 4, ncclFloat32, ncclMax, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, buffer, 4, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);  // nothing to do
  EXPECT_EQ(ncclBroadcast(buffer, buffer, 4, ncclFloat32, 1, comm, nullptr), ncclInvalidArgument);  // no rank 1
  EXPECT_EQ(ncclBroadcast(buffer, buffer, 4, ncclFloat32, -1, comm, nullptr), ncclInvalidArgument);
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_EQ(ncclCommGetAsyncError(comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buffer, buffer, 4, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument);  // destroyed
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
  cudaFree(buffer);
}

// Two ranks on one card: NCCL's "Duplicate GPU detected" (ncclInvalidUsage), on every rank.
TEST(EmulatedNccl, RefusesTwoRanksOnOneCard) {
  const World w = start();
  if (w.size < 2) GTEST_SKIP() << "needs mpirun -np 2";
  ncclComm_t comm = nullptr;
  EXPECT_EQ(init_comm(w, 0, &comm), ncclInvalidUsage);
  EXPECT_EQ(comm, nullptr);
}

// Every collective, in place and not, sum and avg, as stream work: nothing moves until the stream runs.
TEST(EmulatedNccl, CollectivesRunWhenTheirStreamRuns) {
  const World w = start();
  ncclComm_t comm = make_comm(w);
  ASSERT_NE(comm, nullptr);
  const int n = w.size, r = w.rank;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  // all-reduce: float sum in place, double avg out of place, int64 avg (divided), uint8 sum
  float* f = device_copy(std::vector<float>{1.0f + r, 2.0f * (r + 1)});
  double* d_in = device_copy(std::vector<double>{3.0 * (r + 1), 1.0});
  double* d_out = device_copy(std::vector<double>{-7, -7});
  std::int64_t* i = device_copy(std::vector<std::int64_t>{5 + r, -4});
  std::uint8_t* u = device_copy(std::vector<std::uint8_t>{static_cast<std::uint8_t>(r + 1), 7});
  ASSERT_EQ(ncclAllReduce(f, f, 2, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(d_in, d_out, 2, ncclFloat64, ncclAvg, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(i, i, 2, ncclInt64, ncclAvg, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(u, u, 2, ncclUint8, ncclSum, comm, stream), ncclSuccess);
  // broadcast from the last rank, out of place; all-gather in place; reduce-scatter out of place (avg)
  std::vector<std::int32_t> mine(3, 10 * (r + 1));
  std::int32_t* b_in = device_copy(mine);
  std::int32_t* b_out = device_copy(std::vector<std::int32_t>(3, -1));
  std::vector<float> slots(static_cast<std::size_t>(2 * n), -1.0f);
  slots[static_cast<std::size_t>(2 * r)] = static_cast<float>(r);
  slots[static_cast<std::size_t>(2 * r + 1)] = static_cast<float>(100 + r);
  float* g = device_copy(slots);
  std::vector<float> scatter_in(static_cast<std::size_t>(2 * n));
  for (std::size_t k = 0; k < scatter_in.size(); ++k) scatter_in[k] = static_cast<float>(k * (r + 1));
  float* s_in = device_copy(scatter_in);
  float* s_out = device_copy(std::vector<float>{-1, -1});
  ASSERT_EQ(ncclBroadcast(b_in, b_out, 3, ncclInt32, n - 1, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclAllGather(g + 2 * r, g, 2, ncclFloat32, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclReduceScatter(s_in, s_out, 2, ncclFloat32, ncclAvg, comm, stream), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  const float nf = static_cast<float>(n);
  const float rank_sum = nf * (nf - 1) / 2;  // 0 + 1 + ... + n-1
  EXPECT_EQ(host_copy(f, 2), (std::vector<float>{nf + rank_sum, 2 * (nf + rank_sum)}));
  EXPECT_EQ(host_copy(d_out, 2), (std::vector<double>{3.0 * (n + 1) / 2, 1.0}));
  EXPECT_EQ(host_copy(i, 2), (std::vector<std::int64_t>{(5 * n + static_cast<std::int64_t>(rank_sum)) / n, -4}));
  EXPECT_EQ(host_copy(u, 2), (std::vector<std::uint8_t>{static_cast<std::uint8_t>(n + rank_sum),
                                                        static_cast<std::uint8_t>(7 * n)}));
  EXPECT_EQ(host_copy(b_out, 3), std::vector<std::int32_t>(3, 10 * n));
  std::vector<float> gathered;
  for (int k = 0; k < n; ++k) gathered.insert(gathered.end(), {static_cast<float>(k), static_cast<float>(100 + k)});
  EXPECT_EQ(host_copy(g, static_cast<std::size_t>(2 * n)), gathered);
  // element k of the input, summed over ranks (factor 1 + ... + n) and averaged: k (n + 1) / 2; this rank's slice
  const float factor = (nf + 1) / 2;
  EXPECT_EQ(host_copy(s_out, 2), (std::vector<float>{2.0f * r * factor, (2.0f * r + 1) * factor}));

  for (void* p : std::vector<void*>{f, d_in, d_out, i, u, b_in, b_out, g, s_in, s_out}) cudaFree(p);
  cudaStreamDestroy(stream);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// Captured into a graph, a collective runs at each launch of it; an aborted communicator's queued work does nothing.
TEST(EmulatedNccl, CollectivesAreRecordedInGraphsAndAbortDropsQueuedWork) {
  const World w = start();
  ncclComm_t comm = make_comm(w);
  ASSERT_NE(comm, nullptr);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  float* x = device_copy(std::vector<float>{1, 2});
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(x, x, 2, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiateWithFlags(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(host_copy(x, 2), (std::vector<float>{1, 2}));  // captured, not run
  const float n = static_cast<float>(w.size);
  for (float launches = 1; launches <= 2; ++launches) {
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const float scale = launches == 1 ? n : n * n;
    EXPECT_EQ(host_copy(x, 2), (std::vector<float>{scale, 2 * scale}));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  ASSERT_EQ(ncclAllReduce(x, x, 2, ncclFloat32, ncclSum, comm, stream), ncclSuccess);  // queued, not run
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(host_copy(x, 2), (std::vector<float>{n * n, 2 * n * n}));
  cudaFree(x);
  cudaStreamDestroy(stream);
}

// A collective waits on the card for its peers, as NCCL's kernel spins: until every rank has joined, queries of its
// stream and of an event after it say cudaErrorNotReady (not an error: the last error stays clear), and the host
// goes on. ncclCommAbort ends one that waits, leaving its output as it was. Needs two ranks (nccl_two_ranks).
TEST(EmulatedNccl, ACollectiveStaysInFlightUntilEveryRankJoinsAndAbortEndsIt) {
  const World w = start();
  if (w.size < 2) GTEST_SKIP() << "needs two ranks: cuda_on_host.nccl_two_ranks runs it under mpirun -np 2";
  ncclComm_t comm = make_comm(w);
  ASSERT_NE(comm, nullptr);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  const int late = w.size - 1;  // the rank that joins late
  const bool early = w.rank != late;
  const auto expect_waiting = [&] {
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
      EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);
    }
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  };

  float* x = device_copy(std::vector<float>{1.0f + w.rank});
  if (early) {
    ASSERT_EQ(ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
    ASSERT_EQ(cudaEventRecord(done, stream), cudaSuccess);
    expect_waiting();
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the early ranks have seen it wait; now the late one joins
  if (!early) {
    ASSERT_EQ(ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
    ASSERT_EQ(cudaEventRecord(done, stream), cudaSuccess);
  }
  cudaError_t status = cudaErrorNotReady;
  for (int polls = 0; polls < 1000000 && status == cudaErrorNotReady; ++polls) status = cudaEventQuery(done);
  EXPECT_EQ(status, cudaSuccess);
  const float n = static_cast<float>(w.size);
  EXPECT_EQ(host_copy(x, 1)[0], n + n * (n - 1) / 2);

  // The early ranks abort while the late one has not joined: the wait ends, the output untouched.
  float* y = device_copy(std::vector<float>{5});
  if (early) {
    ASSERT_EQ(ncclAllReduce(y, y, 1, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
    ASSERT_EQ(cudaEventRecord(done, stream), cudaSuccess);
    expect_waiting();
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
    EXPECT_EQ(host_copy(y, 1)[0], 5.0f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (!early) {  // joins the collective the early ranks posted, so that MPI ends it everywhere
    ASSERT_EQ(ncclAllReduce(y, y, 1, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(host_copy(y, 1)[0], 5 * n);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (early) {
    EXPECT_EQ(host_copy(y, 1)[0], 5.0f) << "an aborted collective wrote its output when MPI finished it";
  }
  cudaFree(x);
  cudaFree(y);
  cudaEventDestroy(done);
  cudaStreamDestroy(stream);
}

// ferry's NCCL process group on cuda tensors made by kernels on the compute stream: the comm stream must wait for
// them. all_gather's output is not its input, so a collective that ran early leaves poison (NaN) there, even alone.
TEST(EmulatedNccl, FerrysProcessGroupOrdersCollectivesAfterTheComputeStream) {
  const World w = start();
  auto group = nccl_group(w);
  if (!group) GTEST_SKIP() << "one card per rank: FERRY_EMU_DEVICES >= ranks";
  const ferry::Device device = group->device();
  ASSERT_EQ(group->backend(), ferry::dist::CommBackend::NCCL);
  const int n = w.size;
  const float nf = static_cast<float>(n);
  ferry::Tensor x = ferry::mul(ferry::ones({4}, {.device = device}), static_cast<double>(w.rank + 1));  // a kernel
  ferry::Tensor gathered = ferry::empty({4 * n}, {.device = device});
  group->all_gather(gathered, x);
  const ferry::Tensor g = gathered.cpu();
  for (int k = 0; k < 4 * n; ++k) EXPECT_EQ(g.data<float>()[k], static_cast<float>(k / 4 + 1)) << k;

  ferry::Tensor y = ferry::mul(ferry::ones({4 * n}, {.device = device}), static_cast<double>(w.rank + 1));
  ferry::Tensor part = ferry::empty({4}, {.device = device});
  group->reduce_scatter(part, y, ferry::dist::ReduceOp::Sum);
  const ferry::Tensor p = part.cpu();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(p.data<float>()[k], nf * (nf + 1) / 2) << k;

  ferry::Tensor z = ferry::mul(ferry::ones({4}, {.device = device}), static_cast<double>(w.rank + 1));
  group->all_reduce(z, ferry::dist::ReduceOp::Avg);
  group->broadcast(z, 0);
  group->barrier();
  const ferry::Tensor zc = z.cpu();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(zc.data<float>()[k], (nf + 1) / 2) << k;
}

// float16 and bfloat16 through ferry's NCCL group: NCCL sums them natively (float32 arithmetic, rounded back); avg
// pre-multiplies by 1/N. Values whose sums and averages are exact in both types.
TEST(EmulatedNccl, FerrysProcessGroupSumsHalfTensors) {
  const World w = start();
  auto group = nccl_group(w);
  if (!group) GTEST_SKIP() << "one card per rank: FERRY_EMU_DEVICES >= ranks";
  const ferry::Device device = group->device();
  const float nf = static_cast<float>(w.size);
  for (const ferry::DType dtype : {ferry::DType::Float16, ferry::DType::BFloat16}) {
    SCOPED_TRACE(ferry::dtype_name(dtype));
    ferry::Tensor x = ferry::full({1000}, 2.0 * (w.rank + 1), {.device = device, .dtype = dtype});
    group->all_reduce(x, ferry::dist::ReduceOp::Sum);
    EXPECT_EQ(x.dtype(), dtype);
    for (float v : x.to_vector<float>()) ASSERT_EQ(v, nf * (nf + 1)) << "sum";
    ferry::Tensor y = ferry::full({1000}, 2.0 * (w.rank + 1), {.device = device, .dtype = dtype});
    group->all_reduce(y, ferry::dist::ReduceOp::Avg);
    for (float v : y.to_vector<float>()) ASSERT_EQ(v, nf + 1) << "avg";
  }
}

}  // namespace

#endif  // FERRY_HAVE_NCCL
