// graph.h — CUDA graphs for ferry::Graph: capture on a device's compute stream, instantiate, replay, destroy.
// Not here: the rules a captured body follows (ferry/graph.h), the training step built on it (step_graph.h).
#pragma once

#include <cstdint>
#include <string>

#include "device_state.h"

namespace ferry::cuda {

// The compute stream of `s` starts recording this thread's work (cudaStreamCaptureModeThreadLocal); the
// cuBLAS and cuDNN handles are made first (their creation cannot be recorded).
void begin_capture(DeviceState& s);
// Ends the capture and instantiates it (allocations the body leaves alive are freed by the next replay
// before it allocates them again, at the same address). Throws GraphCaptureError when the capture was
// invalidated, naming CUDA's reason, or when the body freed memory made before the capture (that free is
// held back until now: cudaFreeAsync inside a capture takes only the graph's own allocations). Tensors the
// failed body allocated hold no memory. `operations` gets the graph's node count.
void* end_capture(DeviceState& s, std::int64_t* operations);
void replay_graph(void* graph, DeviceState& s);
void destroy_graph(void* graph, int index) noexcept;
// The graph's nodes by type: "112 kernels, 30 allocations, 30 frees, 2 memsets" (cudaGraphNodeGetType); empty
// when CUDA cannot list them. Never throws.
std::string describe_graph(void* graph);

}  // namespace ferry::cuda
