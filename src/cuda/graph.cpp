// graph.cpp — CUDA graphs for ferry::Graph (see graph.h). Memory: ferry's allocations during a capture are
// cudaMallocFromPoolAsync calls, which a capture turns into allocation nodes owned by the graph (fixed
// addresses on every launch); frees of them become free nodes. The executable graph is instantiated with
// cudaGraphInstantiateFlagAutoFreeOnLaunch, so outputs the body leaves alive are given back and taken again
// by each launch, at the same address.
#include "graph.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"
#include "cudnn_layers.h"
#include "kernels.h"
#include "ferry/error.h"

namespace ferry::cuda {

namespace {
struct CudaGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<void*> blocks;  // allocated inside the capture: no memory behind them until the first launch
  bool launched = false;
};

// Ends the capture on `s`'s side: no longer recording; frees held back during it go now (outside the capture,
// in the compute stream's order); returns the blocks the capture allocated, and why it cannot stand ("" if it can).
std::pair<std::vector<void*>, std::string> close_capture(DeviceState& s) {
  std::lock_guard lock(s.capture_mutex);
  s.capturing = false;
  for (const auto& [ptr, bytes] : s.held_frees) {
    if (cudaFreeAsync(ptr, s.compute_stream) != cudaSuccess) cudaGetLastError();
  }
  s.held_frees.clear();
  std::pair<std::vector<void*>, std::string> out{std::vector<void*>(s.capture_blocks.begin(), s.capture_blocks.end()),
                                                 std::move(s.capture_error)};
  s.capture_blocks.clear();
  s.capture_error.clear();
  return out;
}

// Blocks of a graph that will never launch: tensors still pointing at them hold no memory; their frees only
// count.
void mark_dead(DeviceState& s, const std::vector<void*>& blocks) {
  if (blocks.empty()) return;
  std::lock_guard lock(s.capture_mutex);
  s.dead_blocks.insert(blocks.begin(), blocks.end());
  s.has_dead_blocks = true;
}

[[noreturn]] void capture_failed(const DeviceState& s, const char* call, cudaError_t status) {
  cudaGetLastError();  // clear the sticky-free error so the device stays usable
  throw GraphCaptureError(detail::concat(
      "The graph capture on cuda:", s.index, " failed at ", call, ": ", cudaGetErrorName(status), " (",
      cudaGetErrorString(status), "). Something in the captured body synchronized, copied through pageable "
      "memory, used another stream without joining it, or freed memory allocated before the capture"));
}
}  // namespace

void begin_capture(DeviceState& s) {
  DeviceGuard guard(s.index);
  // What a first GEMM or cuDNN call would create (a handle, cuBLAS's workspace by cudaMalloc) cannot be made
  // inside a capture: made now.
  prepare_cublas(s.index);
  prepare_cudnn(s.index);
  {
    std::lock_guard lock(s.capture_mutex);
    s.capture_thread = std::this_thread::get_id();
    s.capture_blocks.clear();
    s.held_frees.clear();
    s.capture_error.clear();
    s.capturing = true;
  }
  const cudaError_t began = cudaStreamBeginCapture(s.compute_stream, cudaStreamCaptureModeThreadLocal);
  if (began != cudaSuccess) {
    close_capture(s);
    throw_cuda_error(began, "cudaStreamBeginCapture", __FILE__, __LINE__);
  }
}

void* end_capture(DeviceState& s, std::int64_t* operations) {
  DeviceGuard guard(s.index);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s.compute_stream, &graph);
  auto [blocks, error] = close_capture(s);
  if (ended != cudaSuccess || !error.empty()) {
    if (graph) cudaGraphDestroy(graph);
    mark_dead(s, blocks);
    if (!error.empty()) {
      cudaGetLastError();
      throw GraphCaptureError(detail::concat(error, " (cuda:", s.index, ")"));
    }
    capture_failed(s, "cudaStreamEndCapture", ended);
  }
  std::size_t nodes = 0;
  if (cudaGraphGetNodes(graph, nullptr, &nodes) != cudaSuccess) {
    cudaGetLastError();
    nodes = 0;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  if (made != cudaSuccess) {
    cudaGraphDestroy(graph);
    mark_dead(s, blocks);
    capture_failed(s, "cudaGraphInstantiateWithFlags", made);
  }
  if (operations) *operations = static_cast<std::int64_t>(nodes);
  return new CudaGraph{graph, exec, std::move(blocks), false};
}

