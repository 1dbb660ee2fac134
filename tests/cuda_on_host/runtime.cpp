// runtime.cpp — the CUDA runtime API emulated on the host, for tests only (see emulator.h): devices, streams
// as queues of deferred work, events, device memory as exact-size heap blocks on a card of fixed capacity,
// stream-ordered memory pools, pinned host memory, copies and memsets, and stream capture into graphs that
// can be replayed. Each function here is the ferry_emu_ twin of the runtime function of the same name
// (include/cuda_runtime_api.h renames them, so the definitions below are written with CUDA's own names).
// Not here: kernels and their launches (device.cpp, include/cuda_runtime.h), cuBLAS (cublas.cpp).
//
// Model, in short:
//   - Work is enqueued on a stream and runs only when something flushes that stream up to it: a
//     synchronize, an event query, a wait of another stream being flushed, a copy to pageable memory.
//     Flushing runs the queue's items in order, one at a time, with the emulator's lock held.
//   - Events remember (stream, position); a wait enqueues "flush that stream up to that position", with the
//     position taken when the wait is enqueued, as CUDA reads the event's state at that moment.
//   - Device memory is counted against kDeviceBytes: cudaMalloc blocks, pool blocks in use or cached
//     (freed, kept by the pool until trimmed or released at a sync above the pool's release threshold),
//     and graph allocations once their graph has been launched.
//   - A capture records the captured streams' work into a graph instead of their queues; calls that would
//     synchronize with it fail and invalidate it, as CUDA's do.
//   - Work that waits on something outside the card (an emulated NCCL collective) stays in flight
//     (finish_later): queries say cudaErrorNotReady, synchronizes poll it to the end.
// Simplified (and said where it matters below): no concurrency and no timing (event times are the host's); a
// pool "reuses" freed bytes only for its accounting (every allocation is a fresh heap block, so the sanitizers
// see stale uses); one error state per host thread with no sticky errors.
#include "emulator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ferry::emu {

namespace {

using Work = std::function<void()>;

// Device blocks keep their exact size (AddressSanitizer then sees the first byte past the end); 256 is
// cudaMalloc's documented minimum alignment. Pinned blocks are page aligned, as page-locked memory is.
constexpr std::align_val_t kDeviceAlignment{256};
constexpr std::align_val_t kHostAlignment{4096};

struct Capture;
struct GraphData;

struct Stream {
  unsigned flags = cudaStreamDefault;
  bool legacy = false;  // the NULL stream
  bool eager = false;   // runs its work as it is enqueued (FERRY_EMU_EAGER_STREAM)
  std::deque<std::pair<std::uint64_t, Work>> queue;  // (sequence number, work), not yet run
  std::uint64_t last = 0;                            // sequence number of the last item enqueued
  Capture* capture = nullptr;                        // recording into this capture instead of `queue`
  // The item that started and has not finished (finish_later), and its sequence number: polled until done;
  // nothing after it runs before. Null when none.
  std::function<bool()> in_flight;
  std::uint64_t in_flight_position = 0;
  // Blocking streams (and the per-thread default stream) are ordered with the legacy stream.
  bool blocking() const { return !legacy && (flags & cudaStreamNonBlocking) == 0; }
};

struct Event {
  unsigned flags = 0;
  Stream* stream = nullptr;      // last recorded outside a capture: on this stream ...
  std::uint64_t position = 0;    // ... after this item
  // Timing events only: records outside a capture so far, the last one whose stream has run past it, and when.
  std::uint64_t records = 0, stamped = 0;
  std::chrono::steady_clock::time_point stamp{};
  std::uint64_t capture_id = 0;  // last recorded inside this capture (0: not)
  Stream* capture_stream = nullptr;
  std::size_t capture_node = 0;  // the nodes that capture had recorded then
};

struct Pool {
  int device = 0;
  bool alive = true;
  std::uint64_t release_threshold = 0;  // CUDA's default: give everything back at the next sync
  int reuse_follow_events = 1, reuse_opportunistic = 1, reuse_internal_dependencies = 1;
  std::size_t used = 0;    // bytes of live blocks
  std::size_t cached = 0;  // bytes of freed blocks the pool keeps (reserved, not in use)
  std::size_t used_high = 0, reserved_high = 0;
};

enum class Owner { Malloc, Pool, Graph };

struct Block {
  std::size_t bytes = 0;
  int device = 0;
  Owner owner = Owner::Malloc;
  Pool* pool = nullptr;          // Owner::Pool
  GraphData* graph = nullptr;    // Owner::Graph: its graph; nullptr once the graph died with the block out
  bool free_pending = false;     // a cudaFreeAsync of it is enqueued
  bool freed_in_graph = false;   // the capture recorded its free
  bool outstanding = false;      // a launch left it allocated and nobody freed it since
  bool counted = false;          // in the device's graph bytes (its graph has been launched)
};

// What a captured graph holds, shared by the cudaGraph_t, its executable graphs and launches not yet run.
struct GraphData {
  std::vector<Work> nodes;       // recorded work, in an order that respects every captured dependency
  std::deque<cudaGraphNodeType> kinds;  // each node's type (cudaGraphNodeGetType); node handles point here
  std::vector<void*> blocks;     // allocated by the capture
  // External event record nodes (cudaEventRecordExternal): (index of the node, its event). A launch records the
  // event once the nodes up to that one have run.
  std::vector<std::pair<std::size_t, cudaEvent_t>> event_records;
  bool launched = false;
  int execs = 0;                 // executable graphs alive
  GraphData() = default;
  GraphData(const GraphData&) = delete;
  GraphData& operator=(const GraphData&) = delete;
  ~GraphData();                  // gives back the blocks no one holds
};

struct Graph {
  std::shared_ptr<GraphData> data;
};

struct GraphExec {
  std::shared_ptr<GraphData> data;
  unsigned long long flags = 0;
  Stream* last_stream = nullptr;  // where it was last launched: a launch waits for the one before it
  std::uint64_t last_position = 0;
};

struct Capture {
  std::uint64_t id = 0;
  Stream* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalidated = false;
  std::shared_ptr<GraphData> graph = std::make_shared<GraphData>();
  std::vector<Stream*> members;                          // origin and the streams that joined
  std::unordered_map<Stream*, std::size_t> last_node;    // per member: nodes recorded up to its last one
  std::unordered_map<Stream*, std::size_t> waited_upto;  // per member: how far others waited on it
};

struct DeviceMemory {
  std::size_t malloc_bytes = 0;  // cudaMalloc blocks
  std::size_t graph_bytes = 0, graph_high = 0;  // blocks of launched graphs
};

struct State {
  std::recursive_mutex mutex;  // one lock for everything; enqueued work runs with it held
  std::vector<std::unique_ptr<Stream>> streams;  // every stream ever made, the legacy one first; never freed,
                                                 // as queued waits keep pointers to them
  std::unordered_set<Stream*> live_streams;
  std::unordered_map<Event*, std::unique_ptr<Event>> events;
  std::vector<std::unique_ptr<Pool>> pools;
  std::unordered_set<Pool*> live_pools;
  std::map<std::uintptr_t, Block> blocks;        // device blocks by address
  std::map<std::uintptr_t, std::size_t> pinned;  // pinned host blocks by address -> bytes
  std::map<std::uint64_t, std::unique_ptr<Capture>> captures;  // active ones
  std::uint64_t next_capture = 1;
  std::unordered_map<Graph*, std::unique_ptr<Graph>> graphs;
  std::unordered_map<GraphExec*, std::unique_ptr<GraphExec>> execs;
  DeviceMemory memory[kMaxDevices];

