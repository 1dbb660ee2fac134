// cuda_runtime_api.h (emulator shim) — found before CUDA's own header when the cuda backend is built for
// the host-emulated GPU (tests/cuda_on_host). It renames every runtime function ferry's backend calls to
// ferry_emu_<name> and then includes the real header, whose declarations (exact signatures, extern "C")
// thereby declare the renamed functions that tests/cuda_on_host/runtime.cpp defines. The real libcudart,
// linked into the same test executable by other parts of the library, keeps its own symbols untouched.
// It is not an implementation and adds no declarations of its own; a function missing from the list
// below would silently call the real runtime, so `nm` of the backend's objects must show no plain cudaXxx.
#pragma once

// CUDA's header must come after the renames: included first (e.g. by a CUDA header that includes it by a
// quoted name), its declarations would keep the real names and the backend would call the real runtime.
#if defined(__CUDA_RUNTIME_API_H__)
#error "CUDA's cuda_runtime_api.h was included before the emulator's shim (tests/cuda_on_host/include)"
#endif

// devices
#define cudaGetDeviceCount ferry_emu_cudaGetDeviceCount
#define cudaGetDevice ferry_emu_cudaGetDevice
#define cudaSetDevice ferry_emu_cudaSetDevice
#define cudaGetDeviceProperties ferry_emu_cudaGetDeviceProperties
#define cudaDeviceGetAttribute ferry_emu_cudaDeviceGetAttribute
#define cudaDeviceGetPCIBusId ferry_emu_cudaDeviceGetPCIBusId
#define cudaDeviceCanAccessPeer ferry_emu_cudaDeviceCanAccessPeer
#define cudaDeviceEnablePeerAccess ferry_emu_cudaDeviceEnablePeerAccess
#define cudaDeviceSynchronize ferry_emu_cudaDeviceSynchronize

// errors
#define cudaGetLastError ferry_emu_cudaGetLastError
#define cudaPeekAtLastError ferry_emu_cudaPeekAtLastError
#define cudaGetErrorName ferry_emu_cudaGetErrorName
#define cudaGetErrorString ferry_emu_cudaGetErrorString

// streams and events
#define cudaStreamCreate ferry_emu_cudaStreamCreate
#define cudaStreamCreateWithFlags ferry_emu_cudaStreamCreateWithFlags
#define cudaStreamDestroy ferry_emu_cudaStreamDestroy
#define cudaStreamSynchronize ferry_emu_cudaStreamSynchronize
#define cudaStreamQuery ferry_emu_cudaStreamQuery
#define cudaStreamWaitEvent ferry_emu_cudaStreamWaitEvent
#define cudaEventCreate ferry_emu_cudaEventCreate
#define cudaEventCreateWithFlags ferry_emu_cudaEventCreateWithFlags
#define cudaEventDestroy ferry_emu_cudaEventDestroy
#define cudaEventRecord ferry_emu_cudaEventRecord
#define cudaEventRecordWithFlags ferry_emu_cudaEventRecordWithFlags
#define cudaEventSynchronize ferry_emu_cudaEventSynchronize
#define cudaEventQuery ferry_emu_cudaEventQuery
#define cudaEventElapsedTime ferry_emu_cudaEventElapsedTime

// device memory and memory pools
#define cudaMalloc ferry_emu_cudaMalloc
#define cudaFree ferry_emu_cudaFree
#define cudaMemGetInfo ferry_emu_cudaMemGetInfo
#define cudaMallocFromPoolAsync ferry_emu_cudaMallocFromPoolAsync
#define cudaFreeAsync ferry_emu_cudaFreeAsync
#define cudaMemPoolCreate ferry_emu_cudaMemPoolCreate
#define cudaMemPoolDestroy ferry_emu_cudaMemPoolDestroy
#define cudaMemPoolSetAttribute ferry_emu_cudaMemPoolSetAttribute
#define cudaMemPoolGetAttribute ferry_emu_cudaMemPoolGetAttribute
#define cudaMemPoolSetAccess ferry_emu_cudaMemPoolSetAccess
#define cudaMemPoolTrimTo ferry_emu_cudaMemPoolTrimTo

// pinned host memory
#define cudaHostAlloc ferry_emu_cudaHostAlloc
#define cudaMallocHost ferry_emu_cudaMallocHost
#define cudaFreeHost ferry_emu_cudaFreeHost
#define cudaHostGetDevicePointer ferry_emu_cudaHostGetDevicePointer

// copies and memsets
#define cudaMemcpy ferry_emu_cudaMemcpy
#define cudaMemcpyAsync ferry_emu_cudaMemcpyAsync
#define cudaMemcpyPeerAsync ferry_emu_cudaMemcpyPeerAsync
#define cudaMemset ferry_emu_cudaMemset
#define cudaMemsetAsync ferry_emu_cudaMemsetAsync

// graphs and stream capture
#define cudaStreamBeginCapture ferry_emu_cudaStreamBeginCapture
#define cudaStreamEndCapture ferry_emu_cudaStreamEndCapture
#define cudaStreamIsCapturing ferry_emu_cudaStreamIsCapturing
#define cudaGraphGetNodes ferry_emu_cudaGraphGetNodes
#define cudaGraphNodeGetType ferry_emu_cudaGraphNodeGetType
#define cudaGraphInstantiateWithFlags ferry_emu_cudaGraphInstantiateWithFlags
#define cudaGraphLaunch ferry_emu_cudaGraphLaunch
#define cudaGraphExecDestroy ferry_emu_cudaGraphExecDestroy
#define cudaGraphDestroy ferry_emu_cudaGraphDestroy
#define cudaDeviceGetGraphMemAttribute ferry_emu_cudaDeviceGetGraphMemAttribute
#define cudaDeviceGraphMemTrim ferry_emu_cudaDeviceGraphMemTrim

#include_next <cuda_runtime_api.h>
