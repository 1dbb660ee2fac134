// sgd.cpp — the fused SGD step of the host devices (cpu, sim): one pass over each parameter, in
// parallel over chunks of elements. Built with -ffp-contract=off (src/CMakeLists.txt) so that it
// rounds exactly like the op-by-op step (src/optim/sgd_rule.h).
#include <algorithm>

#include "../optim/sgd_rule.h"
#include "dispatch.h"
#include "host_kernels.h"
#include "strided.h"

namespace ferry::cpu {

void HostKernels::sgd_step(const KernelTensor* params, const KernelTensor* grads, const KernelTensor* buffers,
                           std::size_t count, const SgdStep& step, const Stream&) {
  constexpr std::int64_t kChunk = 1 << 15;  // elements per parallel work item
  for (std::size_t t = 0; t < count; ++t) {
    dispatch_float(params[t].dtype, "sgd_step", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const double lr = step.lr_on_device ? *step.lr_on_device : step.lr;  // host memory on cpu and sim
      const auto s = optim::detail::sgd_scalars<T>(lr, step.momentum, step.dampening, step.weight_decay,
                                                   step.nesterov, step.maximize, step.first);
      T* p = params[t].ptr<T>();
      const T* g = grads[t].ptr<const T>();
      T* buf = s.use_momentum ? buffers[t].ptr<T>() : nullptr;
      const std::int64_t n = params[t].numel();
      parallel_for((n + kChunk - 1) / kChunk, kChunk, [&](std::int64_t chunk) {
        const std::int64_t begin = chunk * kChunk, end = std::min(n, begin + kChunk);
        if (buf) {
          for (std::int64_t i = begin; i < end; ++i) optim::detail::sgd_element(p[i], g[i], buf + i, s);
        } else {
          for (std::int64_t i = begin; i < end; ++i) optim::detail::sgd_element<T>(p[i], g[i], nullptr, s);
        }
      });
    });
  }
}

}  // namespace ferry::cpu
