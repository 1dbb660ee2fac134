// copy.cpp — every copy that touches the cuda backend's memory: host->device, device->host and
// device->device, enqueued on the stream the one door (src/core/transfer.cpp) hands over. Pinned
// memory goes straight to the DMA engine. Large pageable copies stream through a ring of pinned
// staging buffers: several host threads copy chunk c into a free buffer while the DMAs of earlier
// chunks are in flight, which is how a pageable tensor can cross at nearly the pinned rate. The
// threads hand chunks on without barriers (ChunkProgress); how many copy, with which stores, and in
// chunks of what size, is timed on the first large copies and chosen (StagingChoice); with the way kept, each
// thread's time is split into copying and waiting for the link, which says what limits the copy (StagedTimes).
// Not here: the ledger (the door records every copy; this file records only the one host sync the door cannot see,
// a trial's), pinned allocations (pinned.cpp).
#include <cuda_runtime_api.h>
#include <omp.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../core/environment.h"
#include "check.h"
#include "device_state.h"
#include "ferry/error.h"
#include "ferry/ledger.h"
#include "kernels.h"

namespace ferry::cuda {

namespace {

constexpr std::size_t kStagedMinBytes = std::size_t{4} << 20;   // pageable copies from this size use the ring
constexpr std::size_t kSlotBytes = std::size_t{4} << 20;        // bytes per staging buffer at most (largest chunk)
constexpr std::size_t kSmallSlotBytes = std::size_t{1} << 20;   // the small ring's buffers: 8 MB in all
constexpr std::size_t kMinChunkBytes = std::size_t{1} << 20;    // smallest chunk (keeps per-chunk overhead small)
constexpr std::size_t kSlots = 8;                                // buffers in the ring (>= 2): 32 MB pinned

// Pinned memory for kSlots buffers of up to kSlotBytes and, per buffer, an event recorded after the last DMA that
// used it. The buffers are `slot_bytes` apart: 4 MB (a 32 MB ring) or 1 MB (an 8 MB ring, small enough to stay
// in the host's caches while the DMA engine reads it). `next` carries on across calls, so a new copy starts on the
// buffer whose DMA was issued longest ago.
struct StagingRing {
  std::mutex mutex;
  char* block = nullptr;  // kSlots * kSlotBytes pinned bytes
  std::size_t slot_bytes = kSlotBytes;
  std::array<cudaEvent_t, kSlots> done{};
  std::size_t next = 0;

  char* buffer(std::size_t slot) const { return block + slot_bytes * slot; }
  // Lays the buffers `bytes` apart. A new layout's buffers overlap the old ones' across slot numbers, so every DMA
  // that used the ring must be done first: the host waits for each buffer's event. The layout changes while the
  // choice below is open, and after it only where the two directions chose different sizes: a host->device copy
  // then finds a device->host copy's DMAs done (it returned with its bytes in place), and a device->host copy,
  // which blocks anyway, starts once the host->device DMAs before it are done.
  void lay_out(std::size_t bytes) {
    if (bytes == slot_bytes) return;
    for (cudaEvent_t event : done) FERRY_CUDA_CHECK(cudaEventSynchronize(event));
    slot_bytes = bytes;
  }
};

std::array<std::atomic<StagingRing*>, kMaxDevices> g_rings{};
std::array<std::once_flag, kMaxDevices> g_ring_once;

StagingRing& staging_ring(int device) {
  std::call_once(g_ring_once[static_cast<std::size_t>(device)], [device] {
    DeviceGuard guard(device);
    auto ring = std::make_unique<StagingRing>();
    void* block = nullptr;
    FERRY_CUDA_CHECK(cudaHostAlloc(&block, kSlotBytes * kSlots, cudaHostAllocPortable));
    ring->block = static_cast<char*>(block);
    for (std::size_t s = 0; s < kSlots; ++s) {
      FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&ring->done[s], cudaEventDisableTiming));
    }
    g_rings[static_cast<std::size_t>(device)].store(ring.release());  // kept for the process
  });
  return *g_rings[static_cast<std::size_t>(device)].load();
}

