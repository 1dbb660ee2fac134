// registry.h — how the backend table finds each implementation (internal).
#pragma once

#include <memory>
#include <string>

#include "ferry/backend.h"

namespace ferry {
namespace cpu {
std::unique_ptr<Backend> make_cpu_backend();
class HostMemoryCounter;
}  // namespace cpu
namespace sim { std::unique_ptr<Backend> make_sim_backend(); }
namespace cuda {
#ifdef FERRY_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend();  // src/cuda/cuda_backend.cpp
std::string unavailable_reason();               // why it found no device
#else
// Weak: a build without the CUDA backend may still be linked with one, as the tests' emulated GPU
// (tests/cuda_on_host) is; null otherwise.
[[gnu::weak]] std::unique_ptr<Backend> make_cuda_backend();
[[gnu::weak]] std::string unavailable_reason();
#endif
}  // namespace cuda
}  // namespace ferry
