// registry.h — how the backend table finds each implementation (internal).
#pragma once

#include <memory>

#include "ferry/backend.h"

namespace ferry {
namespace cpu {
std::unique_ptr<Backend> make_cpu_backend();
class HostMemoryCounter;
}  // namespace cpu
namespace sim { std::unique_ptr<Backend> make_sim_backend(); }
namespace cuda { std::unique_ptr<Backend> make_cuda_backend(); }  // defined only when FERRY_HAVE_CUDA
}  // namespace ferry
