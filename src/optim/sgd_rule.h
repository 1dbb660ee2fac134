// sgd_rule.h — torch.optim.SGD's update of one element, shared by the cpu loop (src/cpu/sgd.cpp) and
// the cuda kernel (src/cuda/sgd.cu) so the fused step and the op-by-op one (src/optim/sgd.cpp) agree
// bit for bit: the same operations, in the same order, each rounded to T (no fused multiply-add:
// the cpu file is built with -ffp-contract=off, the kernel uses the _rn intrinsics).
#pragma once

#include "../core/host_device.h"
#include "../core/rounded.h"

namespace ferry::optim::detail {

// The step's numbers in the parameters' dtype, cast once (as the op-by-op path casts its scalars).
template <typename T>
struct SgdScalars {
  T neg_lr, momentum, one_minus_dampening, weight_decay;
  bool use_momentum, dampened, nesterov, maximize, decay, first;
};

using ferry::detail::rounded_add;
using ferry::detail::rounded_mul;

// p, g and (with momentum) buf of one element; p and buf are updated.
template <typename T>
FERRY_HOST_DEVICE inline void sgd_element(T& p, T g, T* buf, const SgdScalars<T>& s) {
  T d = s.maximize ? -g : g;
  if (s.decay) d = rounded_add(d, rounded_mul(p, s.weight_decay));  // add(d, p, weight_decay)
  if (s.use_momentum) {
    T b = d;                                                         // first step: buf = clone(d)
    if (!s.first) {                                                  // buf.mul_(momentum).add_(d, 1 - dampening)
      b = rounded_mul(*buf, s.momentum);
      b = rounded_add(b, s.dampened ? rounded_mul(d, s.one_minus_dampening) : d);
    }
    *buf = b;
    d = s.nesterov ? rounded_add(d, rounded_mul(b, s.momentum)) : b;  // add(d, buf, momentum) or buf
  }
  p = rounded_add(p, rounded_mul(d, s.neg_lr));                      // p.add_(d, -lr)
}

template <typename T>
SgdScalars<T> sgd_scalars(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                          bool maximize, bool first) {
  return {static_cast<T>(-lr),        static_cast<T>(momentum), static_cast<T>(1 - dampening),
          static_cast<T>(weight_decay), momentum != 0,           (1 - dampening) != 1,
          nesterov,                   maximize,                 weight_decay != 0,
          first};
}

}  // namespace ferry::optim::detail
