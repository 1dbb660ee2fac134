// graph.cpp — CUDA graphs for ferry::Graph (see graph.h). Memory: ferry's allocations during a capture are
// cudaMallocFromPoolAsync calls, which a capture turns into allocation nodes owned by the graph (fixed
// addresses on every launch); frees of them become free nodes. The executable graph is instantiated with
// cudaGraphInstantiateFlagAutoFreeOnLaunch, so outputs the body leaves alive are given back and taken again
// by each launch, at the same address.
#include "graph.h"

#include <cuda_runtime_api.h>

#include "check.h"
#include "ferry/error.h"

namespace ferry::cuda {

namespace {
struct CudaGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

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
  FERRY_CUDA_CHECK(cudaStreamBeginCapture(s.compute_stream, cudaStreamCaptureModeThreadLocal));
}

void* end_capture(DeviceState& s, std::int64_t* operations) {
  DeviceGuard guard(s.index);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s.compute_stream, &graph);
  if (ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
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
    capture_failed(s, "cudaGraphInstantiateWithFlags", made);
  }
  if (operations) *operations = static_cast<std::int64_t>(nodes);
  return new CudaGraph{graph, exec};
}

void replay_graph(void* handle, DeviceState& s) {
  DeviceGuard guard(s.index);
  FERRY_CUDA_CHECK(cudaGraphLaunch(static_cast<CudaGraph*>(handle)->exec, s.compute_stream));
}

void destroy_graph(void* handle, int index) noexcept {
  auto* g = static_cast<CudaGraph*>(handle);
  if (!g) return;
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  if (previous != index) cudaSetDevice(index);
  if (g->exec && cudaGraphExecDestroy(g->exec) != cudaSuccess) cudaGetLastError();
  if (g->graph && cudaGraphDestroy(g->graph) != cudaSuccess) cudaGetLastError();
  if (previous >= 0 && previous != index) cudaSetDevice(previous);
  delete g;
}

}  // namespace ferry::cuda
