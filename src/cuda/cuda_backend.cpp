// cuda_backend.cpp — the cuda device: per-GPU state (streams, memory pool, events), memory through
// CUDA's stream-ordered allocator, device properties, syncs, and the Backend class that routes every
// op to its launcher. Not here: the kernels (*.cu), copies (copy.cpp), GEMM (gemm.cpp), pinned memory
// (pinned.cpp).
#include "cuda_backend.h"

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "../core/registry.h"
#include "check.h"
#include "cublas_library.h"
#include "cudnn_layers.h"
#include "device_state.h"
#include "graph.h"
#include "ferry/error.h"
#include "kernels.h"

namespace ferry::cuda {

// --- device discovery ------------------------------------------------------------------------------

namespace {
struct DeviceCount {
  int count = 0;
  std::string reason;  // why count is 0
};

// The driver's two usual answers on a machine without a usable GPU, in plain words (its own wording, "CUDA driver
// version is insufficient", reads as "update the driver" where there is no driver at all).
std::string in_plain_words(cudaError_t status) {
  if (status == cudaErrorInsufficientDriver) {
    return "no NVIDIA driver (so no GPU), or one too old for ferry's CUDA runtime: ";
  }
  if (status == cudaErrorNoDevice) return "the NVIDIA driver sees no GPU: ";
  return "";
}

const DeviceCount& discovered_devices() {
  static const DeviceCount found = [] {
    DeviceCount d;
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      cudaGetLastError();  // no driver / no device is an answer, not a failure: clear it
      d.reason = in_plain_words(status) + "cudaGetDeviceCount: " + cudaGetErrorName(status) + " (" +
                 cudaGetErrorString(status) + ")";
      return d;
    }
    if (n == 0) d.reason = "cudaGetDeviceCount: 0 devices";
    d.count = n < kMaxDevices ? n : kMaxDevices;
    return d;
  }();
  return found;
}
}  // namespace

int cuda_device_count() { return discovered_devices().count; }
std::string cuda_unavailable_reason() { return discovered_devices().reason; }
std::string unavailable_reason() { return cuda_unavailable_reason(); }

// --- DeviceGuard ----------------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int index) : index_(index) {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    cudaGetLastError();
    previous_ = -1;
  }
  if (previous_ != index) FERRY_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  // A failure here (e.g. at process exit) is cleared, so that no later check reports it as its own.
  if (previous_ >= 0 && previous_ != index_ && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
}

// --- per-device state -----------------------------------------------------------------------------

namespace {
// Created once per device and deliberately never destroyed: CUDA objects torn down by static
// destructors after the runtime unloads would only produce errors at exit.
std::array<std::atomic<DeviceState*>, kMaxDevices> g_states{};
std::array<std::once_flag, kMaxDevices> g_state_once;

DeviceState* create_state(int index) {
  DeviceGuard guard(index);
  auto state = std::make_unique<DeviceState>();
  state->index = index;
  cudaDeviceProp prop{};
  FERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  state->multiprocessors = prop.multiProcessorCount;
  state->total_memory = static_cast<std::int64_t>(prop.totalGlobalMem);

  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&state->compute_stream, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&state->copy_stream, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&state->compute_marker, cudaEventDisableTiming));
  FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&state->copy_marker, cudaEventDisableTiming));

  // ferry's own pool (not the device default, which other libraries share). Freed blocks stay in
  // the pool for reuse until empty_cache() trims it: release threshold = everything.
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = index;
  FERRY_CUDA_CHECK(cudaMemPoolCreate(&state->pool, &props));
  std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
  FERRY_CUDA_CHECK(cudaMemPoolSetAttribute(state->pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  // A block freed on the compute stream is not handed to the copy stream with a hidden wait for that free
  // (the driver's default): a prefetch into a fresh buffer would then queue behind the step it should run
  // beside. The pool grows instead; reuse in a stream's own order, or after the free is done, still happens.
  int no_hidden_waits = 0;
  FERRY_CUDA_CHECK(cudaMemPoolSetAttribute(state->pool, cudaMemPoolReuseAllowInternalDependencies, &no_hidden_waits));
  // Peers that can reach this device's memory get access to the pool (device-to-device copies).
  for (int peer = 0; peer < cuda_device_count(); ++peer) {
    int can_access = 0;
    if (peer == index || cudaDeviceCanAccessPeer(&can_access, peer, index) != cudaSuccess || !can_access) {
      cudaGetLastError();
      continue;
    }
    cudaMemAccessDesc access{};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = peer;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    if (cudaMemPoolSetAccess(state->pool, &access, 1) != cudaSuccess) cudaGetLastError();
  }

  void* report = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(&report, sizeof(DeviceErrorReport), cudaHostAllocMapped | cudaHostAllocPortable));
  state->report_host = new (report) DeviceErrorReport();
  void* report_device = nullptr;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(&report_device, report, 0));
  state->report_device = static_cast<DeviceErrorReport*>(report_device);
  return state.release();
}
}  // namespace