// How the staging threads copy: how many of them share each chunk, whether they write the staging buffers (or,
// device->host, the caller's memory) with streaming stores or with memcpy, and how large the chunks (and so the
// ring's buffers) are. Which way is fastest depends on the host. More threads copy faster until host memory
// saturates; past that they only compete with the DMA engine, which reads the same memory. Streaming stores skip
// reading the lines they overwrite (a third less memory traffic), but leave nothing in the caches. With memcpy,
// the lines just written may stay in the writing core's caches until the DMA engine reads them (host->device), or
// the lines the DMA engine just wrote may be read from the last-level cache (device->host, where the host lets
// devices write into it), and then the ring's bytes need not cross host memory at all. That is likelier the
// smaller the ring: 1 MB chunks make it 8 MB, 512 KB a core at 16 threads, where 4 MB chunks make it 32 MB.
struct StagingWay {
  int threads = 1;
  bool streaming = false;
  std::size_t chunk_bytes = kSlotBytes;  // the largest chunk, and the distance between the ring's buffers
};

// Where one staged copy's host time went. The threads' time is threads x wall: each thread copies its slices,
// waits for the link (host->device: for a buffer whose DMA is done; device->host: for a chunk's DMA to land), and
// spends the rest starting, enqueueing DMAs and handing chunks on.
struct StagedTimes {
  double wall = 0;     // s: from the copy's start until its last DMA is enqueued (host->device) or its bytes are in place
  double copying = 0;  // s, summed over the threads: copying between pageable memory and the ring
  double waiting = 0;  // s, summed over the threads: waiting for the link
  int threads = 0;     // threads that shared the chunks
};

// FERRY_STAGING_THREADS=N (1 to 64) fixes the thread count; unset, ferry tries all of the cores (up to 16) and half
// of them.
std::optional<int> forced_threads() {
  static const std::optional<int> forced = []() -> std::optional<int> {
    const std::optional<std::string> value = ferry::detail::environment_text("FERRY_STAGING_THREADS");
    if (!value) return std::nullopt;
    int threads = 0;
    const char* end = value->data() + value->size();
    const auto [stop, error] = std::from_chars(value->data(), end, threads);
    FERRY_CHECK(error == std::errc{} && stop == end && threads >= 1 && threads <= 64, InvalidArgument,
                "FERRY_STAGING_THREADS='", *value, "': expected a whole number of staging threads from 1 to 64, ",
                "or unset (ferry times all the cores, up to 16, and half of them, and keeps the faster)");
    return threads;
  }();
  return forced;
}

// FERRY_STAGING_STREAMING=1 or 0 fixes the stores; unset, ferry tries both.
std::optional<bool> forced_streaming() {
  static const std::optional<bool> forced = []() -> std::optional<bool> {
    const std::optional<std::string> value = ferry::detail::environment_text("FERRY_STAGING_STREAMING");
    if (!value) return std::nullopt;
    FERRY_CHECK(*value == "0" || *value == "1", InvalidArgument, "FERRY_STAGING_STREAMING='", *value,
                "': expected 1 (streaming stores), 0 (memcpy), or unset (ferry times both and keeps the faster)");
    return *value == "1";
  }();
  return forced;
}

// FERRY_STAGING_CHUNK_MB=1, 2 or 4 fixes the chunks' (and the ring's buffers') size in MiB; unset, ferry tries 4
// (with either store) and 1 (with memcpy: streaming stores keep nothing in the caches, which is what small chunks
// are for).
std::optional<std::size_t> forced_chunk_bytes() {
  static const std::optional<std::size_t> forced = []() -> std::optional<std::size_t> {
    const std::optional<std::string> value = ferry::detail::environment_text("FERRY_STAGING_CHUNK_MB");
    if (!value) return std::nullopt;
    FERRY_CHECK(*value == "1" || *value == "2" || *value == "4", InvalidArgument, "FERRY_STAGING_CHUNK_MB='", *value,
                "': expected 1, 2 or 4 (MiB per staged chunk), or unset (ferry times 4 and 1 and keeps the faster)");
    return static_cast<std::size_t>(std::stoi(*value)) << 20;
  }();
  return forced;
}

