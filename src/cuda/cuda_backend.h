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

// How the pinned staging ring copies pageable memory in one direction (src/cuda/copy.cpp): "streaming stores" or
// "memcpy" once chosen (the faster of the two over the first four staged copies of 64 MB or more), "not chosen yet",
// or either with " (forced)" when FERRY_STAGING_STREAMING is 1 or 0.
std::string staging_store_choice(bool host_to_device);

// Why ferry::device_count(DeviceType::CUDA) is 0, e.g.
// "cudaGetDeviceCount: cudaErrorInsufficientDriver (CUDA driver version is insufficient ...)";
// empty when devices are present.
std::string unavailable_reason();

}  // namespace ferry::cuda