DeviceState& device_state(int index) {
  FERRY_CHECK(index >= 0 && index < cuda_device_count(), DeviceUnavailable, "cuda:", index,
              " is not available; devices present: ", available_devices_text());
  std::call_once(g_state_once[static_cast<std::size_t>(index)],
                 [index] { g_states[static_cast<std::size_t>(index)].store(create_state(index)); });
  return *g_states[static_cast<std::size_t>(index)].load();
}

DeviceState* device_state_if_created(int index) noexcept {
  if (index < 0 || index >= kMaxDevices) return nullptr;
  return g_states[static_cast<std::size_t>(index)].load();
}

int current_multiprocessors() {
  int device = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  return device_state(device).multiprocessors;
}

// --- stream ordering and kernel-reported errors -----------------------------------------------------

void stream_wait(cudaStream_t waiter, int waiter_device, cudaStream_t producer, int producer_device) {
  if (waiter == producer) return;
  DeviceState& p = device_state(producer_device);
  cudaEvent_t marker = producer == p.compute_stream ? p.compute_marker
                       : producer == p.copy_stream  ? p.copy_marker
                                                    : nullptr;
  std::lock_guard lock(p.event_mutex);
  bool temporary = false;
  {
    DeviceGuard guard(producer_device);
    if (!marker) {  // a stream ferry did not create: a one-off event
      FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming));
      temporary = true;
    }
    FERRY_CUDA_CHECK(cudaEventRecord(marker, producer));
  }
  DeviceGuard guard(waiter_device);
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(waiter, marker, 0));
  // released by CUDA once the wait no longer needs it
  if (temporary && cudaEventDestroy(marker) != cudaSuccess) cudaGetLastError();
}

void raise_kernel_errors(int index) {
  DeviceState& s = device_state(index);
  volatile DeviceErrorReport* report = s.report_host;
  const auto kind = static_cast<KernelErrorKind>(report->kind);
  if (kind == KernelErrorKind::None) return;
  const std::int64_t value = report->value, limit = report->limit;
  report->kind = 0;
  const std::string where = detail::concat(" (found by a kernel on cuda:", index, ", reported at the next sync)");
  switch (kind) {
    case KernelErrorKind::IndexSelect:
      throw InvalidArgument(detail::concat("index_select: index ", value, " is out of bounds for dimension with size ",
                                           limit, where));
    case KernelErrorKind::IndexAdd:
      throw InvalidArgument(detail::concat("index_add: index ", value, " is out of bounds for dimension with size ",
                                           limit, where));
    case KernelErrorKind::Gather:
      throw InvalidArgument(detail::concat("gather: index ", value, " is out of bounds for dimension with size ", limit,
                                           where));
    case KernelErrorKind::ScatterAdd:
      throw InvalidArgument(detail::concat("scatter_add: index ", value, " is out of bounds for dimension with size ",
                                           limit, where));
    case KernelErrorKind::CrossEntropyTarget:
      throw InvalidArgument(detail::concat("cross_entropy: target ", value, " is out of bounds for ", limit,
                                           " classes", where,
                                           value < 0 ? detail::concat(" (to skip the rows marked ", value,
                                                                      ", pass {.ignore_index = ", value, "})")
                                                     : std::string()));
    default:
      throw InternalError(detail::concat("unknown kernel error report ", static_cast<int>(kind), where));
  }
}

// --- memory ---------------------------------------------------------------------------------------

