// optimizer.cpp — what every optimizer shares: the parameter list, zero_grad, per-parameter state made on
// the parameter's device, and state_dict / load_state_dict with PyTorch's state names. Not here: any
// update rule (sgd.cpp, adam.cpp).
#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/factories.h"
#include "ferry/ops.h"
#include "ferry/optim.h"

namespace ferry::optim {

namespace {
std::vector<ParamGroup> one_group(std::vector<Tensor> parameters) {
  FERRY_CHECK(!parameters.empty(), InvalidArgument,
              "optimizer got an empty parameter list (does the model hold any parameters yet?)");
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(parameters);
  return groups;
}
}  // namespace

Optimizer::Optimizer(std::vector<Tensor> parameters) : Optimizer(one_group(std::move(parameters))) {}

Optimizer::Optimizer(std::vector<ParamGroup> groups) {
  FERRY_CHECK(!groups.empty(), InvalidArgument, "optimizer got no parameter groups");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    FERRY_CHECK(!groups[g].params.empty(), InvalidArgument, "optimizer: parameter group ", g, " has no parameters");
    for (const auto& [value, what] : {std::pair{groups[g].lr, "lr"}, std::pair{groups[g].weight_decay, "weight_decay"}})
      FERRY_CHECK(!value || *value >= 0, InvalidArgument, "optimizer: parameter group ", g, " has a negative ", what,
                  ": ", *value);
    groups_.push_back({parameters_.size(), groups[g].params.size(), groups[g].lr, groups[g].weight_decay});
    for (Tensor& p : groups[g].params) {
      group_of_.push_back(g);
      parameters_.push_back(std::move(p));
    }
  }
  std::unordered_map<const TensorImpl*, std::size_t> first_seen;  // a tensor twice would be updated twice
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    FERRY_CHECK(parameters_[i].defined(), InvalidArgument, "optimizer: parameter ", i, " is undefined");
    FERRY_CHECK(parameters_[i].is_leaf(), InvalidArgument, "optimizer: can't optimize a non-leaf Tensor (parameter ", i, ")");
    FERRY_CHECK(is_floating(parameters_[i].dtype()), InvalidArgument, "optimizer: parameter ", i,
                " is not floating point (", dtype_name(parameters_[i].dtype()), ")");
    if (is_storage_only(parameters_[i].dtype())) {  // a model made half for saving, then handed to an optimizer
      throw_storage_only(parameters_[i].dtype(), detail::concat("optimizer: parameter ", i));
    }
    const auto [it, fresh] = first_seen.emplace(parameters_[i].impl(), i);
    FERRY_CHECK(fresh, InvalidArgument, "optimizer: parameters ", it->second, " and ", i,  // PyTorch refuses it too
                " are the same tensor (in groups ", group_of_[it->second], " and ", group_of_[i],
                "); each parameter belongs to one group, once");
  }
  state_.resize(parameters_.size());
}

void Optimizer::adopt_group_options(double& lr, double& weight_decay) {
  if (groups_.size() != 1) return;
  Group& only = groups_[0];
  if (only.lr) lr = *std::exchange(only.lr, std::nullopt);
  if (only.weight_decay) weight_decay = *std::exchange(only.weight_decay, std::nullopt);
}

void Optimizer::check_group(std::size_t group) const {
  FERRY_CHECK(group < groups_.size(), InvalidArgument, "optimizer: no parameter group ", group, " (there are ",
              groups_.size(), ")");
}

std::vector<Tensor> Optimizer::group_parameters(std::size_t group) const {
  check_group(group);
  const Group& g = groups_[group];
  return {parameters_.begin() + static_cast<std::ptrdiff_t>(g.first),
          parameters_.begin() + static_cast<std::ptrdiff_t>(g.first + g.count)};
}

double Optimizer::group_learning_rate(std::size_t group) const {
  check_group(group);
  return groups_[group].lr.value_or(default_learning_rate());
}

double Optimizer::group_weight_decay(std::size_t group) const {
  check_group(group);
  return groups_[group].weight_decay.value_or(default_weight_decay());
}

void Optimizer::set_group_learning_rate(std::size_t group, double lr) {
  check_group(group);
  if (groups_.size() == 1) {
    set_learning_rate(lr);
    return;
  }
  groups_[group].lr = lr;
  learning_rates_changed();
}

void Optimizer::set_learning_rate(double lr) {
  set_default_learning_rate(lr);
  forget_group_learning_rates();
  learning_rates_changed();
}

void Optimizer::forget_group_learning_rates() {
  for (Group& g : groups_) g.lr.reset();  // every group reads options.lr again
}

double Optimizer::initial_learning_rate(std::size_t group) {
  check_group(group);
  if (initial_lrs_.empty()) {
    for (std::size_t g = 0; g < groups_.size(); ++g) initial_lrs_.push_back(group_learning_rate(g));
  }
  return initial_lrs_[group];
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters_) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else grad.zero_();
  }
}