  State() {
    streams.push_back(std::make_unique<Stream>());
    streams.back()->legacy = true;
  }
  Stream& legacy() { return *streams.front(); }
};

// Never destroyed: backend code frees memory and destroys events from static destructors at exit.
State& state() {
  static State* s = new State();
  return *s;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local Stream* t_per_thread_stream = nullptr;

using Lock = std::lock_guard<std::recursive_mutex>;

// Every failing runtime call also becomes the thread's last error, as in CUDA.
cudaError_t fail(cudaError_t error) {
  t_last_error = error;
  return error;
}

bool valid_device(int device) { return device >= 0 && device < device_count(); }

// --- streams --------------------------------------------------------------------------------------

Stream* find_stream(cudaStream_t handle) {
  State& st = state();
  if (handle == nullptr || handle == cudaStreamLegacy) return &st.legacy();
  if (handle == cudaStreamPerThread) {
    if (!t_per_thread_stream) {  // a blocking stream of the thread's own, made on first use
      st.streams.push_back(std::make_unique<Stream>());
      t_per_thread_stream = st.streams.back().get();
    }
    return t_per_thread_stream;
  }
  auto* s = reinterpret_cast<Stream*>(handle);
  return st.live_streams.count(s) ? s : nullptr;
}

// The item this thread is running from a stream's queue (finish_later leaves it in flight there), and whether it
// may stay in flight (not inside a graph replay).
thread_local Stream* t_running = nullptr;
thread_local std::uint64_t t_running_position = 0;
thread_local bool t_may_defer = false;

// Runs the items of `s` with sequence numbers up to `upto`. Each item is taken off the queue before it
// runs, so that an item may flush other streams, or this one, re-entrantly. False when an item in flight
// (finish_later) at or before `upto` is not done yet: then nothing after it has run.
bool flush(Stream& s, std::uint64_t upto) {
  while (true) {
    if (s.in_flight) {
      if (s.in_flight_position > upto) return true;
      if (!s.in_flight()) return false;
      s.in_flight = nullptr;
    }
    if (s.queue.empty() || s.queue.front().first > upto) return true;
    Work work = std::move(s.queue.front().second);
    const std::uint64_t position = s.queue.front().first;
    s.queue.pop_front();
    Stream* const outer = t_running;
    const std::uint64_t outer_position = t_running_position;
    const bool outer_may_defer = t_may_defer;
    t_running = &s, t_running_position = position, t_may_defer = true;
    work();
    t_running = outer, t_running_position = outer_position, t_may_defer = outer_may_defer;
  }
}

// Runs `s` up to `upto` to the end, polling an item in flight until it is done (a synchronize). A collective some
// peer never joins spins here, as a real synchronize would (the emulated NCCL's timeout ends it).
void finish(Stream& s, std::uint64_t upto) {
  while (!flush(s, upto)) std::this_thread::yield();
}

void flush_all_streams() {
  State& st = state();
  for (bool pending = true; pending;) {
    pending = false;
    for (std::size_t i = 0; i < st.streams.size(); ++i) {
      Stream& s = *st.streams[i];
      if (!s.queue.empty() || s.in_flight) {
        pending = true;
        if (!flush(s, s.last)) std::this_thread::yield();
      }
    }
  }
}

// The work of a wait for `producer` up to `position`: in flight until the producer's work has run that far.
Work wait_for(Stream& producer, std::uint64_t position) {
  Stream* p = &producer;
  return [p, position] { finish_later([p, position] { return flush(*p, position); }); };
}

// Appends a wait for `producer` up to `position` to `waiter`'s queue (never recorded into a capture).
void append_wait(Stream& waiter, Stream& producer, std::uint64_t position) {
  waiter.queue.emplace_back(++waiter.last, wait_for(producer, position));
}

// The legacy stream's implicit ordering: its work waits for all earlier work of blocking streams, and a
// blocking stream's work waits for all earlier work of the legacy stream.
void order_with_legacy(Stream& s) {
  State& st = state();
  if (s.legacy) {
    for (std::size_t i = 1; i < st.streams.size(); ++i) {
      Stream& other = *st.streams[i];
      if (other.blocking() && !other.capture && (!other.queue.empty() || other.in_flight))
        append_wait(s, other, other.last);
    }
  } else if (s.blocking() && !s.capture && (!st.legacy().queue.empty() || st.legacy().in_flight)) {
    append_wait(s, st.legacy(), st.legacy().last);
  }
}

// A blocking stream being captured, which the legacy stream cannot be ordered with.
Capture* capture_blocking_legacy() {
  for (auto& [id, c] : state().captures) {
    for (Stream* m : c->members) {
      if (m->blocking()) return c.get();
    }
  }
  return nullptr;
}

// FERRY_EMU_EAGER_STREAM=N: the N-th stream created (1 is ferry's first, the compute stream of cuda:0; 2 its
// copy stream) runs each item as soon as it is enqueued, waiting for what the item depends on first, while
// the others still run only when a sync or a dependency needs them. A missing cross-stream wait then lets
// that stream's work overtake the other stream's, and the result shows it. 0 or unset: every stream lazy.
int eager_stream() {
  static const int n = [] {
    const char* text = std::getenv("FERRY_EMU_EAGER_STREAM");
    return text ? std::atoi(text) : 0;
  }();
  return n;
}

// FERRY_EMU_SCHEDULE_SEED=S (not 0): a random schedule, for hunting races (CI runs seed 1 beside the three fixed
// schedules; other seeds by hand). After each enqueue, with probability 1/2 that stream runs
// what it has queued, and with probability 1/8 some other stream does: work runs sometimes as soon as it can,
// sometimes late, as a GPU with several engines may run it.
std::uint64_t schedule_seed() {
  static const std::uint64_t seed = [] {
    const char* text = std::getenv("FERRY_EMU_SCHEDULE_SEED");
    return text ? std::strtoull(text, nullptr, 10) : 0;
  }();
  return seed;
}
unsigned schedule_draw() {  // xorshift64*: reproducible for a seed and a program
  static std::uint64_t state = schedule_seed() * 0x9E3779B97F4A7C15ull | 1;
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return static_cast<unsigned>((state * 0x2545F4914F6CDD1Dull) >> 40);
}

// Enqueues `work` on `s`, or records it as a node of the capture `s` belongs to, of type `kind` (work enqueued
// by ferry::emu::enqueue, kernels and library calls alike, is a kernel node, as cuBLAS's and cuDNN's are).
cudaError_t push(Stream& s, Work work, cudaGraphNodeType kind = cudaGraphNodeTypeKernel) {
  if (s.capture) {
    Capture& c = *s.capture;
    if (c.invalidated) return cudaErrorStreamCaptureInvalidated;
    c.graph->nodes.push_back(std::move(work));
    c.graph->kinds.push_back(kind);
    c.last_node[&s] = c.graph->nodes.size();
    return cudaSuccess;
  }
  if (s.legacy) {
    if (Capture* c = capture_blocking_legacy()) {
      c->invalidated = true;
      return cudaErrorStreamCaptureImplicit;
    }
  }
  order_with_legacy(s);
  s.queue.emplace_back(++s.last, std::move(work));
  if (s.eager) flush(s, s.last);
  if (schedule_seed() != 0) {
    if (schedule_draw() % 2 == 0) flush(s, s.last);
    if (schedule_draw() % 8 == 0) {
      std::vector<std::unique_ptr<Stream>>& all = state().streams;
      Stream& other = *all[schedule_draw() % all.size()];
      if (!other.capture) flush(other, other.last);
    }
  }
  return cudaSuccess;
}

// The captures that forbid this thread "potentially unsafe" calls (cudaMalloc, cudaFree, cudaHostAlloc,
// cudaFreeHost, the synchronous copies and memsets): its own captures not begun in relaxed mode, and any
// thread's global-mode capture (a thread's own mode is global, cudaThreadExchangeStreamCaptureMode being
// not modelled). Such a call fails and invalidates them.
cudaError_t refuse_if_capturing() {
  bool refused = false;
  for (auto& [id, c] : state().captures) {
    const bool own = c->thread == std::this_thread::get_id();
    if (c->mode == cudaStreamCaptureModeGlobal || (own && c->mode == cudaStreamCaptureModeThreadLocal)) {
      c->invalidated = true;
      refused = true;
    }
  }
  return refused ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

// A synchronizing call on `s`: refused while `s` is captured (invalidating it), and on the legacy stream
// while a blocking stream is captured.
cudaError_t refuse_sync_of(Stream& s) {
  if (s.capture) {
    s.capture->invalidated = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (s.legacy) {
    if (Capture* c = capture_blocking_legacy()) {
      c->invalidated = true;
      return fail(cudaErrorStreamCaptureImplicit);
    }
  }
  return cudaSuccess;
}

// --- memory ---------------------------------------------------------------------------------------

// Fresh memory, device or pinned, holds what CUDA promises: nothing. It is filled with 0xff bytes (NaN in
// every float, -1 in every integer) so that a read before the first write, e.g. a kernel overtaking the copy
// that fills its input, shows in the result instead of finding the old contents of a reused heap block.
void* heap_new(std::size_t bytes, std::align_val_t alignment) {
  try {
    void* p = ::operator new(bytes, alignment);
    std::memset(p, 0xff, bytes);
    return p;
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

std::size_t committed(int device) {
  const State& st = state();
  std::size_t bytes = st.memory[device].malloc_bytes + st.memory[device].graph_bytes;
  for (const auto& p : st.pools) {
    if (p->device == device) bytes += p->used + p->cached;
  }
  return bytes;
}

bool fits(int device, std::size_t bytes) { return bytes <= kDeviceBytes && committed(device) <= kDeviceBytes - bytes; }

// The device block containing `p`, or end().
std::map<std::uintptr_t, Block>::iterator block_containing(const void* p) {
  auto& blocks = state().blocks;
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = blocks.upper_bound(address);
  if (it == blocks.begin()) return blocks.end();
  --it;
  return address < it->first + it->second.bytes ? it : blocks.end();
}

bool is_pinned(const void* p) {
  const auto& pinned = state().pinned;
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = pinned.upper_bound(address);
  if (it == pinned.begin()) return false;
  --it;
  return address < it->first + it->second;
}

void register_block(void* ptr, const Block& block) {
  state().blocks.emplace(reinterpret_cast<std::uintptr_t>(ptr), block);
}

// Gives a block's memory back to the heap; a pool block's bytes stay with the pool as cached.
void release_block(std::map<std::uintptr_t, Block>::iterator it) {
  State& st = state();
  const Block& b = it->second;
  switch (b.owner) {
    case Owner::Malloc:
      st.memory[b.device].malloc_bytes -= b.bytes;
      break;
    case Owner::Pool:
      b.pool->used -= b.bytes;
      if (b.pool->alive) b.pool->cached += b.bytes;
      break;
    case Owner::Graph:
      if (b.counted) st.memory[b.device].graph_bytes -= b.bytes;
      break;
  }
  ::operator delete(reinterpret_cast<void*>(it->first), kDeviceAlignment);
  st.blocks.erase(it);
}

// What runs when a cudaFreeAsync reaches the front of its stream.
void complete_free(void* ptr) {
  State& st = state();
  auto it = st.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == st.blocks.end()) return;
  it->second.free_pending = false;
  // A block of a live graph keeps its memory: the graph's next launch allocates it again at this address.
  if (it->second.owner == Owner::Graph && it->second.graph) return;
  release_block(it);
}

// At a synchronization, pools give back what they keep above their release threshold.
void release_above_thresholds() {
  for (auto& p : state().pools) {
    if (p->used + p->cached <= p->release_threshold) continue;
    p->cached = p->release_threshold > p->used ? std::min<std::size_t>(p->cached, p->release_threshold - p->used) : 0;
  }
}

Pool* find_pool(cudaMemPool_t handle) {
  auto* p = reinterpret_cast<Pool*>(handle);
  return state().live_pools.count(p) ? p : nullptr;
}

Event* find_event(cudaEvent_t handle) {
  auto& events = state().events;
  auto it = events.find(reinterpret_cast<Event*>(handle));
  return it == events.end() ? nullptr : it->second.get();
}

Capture* find_capture(std::uint64_t id) {
  auto& captures = state().captures;
  auto it = captures.find(id);
  return it == captures.end() ? nullptr : it->second.get();
}

// Where a copy's end lies.
enum class Memory { Device, Pinned, Pageable };
Memory memory_of(const void* p) {
  if (block_containing(p) != state().blocks.end()) return Memory::Device;
  return is_pinned(p) ? Memory::Pinned : Memory::Pageable;
}

// A copy of `bytes` from src to dst in the order of `s`, following CUDA's documented behaviour for
// cudaMemcpyAsync: between pinned or device memory it is asynchronous; from pageable memory the source is
// staged before the call returns and the device side is written in stream order; into pageable memory, or
// between two host buffers, the call returns once the copy is done. Pageable memory cannot be captured.
cudaError_t copy_in_order(Stream& s, void* dst, Memory to, const void* src, Memory from, std::size_t bytes) {
  const bool pageable = to == Memory::Pageable || from == Memory::Pageable;
  if (pageable && s.capture) {
    if (s.capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    s.capture->invalidated = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  if (from == Memory::Pageable && to == Memory::Device) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                              static_cast<const unsigned char*>(src) + bytes);
    const cudaError_t e =
        push(s, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); }, cudaGraphNodeTypeMemcpy);
    return e == cudaSuccess ? e : fail(e);
  }
  const cudaError_t e = push(s, [dst, src, bytes] { std::memcpy(dst, src, bytes); }, cudaGraphNodeTypeMemcpy);
  if (e != cudaSuccess) return fail(e);
  const bool synchronous = to != Memory::Device && (from != Memory::Device || to == Memory::Pageable);
  if (synchronous && !s.capture) finish(s, s.last);
  return cudaSuccess;
}

cudaError_t check_copy_kind(cudaMemcpyKind kind, Memory to, Memory from) {
  switch (kind) {
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
      return cudaSuccess;
    case cudaMemcpyHostToDevice:
      return to == Memory::Pageable ? cudaErrorInvalidValue : cudaSuccess;
    case cudaMemcpyDeviceToHost:
      return from == Memory::Pageable ? cudaErrorInvalidValue : cudaSuccess;
    case cudaMemcpyDeviceToDevice:
      return to == Memory::Pageable || from == Memory::Pageable ? cudaErrorInvalidValue : cudaSuccess;
  }
  return cudaErrorInvalidMemcpyDirection;
}

// --- graphs ---------------------------------------------------------------------------------------

// The end of a capture: its streams record no more; returns it (no longer active).
std::unique_ptr<Capture> close_capture(Capture& c) {
  for (Stream* m : c.members) m->capture = nullptr;
  auto& captures = state().captures;
  auto it = captures.find(c.id);
  std::unique_ptr<Capture> closed = std::move(it->second);
  captures.erase(it);
  return closed;
}

// --- error names ----------------------------------------------------------------------------------

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};

// The codes this emulator (and device.cpp) returns, and the ones ferry names in its code, with the
// names and descriptions the real runtime gives.
constexpr ErrorText kErrorTexts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported",
     "peer access is not supported between these two devices"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled", "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge",
     "operation would result in a merge of separate capture sequences"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched",
     "capture was not ended in the same stream as it began"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined",
     "capturing stream has unjoined work"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation",
     "dependency created on uncaptured work in another stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* error_text(cudaError_t code) {
  for (const ErrorText& e : kErrorTexts) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

}  // namespace

GraphData::~GraphData() {
  // Runs with the lock held: the last reference goes in an API call or in a launch being flushed.
  State& st = state();
  for (void* ptr : blocks) {
    auto it = st.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == st.blocks.end()) continue;
    Block& b = it->second;
    // A block a launch left allocated outlives the graph (CUDA: until freed); one whose free is queued
    // goes when that free runs. The rest has no holder.
    if (b.outstanding || b.free_pending) b.graph = nullptr;
    else release_block(it);
  }
}

