// sgd.cpp — SGD with PyTorch's exact rule (torch.optim.SGD, single-tensor path): weight decay, momentum
// with dampening, nesterov, maximize. In-place tensor ops on the parameter's device, no host syncs.
#include "ferry/autograd.h"
#include "ferry/ops.h"
#include "ferry/optim.h"

namespace ferry::optim {

SGD::SGD(std::vector<Tensor> parameters, const SGDOptions& sgd) : Optimizer(std::move(parameters)), options(sgd) {
  FERRY_CHECK(options.lr >= 0, InvalidArgument, "SGD: invalid learning rate: ", options.lr);
  FERRY_CHECK(options.momentum >= 0, InvalidArgument, "SGD: invalid momentum value: ", options.momentum);
  FERRY_CHECK(options.weight_decay >= 0, InvalidArgument, "SGD: invalid weight_decay value: ", options.weight_decay);
  FERRY_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0), InvalidArgument,
              "SGD: nesterov momentum requires a momentum and zero dampening (got momentum ", options.momentum,
              ", dampening ", options.dampening, ")");
}

void SGD::step() {
  autograd::NoGradGuard no_grad;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    Tensor p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    check_same_device("SGD.step", {&p, &grad});
    Tensor d = options.maximize ? neg(grad) : grad;
    if (options.weight_decay != 0) d = add(d, p, options.weight_decay);  // a new tensor: never alters .grad
    if (options.momentum != 0) {
      bool created = false;
      Tensor buffer = state_tensor(i, "momentum_buffer", &created);
      if (created) {
        buffer.copy_(d);  // PyTorch: buf = clone(d) on the first step
      } else {
        buffer.mul_(options.momentum).add_(d, 1 - options.dampening);
      }
      d = options.nesterov ? add(d, buffer, options.momentum) : buffer;
    }
    p.add_(d, -options.lr);
  }
}

}  // namespace ferry::optim