void Optimizer::check_step_devices(const char* op) const {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    FERRY_CHECK(grad.device() == p.device(), DeviceMismatch, op, ": parameter ", i, " is on ", p.device().str(),
                " but its gradient is on ", grad.device().str(), "; nothing was updated");
    for (const auto& [name, value] : state_[i].tensors) {
      FERRY_CHECK(value.device() == p.device(), DeviceMismatch, op, ": parameter ", i, " is on ", p.device().str(),
                  " but its state '", name, "' is on ", value.device().str(),
                  " (the model moved after the optimizer made its state); nothing was updated: call "
                  "optimizer.to_parameter_devices() after model.to(), then step again");
    }
  }
}

bool Optimizer::fusable(const char* op, std::vector<std::size_t>& order, std::vector<Tensor>& grads) const {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& p = parameters_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    check_same_device(op, {&p, &grad});
    if (!order.empty() && (p.device() != parameters_[order[0]].device() || p.dtype() != parameters_[order[0]].dtype()))
      return false;
    if (!is_floating(p.dtype()) || !p.is_contiguous() || grad.dtype() != p.dtype() || grad.shape() != p.shape())
      return false;
    for (const auto& [name, value] : state_[i].tensors)
      if (!value.is_contiguous()) return false;
    order.push_back(i);
    grads.push_back(grad.contiguous());
  }
  return true;
}

bool Optimizer::has_state(std::size_t i, const std::string& name) const {
  for (const auto& entry : state_[i].tensors)
    if (entry.first == name) return true;
  return false;
}

Tensor& Optimizer::state_tensor(std::size_t i, const std::string& name, bool* created) {
  NamedTensors& tensors = state_[i].tensors;
  for (auto& [key, value] : tensors) {
    if (key == name) {
      if (created) *created = false;
      check_same_device("optimizer state", {&parameters_[i], &value});
      return value;
    }
  }
  if (created) *created = true;
  tensors.emplace_back(name, make_state(i, name));
  return tensors.back().second;
}

Tensor Optimizer::make_state(std::size_t i, const std::string&) const {
  const Tensor& p = parameters_[i];
  return zeros(p.shape(), {.device = p.device(), .dtype = p.dtype()});
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  for (std::size_t i = 0; i < state_.size(); ++i) {
    const std::string prefix = "state." + std::to_string(i) + ".";
    if (counts_steps() && state_[i].step > 0) {
      out.emplace_back(prefix + "step", scalar_tensor(static_cast<double>(state_[i].step), {.dtype = DType::Float32}));
    }
    for (const auto& [name, value] : state_[i].tensors) out.emplace_back(prefix + name, value.detach());
  }
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& state) {
  const std::vector<std::string> names = state_names();
  struct Entry {
    std::size_t index;
    std::string name;
    const Tensor* value;
  };
  std::vector<Entry> entries;
  for (const auto& [key, value] : state) {  // "state.<i>.<name>"
    const std::size_t dot = key.find('.', 6);
    FERRY_CHECK(key.rfind("state.", 0) == 0 && dot != std::string::npos && dot > 6, InvalidArgument,
                "optimizer load_state_dict: expected names \"state.<index>.<name>\", got \"", key, "\"");
    std::size_t index = 0;
    try {
      index = std::stoul(key.substr(6, dot - 6));
    } catch (const std::exception&) {
      throw InvalidArgument("optimizer load_state_dict: bad parameter index in \"" + key + "\"");
    }
    const std::string name = key.substr(dot + 1);
    FERRY_CHECK(index < parameters_.size(), InvalidArgument, "optimizer load_state_dict: \"", key,
                "\" names parameter ", index, " but the optimizer has ", parameters_.size());
    const bool known = (counts_steps() && name == "step") || std::find(names.begin(), names.end(), name) != names.end();
    FERRY_CHECK(known, InvalidArgument, "optimizer load_state_dict: unknown state \"", name, "\" in \"", key, "\"");
    FERRY_CHECK(name != "step" || (value.defined() && value.numel() == 1), ShapeMismatch,
                "optimizer load_state_dict: \"", key, "\" is a step count: one number, got ",
                value.defined() ? shape_str(value.shape()) : "(undefined)");
    FERRY_CHECK(name == "step" || (value.defined() && value.shape() == parameters_[index].shape()), ShapeMismatch,
                "optimizer load_state_dict: \"", key, "\" has shape ",
                value.defined() ? shape_str(value.shape()) : "(undefined)", " but parameter ", index, " has shape ",
                shape_str(parameters_[index].shape()));
    entries.push_back({index, name, &value});
  }
  autograd::NoGradGuard no_grad;
  for (auto& s : state_) s = ParameterState{};
  for (const Entry& e : entries) {
    if (e.name == "step" && counts_steps()) {
      state_[e.index].step = static_cast<std::int64_t>(e.value->item<double>());
      continue;
    }
    if (e.name == "step") {  // a count on the device (Adam's capturable): a float64 scalar there
      state_tensor(e.index, e.name).copy_(e.value->reshape({}));
      continue;
    }
    state_tensor(e.index, e.name).copy_(*e.value);  // onto the parameter's device, through the transfer door
  }
}

std::size_t Optimizer::to_parameter_devices() {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < state_.size(); ++i) {
    const Device device = parameters_[i].device();
    for (auto& [name, value] : state_[i].tensors) {
      if (value.device() == device) continue;
      bytes += value.nbytes();
      value = ferry::detail::transfer(value.contiguous(), device, false, "optimizer state to()");
    }
  }
  return bytes;
}

}  // namespace ferry::optim