void finish_later(std::function<bool()> done) {
  if (done()) return;
  if (t_running != nullptr && t_may_defer && !t_running->in_flight) {
    t_running->in_flight = std::move(done);
    t_running->in_flight_position = t_running_position;
    return;
  }
  while (!done()) std::this_thread::yield();
}

void enqueue(cudaStream_t stream, std::function<void()> work) {
  Lock lock(state().mutex);
  Stream* s = find_stream(stream);
  if (!s) {
    fail(cudaErrorInvalidResourceHandle);
    return;
  }
  const cudaError_t e = push(*s, std::move(work));
  if (e != cudaSuccess) fail(e);
}

bool device_range(const void* p, std::size_t bytes) {
  Lock lock(state().mutex);
  const auto it = block_containing(p);
  if (it == state().blocks.end()) return false;
  return reinterpret_cast<std::uintptr_t>(p) - it->first + bytes <= it->second.bytes;
}

int device_count() {
  static const int count = [] {
    const char* text = std::getenv("FERRY_EMU_DEVICES");
    return text ? std::clamp(std::atoi(text), 1, kMaxDevices) : 1;
  }();
  return count;
}

void set_last_error(cudaError_t error) {
  if (error != cudaSuccess) t_last_error = error;
}

// The armed fault of fail_memcpy_async: which kind, how many such calls still pass, the error (cudaSuccess: none).
struct MemcpyFault {
  cudaMemcpyKind kind = cudaMemcpyDefault;
  int pass = 0;
  cudaError_t error = cudaSuccess;
};
MemcpyFault g_memcpy_fault;  // under state().mutex

