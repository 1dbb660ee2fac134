// emulator.h — a GPU emulated on the host, for tests only: ferry's real cuda backend (every file of
// src/cuda, kernels included) compiled with g++ against this emulator instead of the CUDA runtime, so
// its code runs, and is checked against the cpu backend, on a machine without a GPU.
//
// What it models, and so what it can catch:
//   - streams are queues: work (kernels, async copies, memsets, frees, cuBLAS calls) runs only when a
//     sync point or a dependency asks for it (stream/event synchronize, an event wait, a copy that must
//     be synchronous). A missing sync or a missing cross-stream wait reads stale data or uses freed
//     memory (which AddressSanitizer then reports). FERRY_EMU_EAGER_STREAM makes one stream run its work at
//     once and FERRY_EMU_SCHEDULE_SEED draws random schedules (runtime.cpp), so either side of a race can win;
//   - kernels run block by block, each block's threads as cooperative fibers with real barriers and
//     warp shuffles, in an order that alternates between launches (forward, reverse), so a missing
//     __syncthreads changes results; a launch configuration CUDA would refuse is refused;
//   - device memory is exact-size host heap blocks, filled with 0xff when made (sanitizers see out-of-bounds
//     kernel accesses; a read before the first write finds NaN or -1); each card (FERRY_EMU_DEVICES of them)
//     has a fixed capacity (kDeviceBytes), beyond which allocations fail as on a real one;
//   - graph capture records the captured stream's work and replays it; a sync or a pageable copy
//     inside a capture invalidates it, as CUDA does;
//   - a failing copy on demand (fail_memcpy_async), for tests of the error paths (test_faults.cpp).
// Not modelled: real concurrency between streams (work runs when flushed, in dependency order),
// timing (cudaEventElapsedTime gives the host's clock). cuDNN (cudnn.cpp) is modelled for what ferry
// calls: descriptors checked, work on the handle's stream, an emulated algorithm menu whose workspaces
// and math types must be passed back right.
// NCCL (nccl.cpp) is modelled over MPI, one card per rank (a card: host and device index): its collectives
// are stream work like the rest, each an MPI collective on the communicator's own MPI communicator when run,
// in flight (finish_later) until every peer has joined.
//
// The runtime half (runtime.cpp, cublas.cpp) and the device half (device.cpp) meet here.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

namespace ferry::emu {

inline constexpr int kMaxDevices = 4;                               // emulated cards at most
int device_count();  // FERRY_EMU_DEVICES (1 to kMaxDevices), 1 when unset: the cards the runtime reports
inline constexpr std::size_t kDeviceBytes = std::size_t{3} << 30;   // each card's memory (3 GiB)
inline constexpr int kMultiprocessors = 132;                        // as an H200 (grid sizing)

// Enqueues `work` on `stream` (nullptr: the legacy default stream). It runs when the stream is flushed
// up to it; while the stream is being captured it is recorded into the graph instead.
void enqueue(cudaStream_t stream, std::function<void()> work);

// Called by enqueued work that has started something outside the emulated card and must wait for it (an emulated
// NCCL collective waiting for its peers): `done` is polled until it returns true, and nothing after the work on
// its stream runs before. Run from a flush that may stop there (an event or stream query, another stream's
// turn), the work stays in flight: the flush returns and queries say cudaErrorNotReady until a later flush finds
// it done, as a real card's kernel spins while the host goes on; a synchronize polls it to the end. Run inside
// a graph replay, it is polled to the end at once.
void finish_later(std::function<bool()> done);

// fp32 rounded to TF32 (10 explicit mantissa bits, to nearest even): what tensor cores multiply when TF32 is
// allowed (the emulated cuBLAS and cuDNN round their inputs so).
inline float to_tf32(float x) {
  if (!std::isfinite(x)) return x;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x0FFFu + ((bits >> 13) & 1u);
  bits &= 0xFFFFE000u;
  std::memcpy(&x, &bits, sizeof bits);
  return x;
}

// True when [p, p + bytes) lies inside one live device allocation (for the emulated libraries' checks of
// the pointers they are given, as a real card would fault on the first access outside).
bool device_range(const void* p, std::size_t bytes);

// The error cudaGetLastError() returns next (and clears); cudaSuccess leaves an earlier error in place.
void set_last_error(cudaError_t error);

// A fault for tests of ferry's error paths: the copy call of `kind` (cudaMemcpyAsync, or cudaMemcpy) that comes
// `after` such calls from now fails with `error`: once; the calls before and after it behave.
void fail_memcpy_async(cudaMemcpyKind kind, int after, cudaError_t error);

// Launch configuration as written between <<< >>>.
struct LaunchConfig {
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
};

// Runs `body` once per thread of every block of `config` (device.cpp). Called from enqueued work.
void run_grid(const LaunchConfig& config, const std::function<void()>& body);

// The check CUDA makes at launch: cudaSuccess or cudaErrorInvalidConfiguration.
cudaError_t check_launch(const LaunchConfig& config);

}  // namespace ferry::emu
