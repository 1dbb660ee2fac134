// adam.cpp — Adam and AdamW with PyTorch's exact rule (torch.optim.Adam / AdamW, single-tensor path):
// bias corrections from a host-side step count, optional amsgrad, maximize. Tensor ops on the
// parameter's device, no host syncs. Capturable: the step counts and learning rates on the device, the bias
// corrections from a table made here with the same std::pow, so that a captured step replays with the same bits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "ferry/optim.h"

namespace ferry::optim {

namespace {

constexpr const char* kWritingLr =
    "writing Adam's learning rate to the device (set it before the capture and before each replay)";
constexpr std::int64_t kMostTableRows = std::int64_t{1} << 20;  // 16 MB of bias corrections

// capturable: the host numbers of step t, as the step without capturable computes them (Adam::step_fused).
double bias_correction1(double beta1, std::int64_t t) { return 1 - std::pow(beta1, static_cast<double>(t)); }
double bias_correction2_sqrt(double beta2, std::int64_t t) {
  return std::sqrt(1 - std::pow(beta2, static_cast<double>(t)));
}

// The rows of the capturable step's table: up to the first t where both corrections are 1 (rows past it would be
// the same).
std::int64_t bias_correction_rows(double beta1, double beta2) {
  for (std::int64_t t = 1; t < kMostTableRows; ++t) {
    if (bias_correction1(beta1, t) == 1 && bias_correction2_sqrt(beta2, t) == 1) return t + 1;
  }
  throw InvalidArgument(ferry::detail::concat(
      "Adam: capturable keeps the bias corrections by step in a table up to the step where they reach 1; with beta1 ",
      beta1, " and beta2 ", beta2, " that is more than ", kMostTableRows, " steps (use capturable = false)"));
}

}  // namespace

Adam::Adam(std::vector<Tensor> parameters, const AdamOptions& adam) : Optimizer(std::move(parameters)), options(adam) {
  check_options();
}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& adam) : Adam(std::move(groups), adam, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& adam, bool decoupled_weight_decay)
    : Optimizer(std::move(groups)), options(adam), decoupled_weight_decay_(decoupled_weight_decay) {
  check_options();
}