int most_threads() {
  return forced_threads().value_or(std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16));
}

// The choice, one per direction. Unset variables leave up to six ways to try: all the threads or half of them,
// each with streaming stores in 4 MB chunks, memcpy in 4 MB chunks and memcpy in 1 MB chunks. The first staged
// copies of kTuneMinBytes or more in a direction take them in turn, kTuneRounds times over, each copy timed whole
// (host->device: until its last DMA is done); the way with the best rate is then kept for the process. Copies
// smaller than that, and those made while the choice is open, take the default way: all the threads, memcpy
// unless streaming stores are forced, 4 MB chunks unless the size is forced.
constexpr std::size_t kTuneMinBytes = std::size_t{64} << 20;
constexpr std::size_t kTuneRounds = 2;

class StagingChoice {
 public:
  // The way a staged copy of `bytes` takes; `trial` is set to its index among the ways while the choice is open
  // and the copy is large enough to be timed for it.
  StagingWay pick(std::size_t bytes, std::optional<std::size_t>& trial) {
    std::lock_guard lock(mutex_);
    init();
    trial.reset();
    if (chosen()) return ways_[best_way()];
    if (bytes < kTuneMinBytes) {
      return StagingWay{most_threads(), forced_streaming().value_or(false), forced_chunk_bytes().value_or(kSlotBytes)};
    }
    trial = timed_ % ways_.size();
    return ways_[*trial];
  }
  void record(std::size_t trial, std::size_t bytes, double seconds) {
    std::lock_guard lock(mutex_);
    if (chosen() || seconds <= 0) return;
    rates_[trial] = std::max(rates_[trial], static_cast<double>(bytes) / seconds);
    ++timed_;
  }
  bool settled() {
    std::lock_guard lock(mutex_);
    init();
    return chosen();
  }
  // Adds a copy that was not a trial to the split of the threads' time, if it was made with the kept way and is of
  // kTuneMinBytes or more (the size of the copies the choice was made on).
  void add_times(std::size_t bytes, const StagedTimes& times) {
    std::lock_guard lock(mutex_);
    if (!chosen() || bytes < kTuneMinBytes || times.wall <= 0 || times.threads <= 0) return;
    ++split_.copies;
    split_.bytes += static_cast<double>(bytes);
    split_.thread_seconds += times.wall * times.threads;
    split_.copying += times.copying;
    split_.waiting += times.waiting;
    split_.copying_wall += times.copying / times.threads;
  }
  void fill_times(PageableCopyPath& path) {
    std::lock_guard lock(mutex_);
    path.timed_copies = split_.copies;
    if (split_.copies == 0) return;
    path.copying_share = split_.copying / split_.thread_seconds;
    path.waiting_share = split_.waiting / split_.thread_seconds;
    path.copying_rate = split_.copying_wall > 0 ? split_.bytes / split_.copying_wall : 0;
  }
  // "memcpy, 16 threads, 1 MiB chunks", with "(forced)" after what a variable fixed, or "not chosen yet".
  std::string text() {
    std::lock_guard lock(mutex_);
    init();
    if (!chosen()) return "not chosen yet";
    const StagingWay way = ways_[best_way()];
    return std::string(way.streaming ? "streaming stores" : "memcpy") + (forced_streaming() ? " (forced)" : "") + ", " +
           std::to_string(way.threads) + (way.threads == 1 ? " thread" : " threads") +
           (forced_threads() ? " (forced)" : "") + ", " + std::to_string(way.chunk_bytes >> 20) + " MiB chunks" +
           (forced_chunk_bytes() ? " (forced)" : "");
  }

