// device_state.h — what the cuda backend keeps per GPU: its two streams, its memory pool and byte
// counters, the events used to order streams, and the slot where kernels report bad indices.
// Not here: kernels (kernels.h), copies (copy.cpp), cuBLAS handles (gemm.cpp), pinned memory (pinned.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ferry/backend.h"

namespace ferry::cuda {

inline constexpr int kMaxDevices = 16;

// Written by kernels that find a bad index (in mapped host memory, so reading it after a sync costs
// no copy); read and cleared by the backend at the next sync, which throws InvalidArgument.
enum class KernelErrorKind : std::int32_t {
  None = 0, IndexSelect = 1, IndexAdd = 2, CrossEntropyTarget = 3, Gather = 4, ScatterAdd = 5,
};
struct DeviceErrorReport {
  std::int32_t kind = 0;     // a KernelErrorKind
  std::int32_t unused = 0;
  std::int64_t value = 0;    // the offending index or target
  std::int64_t limit = 0;    // the size it had to be below
};

struct DeviceState {
  int index = 0;
  cudaStream_t compute_stream = nullptr;  // kernels; created non-blocking
  cudaStream_t copy_stream = nullptr;     // host<->device and device<->device copies; non-blocking
  // Reads of a value once its ready event is complete (Backend::read_when_ready): a stream of their own, so that
  // no copy queued on the copy stream delays them. Made at the first such read; non-blocking.
  std::once_flag read_stream_once;
  cudaStream_t read_stream = nullptr;
  cudaMemPool_t pool = nullptr;           // stream-ordered allocator; keeps freed memory until empty_cache
  int multiprocessors = 0;
  std::int64_t total_memory = 0;          // bytes of device memory

  // Reused events for stream_wait (a wait captures the event's state when it is enqueued, so the
  // event can be recorded again right after). The mutex keeps record+wait pairs together.
  std::mutex event_mutex;
  cudaEvent_t compute_marker = nullptr;
  cudaEvent_t copy_marker = nullptr;

  // bytes held by live ferry tensors, scratch buffers and library workspaces (MemoryStats::allocated), their
  // peak, the number of allocate calls, and the workspaces' share (outside the pool: cudaMalloc'd once)
  std::atomic<std::int64_t> allocated{0}, peak{0}, allocations{0}, library{0};

  // allocated += bytes (negative: a release), raising peak to it.
  void count_allocated(std::int64_t bytes) {
    const std::int64_t now = allocated.fetch_add(bytes) + bytes;
    std::int64_t highest = peak.load();
    while (now > highest && !peak.compare_exchange_weak(highest, now)) {}
  }

  DeviceErrorReport* report_host = nullptr;    // mapped pinned memory ...
  DeviceErrorReport* report_device = nullptr;  // ... and the same bytes as the device sees them

  // Graph captures (graph.cpp). While `capturing`, the compute stream's allocations become the graph's; a
  // free of memory made before the capture cannot be recorded (cudaFreeAsync in a capture takes graph
  // allocations only), so it is held back until the capture ends, and fails it. Blocks of a graph that was
  // never launched have no memory behind them: freeing one only updates the counters.
  std::mutex capture_mutex;
  std::atomic<bool> capturing{false}, has_dead_blocks{false};
  std::thread::id capture_thread;                          // the thread whose work is recorded
  std::unordered_set<void*> capture_blocks;                // allocated inside the capture on now
  std::vector<std::pair<void*, std::size_t>> held_frees;  // made before it, freed inside it
  std::string capture_error;                               // why the capture on now cannot stand
  std::unordered_set<void*> dead_blocks;
};

// Number of CUDA devices; 0 (never an exception) when there is no driver or no device. Cached.
int cuda_device_count();
// The reason device_count() is 0, e.g. "cudaGetDeviceCount: cudaErrorInsufficientDriver (...)"; "" when >0.
std::string cuda_unavailable_reason();
// The state of device `index`, created on first use (streams, pool, events). Throws DeviceUnavailable
// for an index that is not present.
DeviceState& device_state(int index);
// The state when device `index` has been used already, else nullptr (never creates; noexcept paths).
DeviceState* device_state_if_created(int index) noexcept;

// SMs of the calling thread's current device (grid sizing in the launchers).
int current_multiprocessors();

// Make the current device `index` for the lifetime of the guard, then restore the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int index_ = 0;
};

// `waiter` waits on the device (not the host) for the work enqueued so far on `producer`.
void stream_wait(cudaStream_t waiter, int waiter_device, cudaStream_t producer, int producer_device);

// Throws InvalidArgument when a kernel of device `index` reported a bad index since the last check.
void raise_kernel_errors(int index);

// Temporary device memory for one launcher (dtype conversions, partial reductions, cuDNN's workspace):
// taken from the current device's pool in the order of `stream`, given back in the same order when it
// goes out of scope. Counted in `allocated` (and so in `peak`) while it lives, as PyTorch's allocator
// counts cuDNN's workspace, so the two libraries' peaks compare like with like.
class ScratchBuffer {
 public:
  ScratchBuffer(std::size_t bytes, cudaStream_t stream);
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* data() const { return data_; }
  template <typename T> T* as() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceState* state_ = nullptr;  // whose `allocated` counts it
  std::int64_t bytes_ = 0;
};

}  // namespace ferry::cuda