void fail_memcpy_async(cudaMemcpyKind kind, int after, cudaError_t error) {
  Lock lock(state().mutex);
  g_memcpy_fault = MemcpyFault{kind, after, error};
}

// The armed fault's error when this call is the one it names, else cudaSuccess.
cudaError_t memcpy_fault(cudaMemcpyKind kind) {
  MemcpyFault& f = g_memcpy_fault;
  if (f.error == cudaSuccess || f.kind != kind) return cudaSuccess;
  if (f.pass-- > 0) return cudaSuccess;
  const cudaError_t error = f.error;
  f = MemcpyFault{};
  return error;
}

}  // namespace ferry::emu

using namespace ferry::emu;  // NOLINT: the definitions below are CUDA's global functions

// === devices ======================================================================================

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

namespace {
// An H200-like card (compute capability 9.0) with the emulator's memory size.
constexpr int kClockKhz = 1980000;        // boost clock
constexpr int kMemoryClockKhz = 3201000;  // HBM3e
constexpr int kMemoryBusBits = 6144;
constexpr int kL2Bytes = 60 << 20;
constexpr int kSharedPerBlock = 48 << 10, kSharedPerBlockOptin = 227 << 10, kSharedPerSm = 228 << 10;
}  // namespace

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "%s", "ferry emulated GPU (host)");
  prop->uuid.bytes[0] = static_cast<char>(0xfe);
  prop->uuid.bytes[15] = static_cast<char>(device);
  prop->totalGlobalMem = kDeviceBytes;
  prop->sharedMemPerBlock = kSharedPerBlock;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->memPitch = 2147483647;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 65536;
  prop->major = 9;
  prop->minor = 0;
  prop->textureAlignment = 512;
  prop->texturePitchAlignment = 32;
  prop->multiProcessorCount = kMultiprocessors;
  prop->canMapHostMemory = 1;
  prop->concurrentKernels = 1;
  prop->pciBusID = 0;
  prop->pciDeviceID = device;
  prop->asyncEngineCount = 2;
  prop->unifiedAddressing = 1;
  prop->memoryBusWidth = kMemoryBusBits;
  prop->l2CacheSize = kL2Bytes;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->streamPrioritiesSupported = 1;
  prop->globalL1CacheSupported = 1;
  prop->localL1CacheSupported = 1;
  prop->sharedMemPerMultiprocessor = kSharedPerSm;
  prop->regsPerMultiprocessor = 65536;
  prop->managedMemory = 1;
  prop->concurrentManagedAccess = 1;
  prop->computePreemptionSupported = 1;
  prop->cooperativeLaunch = 1;
  prop->sharedMemPerBlockOptin = kSharedPerBlockOptin;
  prop->maxBlocksPerMultiProcessor = 32;
  prop->reservedSharedMemPerBlock = 1024;
  prop->hostRegisterSupported = 1;
  prop->memoryPoolsSupported = 1;
  prop->memoryPoolSupportedHandleTypes = cudaMemHandleTypeNone;
  prop->clusterLaunch = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrClockRate: *value = kClockKhz; break;
    case cudaDevAttrMemoryClockRate: *value = kMemoryClockKhz; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = kMemoryBusBits; break;
    case cudaDevAttrMultiProcessorCount: *value = kMultiprocessors; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *value = 65535; break;
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = kSharedPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = kSharedPerBlockOptin; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = kSharedPerSm; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = 65536; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrL2CacheSize: *value = kL2Bytes; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = 32; break;
    case cudaDevAttrIntegrated: *value = 0; break;
    case cudaDevAttrCanMapHostMemory: *value = 1; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrConcurrentKernels: *value = 1; break;
    case cudaDevAttrAsyncEngineCount: *value = 2; break;
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    case cudaDevAttrPciBusId: *value = 0; break;
    case cudaDevAttrPciDeviceId: *value = device; break;
    case cudaDevAttrPciDomainId: *value = 0; break;
    case cudaDevAttrEccEnabled: *value = 0; break;
    default:
      // Not modelled: an attribute no code under test asks for.
      return fail(cudaErrorNotSupported);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (!pciBusId || len <= 0) return fail(cudaErrorInvalidValue);
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  std::snprintf(pciBusId, static_cast<std::size_t>(len), "0000:%02x:00.0", device);
  return cudaSuccess;
}

// No two emulated devices can reach each other's memory.
cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  if (!canAccessPeer) return fail(cudaErrorInvalidValue);
  if (!valid_device(device) || !valid_device(peerDevice)) return fail(cudaErrorInvalidDevice);
  *canAccessPeer = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  if (flags != 0) return fail(cudaErrorInvalidValue);
  if (!valid_device(peerDevice) || peerDevice == t_device) return fail(cudaErrorInvalidDevice);
  return fail(cudaErrorPeerAccessUnsupported);
}

cudaError_t cudaDeviceSynchronize() {
  Lock lock(state().mutex);
  // It would wait for every stream, captured ones included.
  if (!state().captures.empty()) {
    for (auto& [id, c] : state().captures) c->invalidated = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  flush_all_streams();
  release_above_thresholds();
  return cudaSuccess;
}

// === errors =======================================================================================

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return t_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* e = error_text(error);
  return e ? e->name : "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* e = error_text(error);
  return e ? e->text : "unrecognized error code";
}

// === streams ======================================================================================

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  if (!pStream || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0) return fail(cudaErrorInvalidValue);
  State& st = state();
  Lock lock(st.mutex);
  st.streams.push_back(std::make_unique<Stream>());
  Stream* s = st.streams.back().get();
  s->flags = flags;
  s->eager = static_cast<int>(st.streams.size() - 1) == eager_stream();
  st.live_streams.insert(s);
  *pStream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return cudaStreamCreateWithFlags(pStream, cudaStreamDefault); }

