// adagrad.cpp — Adagrad with PyTorch's exact rule (torch.optim.Adagrad, single-tensor path): tensor ops on the
// parameter's device under NoGradGuard, no host syncs; the learning-rate decay from the host-side step count.
#include <vector>

#include "ferry/autograd.h"
#include "ferry/ops.h"
#include "ferry/optim.h"

namespace ferry::optim {

Adagrad::Adagrad(std::vector<ParamGroup> groups, const AdagradOptions& adagrad)
    : Optimizer(std::move(groups)), options(adagrad) {
  check_options();
}

void Adagrad::check_options() {
  adopt_group_options(options.lr, options.weight_decay);
  FERRY_CHECK(options.lr >= 0, InvalidArgument, "Adagrad: invalid learning rate: ", options.lr);
  FERRY_CHECK(options.lr_decay >= 0, InvalidArgument, "Adagrad: invalid lr_decay value: ", options.lr_decay);
  FERRY_CHECK(options.weight_decay >= 0, InvalidArgument, "Adagrad: invalid weight_decay value: ",
              options.weight_decay);
  FERRY_CHECK(options.initial_accumulator_value >= 0, InvalidArgument,
              "Adagrad: invalid initial_accumulator_value value: ", options.initial_accumulator_value);
  FERRY_CHECK(options.eps >= 0, InvalidArgument, "Adagrad: invalid epsilon value: ", options.eps);
}

void Adagrad::step() {
  autograd::NoGradGuard no_grad;
  check_step_devices("Adagrad.step");
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    Tensor p = parameters_[i];
    const Tensor grad_in = p.grad();
    if (!grad_in.defined()) continue;
    const double lr = group_learning_rate(group_of(i)), weight_decay = group_weight_decay(group_of(i));
    Tensor grad = options.maximize ? neg(grad_in) : grad_in;
    const std::int64_t step = ++state_[i].step;
    if (weight_decay != 0) grad = add(grad, p, weight_decay);
    const double clr = lr / (1 + static_cast<double>(step - 1) * options.lr_decay);
    bool created = false;
    Tensor sum = state_tensor(i, "sum", &created);
    if (created && options.initial_accumulator_value != 0) sum.fill_(options.initial_accumulator_value);
    sum.add_(square(grad));                                     // sum += g^2
    p.add_(div(mul(grad, -clr), add(sqrt(sum), options.eps)));  // p += (-clr g) / (sqrt(sum) + eps): addcdiv's order
  }
}

}  // namespace ferry::optim