 private:
  void init() {
    if (!ways_.empty()) return;
    std::vector<int> threads{most_threads()};
    if (!forced_threads() && most_threads() >= 2) threads.push_back(most_threads() / 2);
    std::vector<bool> stores{true, false};
    if (const auto forced = forced_streaming()) stores = {*forced};
    std::vector<std::size_t> chunks{kSlotBytes, kSmallSlotBytes};
    if (const auto forced = forced_chunk_bytes()) chunks = {*forced};
    for (const int t : threads) {
      for (const bool streaming : stores) {
        for (const std::size_t chunk : chunks) {
          // small chunks are for a ring that stays in the caches, which streaming stores bypass
          if (streaming && chunk < kSlotBytes && !forced_streaming() && !forced_chunk_bytes()) continue;
          ways_.push_back(StagingWay{t, streaming, chunk});
        }
      }
    }
    rates_.assign(ways_.size(), 0.0);
  }
  bool chosen() const { return ways_.size() == 1 || timed_ >= kTuneRounds * ways_.size(); }
  std::size_t best_way() const {
    return static_cast<std::size_t>(std::max_element(rates_.begin(), rates_.end()) - rates_.begin());
  }

  std::mutex mutex_;
  std::vector<StagingWay> ways_;  // the ways to try, in turn
  std::vector<double> rates_;     // bytes/s: the best timed copy of each way
  std::size_t timed_ = 0;         // copies timed so far
  struct {
    std::size_t copies = 0;     // of kTuneMinBytes or more, with the kept way
    double bytes = 0;           // their bytes
    double thread_seconds = 0;  // s: the sum of each copy's threads x wall
    double copying = 0;         // s, summed over the threads
    double waiting = 0;         // s, summed over the threads
    double copying_wall = 0;    // s: the sum of each copy's copying / threads (its bytes' time if copying alone)
  } split_;
};
std::array<StagingChoice, 2> g_choice;  // [device->host, host->device]

// memcpy of one thread's slice; with `streaming`, non-temporal stores on x86-64: the destination's cache lines are
// written whole without being read first (a plain memcpy reads each line it writes: 3 memory passes
// instead of 2), and the staging buffer the DMA engine reads next is not left dirty in the caches.
// Ends with a store fence, so every byte is in memory before the DMA is enqueued (or the caller reads).
void stream_copy(char* dst, const char* src, std::size_t n, bool streaming) {
#if defined(__x86_64__)
  if (streaming && n >= 4096) {
    const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;  // to dst's 16-byte boundary
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    const std::size_t body = n & ~std::size_t{63};
    for (std::size_t i = 0; i < body; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + body, src + body, n - body);
    _mm_sfence();
    return;
  }
#else
  (void)streaming;
#endif
  std::memcpy(dst, src, n);
}

// Chunks: about 8 per copy, between 1 MB and the way's chunk size (one staging buffer, 1 MB at least).
static_assert(kSmallSlotBytes >= kMinChunkBytes, "every way's chunk size holds the smallest chunk");
std::size_t chunk_bytes(std::size_t bytes, StagingWay way) {
  const std::size_t chunk = (bytes / 8 + 4095) / 4096 * 4096;
  return std::clamp(chunk, kMinChunkBytes, way.chunk_bytes);
}

// The way's threads, but no more than leave each at least 64 KiB of a chunk.
int threads_for(StagingWay way, std::size_t chunk) {
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(way.threads), chunk / 65536 + 1));
}

// Start of thread t's slice of a chunk of `length` bytes, on a cache-line boundary.
std::size_t slice_start(std::size_t length, int t, int threads) {
  if (t >= threads) return length;
  return (length * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads)) & ~std::size_t{63};
}

// Progress of one staged copy, shared by its threads without barriers: per chunk, how many threads have finished
// their slice and whether its buffer is known ready; and how many chunks' DMAs are enqueued (each with its
// buffer's event recorded after it). The thread that finishes a chunk's last slice enqueues that chunk's DMA, so
// the others never wait for an enqueue, nor for the slowest thread of a chunk, unless they run a whole ring ahead
// of it. DMAs are enqueued in chunk order: the last thread of chunk c+1 has also finished chunk c, after
// enqueueing it if it was c's last.
class ChunkProgress {
 public:
  explicit ChunkProgress(std::size_t chunks) : chunks_(chunks) {}