// Returns at once; work already enqueued still runs (when the device is flushed), as in CUDA.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  State& st = state();
  Lock lock(st.mutex);
  auto* s = reinterpret_cast<Stream*>(stream);
  if (!st.live_streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture) s->capture->invalidated = true;
  st.live_streams.erase(s);  // the handle is invalid now; the object stays for the queued work
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(state().mutex);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = refuse_sync_of(*s); e != cudaSuccess) return e;
  finish(*s, s->last);
  release_above_thresholds();
  return cudaSuccess;
}

// A query runs the stream's work and reports it done, or cudaErrorNotReady while an item is in flight
// (finish_later; not an error: cudaGetLastError does not return it).
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Lock lock(state().mutex);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = refuse_sync_of(*s); e != cudaSuccess) return e;
  return flush(*s, s->last) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Lock lock(state().mutex);
  Stream* s = find_stream(stream);
  Event* ev = find_event(event);
  if (!s || !ev) return fail(cudaErrorInvalidResourceHandle);
  if (flags & ~static_cast<unsigned>(cudaEventWaitExternal)) return fail(cudaErrorInvalidValue);
  if (s->capture && s->capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated);

  if (Capture* c = ev->capture_id ? find_capture(ev->capture_id) : nullptr) {  // recorded in a live capture
    if (s->capture && s->capture != c) {  // two captures would become one
      s->capture->invalidated = c->invalidated = true;
      return fail(cudaErrorStreamCaptureMerge);
    }
    if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    if (!s->capture) {  // the stream joins the capture: its later work is recorded too
      if (s->legacy) return fail(cudaErrorStreamCaptureImplicit);
      s->capture = c;
      c->members.push_back(s);
    }
    std::size_t& upto = c->waited_upto[ev->capture_stream];
    upto = std::max(upto, ev->capture_node);
    return cudaSuccess;  // the recorded order already puts the event's work first
  }
  if (!ev->stream) return cudaSuccess;  // never recorded (or last recorded in a capture now over): no wait
  if (s->capture) {
    // CUDA records cudaEventWaitExternal as an external-wait node; replaying one is not modelled.
    s->capture->invalidated = true;
    return fail(flags ? cudaErrorNotSupported : cudaErrorStreamCaptureIsolation);
  }
  Stream* producer = ev->stream;
  const std::uint64_t position = ev->position;  // the event's state now, not when the wait runs
  const cudaError_t e = push(*s, wait_for(*producer, position));
  return e == cudaSuccess ? e : fail(e);
}

// === events =======================================================================================

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  const unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (!event || (flags & ~known) != 0) return fail(cudaErrorInvalidValue);
  if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming)) return fail(cudaErrorInvalidValue);
  State& st = state();
  Lock lock(st.mutex);
  auto ev = std::make_unique<Event>();
  ev->flags = flags;
  *event = reinterpret_cast<cudaEvent_t>(ev.get());
  st.events.emplace(ev.get(), std::move(ev));
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

// Waits already enqueued hold the event's position, not the event: it can go at once.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  State& st = state();
  Lock lock(st.mutex);
  if (st.events.erase(reinterpret_cast<Event*>(event)) == 0) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

namespace {
// The event marks the work enqueued on `s` so far (outside a capture): cudaEventRecord's, and a graph launch's for
// each of its event record nodes.
void record_at_end(Event& ev, cudaEvent_t event, Stream& s) {
  ev.capture_id = 0;
  ev.stream = &s;
  if ((ev.flags & cudaEventDisableTiming) == 0) {
    // A timing event: an item on the stream stamps it with the host's clock when the stream runs past it.
    const std::uint64_t record = ++ev.records;
    push(s, [event, record] {
      Event* e = find_event(event);
      if (e == nullptr || e->records != record) return;  // destroyed, or recorded again since
      e->stamped = record;
      e->stamp = std::chrono::steady_clock::now();
    });
  }
  ev.position = s.last;
}
}  // namespace

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(state().mutex);
  Event* ev = find_event(event);
  Stream* s = find_stream(stream);
  if (!ev || !s) return fail(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    Capture& c = *s->capture;
    if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    ev->stream = nullptr;
    ev->capture_id = c.id;
    ev->capture_stream = s;
    ev->capture_node = c.graph->nodes.size();
    return cudaSuccess;
  }
  if (s->legacy) {
    if (Capture* c = capture_blocking_legacy()) {
      c->invalidated = true;
      return fail(cudaErrorStreamCaptureImplicit);
    }
  }
  order_with_legacy(*s);  // the record itself is ordered like any work on the stream
  record_at_end(*ev, event, *s);
  return cudaSuccess;
}

// cudaEventRecordExternal, inside a capture only (CUDA refuses it outside one): an event record node. Each launch
// of the graph records the event once the nodes recorded before it have run, so work outside the graph can wait
// for that point of a replay and not for the rest. The event is not part of the capture's own ordering.
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  if (flags == cudaEventRecordDefault) return cudaEventRecord(event, stream);
  Lock lock(state().mutex);
  Event* ev = find_event(event);
  Stream* s = find_stream(stream);
  if (!ev || !s) return fail(cudaErrorInvalidResourceHandle);
  if (flags != cudaEventRecordExternal || !s->capture) return fail(cudaErrorInvalidValue);
  if (s->capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  GraphData& g = *s->capture->graph;
  g.event_records.emplace_back(g.nodes.size(), event);
  const cudaError_t e = push(*s, [] {}, cudaGraphNodeTypeEventRecord);
  return e == cudaSuccess ? e : fail(e);
}

// The emulator has no clock of a card's: the time between two timing events is the host's time between the
// moments the emulated streams ran past them. Work runs when a sync flushes it, so the number says nothing of a
// card's speed; it lets programs that time their work with events run here. Errors as CUDA's: an event without
// timing, or not recorded, is an invalid handle; one recorded but not yet reached, not ready.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Lock lock(state().mutex);
  if (!ms) return fail(cudaErrorInvalidValue);
  const Event* a = find_event(start);
  const Event* b = find_event(end);
  if (!a || !b) return fail(cudaErrorInvalidResourceHandle);
  for (const Event* e : {a, b}) {
    if ((e->flags & cudaEventDisableTiming) != 0 || e->records == 0 || !e->stream) {
      return fail(cudaErrorInvalidResourceHandle);
    }
  }
  if (a->stamped != a->records || b->stamped != b->records) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->stamp - a->stamp).count();
  return cudaSuccess;
}

namespace {
// What cudaEventSynchronize and cudaEventQuery share: run the event's stream up to the event; to the end when
// `wait`, else cudaErrorNotReady while an item before it is in flight.
cudaError_t complete_event(cudaEvent_t event, bool wait) {
  Event* ev = find_event(event);
  if (!ev) return fail(cudaErrorInvalidResourceHandle);
  if (ev->capture_id && find_capture(ev->capture_id)) return fail(cudaErrorCapturedEvent);
  if (ev->capture_id || !ev->stream) return cudaSuccess;  // nothing recorded that could still run
  if (wait) {
    finish(*ev->stream, ev->position);
    return cudaSuccess;
  }
  return flush(*ev->stream, ev->position) ? cudaSuccess : cudaErrorNotReady;
}
}  // namespace

// Both are "potentially unsafe" during a capture: refused (invalidating it) as cudaMalloc is, which is why
// PyTorch's caching allocator stops querying its events while a graph is captured.
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  Lock lock(state().mutex);
  if (const cudaError_t e = refuse_if_capturing(); e != cudaSuccess) return e;
  const cudaError_t e = complete_event(event, true);
  if (e == cudaSuccess) release_above_thresholds();
  return e;
}

