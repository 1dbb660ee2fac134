// adam.cpp — the fused Adam / AdamW step of the host devices (cpu, sim): one pass over each parameter and its
// moments, in parallel over chunks of elements. Built with -ffp-contract=off (src/CMakeLists.txt) so that it rounds
// exactly like the op-by-op step (src/optim/adam_rule.h).
#include <algorithm>

#include "../optim/adam_rule.h"
#include "dispatch.h"
#include "host_kernels.h"
#include "strided.h"

namespace ferry::cpu {

void HostKernels::adam_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* exp_avgs,
                            const KernelTensor* exp_avg_sqs, const KernelTensor* max_exp_avg_sqs,
                            const KernelTensor* steps, std::size_t count, const AdamStep& step, const Stream&) {
  constexpr std::int64_t kChunk = 1 << 14;  // elements per parallel work item
  for (std::size_t t = 0; t < count; ++t) {
    AdamStep numbers = step;
    if (steps) {  // capturable: the count and the learning rate in (host) device memory, read as the step runs
      double& count_t = *steps[t].ptr<double>();
      count_t += 1;
      numbers = optim::detail::adam_step_at(step, *step.lr_on_device, count_t);
    }
    dispatch_float(params[t].dtype, "adam_step", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const auto s = optim::detail::adam_scalars<T>(numbers);
      T* p = params[t].ptr<T>();
      const T* g = grads[t].ptr<const T>();
      T* m = exp_avgs[t].ptr<T>();
      T* v = exp_avg_sqs[t].ptr<T>();
      T* vmax = step.amsgrad ? max_exp_avg_sqs[t].ptr<T>() : nullptr;
      const std::int64_t n = params[t].numel();
      parallel_for((n + kChunk - 1) / kChunk, kChunk, [&](std::int64_t chunk) {
        const std::int64_t begin = chunk * kChunk, end = std::min(n, begin + kChunk);
        for (std::int64_t i = begin; i < end; ++i)
          optim::detail::adam_element(p[i], g[i], m[i], v[i], vmax ? vmax + i : nullptr, s);
      });
    });
  }
}

}  // namespace ferry::cpu
