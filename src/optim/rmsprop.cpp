// rmsprop.cpp — RMSprop with PyTorch's exact rule (torch.optim.RMSprop, single-tensor path; centered, momentum,
// maximize): tensor ops on the parameter's device under NoGradGuard, no host syncs.
#include <limits>
#include <vector>

#include "ferry/autograd.h"
#include "ferry/ops.h"
#include "ferry/optim.h"

namespace ferry::optim {

RMSprop::RMSprop(std::vector<ParamGroup> groups, const RMSpropOptions& rmsprop)
    : Optimizer(std::move(groups)), options(rmsprop) {
  check_options();
}

void RMSprop::check_options() {
  adopt_group_options(options.lr, options.weight_decay);
  FERRY_CHECK(options.lr >= 0, InvalidArgument, "RMSprop: invalid learning rate: ", options.lr);
  FERRY_CHECK(options.eps >= 0, InvalidArgument, "RMSprop: invalid epsilon value: ", options.eps);
  FERRY_CHECK(options.momentum >= 0, InvalidArgument, "RMSprop: invalid momentum value: ", options.momentum);
  FERRY_CHECK(options.weight_decay >= 0, InvalidArgument, "RMSprop: invalid weight_decay value: ",
              options.weight_decay);
  FERRY_CHECK(options.alpha >= 0, InvalidArgument, "RMSprop: invalid alpha value: ", options.alpha);
}

void RMSprop::step() {
  autograd::NoGradGuard no_grad;
  check_step_devices("RMSprop.step");
  const double alpha = options.alpha;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    Tensor p = parameters_[i];
    const Tensor grad_in = p.grad();
    if (!grad_in.defined()) continue;
    const double lr = group_learning_rate(group_of(i)), weight_decay = group_weight_decay(group_of(i));
    Tensor grad = options.maximize ? neg(grad_in) : grad_in;
    ++state_[i].step;
    if (weight_decay != 0) grad = add(grad, p, weight_decay);
    Tensor square_avg = state_tensor(i, "square_avg");  // handles: a reference would not outlive the next entry
    // v = alpha v + ((1 - alpha) g) g: PyTorch's addcmul order, so a g whose square overflows (1e20 in float32)
    // still gives a finite v where (1 - alpha) g^2 is finite.
    square_avg.mul_(alpha).add_(mul(mul(grad, 1 - alpha), grad));
    Tensor avg;
    if (options.centered) {
      Tensor grad_avg = state_tensor(i, "grad_avg");
      grad_avg.mul_(alpha).add_(grad, 1 - alpha);  // a = alpha a + (1 - alpha) g
      // sqrt(v - a^2), a^2 held at the dtype's largest finite value: PyTorch's addcmul is one multiply-add, its
      // product unrounded, so an overflowed v (inf) stays inf there where inf - inf would be NaN here.
      const double largest = p.dtype() == DType::Float64 ? std::numeric_limits<double>::max()
                                                         : std::numeric_limits<float>::max();  // 16-bit: storage only
      avg = sqrt(sub(square_avg, clamp(square(grad_avg), std::nullopt, largest)));
    } else {
      avg = sqrt(square_avg);
    }
    avg = add(avg, options.eps);
    if (options.momentum > 0) {
      Tensor buf = state_tensor(i, "momentum_buffer");
      buf.mul_(options.momentum).add_(div(grad, avg));  // buf = momentum buf + g / denom
      p.add_(buf, -lr);
    } else {
      p.add_(div(mul(grad, -lr), avg));  // p += (-lr g) / denom: PyTorch's addcdiv order
    }
  }
}

}  // namespace ferry::optim
