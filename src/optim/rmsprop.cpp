// rmsprop.cpp — RMSprop with PyTorch's exact rule (torch.optim.RMSprop, single-tensor path; centered, momentum,
// maximize): tensor ops on the parameter's device under NoGradGuard, no host syncs.
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
    square_avg.mul_(alpha).add_(square(grad), 1 - alpha);  // v = alpha v + (1 - alpha) g^2
    Tensor avg;
    if (options.centered) {
      Tensor grad_avg = state_tensor(i, "grad_avg");
      grad_avg.mul_(alpha).add_(grad, 1 - alpha);  // a = alpha a + (1 - alpha) g
      avg = sqrt(sub(square_avg, square(grad_avg)));
    } else {
      avg = sqrt(square_avg);
    }
    avg = add(avg, options.eps);
    if (options.momentum > 0) {
      Tensor buf = state_tensor(i, "momentum_buffer");
      buf.mul_(options.momentum).add_(div(grad, avg));  // buf = momentum buf + g / denom
      p.add_(buf, -lr);
    } else {
      p.add_(div(grad, avg), -lr);
    }
  }
}

}  // namespace ferry::optim