std::vector<std::string> Adam::state_names() const {
  if (capturable_) return {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}

Tensor Adam::make_state(std::size_t i, const std::string& name) const {
  if (name == "step") return zeros({}, {.device = parameters_[i].device(), .dtype = DType::Float64});
  return Optimizer::make_state(i, name);
}

void Adam::learning_rates_changed() {
  if (!capturable_) return;
  for (std::size_t group = 0; group < lr_on_device_.size(); ++group) {
    if (lr_on_device_[group].defined()) {
      lr_on_device_[group].get(lr_on_device_[group].device(), group_learning_rate(group), kWritingLr);
    }
  }
}

const double* Adam::bias_correction_table(Device device) {
  if (bias_corrections_.defined() && bias_corrections_.device() == device && table_beta1_ == options.beta1 &&
      table_beta2_ == options.beta2) {
    return static_cast<const double*>(bias_corrections_.data_ptr());
  }
  ferry::detail::check_not_capturing("making Adam's table of bias corrections (take one eager step first)");
  const std::int64_t rows = bias_correction_rows(options.beta1, options.beta2);
  std::vector<double> table(static_cast<std::size_t>(2 * rows), 1.0);  // row 0 is never read (t >= 1)
  for (std::int64_t t = 1; t < rows; ++t) {
    table[static_cast<std::size_t>(2 * t)] = bias_correction1(options.beta1, t);
    table[static_cast<std::size_t>(2 * t + 1)] = bias_correction2_sqrt(options.beta2, t);
  }
  bias_corrections_ = from_vector(table, {rows, 2}).to(device);
  table_beta1_ = options.beta1;
  table_beta2_ = options.beta2;
  return static_cast<const double*>(bias_corrections_.data_ptr());
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
  capturable_ = options.capturable;
  if (!capturable_) return;
  FERRY_CHECK(options.fused, InvalidArgument, "Adam: capturable needs the fused step (fused = true)");
  lr_on_device_.resize(group_count());
  if (parameters_.empty()) return;
  const Device device = parameters_[0].device();  // made now, outside any capture (a step remakes them if it moved)
  bias_correction_table(device);
  for (std::size_t group = 0; group < group_count(); ++group) {
    lr_on_device_[group].get(device, group_learning_rate(group), kWritingLr);
  }
}

bool Adam::step_fused() {
  std::vector<std::size_t> order;  // parameters with a gradient
  std::vector<Tensor> grads;
  if (!fusable("Adam.step", order, grads)) return false;
  if (order.empty()) return true;
  const Device device = parameters_[order[0]].device();
  // Capturable: what the step reads on the device, checked (and made, outside a capture) before anything changes.
  // State made inside a capture would be the graph's memory, zeroed again by every replay.
  const double* table = nullptr;
  std::vector<const double*> lrs;
  if (capturable_) {
    if (ferry::detail::capture_active()) {
      for (const std::size_t i : order) {
        if (!has_state(i, "step") || !has_state(i, "exp_avg") || !has_state(i, "exp_avg_sq") ||
            (options.amsgrad && !has_state(i, "max_exp_avg_sq"))) {
          ferry::detail::check_not_capturing("Adam.step creating its state (take one eager step first)");
        }
      }
    }
    table = bias_correction_table(device);
    for (std::size_t group = 0; group < group_count(); ++group) {
      lrs.push_back(lr_on_device_[group].get(device, group_learning_rate(group), kWritingLr));
    }
  }
  // One call per (group, step count): the scalars of a call are one group's, at one step. Capturable: one call per
  // group, each parameter's count on the device.
  struct Call {
    std::size_t group;
    std::int64_t step;
    std::vector<KernelTensor> p, g, m, v, vmax, counts;
  };
  std::vector<Call> calls;
  for (std::size_t j = 0; j < order.size(); ++j) {
    const std::size_t i = order[j];
    const std::int64_t step = capturable_ ? 0 : ++state_[i].step;
    // Handles (a reference into the state list would not outlive its next entry), made in PyTorch's order.
    Tensor count = capturable_ ? state_tensor(i, "step") : Tensor();
    Tensor p = parameters_[i];
    Tensor m = state_tensor(i, "exp_avg");
    Tensor v = state_tensor(i, "exp_avg_sq");
    Tensor vmax = options.amsgrad ? state_tensor(i, "max_exp_avg_sq") : Tensor();
    auto call = std::find_if(calls.begin(), calls.end(),
                             [&](const Call& c) { return c.group == group_of(i) && c.step == step; });
    if (call == calls.end()) call = calls.insert(calls.end(), Call{group_of(i), step, {}, {}, {}, {}, {}, {}});
    call->p.push_back(ferry::detail::kernel_view(p));
    call->g.push_back(ferry::detail::kernel_view(grads[j]));
    call->m.push_back(ferry::detail::kernel_view(m));
    call->v.push_back(ferry::detail::kernel_view(v));
    if (vmax.defined()) call->vmax.push_back(ferry::detail::kernel_view(vmax));
    if (count.defined()) call->counts.push_back(ferry::detail::kernel_view(count));
    for (Tensor* t : {&count, &p, &m, &v, &vmax})
      if (t->defined()) t->impl()->bump_version();
  }
  for (const Call& c : calls) {
    const double lr = group_learning_rate(c.group), weight_decay = group_weight_decay(c.group);
    Backend::AdamStep step;
    step.beta1 = options.beta1;
    step.beta2 = options.beta2;
    step.eps = options.eps;
    step.decoupled = decoupled_weight_decay_;
    step.amsgrad = options.amsgrad;
    step.maximize = options.maximize;
    if (capturable_) {  // the step size and AdamW's decay factor made on the device from lr, t and the table
      step.weight_decay = weight_decay;
      step.lr_on_device = lrs[c.group];
      step.bias_corrections = table;
      step.table_rows = bias_corrections_.size(0);
    } else {
      if (weight_decay != 0) {
        if (decoupled_weight_decay_) step.decay_factor = 1 - lr * weight_decay;
        else step.weight_decay = weight_decay;
      }
      step.step_size = lr / bias_correction1(options.beta1, c.step);
      step.bias_correction2_sqrt = bias_correction2_sqrt(options.beta2, c.step);
    }
    const auto views = [](const std::vector<KernelTensor>& v) { return v.empty() ? nullptr : v.data(); };
    backend(device).adam_step(c.p.data(), c.g.data(), c.m.data(), c.v.data(), views(c.vmax), views(c.counts),
                              c.p.size(), step, ferry::detail::compute_stream(device));
  }
  return true;
}

void Adam::step() {
  FERRY_CHECK(options.capturable == capturable_, InvalidArgument, "Adam: capturable is fixed at construction (it "
              "decides where the step counts live); make a new optimizer, or load this one's state_dict into it");
  if (capturable_) {
    autograd::NoGradGuard no_grad;
    check_step_devices("Adam.step");
    FERRY_CHECK(options.fused && step_fused(), InvalidArgument,
                "Adam.step with capturable: the step counts on the device need the fused step (fused = true, and the "
                "parameters with gradients on one device, of one dtype, contiguous)");
    return;
  }
  // The step count and its bias corrections live on the host: a replay would repeat the captured ones.
  ferry::detail::check_not_capturing(
      "Adam.step (its step count and bias corrections are host numbers; AdamOptions.capturable puts them on the "
      "device, where a replay reads the current ones)");
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
    const double step_size = lr / bias_correction1(beta1, step);
    const double correction2_sqrt = bias_correction2_sqrt(beta2, step);
    Tensor second = exp_avg_sq;
    if (options.amsgrad) {
      Tensor max_exp_avg_sq = state_tensor(i, "max_exp_avg_sq");
      max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq));
      second = max_exp_avg_sq;
    }
    const Tensor denom = add(div(sqrt(second), correction2_sqrt), options.eps);  // sqrt(v) / sqrt(bc2) + eps
    p.add_(div(mul(exp_avg, -step_size), denom));  // p += (-step_size m) / denom, PyTorch's addcdiv order
  }
}

}  // namespace ferry::optim
