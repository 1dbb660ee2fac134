// cuda_backend.h — the few settings of the cuda backend that a program may change (TF32), and why
// there is no device. Include only in code built with FERRY_HAVE_CUDA.
// Not here: the backend interface itself (ferry/backend.h).
#pragma once

#include <string>

namespace ferry::cuda {

// fp32 GEMMs on tensor cores with TF32 inputs: about 8x faster on an H200, ~1e-3 relative error.
// Off by default (DESIGN.md: float32, no TF32 unless a flag asks), as PyTorch's allow_tf32 = False.
void set_allow_tf32(bool allow);
bool allow_tf32();

// How the pinned staging ring copies pageable memory in one direction (src/cuda/copy.cpp): its stores, threads and
// chunk size once chosen, e.g. "memcpy, 16 threads, 1 MiB chunks" (the fastest way over the first staged copies of
// 64 MB or more, each way tried twice), or "not chosen yet"; " (forced)" follows what FERRY_STAGING_STREAMING,
// FERRY_STAGING_THREADS or FERRY_STAGING_CHUNK_MB fixed.
std::string staging_choice(bool host_to_device);

// Why ferry::device_count(DeviceType::CUDA) is 0, e.g.
// "cudaGetDeviceCount: cudaErrorInsufficientDriver (CUDA driver version is insufficient ...)";
// empty when devices are present.
std::string unavailable_reason();

}  // namespace ferry::cuda
