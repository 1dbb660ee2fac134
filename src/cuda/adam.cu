// adam.cu — the fused Adam / AdamW step on cuda: every parameter of a step in one launch (a table of up to
// kAdamTableSize tensors per launch, passed by value), blockIdx.y picking the tensor and a grid-stride loop over
// its elements, where the op-by-op step launches about twelve kernels per parameter. The element rule is
// src/optim/adam_rule.h, shared with the cpu, each operation rounded on its own (the _rn intrinsics), so it equals
// the op-by-op step. Capturable (step counts on the device): a one-block launch counts each table's steps first,
// then every thread derives its tensor's numbers from the count, the learning rate and the bias-correction table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../optim/adam_rule.h"
#include "check.h"
#include "kernels.h"

namespace ferry::cuda {

namespace {

constexpr int kAdamTableSize = 24;  // 24 x 56 bytes of pointers and sizes: well inside 4 KB of arguments
constexpr int kThreads = 256;
constexpr int kMaxBlocksPerTensor = 1024;

struct AdamTable {
  void* params[kAdamTableSize];
  const void* grads[kAdamTableSize];
  void* exp_avgs[kAdamTableSize];
  void* exp_avg_sqs[kAdamTableSize];
  void* max_exp_avg_sqs[kAdamTableSize];
  double* steps[kAdamTableSize];  // capturable: each tensor's step count; null otherwise
  std::int64_t numel[kAdamTableSize];
};

// capturable: t += 1 for each of the table's n tensors, before adam_kernel reads the counts.
__global__ void adam_count_kernel(AdamTable table, int n) {
  if (static_cast<int>(threadIdx.x) < n) *table.steps[threadIdx.x] += 1;
}

template <typename T>
__global__ void adam_kernel(AdamTable table, optim::detail::AdamScalars<T> s, Backend::AdamStep step) {
  const int t = blockIdx.y;
  if (table.steps[t]) {  // capturable: this tensor's numbers at its count
    s = optim::detail::adam_scalars<T>(optim::detail::adam_step_at(step, *step.lr_on_device, *table.steps[t]));
  }
  T* p = static_cast<T*>(table.params[t]);
  const T* g = static_cast<const T*>(table.grads[t]);
  T* m = static_cast<T*>(table.exp_avgs[t]);
  T* v = static_cast<T*>(table.exp_avg_sqs[t]);
  T* vmax = static_cast<T*>(table.max_exp_avg_sqs[t]);
  const std::int64_t n = table.numel[t];
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    T value = p[i], first = m[i], second = v[i];
    optim::detail::adam_element(value, g[i], first, second, s.amsgrad ? vmax + i : nullptr, s);
    p[i] = value;
    m[i] = first;
    v[i] = second;
  }
}

template <typename T>
void launch_typed(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* exp_avgs,
                  const KernelTensor* exp_avg_sqs, const KernelTensor* max_exp_avg_sqs, const KernelTensor* steps,
                  std::size_t count, const Backend::AdamStep& step, cudaStream_t stream) {
  const auto scalars = optim::detail::adam_scalars<T>(step);
  for (std::size_t first = 0; first < count; first += kAdamTableSize) {
    const std::size_t n = std::min<std::size_t>(kAdamTableSize, count - first);
    AdamTable table{};
    std::int64_t largest = 0;
    for (std::size_t j = 0; j < n; ++j) {
      table.params[j] = params[first + j].data;
      table.grads[j] = grads[first + j].data;
      table.exp_avgs[j] = exp_avgs[first + j].data;
      table.exp_avg_sqs[j] = exp_avg_sqs[first + j].data;
      table.max_exp_avg_sqs[j] = step.amsgrad ? max_exp_avg_sqs[first + j].data : nullptr;
      table.steps[j] = steps ? steps[first + j].ptr<double>() : nullptr;
      table.numel[j] = params[first + j].numel();
      largest = std::max(largest, table.numel[j]);
    }
    if (steps) {  // counted even when every tensor is empty, as the host counts
      adam_count_kernel<<<1, kAdamTableSize, 0, stream>>>(table, static_cast<int>(n));
      FERRY_LAUNCH_CHECK();
    }
    if (largest == 0) continue;
    const auto blocks =
        static_cast<unsigned>(std::min<std::int64_t>((largest + kThreads - 1) / kThreads, kMaxBlocksPerTensor));
    adam_kernel<T><<<dim3(blocks, static_cast<unsigned>(n)), kThreads, 0, stream>>>(table, scalars, step);
    FERRY_LAUNCH_CHECK();
  }
}

}  // namespace

void launch_adam_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* exp_avgs,
                      const KernelTensor* exp_avg_sqs, const KernelTensor* max_exp_avg_sqs, const KernelTensor* steps,
                      std::size_t count, const Backend::AdamStep& step, cudaStream_t stream) {
  if (count == 0) return;
  const DType dtype = params[0].dtype;
  for (std::size_t i = 0; i < count; ++i) {
    FERRY_CHECK(params[i].dtype == dtype && grads[i].dtype == dtype, DTypeMismatch,
                "adam_step: one launch takes parameters and gradients of one dtype");
  }
  if (dtype == DType::Float32) {
    launch_typed<float>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, count, step, stream);
  } else if (dtype == DType::Float64) {
    launch_typed<double>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, count, step, stream);
  } else {
    throw DTypeMismatch("adam_step: expected float32 or float64 parameters");
  }
}

}  // namespace ferry::cuda