// A query runs the work up to the event and reports it done, or cudaErrorNotReady while an item before it is in
// flight (finish_later).
cudaError_t cudaEventQuery(cudaEvent_t event) {
  Lock lock(state().mutex);
  if (const cudaError_t e = refuse_if_capturing(); e != cudaSuccess) return e;
  return complete_event(event, false);
}

// === device memory ================================================================================

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (!devPtr) return fail(cudaErrorInvalidValue);
  State& st = state();
  Lock lock(st.mutex);
  if (const cudaError_t e = refuse_if_capturing(); e != cudaSuccess) return e;
  if (size == 0) {  // CUDA: success, and no memory
    *devPtr = nullptr;
    return cudaSuccess;
  }
  void* ptr = fits(t_device, size) ? heap_new(size, kDeviceAlignment) : nullptr;
  if (!ptr) return fail(cudaErrorMemoryAllocation);
  Block b;
  b.bytes = size;
  b.device = t_device;
  register_block(ptr, b);
  st.memory[t_device].malloc_bytes += size;
  *devPtr = ptr;
  return cudaSuccess;
}

// Synchronizes the device first, as CUDA's cudaFree does.
cudaError_t cudaFree(void* devPtr) {
  if (!devPtr) return cudaSuccess;
  State& st = state();
  Lock lock(st.mutex);
  if (const cudaError_t e = refuse_if_capturing(); e != cudaSuccess) return e;
  auto it = st.blocks.find(reinterpret_cast<std::uintptr_t>(devPtr));
  if (it == st.blocks.end() || it->second.free_pending) return fail(cudaErrorInvalidValue);
  if (it->second.owner == Owner::Graph && !it->second.outstanding) return fail(cudaErrorInvalidValue);
  flush_all_streams();
  it = st.blocks.find(reinterpret_cast<std::uintptr_t>(devPtr));  // the flush may have changed the map
  if (it == st.blocks.end()) return fail(cudaErrorInvalidValue);
  it->second.outstanding = false;
  if (it->second.owner == Owner::Graph && it->second.graph) return cudaSuccess;  // the graph reuses it
  release_block(it);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return fail(cudaErrorInvalidValue);
  Lock lock(state().mutex);
  *total = kDeviceBytes;
  *free = kDeviceBytes - std::min(kDeviceBytes, committed(t_device));
  return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const cudaMemPoolProps* poolProps) {
  if (!memPool || !poolProps || poolProps->allocType != cudaMemAllocationTypePinned) return fail(cudaErrorInvalidValue);
  // Host-located pools (cudaMemLocationTypeHost...) are not modelled.
  if (poolProps->location.type != cudaMemLocationTypeDevice) return fail(cudaErrorNotSupported);
  if (!valid_device(poolProps->location.id)) return fail(cudaErrorInvalidDevice);
  State& st = state();
  Lock lock(st.mutex);
  st.pools.push_back(std::make_unique<Pool>());
  Pool* p = st.pools.back().get();
  p->device = poolProps->location.id;
  st.live_pools.insert(p);
  *memPool = reinterpret_cast<cudaMemPool_t>(p);
  return cudaSuccess;
}

// Blocks still allocated from it stay valid until freed (CUDA defers the destruction the same way).
cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
  State& st = state();
  Lock lock(st.mutex);
  Pool* p = find_pool(memPool);
  if (!p) return fail(cudaErrorInvalidValue);
  p->alive = false;
  p->cached = 0;
  st.live_pools.erase(p);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr, void* value) {
  Lock lock(state().mutex);
  Pool* p = find_pool(memPool);
  if (!p || !value) return fail(cudaErrorInvalidValue);
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies: p->reuse_follow_events = *static_cast<int*>(value) != 0; break;
    case cudaMemPoolReuseAllowOpportunistic: p->reuse_opportunistic = *static_cast<int*>(value) != 0; break;
    case cudaMemPoolReuseAllowInternalDependencies:
      p->reuse_internal_dependencies = *static_cast<int*>(value) != 0;
      break;
    case cudaMemPoolAttrReleaseThreshold: p->release_threshold = *static_cast<std::uint64_t*>(value); break;
    case cudaMemPoolAttrReservedMemHigh:  // only a reset (to 0) is allowed
      if (*static_cast<std::uint64_t*>(value) != 0) return fail(cudaErrorInvalidValue);
      p->reserved_high = p->used + p->cached;
      break;
    case cudaMemPoolAttrUsedMemHigh:
      if (*static_cast<std::uint64_t*>(value) != 0) return fail(cudaErrorInvalidValue);
      p->used_high = p->used;
      break;
    default:
      return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, cudaMemPoolAttr attr, void* value) {
  Lock lock(state().mutex);
  Pool* p = find_pool(memPool);
  if (!p || !value) return fail(cudaErrorInvalidValue);
  auto as_u64 = [value](std::uint64_t v) { *static_cast<std::uint64_t*>(value) = v; };
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies: *static_cast<int*>(value) = p->reuse_follow_events; break;
    case cudaMemPoolReuseAllowOpportunistic: *static_cast<int*>(value) = p->reuse_opportunistic; break;
    case cudaMemPoolReuseAllowInternalDependencies: *static_cast<int*>(value) = p->reuse_internal_dependencies; break;
    case cudaMemPoolAttrReleaseThreshold: as_u64(p->release_threshold); break;
    case cudaMemPoolAttrReservedMemCurrent: as_u64(p->used + p->cached); break;
    case cudaMemPoolAttrReservedMemHigh: as_u64(p->reserved_high); break;
    case cudaMemPoolAttrUsedMemCurrent: as_u64(p->used); break;
    case cudaMemPoolAttrUsedMemHigh: as_u64(p->used_high); break;
    default:
      return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

// The owning device always has read-write access; no other device can be given any (no peers).
cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool, const cudaMemAccessDesc* descList, size_t count) {
  Lock lock(state().mutex);
  Pool* p = find_pool(memPool);
  if (!p || (count > 0 && !descList)) return fail(cudaErrorInvalidValue);
  for (size_t i = 0; i < count; ++i) {
    const cudaMemAccessDesc& d = descList[i];
    if (d.location.type != cudaMemLocationTypeDevice) return fail(cudaErrorInvalidValue);
    if (!valid_device(d.location.id)) return fail(cudaErrorInvalidDevice);
    if (d.location.id == p->device && d.flags != cudaMemAccessFlagsProtReadWrite) return fail(cudaErrorInvalidValue);
    if (d.location.id != p->device) return fail(cudaErrorInvalidDevice);
  }
  return cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
  Lock lock(state().mutex);
  Pool* p = find_pool(memPool);
  if (!p) return fail(cudaErrorInvalidValue);
  p->cached = minBytesToKeep > p->used ? std::min(p->cached, minBytesToKeep - p->used) : 0;
  return cudaSuccess;
}

