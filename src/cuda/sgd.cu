// sgd.cu — the fused SGD step on cuda: every parameter of a step in one launch (a table of up to
// kSgdTableSize tensors per launch, passed by value), blockIdx.y picking the tensor and a grid-stride
// loop over its elements. The element rule is src/optim/sgd_rule.h, shared with the cpu, with each
// multiply and add rounded on its own (the _rn intrinsics), so it equals the op-by-op step.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../optim/sgd_rule.h"
#include "check.h"
#include "kernels.h"

namespace ferry::cuda {

namespace {

constexpr int kSgdTableSize = 48;  // 48 x 32 bytes of pointers and sizes: well inside 4 KB of arguments
constexpr int kThreads = 256;
constexpr int kMaxBlocksPerTensor = 1024;

struct SgdTable {
  void* params[kSgdTableSize];
  const void* grads[kSgdTableSize];
  void* buffers[kSgdTableSize];
  std::int64_t numel[kSgdTableSize];
};

template <typename T>
__global__ void sgd_kernel(SgdTable table, optim::detail::SgdScalars<T> s, const double* lr_on_device) {
  if (lr_on_device) s.neg_lr = static_cast<T>(-*lr_on_device);  // as sgd_scalars casts it on the host
  const int t = blockIdx.y;
  T* p = static_cast<T*>(table.params[t]);
  const T* g = static_cast<const T*>(table.grads[t]);
  T* buf = static_cast<T*>(table.buffers[t]);
  const std::int64_t n = table.numel[t];
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    T value = p[i];
    optim::detail::sgd_element(value, g[i], s.use_momentum ? buf + i : nullptr, s);
    p[i] = value;
  }
}

template <typename T>
void launch_typed(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* buffers, std::size_t count,
                  const Backend::SgdStep& step, cudaStream_t stream) {
  const auto scalars = optim::detail::sgd_scalars<T>(step.lr, step.momentum, step.dampening, step.weight_decay,
                                                     step.nesterov, step.maximize, step.first);
  for (std::size_t first = 0; first < count; first += kSgdTableSize) {
    const std::size_t n = std::min<std::size_t>(kSgdTableSize, count - first);
    SgdTable table{};
    std::int64_t largest = 0;
    for (std::size_t j = 0; j < n; ++j) {
      table.params[j] = params[first + j].data;
      table.grads[j] = grads[first + j].data;
      table.buffers[j] = scalars.use_momentum ? buffers[first + j].data : nullptr;
      table.numel[j] = params[first + j].numel();
      largest = std::max(largest, table.numel[j]);
    }
    if (largest == 0) continue;
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((largest + kThreads - 1) / kThreads, kMaxBlocksPerTensor));
    sgd_kernel<T><<<dim3(blocks, static_cast<unsigned>(n)), kThreads, 0, stream>>>(table, scalars, step.lr_on_device);
    FERRY_LAUNCH_CHECK();
  }
}

}  // namespace

void launch_sgd_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* buffers,
                     std::size_t count, const Backend::SgdStep& step, cudaStream_t stream) {
  if (count == 0) return;
  const DType dtype = params[0].dtype;
  for (std::size_t i = 0; i < count; ++i) {
    FERRY_CHECK(params[i].dtype == dtype && grads[i].dtype == dtype, DTypeMismatch,
                "sgd_step: one launch takes parameters and gradients of one dtype");
  }
  if (dtype == DType::Float32) launch_typed<float>(params, grads, buffers, count, step, stream);
  else if (dtype == DType::Float64) launch_typed<double>(params, grads, buffers, count, step, stream);
  else throw DTypeMismatch("sgd_step: expected float32 or float64 parameters");
}

}  // namespace ferry::cuda
