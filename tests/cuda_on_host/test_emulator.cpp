// test_emulator.cpp — the emulated GPU's own promises (emulator.h), each the behaviour of a real card that a
// test of ferry's cuda code leans on: launch checks, barriers, warp shuffles, deferred stream work, poisoned
// fresh memory, deadlock detection. Kernels here are written as ferry's are, launched through the same
// ferry::emu::launch a rewritten `<<<...>>>` becomes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kThreads = 128;

// out[b * kThreads + t] = the value thread t + 1 (mod kThreads) of block b stored before the barrier.
__global__ void rotate_through_shared(int* out) {
  __shared__ int values[kThreads];
  values[threadIdx.x] = static_cast<int>(blockIdx.x * 1000 + threadIdx.x);
  __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = values[(threadIdx.x + 1) % kThreads];
}

// out[warp] = the sum of the warp's lane numbers times `scale`, by a shuffle-down tree (valid in lane 0).
__global__ void warp_sums(double* out, double scale) {
  double v = threadIdx.x % 32 * scale;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) out[threadIdx.x / 32] = v;
}

// Half the warp waits in a shuffle for the other half, which waits at __syncthreads for the first half.
// (Threads that exit count as arrived, as on Volta and later: a barrier behind an early return is no deadlock.)
__global__ void divergent_barrier(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x < 16) v = __shfl_down_sync(0xffffffffu, v, 1);
  else __syncthreads();
  out[threadIdx.x] = v;
}

template <typename Kernel, typename... Args>
cudaError_t launch(dim3 grid, dim3 block, cudaStream_t stream, Kernel kernel, Args... args) {
  ferry::emu::launch(ferry::emu::LaunchConfig{grid, block, 0, stream}, kernel, args...);
  return cudaGetLastError();
}

struct DeviceBuffer {
  void* data = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { EXPECT_EQ(cudaMalloc(&data, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(data); }
  template <typename T> T* as() const { return static_cast<T*>(data); }
};

TEST(CudaEmulator, RefusesTheLaunchesCudaRefuses) {
  DeviceBuffer out(4 * kThreads * sizeof(int));
  EXPECT_EQ(launch(dim3(0), dim3(kThreads), nullptr, rotate_through_shared, out.as<int>()),
            cudaErrorInvalidConfiguration);  // an empty grid
  EXPECT_EQ(launch(dim3(1), dim3(1025), nullptr, rotate_through_shared, out.as<int>()),
            cudaErrorInvalidConfiguration);  // more than 1024 threads
  EXPECT_EQ(launch(dim3(1, 65536), dim3(32), nullptr, rotate_through_shared, out.as<int>()),
            cudaErrorInvalidConfiguration);  // grid.y over 65535
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and cleared
}

TEST(CudaEmulator, SyncthreadsOrdersSharedMemoryInBothThreadOrders) {
  constexpr int kBlocks = 3;
  DeviceBuffer out(kBlocks * kThreads * sizeof(int));
  for (int launch_number = 0; launch_number < 2; ++launch_number) {  // forward, then reverse (or the other way)
    ASSERT_EQ(launch(dim3(kBlocks), dim3(kThreads), nullptr, rotate_through_shared, out.as<int>()), cudaSuccess);
    std::vector<int> host(kBlocks * kThreads);
    ASSERT_EQ(cudaMemcpy(host.data(), out.data, host.size() * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int b = 0; b < kBlocks; ++b) {
      for (int t = 0; t < kThreads; ++t) ASSERT_EQ(host[b * kThreads + t], b * 1000 + (t + 1) % kThreads);
    }
  }
}

TEST(CudaEmulator, WarpShufflesAddUpEachWarp) {
  DeviceBuffer out(kThreads / 32 * sizeof(double));
  ASSERT_EQ(launch(dim3(1), dim3(kThreads), nullptr, warp_sums, out.as<double>(), 0.5), cudaSuccess);
  std::vector<double> host(kThreads / 32);
  ASSERT_EQ(cudaMemcpy(host.data(), out.data, host.size() * sizeof(double), cudaMemcpyDeviceToHost), cudaSuccess);
  for (double v : host) EXPECT_EQ(v, 0.5 * (31 * 32 / 2));
}

// A stream's work waits for a sync: until then its destination holds what fresh memory holds, 0xff bytes.
TEST(CudaEmulator, StreamWorkRunsAtTheSyncAndFreshMemoryIsPoison) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, sizeof(int), cudaHostAllocDefault), cudaSuccess);
  DeviceBuffer device(sizeof(int));
  ASSERT_EQ(cudaMemsetAsync(device.data, 0, sizeof(int), stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(pinned, device.data, sizeof(int), cudaMemcpyDeviceToHost, stream), cudaSuccess);
  int before = 0;
  std::memcpy(&before, pinned, sizeof(int));
  // not copied yet: the pinned block is as it was made (unless a schedule ran this stream early)
  if (!std::getenv("FERRY_EMU_EAGER_STREAM") && !std::getenv("FERRY_EMU_SCHEDULE_SEED")) {
    EXPECT_EQ(before, -1);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  int after = 1;
  std::memcpy(&after, pinned, sizeof(int));
  EXPECT_EQ(after, 0);
  cudaFreeHost(pinned);
  cudaStreamDestroy(stream);
}

// Event timing as CUDA reports it (the times themselves are the host's): an event recorded but not yet reached is
// not ready; one made without timing, or never recorded, is an invalid handle.
TEST(CudaEmulator, ElapsedTimeBetweenTimingEventsOnceTheStreamRanPastThem) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start = nullptr, stop = nullptr, untimed = nullptr, unrecorded = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&unrecorded), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  DeviceBuffer device(1 << 20);
  ASSERT_EQ(cudaEventRecord(start, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device.data, 0, 1 << 20, stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, stream), cudaSuccess);
  float ms = -1;
  if (!std::getenv("FERRY_EMU_EAGER_STREAM") && !std::getenv("FERRY_EMU_SCHEDULE_SEED")) {
    EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorNotReady);
    cudaGetLastError();
  }
  ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventElapsedTime(&ms, unrecorded, stop), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  for (cudaEvent_t e : {start, stop, untimed, unrecorded}) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
}

TEST(CudaEmulatorDeathTest, ABarrierSomeThreadsNeverReachIsADeadlock) {
  DeviceBuffer out(32 * sizeof(int));
  EXPECT_DEATH(
      {
        launch(dim3(1), dim3(32), nullptr, divergent_barrier, out.as<int>());
        cudaDeviceSynchronize();
      },
      "deadlock");
}

}  // namespace