  // Waits until chunk `c`'s buffer is ready: the DMAs of chunks 0..enqueued-1 enqueued, then `event` done. One
  // thread per chunk asks the driver; the others wait for its answer, so a chunk costs one driver call.
  // False once any thread's CUDA call failed: every thread then stops at its next chunk, and none writes into
  // a buffer whose wait did not succeed.
  bool wait_ready(std::size_t c, std::size_t enqueued, cudaEvent_t event) {
    Chunk& chunk = chunks_[c];
    if (chunk.ready.load(std::memory_order_acquire)) return !failed();
    if (bool asked = false; chunk.asked.compare_exchange_strong(asked, true, std::memory_order_acq_rel)) {
      if (!wait_for([&] { return enqueued_.load(std::memory_order_acquire) >= enqueued; })) return false;
      if (const cudaError_t status = cudaEventSynchronize(event); status != cudaSuccess) {
        fail(status);
        return false;
      }
      chunk.ready.store(true, std::memory_order_release);
      return true;
    }
    return wait_for([&] { return chunk.ready.load(std::memory_order_acquire); });
  }
  // Counts one thread's slice of chunk `c` as done; true for the last of the `threads`.
  bool finish_slice(std::size_t c, int threads) {
    return chunks_[c].finished.fetch_add(1, std::memory_order_acq_rel) + 1 == threads;
  }
  void set_enqueued(std::size_t count) { enqueued_.store(count, std::memory_order_release); }
  // Keeps the first failure. Called on the failing thread, whose last error it clears: the status is reported
  // here, not by a later check on this thread.
  void fail(cudaError_t status) {
    cudaGetLastError();
    int expected = cudaSuccess;
    error_.compare_exchange_strong(expected, status, std::memory_order_acq_rel);
  }
  bool failed() const { return error_.load(std::memory_order_acquire) != cudaSuccess; }
  cudaError_t error() const { return static_cast<cudaError_t>(error_.load(std::memory_order_acquire)); }

 private:
  struct Chunk {
    std::atomic<int> finished{0};    // threads done with their slice
    std::atomic<bool> asked{false};  // a thread waits for its buffer's event
    std::atomic<bool> ready{false};  // that wait has succeeded
  };
  // Yields until `done()`; false (at once) when a call has failed.
  template <typename Done>
  bool wait_for(Done done) const {
    while (!done()) {
      if (failed()) return false;
      std::this_thread::yield();
    }
    return !failed();
  }
  std::vector<Chunk> chunks_;
  std::atomic<std::size_t> enqueued_{0};  // chunks 0..enqueued_-1 have their DMA enqueued
  std::atomic<int> error_{cudaSuccess};   // the first failed call's status
};

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// One thread's turn at a chunk: `wait` for its buffer, then `copy` its slice, adding the time of each to `waiting`
// and `copying` (three clock reads, ~0.1 us a chunk). False, with nothing copied, when the wait fails.
template <typename Wait, typename Copy>
bool timed_turn(Wait&& wait, Copy&& copy, double& waiting, double& copying) {
  const Clock::time_point before_wait = Clock::now();
  if (!wait()) return false;
  const Clock::time_point before_copy = Clock::now();
  copy();
  const Clock::time_point after_copy = Clock::now();
  waiting += seconds_between(before_wait, before_copy);
  copying += seconds_between(before_copy, after_copy);
  return true;
}

// Staging threads are OpenMP workers: each makes the copy's device current before its first CUDA call, so none
// binds another device's context. No exception may leave a parallel region; a failure goes to `progress`.
bool enter_device(int device, ChunkProgress& progress) {
  const cudaError_t status = cudaSetDevice(device);
  if (status != cudaSuccess) progress.fail(status);
  return status == cudaSuccess;
}

void check_staged(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw_cuda_error(status, what, __FILE__, __LINE__);
}