// The address is valid at once for work in the stream's order. A pool first reuses what it keeps (for the
// accounting only: the block is always fresh); when the device is full it gives back the rest of what it
// keeps, and fails only if that is not enough. Inside a capture the block is the graph's.
cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  State& st = state();
  Lock lock(st.mutex);
  Pool* p = find_pool(memPool);
  if (!ptr || !p) return fail(cudaErrorInvalidValue);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  if (s->capture) {
    // Graph allocations need no device memory until the graph is launched (cudaGraphLaunch counts them).
    Capture& c = *s->capture;
    if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    void* block = heap_new(size, kDeviceAlignment);
    if (!block) return fail(cudaErrorMemoryAllocation);
    Block b;
    b.bytes = size;
    b.device = p->device;
    b.owner = Owner::Graph;
    b.graph = c.graph.get();
    register_block(block, b);
    c.graph->blocks.push_back(block);
    push(*s, [] {}, cudaGraphNodeTypeMemAlloc);  // the allocation node
    *ptr = block;
    return cudaSuccess;
  }
  const std::size_t reused = std::min(p->cached, size);
  const std::size_t fresh = size - reused;
  if (!fits(p->device, fresh)) p->cached = reused;  // give back what this allocation will not reuse
  void* block = fits(p->device, fresh) ? heap_new(size, kDeviceAlignment) : nullptr;
  if (!block) return fail(cudaErrorMemoryAllocation);
  p->cached -= reused;
  p->used += size;
  p->used_high = std::max(p->used_high, p->used);
  p->reserved_high = std::max(p->reserved_high, p->used + p->cached);
  Block b;
  b.bytes = size;
  b.device = p->device;
  b.owner = Owner::Pool;
  b.pool = p;
  register_block(block, b);
  *ptr = block;
  return cudaSuccess;
}

// The free happens when the stream reaches it: a use of the block that is not ordered before it (another
// stream without a wait) may find the memory gone, which AddressSanitizer reports. Inside a capture only
// the capture's own allocations can be freed (a free node).
cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  State& st = state();
  Lock lock(st.mutex);
  Stream* s = find_stream(hStream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!devPtr) return cudaSuccess;
  auto it = st.blocks.find(reinterpret_cast<std::uintptr_t>(devPtr));
  if (s->capture) {
    Capture& c = *s->capture;
    if (c.invalidated) return fail(cudaErrorStreamCaptureInvalidated);
    if (it == st.blocks.end() || it->second.owner != Owner::Graph || it->second.graph != c.graph.get() ||
        it->second.freed_in_graph) {
      c.invalidated = true;
      return fail(cudaErrorInvalidValue);
    }
    it->second.freed_in_graph = true;
    push(*s, [] {}, cudaGraphNodeTypeMemFree);  // the free node: the memory stays the graph's
    return cudaSuccess;
  }
  if (it == st.blocks.end() || it->second.free_pending) return fail(cudaErrorInvalidValue);
  Block& b = it->second;
  if (b.owner == Owner::Graph && !b.outstanding) return fail(cudaErrorInvalidValue);  // not allocated now
  const cudaError_t e = push(*s, [devPtr] { complete_free(devPtr); });
  if (e != cudaSuccess) return fail(e);
  b.outstanding = false;
  b.free_pending = true;
  return cudaSuccess;
}

// === pinned host memory ===========================================================================

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  const unsigned known = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
  if (!pHost || (flags & ~known) != 0) return fail(cudaErrorInvalidValue);
  State& st = state();
  Lock lock(st.mutex);
  if (const cudaError_t e = refuse_if_capturing(); e != cudaSuccess) return e;
  if (size == 0) {
    *pHost = nullptr;
    return cudaSuccess;
  }
  void* ptr = heap_new(size, kHostAlignment);
  if (!ptr) return fail(cudaErrorMemoryAllocation);
  st.pinned.emplace(reinterpret_cast<std::uintptr_t>(ptr), size);
  *pHost = ptr;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

// Synchronizes the device first, as CUDA's cudaFreeHost does.
cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  State& st = state();
  Lock lock(st.mutex);
  if (const cudaError_t e = refuse_if_capturing(); e != cudaSuccess) return e;
  if (!st.pinned.count(reinterpret_cast<std::uintptr_t>(ptr))) return fail(cudaErrorInvalidValue);
  flush_all_streams();
  st.pinned.erase(reinterpret_cast<std::uintptr_t>(ptr));
  ::operator delete(ptr, kHostAlignment);
  return cudaSuccess;
}

// Unified addressing: the device sees pinned memory at its host address.
cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  if (!pDevice || !pHost || flags != 0) return fail(cudaErrorInvalidValue);
  Lock lock(state().mutex);
  if (!is_pinned(pHost)) return fail(cudaErrorInvalidValue);
  *pDevice = pHost;
  return cudaSuccess;
}

// === copies and memsets ===========================================================================

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  Lock lock(state().mutex);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  const Memory to = memory_of(dst), from = memory_of(src);
  if (const cudaError_t e = check_copy_kind(kind, to, from); e != cudaSuccess) return fail(e);
  if (const cudaError_t e = memcpy_fault(kind); e != cudaSuccess) return fail(e);
  return copy_in_order(*s, dst, to, src, from, count);
}

// On the legacy stream, returning when the copy is done (CUDA: cudaMemcpy is synchronous for the host,
// except device-to-device, which the emulator also finishes: nothing is lost by it).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  State& st = state();
  Lock lock(st.mutex);
  if (const cudaError_t e = refuse_if_capturing(); e != cudaSuccess) return e;
  const cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, cudaStreamLegacy);
  if (e != cudaSuccess) return e;
  finish(st.legacy(), st.legacy().last);
  return cudaSuccess;
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                                cudaStream_t stream) {
  Lock lock(state().mutex);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!valid_device(dstDevice) || !valid_device(srcDevice)) return fail(cudaErrorInvalidDevice);
  if (count == 0) return cudaSuccess;
  if (!dst || !src || memory_of(dst) != Memory::Device || memory_of(src) != Memory::Device) {
    return fail(cudaErrorInvalidValue);
  }
  return copy_in_order(*s, dst, Memory::Device, src, Memory::Device, count);
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  Lock lock(state().mutex);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!devPtr || memory_of(devPtr) == Memory::Pageable) return fail(cudaErrorInvalidValue);
  const cudaError_t e = push(*s, [devPtr, value, count] { std::memset(devPtr, value, count); }, cudaGraphNodeTypeMemset);
  return e == cudaSuccess ? e : fail(e);
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  State& st = state();
  Lock lock(st.mutex);
  if (const cudaError_t e = refuse_if_capturing(); e != cudaSuccess) return e;
  const cudaError_t e = cudaMemsetAsync(devPtr, value, count, cudaStreamLegacy);
  if (e != cudaSuccess) return e;
  finish(st.legacy(), st.legacy().last);
  return cudaSuccess;
}

// === stream capture and graphs ====================================================================

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  State& st = state();
  Lock lock(st.mutex);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return fail(cudaErrorInvalidValue);
  }
  if (s->legacy) return fail(cudaErrorStreamCaptureUnsupported);
  if (s->capture) return fail(cudaErrorIllegalState);
  auto c = std::make_unique<Capture>();
  c->id = st.next_capture++;
  c->origin = s;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->members.push_back(s);
  s->capture = c.get();
  st.captures.emplace(c->id, std::move(c));
  return cudaSuccess;
}

// Ends the capture begun on `stream`. On failure there is no graph, and the memory the capture allocated
// goes back (nothing can have used it: captured work never ran).
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  State& st = state();
  Lock lock(st.mutex);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!pGraph) return fail(cudaErrorInvalidValue);
  if (!s->capture) return fail(cudaErrorIllegalState);
  Capture& c = *s->capture;
  if (c.origin != s) {
    c.invalidated = true;
    return fail(cudaErrorStreamCaptureUnmatched);
  }
  if (c.mode != cudaStreamCaptureModeRelaxed && c.thread != std::this_thread::get_id()) {
    return fail(cudaErrorStreamCaptureWrongThread);
  }
  // Every stream that joined must have been waited on, after its last recorded work, by the capture.
  // (Any member's wait counts, not only a path back to the origin: a simplification.)
  bool unjoined = false;
  for (Stream* m : c.members) {
    if (m == c.origin) continue;
    const auto last = c.last_node.find(m);
    if (last != c.last_node.end() && last->second > c.waited_upto[m]) unjoined = true;
  }
  const bool invalidated = c.invalidated;
  std::unique_ptr<Capture> closed = close_capture(c);
  *pGraph = nullptr;
  if (invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (unjoined) return fail(cudaErrorStreamCaptureUnjoined);
  auto graph = std::make_unique<Graph>();
  graph->data = closed->graph;
  *pGraph = reinterpret_cast<cudaGraph_t>(graph.get());
  st.graphs.emplace(graph.get(), std::move(graph));
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* pCaptureStatus) {
  Lock lock(state().mutex);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!pCaptureStatus) return fail(cudaErrorInvalidValue);
  if (s->legacy && capture_blocking_legacy()) return fail(cudaErrorStreamCaptureImplicit);
  *pCaptureStatus = !s->capture             ? cudaStreamCaptureStatusNone
                    : s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                              : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

