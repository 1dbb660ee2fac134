// adam.cpp — Adam and AdamW with PyTorch's exact rule (torch.optim.Adam / AdamW, single-tensor path):
// bias corrections from a host-side step count, optional amsgrad, maximize. Tensor ops on the
// parameter's device, no host syncs.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/ops.h"
#include "ferry/optim.h"

namespace ferry::optim {

Adam::Adam(std::vector<Tensor> parameters, const AdamOptions& adam) : Optimizer(std::move(parameters)), options(adam) {
  check_options();
}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& adam) : Adam(std::move(groups), adam, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& adam, bool decoupled_weight_decay)
    : Optimizer(std::move(groups)), options(adam), decoupled_weight_decay_(decoupled_weight_decay) {
  check_options();
}

void Adam::check_options() {
  adopt_group_options(options.lr, options.weight_decay);
  FERRY_CHECK(options.lr >= 0, InvalidArgument, "Adam: invalid learning rate: ", options.lr);
  FERRY_CHECK(options.eps >= 0, InvalidArgument, "Adam: invalid epsilon value: ", options.eps);
  FERRY_CHECK(options.beta1 >= 0 && options.beta1 < 1, InvalidArgument, "Adam: invalid beta parameter at index 0: ",
              options.beta1);
  FERRY_CHECK(options.beta2 >= 0 && options.beta2 < 1, InvalidArgument, "Adam: invalid beta parameter at index 1: ",
              options.beta2);
  FERRY_CHECK(options.weight_decay >= 0, InvalidArgument, "Adam: invalid weight_decay value: ", options.weight_decay);
}

bool Adam::step_fused() {
  std::vector<std::size_t> order;  // parameters with a gradient
  std::vector<Tensor> grads;
  if (!fusable("Adam.step", order, grads)) return false;
  if (order.empty()) return true;
  const Device device = parameters_[order[0]].device();
  // One call per (group, step count): the scalars of a call are one group's, at one step.
  struct Call {
    std::size_t group;
    std::int64_t step;
    std::vector<KernelTensor> p, g, m, v, vmax;
  };
  std::vector<Call> calls;
  for (std::size_t j = 0; j < order.size(); ++j) {
    const std::size_t i = order[j];
    const std::int64_t step = ++state_[i].step;
    Tensor p = parameters_[i];  // handles (a reference into the state list would not outlive its next entry)
    Tensor m = state_tensor(i, "exp_avg");  // made in the op-by-op step's order
    Tensor v = state_tensor(i, "exp_avg_sq");
    Tensor vmax_handle = options.amsgrad ? state_tensor(i, "max_exp_avg_sq") : Tensor();
    Tensor* vmax = options.amsgrad ? &vmax_handle : nullptr;
    auto call = std::find_if(calls.begin(), calls.end(),
                             [&](const Call& c) { return c.group == group_of(i) && c.step == step; });
    if (call == calls.end()) call = calls.insert(calls.end(), Call{group_of(i), step, {}, {}, {}, {}, {}});
    call->p.push_back(ferry::detail::kernel_view(p));
    call->g.push_back(ferry::detail::kernel_view(grads[j]));
    call->m.push_back(ferry::detail::kernel_view(m));
    call->v.push_back(ferry::detail::kernel_view(v));
    if (vmax) call->vmax.push_back(ferry::detail::kernel_view(*vmax));
    for (Tensor* t : {&p, &m, &v, vmax})
      if (t) t->impl()->bump_version();
  }
  for (const Call& c : calls) {
    const double lr = group_learning_rate(c.group), weight_decay = group_weight_decay(c.group);
    Backend::AdamStep step;
    step.beta1 = options.beta1;
    step.beta2 = options.beta2;
    step.eps = options.eps;
    step.decoupled = decoupled_weight_decay_;
    if (weight_decay != 0) {
      if (decoupled_weight_decay_) step.decay_factor = 1 - lr * weight_decay;
      else step.weight_decay = weight_decay;
    }
    step.step_size = lr / (1 - std::pow(options.beta1, static_cast<double>(c.step)));
    step.bias_correction2_sqrt = std::sqrt(1 - std::pow(options.beta2, static_cast<double>(c.step)));
    step.amsgrad = options.amsgrad;
    step.maximize = options.maximize;
    backend(device).adam_step(c.p.data(), c.g.data(), c.m.data(), c.v.data(), c.vmax.empty() ? nullptr : c.vmax.data(),
                              c.p.size(), step, ferry::detail::compute_stream(device));
  }
  return true;
}

void Adam::step() {
  // The step count and its bias corrections live on the host: a replay would repeat the captured ones.
  ferry::detail::check_not_capturing("Adam.step (its step count and bias corrections are host numbers)");
  autograd::NoGradGuard no_grad;
  check_step_devices("Adam.step");
  if (options.fused && step_fused()) return;
  const double beta1 = options.beta1, beta2 = options.beta2;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    Tensor p = parameters_[i];
    const Tensor grad_in = p.grad();
    if (!grad_in.defined()) continue;
    check_same_device("Adam.step", {&p, &grad_in});
    const double lr = group_learning_rate(group_of(i)), weight_decay = group_weight_decay(group_of(i));
    Tensor grad = options.maximize ? neg(grad_in) : grad_in;
    const std::int64_t step = ++state_[i].step;
    if (weight_decay != 0) {
      if (decoupled_weight_decay_) p.mul_(1 - lr * weight_decay);  // AdamW
      else grad = add(grad, p, weight_decay);                      // Adam
    }
    Tensor exp_avg = state_tensor(i, "exp_avg");
    Tensor exp_avg_sq = state_tensor(i, "exp_avg_sq");
    exp_avg.mul_(beta1).add_(grad, 1 - beta1);                // m = b1 m + (1 - b1) g
    // v = b2 v + ((1 - b2) g) g, PyTorch's addcmul order: a g whose square overflows (1e20 in float32) still gives
    // a finite v where (1 - b2) g^2 is finite.
    exp_avg_sq.mul_(beta2).add_(mul(mul(grad, 1 - beta2), grad));
    const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
    const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
    const double step_size = lr / bias_correction1;
    const double bias_correction2_sqrt = std::sqrt(bias_correction2);
    Tensor second = exp_avg_sq;
    if (options.amsgrad) {
      Tensor max_exp_avg_sq = state_tensor(i, "max_exp_avg_sq");
      max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq));
      second = max_exp_avg_sq;
    }
    const Tensor denom = add(div(sqrt(second), bias_correction2_sqrt), options.eps);  // sqrt(v) / sqrt(bc2) + eps
    p.add_(div(mul(exp_avg, -step_size), denom));  // p += (-step_size m) / denom, PyTorch's addcdiv order
  }
}

}  // namespace ferry::optim