// host (pageable) -> device. Returns once every byte of `src` has been copied into staging buffers and all DMAs
// are enqueued on `stream`; the caller may free `src` then. Each thread, for each chunk c:
//   waits until chunk c's buffer is free (the DMA of chunk c - kSlots enqueued, then its event done);
//   copies its slice of chunk c into that buffer;
//   if its slice was the chunk's last: enqueues chunk c's DMA and records the buffer's event after it.
// Returns where the threads' time went (from here on: a change of the ring's layout before it is not counted).
StagedTimes staged_host_to_device(char* dst, const char* src, std::size_t bytes, cudaStream_t stream, int device,
                                  StagingWay way) {
  StagingRing& ring = staging_ring(device);
  std::lock_guard lock(ring.mutex);
  ring.lay_out(way.chunk_bytes);
  const std::size_t chunk = chunk_bytes(bytes, way);
  const std::size_t chunks = (bytes + chunk - 1) / chunk;
  const std::size_t first = ring.next;
  auto slot_of = [&](std::size_t c) { return (first + c) % kSlots; };
  ChunkProgress progress(chunks);
  StagedTimes times;
  double copying = 0, waiting = 0;  // s, summed over the threads
  const Clock::time_point start = Clock::now();
#pragma omp parallel num_threads(threads_for(way, chunk)) reduction(+ : copying, waiting)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    if (t == 0) times.threads = nt;
    const bool entered = enter_device(device, progress);
    for (std::size_t c = 0; entered && c < chunks; ++c) {
      const std::size_t begin = c * chunk, length = std::min(chunk, bytes - begin), slot = slot_of(c);
      const std::size_t lo = slice_start(length, t, nt), hi = slice_start(length, t + 1, nt);
      // the buffer's event is recorded after chunk c - kSlots's DMA (this copy's), or after an earlier copy's
      const bool copied = timed_turn(
          [&] { return progress.wait_ready(c, c >= kSlots ? c - kSlots + 1 : 0, ring.done[slot]); },
          [&] { stream_copy(ring.buffer(slot) + lo, src + begin + lo, hi - lo, way.streaming); }, waiting, copying);
      if (!copied) break;
      if (progress.finish_slice(c, nt)) {
        if (progress.failed()) break;
        cudaError_t status = cudaMemcpyAsync(dst + begin, ring.buffer(slot), length, cudaMemcpyHostToDevice, stream);
        if (status == cudaSuccess) status = cudaEventRecord(ring.done[slot], stream);
        if (status != cudaSuccess) {
          progress.fail(status);
          break;
        }
        progress.set_enqueued(c + 1);
      }
    }
  }
  ring.next = slot_of(chunks);
  check_staged(progress.error(), "staged host-to-device copy (cudaSetDevice, cudaEventSynchronize, cudaMemcpyAsync)");
  times.wall = seconds_between(start, Clock::now());
  times.copying = copying;
  times.waiting = waiting;
  return times;
}