// Only the count: the emulator's nodes have no handles (cudaErrorNotSupported when they are asked for).
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* numNodes) {
  State& st = state();
  Lock lock(st.mutex);
  auto it = st.graphs.find(reinterpret_cast<Graph*>(graph));
  if (it == st.graphs.end() || !numNodes) return fail(cudaErrorInvalidValue);
  std::deque<cudaGraphNodeType>& kinds = it->second->data->kinds;
  if (nodes) {  // the first *numNodes handles; *numNodes becomes how many were written
    *numNodes = std::min(*numNodes, kinds.size());
    for (std::size_t i = 0; i < *numNodes; ++i) nodes[i] = reinterpret_cast<cudaGraphNode_t>(&kinds[i]);
  } else {
    *numNodes = kinds.size();
  }
  return cudaSuccess;
}

// A node handle is the address of its entry in its graph's `kinds`.
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType* pType) {
  State& st = state();
  Lock lock(st.mutex);
  if (!node || !pType) return fail(cudaErrorInvalidValue);
  for (const auto& [handle, graph] : st.graphs) {
    for (const cudaGraphNodeType& kind : graph->data->kinds) {
      if (reinterpret_cast<cudaGraphNode_t>(const_cast<cudaGraphNodeType*>(&kind)) == node) {
        *pType = kind;
        return cudaSuccess;
      }
    }
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
  State& st = state();
  Lock lock(st.mutex);
  auto it = st.graphs.find(reinterpret_cast<Graph*>(graph));
  if (!pGraphExec || it == st.graphs.end()) return fail(cudaErrorInvalidValue);
  const unsigned long long known = cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload |
                                   cudaGraphInstantiateFlagDeviceLaunch | cudaGraphInstantiateFlagUseNodePriority;
  if ((flags & ~known) != 0) return fail(cudaErrorInvalidValue);
  if (flags & cudaGraphInstantiateFlagDeviceLaunch) return fail(cudaErrorNotSupported);  // not modelled
  const std::shared_ptr<GraphData>& data = it->second->data;
  // CUDA: a graph with memory nodes can have one executable graph at a time.
  if (!data->blocks.empty() && data->execs > 0) return fail(cudaErrorInvalidValue);
  auto exec = std::make_unique<GraphExec>();
  exec->data = data;
  exec->flags = flags;
  ++data->execs;
  *pGraphExec = reinterpret_cast<cudaGraphExec_t>(exec.get());
  st.execs.emplace(exec.get(), std::move(exec));
  return cudaSuccess;
}

// Items on the stream that run every recorded node in order (split at event record nodes). The first launch is when the graph's
// allocations take device memory; each launch leaves those the graph does not free allocated
// ("outstanding") until freed, or until the next launch frees them (cudaGraphInstantiateFlagAutoFreeOnLaunch;
// without it, a launch with outstanding allocations fails).
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  State& st = state();
  Lock lock(st.mutex);
  auto it = st.execs.find(reinterpret_cast<GraphExec*>(graphExec));
  if (it == st.execs.end()) return fail(cudaErrorInvalidValue);
  Stream* s = find_stream(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  GraphExec& exec = *it->second;
  GraphData& g = *exec.data;
  std::vector<Block*> blocks;
  std::size_t bytes = 0;
  for (void* ptr : g.blocks) {
    auto b = st.blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (b == st.blocks.end()) continue;
    blocks.push_back(&b->second);
    bytes += b->second.bytes;
    if (b->second.outstanding && !(exec.flags & cudaGraphInstantiateFlagAutoFreeOnLaunch)) {
      return fail(cudaErrorInvalidValue);
    }
  }
  const int device = t_device;
  if (!g.launched && !fits(device, bytes)) return fail(cudaErrorMemoryAllocation);
  // Launches of one executable graph run one after another, whatever their streams.
  if (exec.last_stream && exec.last_stream != s && !s->capture) append_wait(*s, *exec.last_stream, exec.last_position);
  // The events of the graph's event record nodes must still exist; a launch into a capture (a child graph) would
  // have to record them as nodes again: not modelled.
  for (const auto& [node, event] : g.event_records) {
    if (!find_event(event)) return fail(cudaErrorInvalidResourceHandle);
    if (s->capture) return fail(cudaErrorNotSupported);
  }
  // The nodes run as items on the stream, one stretch up to each event record node, after which that event is
  // recorded, then the rest (one item for a graph without them).
  auto stretch = [data = exec.data](std::size_t from, std::size_t to) -> Work {
    return [data, from, to] {
      const bool may_defer = t_may_defer;
      t_may_defer = false;  // a node's work in flight is finished before the next node runs
      for (std::size_t i = from; i < to; ++i) data->nodes[i]();
      t_may_defer = may_defer;
    };
  };
  std::size_t from = 0;
  for (const auto& [node, event] : g.event_records) {
    if (const cudaError_t e = push(*s, stretch(from, node + 1), cudaGraphNodeTypeGraph); e != cudaSuccess) return fail(e);
    record_at_end(*find_event(event), event, *s);
    from = node + 1;
  }
  if (const cudaError_t e = push(*s, stretch(from, g.nodes.size()), cudaGraphNodeTypeGraph); e != cudaSuccess) {
    return fail(e);
  }
  if (!g.launched) {
    g.launched = true;
    for (Block* b : blocks) b->counted = true;
    st.memory[device].graph_bytes += bytes;
    st.memory[device].graph_high = std::max(st.memory[device].graph_high, st.memory[device].graph_bytes);
  }
  for (Block* b : blocks) b->outstanding = !b->freed_in_graph;
  exec.last_stream = s;
  exec.last_position = s->last;
  return cudaSuccess;
}

// Launches already enqueued still run: they hold the graph's data.
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  State& st = state();
  Lock lock(st.mutex);
  auto it = st.execs.find(reinterpret_cast<GraphExec*>(graphExec));
  if (it == st.execs.end()) return fail(cudaErrorInvalidValue);
  --it->second->data->execs;
  st.execs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  State& st = state();
  Lock lock(st.mutex);
  if (st.graphs.erase(reinterpret_cast<Graph*>(graph)) == 0) return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

// Used and reserved are the same here: the bytes of graph allocations that launches have made real.
cudaError_t cudaDeviceGetGraphMemAttribute(int device, cudaGraphMemAttributeType attr, void* value) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  Lock lock(state().mutex);
  const DeviceMemory& m = state().memory[device];
  switch (attr) {
    case cudaGraphMemAttrUsedMemCurrent:
    case cudaGraphMemAttrReservedMemCurrent:
      *static_cast<std::uint64_t*>(value) = m.graph_bytes;
      break;
    case cudaGraphMemAttrUsedMemHigh:
    case cudaGraphMemAttrReservedMemHigh:
      *static_cast<std::uint64_t*>(value) = m.graph_high;
      break;
    default:
      return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

// Graph memory goes back as soon as no graph or holder needs it, so there is never anything to trim.
cudaError_t cudaDeviceGraphMemTrim(int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  return cudaSuccess;
}
