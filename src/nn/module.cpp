// module.cpp — nn::Module: registration, dotted names, state_dict / load_state_dict, in-place moves
// between devices and dtypes, train/eval. Not here: any layer's maths (functional.cpp).
#include "ferry/nn/module.h"

#include <algorithm>
#include <set>
#include <unordered_set>
#include <utility>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/ops.h"

namespace ferry::nn {

const Tensor* find_tensor(const NamedTensors& tensors, std::string_view name) {
  for (const auto& [key, value] : tensors) {
    if (key == name) return &value;
  }
  return nullptr;
}

// --- registration -------------------------------------------------------------------------------

void Module::check_new_name(const std::string& name) const {
  FERRY_CHECK(!name.empty() && name.find('.') == std::string::npos, InvalidArgument,
              "A module attribute name must be non-empty and contain no '.', got \"", name, "\"");
  const bool taken = find_tensor(parameters_, name) || find_tensor(buffers_, name) ||
                     std::any_of(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  FERRY_CHECK(!taken, InvalidArgument, "attribute \"", name, "\" is already registered in ", type_name());
}

Tensor Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  check_new_name(name);
  FERRY_CHECK(tensor.defined(), InvalidArgument, "register_parameter(\"", name, "\"): the tensor is undefined");
  FERRY_CHECK(tensor.is_leaf(), InvalidArgument, "register_parameter(\"", name,
              "\"): a parameter must be a leaf (detach() it first)");
  tensor.requires_grad_(requires_grad);
  parameters_.emplace_back(name, tensor);
  return tensor;
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  check_new_name(name);
  FERRY_CHECK(tensor.defined(), InvalidArgument, "register_buffer(\"", name, "\"): the tensor is undefined");
  buffers_.emplace_back(name, tensor);
  return tensor;
}

// --- names --------------------------------------------------------------------------------------

void Module::collect(const std::string& prefix, bool parameters, bool buffers, bool recurse, NamedTensors& out) const {
  if (parameters) for (const auto& [name, t] : parameters_) out.emplace_back(prefix + name, t);
  if (buffers) for (const auto& [name, t] : buffers_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", parameters, buffers, true, out);
}

namespace {
// Each tensor once, under the first name it was met by (PyTorch's remove_duplicate=True): a layer registered twice
// (tied or shared) has its parameters listed, counted and updated once.
NamedTensors without_repeats(NamedTensors named) {
  std::unordered_set<const TensorImpl*> seen;
  std::erase_if(named, [&](const auto& entry) { return !seen.insert(entry.second.impl()).second; });
  return named;
}
}  // namespace

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect("", true, false, recurse, out);
  return without_repeats(std::move(out));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", false, true, recurse, out);
  return without_repeats(std::move(out));
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, const Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, const Module*>> out;
  std::unordered_set<const Module*> seen;
  const std::function<void(const Module&, const std::string&)> visit = [&](const Module& m, const std::string& path) {
    if (!seen.insert(&m).second) return;
    out.emplace_back(path, &m);
    for (const auto& [name, child] : m.children_) visit(*child, path.empty() ? name : path + "." + name);
  };
  visit(*this, "");
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  for (const auto& [path, m] : std::as_const(*this).named_modules()) out.emplace_back(path, const_cast<Module*>(m));
  return out;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  std::unordered_set<const Module*> seen;  // a shared module once
  const std::function<void(Module&)> visit = [&](Module& m) {
    if (!seen.insert(&m).second) return;
    for (const auto& [name, child] : m.children_) visit(*child);
    fn(m);
  };
  visit(*this);
  return *this;
}

std::int64_t Module::parameter_count() const {
  std::int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

namespace {
void state_of(const Module& module, const std::string& prefix, NamedTensors& out) {
  for (const auto& [name, t] : module.named_parameters(false)) out.emplace_back(prefix + name, t.detach());
  for (const auto& [name, t] : module.named_buffers(false)) out.emplace_back(prefix + name, t.detach());
  for (const auto& [name, child] : module.named_children()) state_of(*child, prefix + name + ".", out);
}
}  // namespace

NamedTensors Module::state_dict() const {
  NamedTensors out;
  state_of(*this, "", out);
  return out;
}

// --- loading ------------------------------------------------------------------------------------

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  NamedTensors own;
  collect("", true, true, true, own);
  std::vector<std::string> missing, unexpected, mismatched;
  std::string shape_lines;
  std::set<std::string> own_names;
  for (const auto& [name, target] : own) {
    own_names.insert(name);
    const Tensor* source = find_tensor(state, name);
    if (!source) {
      missing.push_back(name);
      continue;
    }
    if (!source->defined() || source->shape() != target.shape()) {
      mismatched.push_back(name);
      shape_lines += ferry::detail::concat("\n\tsize mismatch for ", name, ": copying a param with shape ",
                                    source->defined() ? shape_str(source->shape()) : "(undefined)",
                                    " from checkpoint, the shape in current model is ", shape_str(target.shape()), ".");
    }
  }
  for (const auto& [name, value] : state) {
    if (!own_names.count(name)) unexpected.push_back(name);
  }
  auto quoted = [](const std::vector<std::string>& names) {
    std::string text;
    for (std::size_t i = 0; i < names.size(); ++i) text += (i ? ", \"" : "\"") + names[i] + "\"";
    return text;
  };
  const bool key_problem = strict && (!missing.empty() || !unexpected.empty());
  if (key_problem || !mismatched.empty()) {
    std::string message = "Error(s) in loading state_dict for " + type_name() + ":";
    if (strict && !missing.empty()) message += "\n\tMissing key(s) in state_dict: " + quoted(missing) + ".";
    if (strict && !unexpected.empty()) message += "\n\tUnexpected key(s) in state_dict: " + quoted(unexpected) + ".";
    message += shape_lines;
    throw StateDictError(message, missing, unexpected, mismatched);
  }
  autograd::NoGradGuard no_grad;
  for (auto& [name, target] : own) {
    if (const Tensor* source = find_tensor(state, name)) {
      Tensor destination = target;
      destination.copy_(*source);  // any device -> the tensor's device, through the transfer door
    }
  }
}

// --- placement ----------------------------------------------------------------------------------

namespace {
// Point `tensor`'s impl at `replacement`'s storage, keeping the impl (and so every handle) the same.
void rebind(const Tensor& tensor, const Tensor& replacement) {
  TensorImpl* impl = tensor.impl();
  impl->storage = replacement.storage();
  impl->shape = replacement.shape();
  impl->strides = replacement.strides();
  impl->offset = replacement.offset();
  impl->dtype = replacement.dtype();
  impl->version += 1;
}

}  // namespace

std::size_t Module::to(Device device, bool non_blocking) {
  NamedTensors own;
  collect("", true, true, true, own);
  std::size_t bytes = 0;
  auto move = [&](const Tensor& t) {
    if (t.device() == device) return;
    Tensor moved = ferry::detail::transfer(t.detach().contiguous(), device, non_blocking, "Module::to()");
    bytes += t.nbytes();
    rebind(t, moved);
  };
  for (const auto& [name, t] : without_repeats(own)) {
    move(t);
    if (Tensor grad = t.grad(); grad.defined()) move(grad);
  }
  return bytes;
}

void Module::to(DType dtype) {
  FERRY_CHECK(is_floating(dtype), InvalidArgument, "Module::to(dtype): expected a floating dtype, got ",
              dtype_name(dtype));
  NamedTensors own;
  collect("", true, true, true, own);
  autograd::NoGradGuard no_grad;
  auto convert = [&](const Tensor& t) {
    if (t.dtype() == dtype || !is_floating(t.dtype())) return;
    rebind(t, t.detach().to(dtype));
  };
  for (const auto& [name, t] : without_repeats(own)) {
    convert(t);
    if (Tensor grad = t.grad(); grad.defined()) convert(grad);
  }
}

Device Module::device() const {
  NamedTensors own;
  collect("", true, true, true, own);
  FERRY_CHECK(!own.empty(), InvalidArgument, type_name(), " holds no parameters or buffers, so it has no device");
  const Device first = own.front().second.device();
  for (const auto& [name, t] : own) {
    FERRY_CHECK(t.device() == first, InvalidArgument, type_name(), " is spread over devices: \"", own.front().first,
                "\" is on ", first.str(), " but \"", name, "\" is on ", t.device().str(),
                "; call to(device) to gather it");
  }
  return first;
}

// --- modes --------------------------------------------------------------------------------------

Module& Module::train(bool mode) {
  training_ = mode;
  for (auto& [name, child] : children_) child->train(mode);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else grad.zero_();
  }
}

// --- printing -----------------------------------------------------------------------------------

void Module::print(std::string& out, int indent) const {
  const std::string extra = extra_repr();
  out += type_name() + "(";
  if (children_.empty()) {
    out += extra + ")";
    return;
  }
  // With children, PyTorch puts the module's own line first, on a line of its own.
  if (!extra.empty()) out += "\n" + std::string(indent + 2, ' ') + extra;
  for (const auto& [name, child] : children_) {
    out += "\n" + std::string(indent + 2, ' ') + "(" + name + "): ";
    child->print(out, indent + 2);
  }
  out += "\n" + std::string(indent, ' ') + ")";
}

std::string Module::str() const {
  std::string out;
  print(out, 0);
  return out;
}

}  // namespace ferry::nn