namespace {
std::uint64_t pool_reserved(const DeviceState& s) {
  std::uint64_t reserved = 0;
  if (cudaMemPoolGetAttribute(s.pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  // Memory that captured graphs hold (their allocation nodes; see graph.cpp) is reserved too.
  std::uint64_t graphs = 0;
  if (cudaDeviceGetGraphMemAttribute(s.index, cudaGraphMemAttrReservedMemCurrent, &graphs) != cudaSuccess) {
    cudaGetLastError();
    graphs = 0;
  }
  return reserved + graphs;
}

// The message PyTorch users know, with every number a reader needs to decide what to do.
OutOfMemory out_of_memory(const DeviceState& s, std::size_t bytes) {
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) cudaGetLastError();
  const double gib = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
  return OutOfMemory(detail::concat(
      "CUDA out of memory on cuda:", s.index, ": tried to allocate ", bytes, " bytes (", gib, " GiB); ferry has ",
      s.allocated.load(), " bytes allocated and ", pool_reserved(s), " bytes reserved; the device has ", free,
      " bytes free of ", total, " bytes total. Free tensors that are no longer needed or use a smaller batch"));
}

// One allocation from the device's pool in the order of `stream`; throws OutOfMemory. When the pool
// cannot grow, it waits for the device's streams (pending frees complete), returns every unused block
// to the device and tries once more.
void* allocate_in_stream_order(DeviceState& s, std::size_t bytes, cudaStream_t stream) {
  if (static_cast<std::int64_t>(bytes) > s.total_memory) throw out_of_memory(s, bytes);
  void* ptr = nullptr;
  cudaError_t status = cudaMallocFromPoolAsync(&ptr, bytes, s.pool, stream);
  if (status == cudaErrorMemoryAllocation && s.capturing.load()) {  // no waiting inside a capture
    cudaGetLastError();
    throw out_of_memory(s, bytes);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    // What empty_cache() does: every stream done, every unused block of the pool and of past graph
    // replays given back to the device.
    FERRY_CUDA_CHECK(cudaStreamSynchronize(stream));
    FERRY_CUDA_CHECK(cudaStreamSynchronize(s.compute_stream));  // blocks are freed in its order
    FERRY_CUDA_CHECK(cudaStreamSynchronize(s.copy_stream));
    FERRY_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
    if (cudaDeviceGraphMemTrim(s.index) != cudaSuccess) cudaGetLastError();
    status = cudaMallocFromPoolAsync(&ptr, bytes, s.pool, stream);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw out_of_memory(s, bytes);
  }
  if (status != cudaSuccess) throw_cuda_error(status, "cudaMallocFromPoolAsync", __FILE__, __LINE__);
  return ptr;
}
}  // namespace

ScratchBuffer::ScratchBuffer(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes == 0) return;
  int device = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  DeviceState& s = device_state(device);
  data_ = allocate_in_stream_order(s, bytes, stream);
  state_ = &s;
  bytes_ = static_cast<std::int64_t>(bytes);
  s.count_allocated(bytes_);
}

ScratchBuffer::~ScratchBuffer() {
  if (!data_) return;
  state_->count_allocated(-bytes_);
  if (cudaFreeAsync(data_, stream_) != cudaSuccess) cudaGetLastError();
}

// --- the backend ----------------------------------------------------------------------------------

