// sgd.cpp — SGD with PyTorch's exact rule (torch.optim.SGD, single-tensor path): weight decay, momentum
// with dampening, nesterov, maximize. By default one fused backend call per step (Backend::sgd_step, the
// rule in sgd_rule.h); op by op (in-place tensor ops) when the parameters do not allow it. No host syncs.
// With lr_on_device the fused step reads the learning rate from a device scalar, so it can be captured.
#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/ops.h"
#include "ferry/optim.h"

namespace ferry::optim {

namespace {
constexpr const char* kWritingLr =
    "writing SGD's learning rate to the device (set it before the capture and before each replay)";
}  // namespace

SGD::SGD(std::vector<Tensor> parameters, const SGDOptions& sgd) : Optimizer(std::move(parameters)), options(sgd) {
  check_options();
}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& sgd) : Optimizer(std::move(groups)), options(sgd) {
  check_options();
}

void SGD::check_options() {
  adopt_group_options(options.lr, options.weight_decay);
  FERRY_CHECK(!options.lr_on_device || group_count() == 1, InvalidArgument, "SGD: lr_on_device keeps one learning "
              "rate on the device, but the optimizer has ", group_count(), " parameter groups");
  FERRY_CHECK(options.lr >= 0, InvalidArgument, "SGD: invalid learning rate: ", options.lr);
  FERRY_CHECK(options.momentum >= 0, InvalidArgument, "SGD: invalid momentum value: ", options.momentum);
  FERRY_CHECK(options.weight_decay >= 0, InvalidArgument, "SGD: invalid weight_decay value: ", options.weight_decay);
  FERRY_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0), InvalidArgument,
              "SGD: nesterov momentum requires a momentum and zero dampening (got momentum ", options.momentum,
              ", dampening ", options.dampening, ")");
  if (options.lr_on_device && !parameters_.empty()) {  // not in a capture
    lr_on_device_.get(parameters_[0].device(), options.lr, kWritingLr);
  }
}

void SGD::set_learning_rate(double lr) {
  if (options.lr_on_device && lr_on_device_.defined()) lr_on_device_.get(lr_on_device_.device(), lr, kWritingLr);
  forget_group_learning_rates();
  options.lr = lr;
}

bool SGD::step_fused() {
  std::vector<std::size_t> order;  // parameters with a gradient
  std::vector<Tensor> grads;
  if (!fusable("SGD.step", order, grads)) return false;
  if (order.empty()) return true;
  const Device device = parameters_[order[0]].device();
  // A buffer made inside a capture would be the graph's memory, and "buf = d" would be replayed every step.
  if (options.momentum != 0 && ferry::detail::capture_active()) {
    for (const std::size_t i : order) {
      if (!has_state(i, "momentum_buffer")) {
        ferry::detail::check_not_capturing("SGD.step creating its momentum buffers (take one eager step first)");
      }
    }
  }
  for (std::size_t group = 0; group < group_count(); ++group) {  // one call (two on the first step) per group
    std::vector<std::size_t> mine;
    std::vector<Tensor> my_grads;
    for (std::size_t j = 0; j < order.size(); ++j) {
      if (group_of(order[j]) != group) continue;
      mine.push_back(order[j]);
      my_grads.push_back(grads[j]);
    }
    if (!mine.empty()) step_fused_group(device, mine, my_grads, group);
  }
  return true;
}

void SGD::step_fused_group(Device device, const std::vector<std::size_t>& order, const std::vector<Tensor>& grads,
                           std::size_t group) {
  Backend::SgdStep step{.lr = group_learning_rate(group), .momentum = options.momentum,
                        .dampening = options.dampening, .weight_decay = group_weight_decay(group),
                        .nesterov = options.nesterov, .maximize = options.maximize};
  if (options.lr_on_device) step.lr_on_device = lr_on_device_.get(device, options.lr, kWritingLr);
  // One call for the parameters whose momentum buffer exists and one for those that get it now.
  for (const bool first : {false, true}) {
    std::vector<KernelTensor> p_views, g_views, b_views;
    for (std::size_t j = 0; j < order.size(); ++j) {
      Tensor& p = parameters_[order[j]];
      if (options.momentum != 0) {
        if (has_state(order[j], "momentum_buffer") == first) continue;  // the other call's
        Tensor& buffer = state_tensor(order[j], "momentum_buffer");  // created (zeros) in the `first` call
        b_views.push_back(ferry::detail::kernel_view(buffer));
        buffer.impl()->bump_version();
      } else if (first) {
        continue;
      }
      p_views.push_back(ferry::detail::kernel_view(p));
      g_views.push_back(ferry::detail::kernel_view(grads[j]));
      p.impl()->bump_version();
    }
    if (p_views.empty()) continue;
    step.first = first;
    backend(device).sgd_step(p_views.data(), g_views.data(), b_views.empty() ? nullptr : b_views.data(),
                             p_views.size(), step, ferry::detail::compute_stream(device));
  }
}

void SGD::step() {
  autograd::NoGradGuard no_grad;
  // With the learning rate in the kernels' arguments, a replay would repeat the captured one.
  if (!options.lr_on_device) {
    ferry::detail::check_not_capturing(
        "SGD.step with the learning rate in its kernel's arguments (SGDOptions.lr_on_device puts it on the "
        "device, where a replay reads the current one)");
  }
  check_step_devices("SGD.step");
  if (options.fused && step_fused()) return;
  ferry::detail::check_not_capturing("SGD.step op by op (the learning rate on the device needs the fused step)");
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    Tensor p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    check_same_device("SGD.step", {&p, &grad});
    const double lr = group_learning_rate(group_of(i)), weight_decay = group_weight_decay(group_of(i));
    Tensor d = options.maximize ? neg(grad) : grad;
    if (weight_decay != 0) d = add(d, p, weight_decay);  // a new tensor: never alters .grad
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
    p.add_(d, -lr);
  }
}

}  // namespace ferry::optim