// device -> host (pageable). Returns when every byte is in `dst`. First this thread enqueues the DMAs of chunks
// 0..kSlots-1, each into its buffer. Then each thread, for each chunk c:
//   waits until chunk c's DMA is enqueued, then done (its buffer's event);
//   copies its slice of chunk c out of the buffer;
//   if its slice was the chunk's last: enqueues the DMA of chunk c + kSlots into the buffer chunk c has left.
// Returns where the threads' time went, as staged_host_to_device does.
StagedTimes staged_device_to_host(char* dst, const char* src, std::size_t bytes, cudaStream_t stream, int device,
                                  StagingWay way) {
  StagingRing& ring = staging_ring(device);
  std::lock_guard lock(ring.mutex);
  ring.lay_out(way.chunk_bytes);
  const Clock::time_point start = Clock::now();
  const std::size_t chunk = chunk_bytes(bytes, way);
  const std::size_t chunks = (bytes + chunk - 1) / chunk;
  const std::size_t first = ring.next;
  auto slot_of = [&](std::size_t c) { return (first + c) % kSlots; };
  auto enqueue = [&](std::size_t c) {
    const std::size_t begin = c * chunk, length = std::min(chunk, bytes - begin);
    const std::size_t slot = slot_of(c);
    // a host-to-device DMA from this buffer may still be queued on another stream
    cudaError_t s = cudaStreamWaitEvent(stream, ring.done[slot], 0);
    if (s == cudaSuccess) s = cudaMemcpyAsync(ring.buffer(slot), src + begin, length, cudaMemcpyDeviceToHost, stream);
    if (s == cudaSuccess) s = cudaEventRecord(ring.done[slot], stream);
    return s;
  };
  ChunkProgress progress(chunks);
  std::size_t primed = 0;
  for (; primed < std::min<std::size_t>(chunks, kSlots); ++primed) {
    if (const cudaError_t s = enqueue(primed); s != cudaSuccess) {
      progress.fail(s);
      break;
    }
  }
  progress.set_enqueued(primed);
  StagedTimes times;
  double copying = 0, waiting = 0;  // s, summed over the threads
#pragma omp parallel num_threads(threads_for(way, chunk)) reduction(+ : copying, waiting)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    if (t == 0) times.threads = nt;
    const bool entered = enter_device(device, progress);
    for (std::size_t c = 0; entered && c < chunks; ++c) {
      const std::size_t begin = c * chunk, length = std::min(chunk, bytes - begin), slot = slot_of(c);
      const std::size_t lo = slice_start(length, t, nt), hi = slice_start(length, t + 1, nt);
      const bool copied = timed_turn([&] { return progress.wait_ready(c, c + 1, ring.done[slot]); },
                                     [&] { stream_copy(dst + begin + lo, ring.buffer(slot) + lo, hi - lo, way.streaming); },
                                     waiting, copying);
      if (!copied) break;
      if (progress.finish_slice(c, nt) && c + kSlots < chunks) {
        if (progress.failed()) break;
        if (const cudaError_t status = enqueue(c + kSlots); status != cudaSuccess) {
          progress.fail(status);
          break;
        }
        progress.set_enqueued(c + kSlots + 1);
      }
    }
  }
  ring.next = slot_of(chunks);
  check_staged(progress.error(), "staged device-to-host copy (cudaSetDevice, cudaEventSynchronize, cudaMemcpyAsync)");
  times.wall = seconds_between(start, Clock::now());
  times.copying = copying;
  times.waiting = waiting;
  return times;
}

// Peer access lets device-to-device copies between GPUs go over NVLink/PCIe directly instead of
// through host memory. Enabled once per ordered pair, where the hardware allows it.
void enable_peer_access(int from, int to) {
  static std::mutex mutex;
  static std::array<std::array<bool, kMaxDevices>, kMaxDevices> tried{};
  std::lock_guard lock(mutex);
  if (tried[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)]) return;
  tried[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)] = true;
  int can_access = 0;
  if (cudaDeviceCanAccessPeer(&can_access, from, to) != cudaSuccess || !can_access) {
    cudaGetLastError();
    return;
  }
  DeviceGuard guard(from);
  const cudaError_t status = cudaDeviceEnablePeerAccess(to, 0);
  if (status != cudaSuccess && status != cudaErrorPeerAccessAlreadyEnabled) {
    throw_cuda_error(status, "cudaDeviceEnablePeerAccess", __FILE__, __LINE__);
  }
  cudaGetLastError();  // "already enabled" is fine
}

}  // namespace

std::string staging_choice(bool host_to_device) { return g_choice[host_to_device].text(); }

PageableCopyPath pageable_copy_path(bool host_to_device) {
  StagingChoice& choice = g_choice[host_to_device];
  PageableCopyPath path;
  path.settled = choice.settled();
  path.tuning_bytes = kTuneMinBytes;
  static_assert(kStagedMinBytes == std::size_t{4} << 20 && kTuneMinBytes == std::size_t{64} << 20, "the words below");
  path.description = "copies of 4 MiB or more go through the pinned staging ring, " +
                     (path.settled ? "with " + choice.text()
                                   : std::string("which is still choosing its way (by timing copies of 64 MiB or more)"));
  choice.fill_times(path);
  return path;
}