namespace {

int cores_per_multiprocessor(int major, int minor) {
  if (major == 7) return 64;                 // Volta, Turing
  if (major == 8) return minor == 0 ? 64 : 128;  // A100: 64; GA10x, Ada: 128
  return 128;                                // Hopper, Blackwell and later
}

cudaStream_t to_cuda(const Stream& stream) { return static_cast<cudaStream_t>(stream.handle); }

class CudaBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::CUDA; }
  int device_count() const override { return cuda_device_count(); }

  DeviceProperties properties(int index) const override {
    device_state(index);  // checks the index
    DeviceGuard guard(index);
    cudaDeviceProp prop{};
    FERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    int clock_khz = 0, memory_clock_khz = 0, bus_width_bits = 0;
    FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, index));
    FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, index));
    FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, index));
    DeviceProperties p;
    p.name = prop.name;
    p.multiprocessors = prop.multiProcessorCount;
    p.cores = prop.multiProcessorCount * cores_per_multiprocessor(prop.major, prop.minor);
    p.clock_hz = clock_khz * 1e3;
    p.memory_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
    // double data rate x bus width: the nominal device memory bandwidth
    p.memory_bytes_per_second = 2.0 * memory_clock_khz * 1e3 * bus_width_bits / 8.0;
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), index) != cudaSuccess) cudaGetLastError();
    p.link = std::string("PCIe (bus ") + bus_id + ")";
    p.bus_id = bus_id;
    p.link_bytes_per_second = 0;  // the runtime cannot say (NVML could); measured by `ferry bench`
    p.libraries = cublas_description();
    p.libraries += cudnn_description(index);
    return p;
  }

  // --- memory ----------------------------------------------------------------------------------
  void* allocate(std::size_t bytes, int index) override { return take(bytes, index, false); }
  // In the copy stream's order: its host->device copy need not wait for the compute stream. The block is
  // freed on the compute stream (deallocate) after the compute stream has waited for the copy.
  void* allocate_for_copy(std::size_t bytes, int index) override { return take(bytes, index, true); }

  void* take(std::size_t bytes, int index, bool copy_order) {
    DeviceState& s = device_state(index);
    DeviceGuard guard(index);
    void* ptr = allocate_in_stream_order(s, bytes, copy_order ? s.copy_stream : s.compute_stream);
    if (s.capturing.load() || s.has_dead_blocks.load()) {
      std::lock_guard lock(s.capture_mutex);
      if (s.capturing.load() && !copy_order && std::this_thread::get_id() == s.capture_thread) {
        s.capture_blocks.insert(ptr);  // the graph's
      }
      if (s.dead_blocks.erase(ptr) > 0) s.has_dead_blocks = !s.dead_blocks.empty();  // the address is live again
    }
    s.count_allocated(static_cast<std::int64_t>(bytes));
    s.allocations.fetch_add(1);
    return ptr;
  }

  // Freed in the order of the compute stream: kernels already enqueued that use the block finish
  // first. Copies on the copy stream are ordered before later compute work by copy_bytes().
  void deallocate(void* ptr, std::size_t bytes, int index) noexcept override {
    DeviceState* state = device_state_if_created(index);
    if (!ptr || !state) return;
    DeviceState& s = *state;
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) {
      cudaGetLastError();
      previous = -1;
    }
    s.allocated.fetch_sub(static_cast<std::int64_t>(bytes));
    if (s.capturing.load() || s.has_dead_blocks.load()) {
      std::lock_guard lock(s.capture_mutex);
      if (s.capturing.load() && s.capture_blocks.count(ptr) == 0) {  // made before the capture: held back
        s.held_frees.emplace_back(ptr, bytes);
        if (s.capture_error.empty() && std::this_thread::get_id() == s.capture_thread) {  // the body's doing
          s.capture_error = detail::concat("Freeing ", bytes, " bytes of cuda:", index, " memory allocated before "
                                           "the capture (a tensor made before it was released inside it); release "
                                           "such tensors before capturing");
        }
        return;
      }
      if (s.dead_blocks.erase(ptr) > 0) {  // a block of a graph never launched: nothing to give back
        s.has_dead_blocks = !s.dead_blocks.empty();
        return;
      }
    }
    if (previous != index && cudaSetDevice(index) != cudaSuccess) cudaGetLastError();
    if (cudaFreeAsync(ptr, s.compute_stream) != cudaSuccess) cudaGetLastError();  // e.g. at process exit
    if (previous >= 0 && previous != index && cudaSetDevice(previous) != cudaSuccess) cudaGetLastError();
  }

  MemoryStats memory_stats(int index) const override {
    DeviceState& s = device_state(index);
    DeviceGuard guard(index);
    MemoryStats stats;
    stats.allocated = s.allocated.load();
    stats.library = s.library.load();
    stats.peak = s.peak.load();
    stats.allocations = s.allocations.load();
    stats.reserved = static_cast<std::int64_t>(pool_reserved(s)) + stats.library;  // the workspaces are outside the pool
    std::size_t free = 0, total = 0;
    FERRY_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    stats.free = static_cast<std::int64_t>(free);
    stats.total = static_cast<std::int64_t>(total);
    return stats;
  }

  void reset_peak_memory_stats(int index) override {
    DeviceState& s = device_state(index);
    s.peak.store(s.allocated.load());
  }

  // Waits for the device, then hands every cached (unused) block back to the driver.
  void empty_cache(int index) override {
    DeviceState& s = device_state(index);
    DeviceGuard guard(index);
    FERRY_CUDA_CHECK(cudaStreamSynchronize(s.compute_stream));
    FERRY_CUDA_CHECK(cudaStreamSynchronize(s.copy_stream));
    FERRY_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
    FERRY_CUDA_CHECK(cudaDeviceGraphMemTrim(index));  // what graphs of the past replays keep reserved
    pinned_release_cached();
  }

  void* allocate_pinned(std::size_t bytes) override {
    if (cuda_device_count() == 0) return Backend::allocate_pinned(bytes);  // throws NotSupported
    return pinned_allocate(bytes);
  }
  void deallocate_pinned(void* ptr) noexcept override { pinned_deallocate(ptr); }

  // --- streams ---------------------------------------------------------------------------------
  Stream compute_stream(int index) override {
    return {Device(DeviceType::CUDA, index), device_state(index).compute_stream};
  }
  Stream copy_stream(int index) override { return {Device(DeviceType::CUDA, index), device_state(index).copy_stream}; }

  void synchronize(const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    FERRY_CUDA_CHECK(cudaStreamSynchronize(to_cuda(stream)));
    raise_kernel_errors(stream.device.index);
  }
  void synchronize_device(int index) override {
    device_state(index);
    DeviceGuard guard(index);
    FERRY_CUDA_CHECK(cudaDeviceSynchronize());
    raise_kernel_errors(index);
  }
  void stream_wait(const Stream& waiter, const Stream& producer) override {
    cuda::stream_wait(to_cuda(waiter), waiter.device.index, to_cuda(producer), producer.device.index);
  }
  void* create_event(int index) override {
    device_state(index);
    DeviceGuard guard(index);
    cudaEvent_t event = nullptr;
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }
  void destroy_event(void* event, int index) noexcept override {
    if (!event || !device_state_if_created(index)) return;
    if (cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) cudaGetLastError();
  }
  void record_event(void* event, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    // In this thread's capture a plain record would only order the capture's own streams: recorded as external,
    // it becomes an event record node that each replay records, which work outside the graph can wait for.
    const DeviceState& s = device_state(stream.device.index);
    if (s.capturing.load() && s.capture_thread == std::this_thread::get_id() && to_cuda(stream) == s.compute_stream) {
      FERRY_CUDA_CHECK(
          cudaEventRecordWithFlags(static_cast<cudaEvent_t>(event), to_cuda(stream), cudaEventRecordExternal));
      return;
    }
    FERRY_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), to_cuda(stream)));
  }
  void event_synchronize(void* event, int index) override {
    DeviceGuard guard(index);
    FERRY_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
    raise_kernel_errors(index);
  }
  void read_when_ready(void* dst, const void* src, std::size_t bytes, void* event, int index) override {
    DeviceState& s = device_state(index);
    DeviceGuard guard(index);
    std::call_once(s.read_stream_once,
                   [&s] { FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s.read_stream, cudaStreamNonBlocking)); });
    FERRY_CUDA_CHECK(cudaStreamWaitEvent(s.read_stream, static_cast<cudaEvent_t>(event), 0));
    FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s.read_stream));
    FERRY_CUDA_CHECK(cudaStreamSynchronize(s.read_stream));
    raise_kernel_errors(index);
  }

  void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes, const Stream& stream,
            bool pinned, bool non_blocking) override {
    copy_bytes(dst, dst_device, src, src_device, bytes, stream, pinned, non_blocking);
  }
  PageableCopyPath pageable_copy_path(bool host_to_device) const override {
    return cuda::pageable_copy_path(host_to_device);
  }

  // --- kernels ---------------------------------------------------------------------------------
  void fill(const KernelTensor& out, double value, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_fill(out, value, to_cuda(stream));
  }
  void arange(const KernelTensor& out, double start, double step, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_arange(out, start, step, to_cuda(stream));
  }
  void random(const KernelTensor& out, RandomKind kind, double low, double high, std::uint64_t seed,
              std::uint64_t offset, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_random(out, kind, low, high, seed, offset, to_cuda(stream));
  }
  void unary(UnaryOp op, const KernelTensor& out, const KernelTensor& in, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_unary(op, out, in, to_cuda(stream));
  }
  void binary(BinaryOp op, const KernelTensor& out, const KernelTensor& a, const KernelTensor& b,
              const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_binary(op, out, a, b, to_cuda(stream));
  }
  void binary_scalar(BinaryOp op, const KernelTensor& out, const KernelTensor& a, double scalar, bool scalar_first,
                     const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_binary_scalar(op, out, a, scalar, scalar_first, to_cuda(stream));
  }
  void where(const KernelTensor& out, const KernelTensor& cond, const KernelTensor& a, const KernelTensor& b,
             const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_where(out, cond, a, b, to_cuda(stream));
  }
  void reduce(ReduceOp op, const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t reduce,
              std::int64_t inner, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_reduce(op, out, in, outer, reduce, inner, to_cuda(stream));
  }
  void gemm(const GemmArgs& args, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    cuda::gemm(args, stream.device.index, to_cuda(stream));
  }
  void index_select(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
                    std::int64_t n_in, std::int64_t inner, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_index_select(out, in, index, outer, n_in, inner, device_state(stream.device.index).report_device,
                        to_cuda(stream));
  }
  void index_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index, std::int64_t outer,
                 std::int64_t n_out, std::int64_t inner, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_index_add(out, src, index, outer, n_out, inner, device_state(stream.device.index).report_device,
                     to_cuda(stream));
  }
  void gather(const KernelTensor& out, const KernelTensor& in, const KernelTensor& index, std::int64_t outer,
              std::int64_t n_in, std::int64_t inner, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_gather(out, in, index, outer, n_in, inner, device_state(stream.device.index).report_device, to_cuda(stream));
  }
  void scatter_add(const KernelTensor& out, const KernelTensor& src, const KernelTensor& index, std::int64_t outer,
                   std::int64_t n_out, std::int64_t inner, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_scatter_add(out, src, index, outer, n_out, inner, device_state(stream.device.index).report_device,
                       to_cuda(stream));
  }
  void cumsum(const KernelTensor& out, const KernelTensor& in, std::int64_t outer, std::int64_t n, std::int64_t inner,
              const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_cumsum(out, in, outer, n, inner, to_cuda(stream));
  }
  void argsort(const KernelTensor& indices, const KernelTensor& in, std::int64_t rows, std::int64_t n, bool descending,
               const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_argsort(indices, in, rows, n, descending, to_cuda(stream));
  }
  void cross_entropy(const KernelTensor& loss_rows, const KernelTensor& grad, const KernelTensor& logits,
                     const KernelTensor& target, double grad_scale, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_cross_entropy(loss_rows, grad, logits, target, grad_scale, device_state(stream.device.index).report_device,
                         to_cuda(stream));
  }
  // softmax along the last dim: ferry's kernels (softmax.cu), one launch each way.
  bool softmax_library(DType dtype, int index) override {
    return library_query(index, [&] { return softmax_supported(dtype); });
  }
  void softmax_forward(const KernelTensor& out, const KernelTensor& in, std::int64_t rows, std::int64_t n, bool log,
                       const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_softmax_forward(out, in, rows, n, log, to_cuda(stream));
  }
  void softmax_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& out,
                        std::int64_t rows, std::int64_t n, bool log, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_softmax_backward(grad_in, grad_out, out, rows, n, log, to_cuda(stream));
  }
  // clip_grad_norm_'s norms and scale over many tensors: ferry's kernels (multi_norm.cu).
  bool multi_norm_library(DType dtype, int index) override {
    return library_query(index, [&] { return multi_norm_supported(dtype); });
  }
  void multi_norm(const KernelTensor* tensors, std::size_t count, const KernelTensor& norms, double p,
                  const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_multi_norm(tensors, count, norms, p, to_cuda(stream));
  }
  void multi_scale(const KernelTensor* tensors, std::size_t count, const KernelTensor& scale,
                   const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_multi_scale(tensors, count, scale, to_cuda(stream));
  }
  // LayerNorm over the last dim and GELU: ferry's kernels (layer_norm.cu, gelu.cu).
  bool layer_norm_library(DType dtype, int index) override {
    return library_query(index, [&] { return layer_norm_supported(dtype); });
  }
  void layer_norm_forward(const KernelTensor& out, const KernelTensor& normalized, const KernelTensor& rstd,
                          const KernelTensor& in, const KernelTensor& weight, const KernelTensor& bias,
                          std::int64_t rows, std::int64_t d, double eps, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_layer_norm_forward(out, normalized, rstd, in, weight, bias, rows, d, eps, to_cuda(stream));
  }
  void layer_norm_backward(const KernelTensor& grad_in, const KernelTensor& grad_weight, const KernelTensor& grad_bias,
                           const KernelTensor& grad_out, const KernelTensor& weight, const KernelTensor& normalized,
                           const KernelTensor& rstd, std::int64_t rows, std::int64_t d, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_layer_norm_backward(grad_in, grad_weight, grad_bias, grad_out, weight, normalized, rstd, rows, d,
                               to_cuda(stream));
  }
  bool gelu_library(DType dtype, int index) override {
    return library_query(index, [&] { return gelu_supported(dtype); });
  }
  void gelu_forward(const KernelTensor& out, const KernelTensor& cdf, const KernelTensor& in,
                    const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_gelu_forward(out, cdf, in, to_cuda(stream));
  }
  void gelu_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& in,
                     const KernelTensor& cdf, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_gelu_backward(grad_in, grad_out, in, cdf, to_cuda(stream));
  }
  void im2col(const KernelTensor& columns, const KernelTensor& image, const Conv2dShape& shape,
              const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_im2col(columns, image, shape, to_cuda(stream));
  }
  void col2im(const KernelTensor& image, const KernelTensor& columns, const Conv2dShape& shape,
              const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_col2im(image, columns, shape, to_cuda(stream));
  }
  void max_pool2d(const KernelTensor& out, const KernelTensor& argmax, const KernelTensor& in, const Pool2dShape& shape,
                  const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_max_pool2d(out, argmax, in, shape, to_cuda(stream));
  }
  void max_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const KernelTensor& argmax,
                           const Pool2dShape& shape, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_max_pool2d_backward(grad_in, grad_out, argmax, shape, to_cuda(stream));
  }
  void avg_pool2d(const KernelTensor& out, const KernelTensor& in, const Pool2dShape& shape,
                  const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_avg_pool2d(out, in, shape, to_cuda(stream));
  }
  void avg_pool2d_backward(const KernelTensor& grad_in, const KernelTensor& grad_out, const Pool2dShape& shape,
                           const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_avg_pool2d_backward(grad_in, grad_out, shape, to_cuda(stream));
  }

  void sgd_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* buffers, std::size_t count,
                const SgdStep& step, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_sgd_step(params, grads, buffers, count, step, to_cuda(stream));
  }

  void adam_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* exp_avgs,
                 const KernelTensor* exp_avg_sqs, const KernelTensor* max_exp_avg_sqs, const KernelTensor* steps,
                 std::size_t count, const AdamStep& step, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, count, step, to_cuda(stream));
  }

  // --- library layers: cuDNN (cudnn_layers.cpp) -----------------------------------------------------
  // The *_library queries never throw: a device that cannot be made current answers no.
  template <typename Query>
  static bool library_query(int index, Query&& query) {
    try {
      DeviceGuard guard(index);
      return query();
    } catch (const std::exception&) {
      return false;
    }
  }
  // --- graphs (graph.cpp) ---------------------------------------------------------------------------
  bool graph_supported(int index) override { return index >= 0 && index < cuda_device_count(); }
  void begin_capture(int index) override { cuda::begin_capture(device_state(index)); }
  void* end_capture(int index, std::int64_t* operations) override {
    return cuda::end_capture(device_state(index), operations);
  }
  void replay_graph(void* graph, int index) override { cuda::replay_graph(graph, device_state(index)); }
  void destroy_graph(void* graph, int index) noexcept override { cuda::destroy_graph(graph, index); }
  std::string describe_graph(void* graph, int) const override { return cuda::describe_graph(graph); }

  bool conv2d_library(const Conv2dShape& shape, DType dtype, int index) override {
    return library_query(index, [&] { return cudnn_conv2d_supported(shape, dtype, index); });
  }
  void conv2d_forward(const KernelTensor& out, const KernelTensor& input, const KernelTensor& weight,
                      const KernelTensor& bias, const Conv2dShape& shape, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    if (bias.data) {  // out = the bias over every sample and position, then cuDNN adds the convolution (beta 1)
      KernelTensor per_channel = out;  // (N, O, oh, ow) with strides (0, 1, 0, 0) into bias (O)
      per_channel.data = bias.data;
      per_channel.strides = {0, 1, 0, 0};
      unary(UnaryOp::Copy, out, per_channel, stream);
    }
    cudnn_conv2d_forward(out, input, weight, shape, bias.data ? 1.0f : 0.0f, stream.device.index, to_cuda(stream));
  }
  void conv2d_backward_input(const KernelTensor& grad_input, const KernelTensor& grad_out, const KernelTensor& weight,
                             const Conv2dShape& shape, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    cudnn_conv2d_backward_input(grad_input, grad_out, weight, shape, stream.device.index, to_cuda(stream));
  }
  void conv2d_backward_weight(const KernelTensor& grad_weight, const KernelTensor& grad_out, const KernelTensor& input,
                              const Conv2dShape& shape, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    cudnn_conv2d_backward_weight(grad_weight, grad_out, input, shape, stream.device.index, to_cuda(stream));
  }
  // BatchNorm alone: cuDNN. BatchNorm + ReLU: ferry's fused kernels (batch_norm.cu), the ReLU applied in
  // the normalising pass and its mask in the gradient's, with no pass of their own.
  bool batch_norm_library(const BatchNormShape& shape, DType dtype, int index) override {
    if (shape.relu) return library_query(index, [&] { return batch_norm_kernels_supported(shape, dtype); });
    return library_query(index, [&] { return cudnn_batch_norm_supported(shape, dtype, index); });
  }
  void batch_norm_forward(const KernelTensor& out, const KernelTensor& x, const KernelTensor& weight,
                          const KernelTensor& bias, const KernelTensor& running_mean, const KernelTensor& running_var,
                          const KernelTensor& save_mean, const KernelTensor& save_invstd, const BatchNormShape& shape,
                          double factor, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    if (shape.relu) {
      launch_batch_norm_forward(out, x, weight, bias, running_mean, running_var, save_mean, save_invstd, shape, factor,
                                to_cuda(stream));
      return;
    }
    cudnn_batch_norm_forward(out, x, weight, bias, running_mean, running_var, save_mean, save_invstd, shape, factor,
                             stream.device.index, to_cuda(stream));
  }
  void batch_norm_backward(const KernelTensor& grad_x, const KernelTensor& grad_weight, const KernelTensor& grad_bias,
                           const KernelTensor& grad_out, const KernelTensor& x, const KernelTensor& out,
                           const KernelTensor& weight, const KernelTensor& save_mean, const KernelTensor& save_invstd,
                           const BatchNormShape& shape, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    if (shape.relu) {
      launch_batch_norm_backward(grad_x, grad_weight, grad_bias, grad_out, x, out, weight, save_mean, save_invstd,
                                 shape, to_cuda(stream));
      return;
    }
    cudnn_batch_norm_backward(grad_x, grad_weight, grad_bias, grad_out, x, weight, save_mean, save_invstd, shape,
                              stream.device.index, to_cuda(stream));
  }
  // One LSTM or GRU step: ferry's kernels (rnn_cells.cu), one launch each way.
  bool rnn_cell_library(const RnnCellShape& /*shape*/, DType dtype, int index) override {
    return library_query(index, [&] { return rnn_cell_supported(dtype); });
  }
  void lstm_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& tanh_c,
                         const KernelTensor& x_gates, const KernelTensor& h_gates, const KernelTensor& c,
                         const RnnCellShape& shape, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_lstm_cell_forward(out, act, tanh_c, x_gates, h_gates, c, shape, to_cuda(stream));
  }
  void lstm_cell_backward(const KernelTensor& d_gates, const KernelTensor& d_c, const KernelTensor& grad_out,
                          const KernelTensor& act, const KernelTensor& tanh_c, const KernelTensor& c,
                          const RnnCellShape& shape, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_lstm_cell_backward(d_gates, d_c, grad_out, act, tanh_c, c, shape, to_cuda(stream));
  }
  void gru_cell_forward(const KernelTensor& out, const KernelTensor& act, const KernelTensor& x_gates,
                        const KernelTensor& h_gates, const KernelTensor& h, const RnnCellShape& shape,
                        const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_gru_cell_forward(out, act, x_gates, h_gates, h, shape, to_cuda(stream));
  }
  void gru_cell_backward(const KernelTensor& d_x_gates, const KernelTensor& d_h_gates, const KernelTensor& d_h,
                         const KernelTensor& grad_out, const KernelTensor& act, const KernelTensor& h_gates,
                         const KernelTensor& h, const RnnCellShape& shape, const Stream& stream) override {
    DeviceGuard guard(stream.device.index);
    launch_gru_cell_backward(d_x_gates, d_h_gates, d_h, grad_out, act, h_gates, h, shape, to_cuda(stream));
  }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace ferry::cuda