std::string describe_graph(void* handle) {
  const auto* g = static_cast<const CudaGraph*>(handle);
  if (!g || !g->graph) return {};
  std::size_t count = 0;
  if (cudaGraphGetNodes(g->graph, nullptr, &count) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0 && cudaGraphGetNodes(g->graph, nodes.data(), &count) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  struct Kind {
    cudaGraphNodeType type;
    const char* one;
    const char* many;
    std::size_t count = 0;
  };
  Kind kinds[] = {{cudaGraphNodeTypeKernel, "kernel", "kernels"},
                  {cudaGraphNodeTypeMemcpy, "copy", "copies"},
                  {cudaGraphNodeTypeMemset, "memset", "memsets"},
                  {cudaGraphNodeTypeMemAlloc, "allocation", "allocations"},
                  {cudaGraphNodeTypeMemFree, "free", "frees"},
                  {cudaGraphNodeTypeEventRecord, "event record", "event records"},
                  {cudaGraphNodeTypeGraph, "child graph", "child graphs"}};
  std::size_t other = 0;
  for (std::size_t i = 0; i < count; ++i) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(nodes[i], &type) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    Kind* kind = std::find_if(std::begin(kinds), std::end(kinds), [type](const Kind& k) { return k.type == type; });
    if (kind == std::end(kinds)) ++other;
    else ++kind->count;
  }
  std::string text;
  const auto add = [&text](std::size_t n, const char* one, const char* many) {
    if (n == 0) return;
    text += detail::concat(text.empty() ? "" : ", ", n, " ", n == 1 ? one : many);
  };
  for (const Kind& k : kinds) add(k.count, k.one, k.many);
  add(other, "other node", "other nodes");
  return text;
}

void replay_graph(void* handle, DeviceState& s) {
  DeviceGuard guard(s.index);
  auto* g = static_cast<CudaGraph*>(handle);
  const cudaError_t status = cudaGraphLaunch(g->exec, s.compute_stream);
  if (status == cudaErrorMemoryAllocation) {  // the graph's memory nodes could not be met: the caller can free some
    cudaGetLastError();
    throw OutOfMemory(detail::concat("CUDA out of memory on cuda:", s.index, " while replaying a captured graph ",
                                     "(its allocations could not be met); free tensors or empty_cache() and replay "
                                     "again"));
  }
  FERRY_CUDA_CHECK(status);
  g->launched = true;
}

void destroy_graph(void* handle, int index) noexcept {
  auto* g = static_cast<CudaGraph*>(handle);
  if (!g) return;
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) {
    cudaGetLastError();
    previous = -1;
  }
  if (previous != index && cudaSetDevice(index) != cudaSuccess) cudaGetLastError();
  if (g->exec && cudaGraphExecDestroy(g->exec) != cudaSuccess) cudaGetLastError();
  if (g->graph && cudaGraphDestroy(g->graph) != cudaSuccess) cudaGetLastError();
  if (previous >= 0 && previous != index && cudaSetDevice(previous) != cudaSuccess) cudaGetLastError();
  if (!g->launched) {  // e.g. the body threw after the capture: its outputs never had memory
    if (DeviceState* s = device_state_if_created(index)) {
      try {
        mark_dead(*s, g->blocks);
      } catch (...) {  // out of host memory: the counters stay high, nothing worse
      }
    }
  }
  delete g;
}

}  // namespace ferry::cuda
