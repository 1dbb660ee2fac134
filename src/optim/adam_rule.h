// adam_rule.h — torch.optim.Adam's (and AdamW's) update of one element, shared by the cpu loop (src/cpu/adam.cpp)
// and the cuda kernel (src/cuda/adam.cu) so that the fused step equals the op-by-op one (src/optim/adam.cpp) bit
// for bit: the same operations in the same order, each rounded to T (the cpu file is built with
// -ffp-contract=off; the kernel uses the _rn intrinsics, whose sqrt and division are correctly rounded as the
// op-by-op kernels' are).
#pragma once

#include <cmath>
#include <cstdint>

#include "../core/host_device.h"
#include "sgd_rule.h"

namespace ferry::optim::detail {

// The step's numbers in the parameters' dtype, cast once, as the op-by-op step casts each scalar it passes.
template <typename T>
struct AdamScalars {
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay_factor, weight_decay, neg_step_size,
      bias_correction2_sqrt;
  bool decoupled, decay, amsgrad, maximize;
};

using ferry::detail::rounded_div;
using ferry::detail::rounded_sqrt;
using ferry::detail::rounded_sub;

// p, g, m, v and (amsgrad) vmax of one element; p, m, v and vmax are updated.
template <typename T>
FERRY_HOST_DEVICE inline void adam_element(T& p, T g, T& m, T& v, T* vmax, const AdamScalars<T>& s) {
  if (s.maximize) g = -g;                                                   // neg(grad)
  if (s.decay) {
    if (s.decoupled) p = rounded_mul(p, s.decay_factor);                     // p.mul_(1 - lr wd)
    else g = rounded_add(g, rounded_mul(p, s.weight_decay));                 // add(grad, p, wd)
  }
  m = rounded_add(rounded_mul(m, s.beta1), rounded_mul(g, s.one_minus_beta1));  // m.mul_(b1).add_(g, 1 - b1)
  v = rounded_add(rounded_mul(v, s.beta2), rounded_mul(rounded_mul(g, s.one_minus_beta2), g));  // addcmul's order
  T second = v;
  if (s.amsgrad) {  // maximum(vmax, v): NaN in vmax stays
    const T held = *vmax;
    *vmax = (held != held || held > v) ? held : v;
    second = *vmax;
  }
  const T denom = rounded_add(rounded_div(rounded_sqrt(second), s.bias_correction2_sqrt), s.eps);
  p = rounded_add(p, rounded_div(rounded_mul(m, s.neg_step_size), denom));  // p.add_((-step_size m) / denom)
}

template <typename T, typename Step>
FERRY_HOST_DEVICE AdamScalars<T> adam_scalars(const Step& step) {
  AdamScalars<T> s;
  s.beta1 = static_cast<T>(step.beta1);
  s.one_minus_beta1 = static_cast<T>(1 - step.beta1);
  s.beta2 = static_cast<T>(step.beta2);
  s.one_minus_beta2 = static_cast<T>(1 - step.beta2);
  s.eps = static_cast<T>(step.eps);
  s.decay_factor = static_cast<T>(step.decay_factor);
  s.weight_decay = static_cast<T>(step.weight_decay);
  s.neg_step_size = static_cast<T>(-step.step_size);
  s.bias_correction2_sqrt = static_cast<T>(step.bias_correction2_sqrt);
  s.decoupled = step.decoupled;
  s.decay = step.decoupled ? step.decay_factor != 1 : step.weight_decay != 0;
  s.amsgrad = step.amsgrad;
  s.maximize = step.maximize;
  return s;
}

// Adam's capturable step (Backend::AdamStep with steps): the host numbers of one parameter's step at step count t,
// from the learning rate read on the device and the host's table of bias corrections (row t: 1 - beta1^t and
// sqrt(1 - beta2^t) as std::pow gives them; a count past the last row reads the last, where both are 1), with the
// host step's double operations (src/optim/adam.cpp) each rounded on its own: the same numbers, bit for bit.
template <typename Step>
FERRY_HOST_DEVICE Step adam_step_at(Step step, double lr, double t) {
  const std::int64_t last = step.table_rows - 1;
  const std::int64_t row = t < static_cast<double>(last) ? static_cast<std::int64_t>(t) : last;
  step.step_size = rounded_div(lr, step.bias_corrections[2 * row]);  // lr / (1 - beta1^t)
  step.bias_correction2_sqrt = step.bias_corrections[2 * row + 1];
  if (step.decoupled && step.weight_decay != 0) {
    step.decay_factor = rounded_sub(1.0, rounded_mul(lr, step.weight_decay));  // 1 - lr * weight_decay
  }
  return step;
}

}  // namespace ferry::optim::detail