// Ordering, for both kinds of device memory a copy can touch:
//  - before: the door has made `stream` wait for the compute stream of the stream's device; a
//    destination on another GPU was allocated in the order of that GPU's compute stream, so the
//    copy also waits for it;
//  - after, when non_blocking: the compute stream of every GPU whose memory the copy read or wrote
//    waits for the copy, so a later kernel cannot overwrite a source still being read, and a later
//    free (cudaFreeAsync on the compute stream) cannot hand the block out while the copy runs;
//  - after, when blocking: the host waits for `stream`.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes,
                const Stream& stream, bool pinned, bool non_blocking) {
  if (bytes == 0) return;
  FERRY_ASSERT(!(src_device.is_cpu() && dst_device.is_cpu()), "cuda copy: host to host is not a device copy");
  const int device = stream.device.index;
  DeviceGuard guard(device);
  auto* s = static_cast<cudaStream_t>(stream.handle);
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  // pageable host memory on one side, and large: through the staging ring (device-to-device copies never are)
  const bool staged = !pinned && bytes >= kStagedMinBytes && (src_device.is_cpu() || dst_device.is_cpu());
  if (staged) {
    const bool to_device = src_device.is_cpu();
    std::optional<std::size_t> trial;
    StagingChoice& choice = g_choice[to_device];
    const StagingWay way = choice.pick(bytes, trial);
    const Clock::time_point start = Clock::now();
    const StagedTimes times = to_device ? staged_host_to_device(out, in, bytes, s, device, way)  // last DMAs queued
                                        : staged_device_to_host(out, in, bytes, s, device, way); // data in place
    if (trial) {
      // Timed to its end: host->device returns with up to a ring of DMAs in flight (32 MB with 4 MB chunks, 8 with
      // 1 MB), and a way must not look faster for leaving more of them untimed. So a trial copy waits for them (twelve
      // trials a process at most, each at most ~0.6 ms longer on a 55 GB/s link).
      if (to_device) {
        Ledger& ledger = Ledger::global();
        const double wait_start = ledger.now_ms();
        FERRY_CUDA_CHECK(cudaStreamSynchronize(s));
        // A non-blocking copy's host now waited for its DMAs: a sync of its own, in the ledger with its reason (a
        // blocking copy waits for them anyway, and the door records that wait as the copy's).
        if (non_blocking)
          ledger.record_sync({.device = Device(DeviceType::CUDA, device),
                              .reason = ferry::detail::concat(
                                  "staging ring trial: a non-blocking pageable host->device copy of ", bytes,
                                  " bytes timed to its end (the first copies of 64 MiB or more each way choose the "
                                  "ring's way)"),
                              .start_ms = wait_start,
                              .duration_ms = ledger.now_ms() - wait_start});
      }
      choice.record(*trial, bytes, seconds_between(start, Clock::now()));
    } else {
      choice.add_times(bytes, times);
    }
  } else if (src_device.is_cpu()) {
    FERRY_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyHostToDevice, s));
  } else if (dst_device.is_cpu()) {
    FERRY_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToHost, s));
  } else if (src_device.index == dst_device.index) {
    FERRY_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, s));
  } else {
    stream_wait(s, device, device_state(dst_device.index).compute_stream, dst_device.index);
    enable_peer_access(src_device.index, dst_device.index);
    FERRY_CUDA_CHECK(cudaMemcpyPeerAsync(out, dst_device.index, in, src_device.index, bytes, s));
  }
  if (!non_blocking) {
    FERRY_CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  if (!src_device.is_cpu()) stream_wait(device_state(src_device.index).compute_stream, src_device.index, s, device);
  if (!dst_device.is_cpu() && dst_device != src_device) {
    stream_wait(device_state(dst_device.index).compute_stream, dst_device.index, s, device);
  }
}

}  // namespace ferry::cuda
