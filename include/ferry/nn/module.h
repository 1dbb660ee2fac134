// ferry/nn/module.h — nn::Module: a tree of layers that owns parameters (trained) and buffers (state such
// as BatchNorm's running statistics) under PyTorch's dotted names. Not here: the layers (one header each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/error.h"
#include "ferry/tensor.h"

namespace ferry::nn {

// Tensors under names, in order: what state_dict() returns and load_state_dict() takes. The names are
// PyTorch's for the equivalent module ("0.weight", "1.running_mean", ...), so checkpoints interoperate.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The entry named `name`, or nullptr.
const Tensor* find_tensor(const NamedTensors& tensors, std::string_view name);

// load_state_dict found keys it lacks, keys it does not know, or shapes that differ. The message lists
// all of them, as PyTorch's does; the lists are kept for programs that want to react.
class StateDictError : public InvalidArgument {
 public:
  StateDictError(const std::string& message, std::vector<std::string> missing, std::vector<std::string> unexpected,
                 std::vector<std::string> mismatched)
      : InvalidArgument(message), missing_(std::move(missing)), unexpected_(std::move(unexpected)),
        mismatched_(std::move(mismatched)) {}
  const std::vector<std::string>& missing_keys() const { return missing_; }
  const std::vector<std::string>& unexpected_keys() const { return unexpected_; }
  const std::vector<std::string>& mismatched_keys() const { return mismatched_; }

 private:
  std::vector<std::string> missing_, unexpected_, mismatched_;
};

// The base of every layer. A layer registers its tensors and children in its constructor; everything
// else (names, moves, loading, modes) is done here, recursively.
//
// Identity rule: a registered tensor is a handle to one TensorImpl that never changes. to(device),
// to(dtype) and load_state_dict() change that impl in place (its storage, dtype, values), as PyTorch's
// Module.to() does with `param.data = ...`. So a layer's members (Linear::weight), the lists returned by
// parameters(), and optimizers built from them all keep seeing the same tensors after a move. Layers
// must never re-assign a registered member.
class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;

  virtual Tensor forward(const Tensor& input) = 0;
  Tensor operator()(const Tensor& input) { return forward(input); }
  // relu(forward(input)); layers that can apply the ReLU themselves (Linear, BatchNorm) say so and do it in
  // the same pass (nn::Sequential uses it for a layer followed by a ReLU).
  virtual bool fuses_relu() const { return false; }
  virtual Tensor forward_relu(const Tensor& input);
  // max_pool2d(relu(forward(input)), 2, 2); BatchNorm2d runs the three as one layer where it can (the CNNs'
  // block tail; nn::Sequential uses it for a layer followed by a ReLU and a MaxPool2d(2)).
  virtual bool fuses_relu_max_pool() const { return false; }
  virtual Tensor forward_relu_max_pool(const Tensor& input);
  // One line about this module alone, as PyTorch prints it: "Linear(in_features=4, out_features=3, bias=True)".
  virtual std::string extra_repr() const { return ""; }
  virtual std::string type_name() const = 0;  // "Linear"
  std::string str() const;                    // the whole tree, PyTorch-style

  // --- what it holds (registration order; children after the module's own tensors) ---------------
  // Each parameter or buffer once, under its first name, when a module is registered twice (shared or tied
  // layers), as PyTorch's remove_duplicate: an optimizer then updates it once. state_dict() lists every name.
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  // Every module of the tree, depth first: this one under "", then each child under its dotted path
  // ("blocks.0.attn"); a module registered twice is listed once, under its first path (PyTorch's named_modules).
  // E.g. the parameters of every LayerNorm: `if (dynamic_cast<LayerNorm*>(m)) ...`.
  std::vector<std::pair<std::string, Module*>> named_modules();
  std::vector<std::pair<std::string, const Module*>> named_modules() const;
  // fn(module) for every module of the tree (a shared one once), each child's subtree first, this one last
  // (PyTorch's Module.apply: custom initialisation, say). Returns *this.
  Module& apply(const std::function<void(Module&)>& fn);
  std::int64_t parameter_count() const;  // elements over all parameters

  // --- checkpoints --------------------------------------------------------------------------------
  // For each module, depth first: its parameters, then its buffers, then its children's entries under
  // "<child>.". Values are detached aliases of the live tensors (no copy), as in PyTorch.
  NamedTensors state_dict() const;
  // Copies each value into the tensor of the same name (any device to any device, through the
  // transfer door; dtype converted). strict: missing and unexpected keys are errors; a shape mismatch
  // is always an error. Throws StateDictError listing every problem; nothing is copied then.
  void load_state_dict(const NamedTensors& state, bool strict = true);

  // --- placement (DESIGN.md invariant 7) ----------------------------------------------------------
  // Moves every parameter, its gradient, and every buffer to `device`, in place (see the identity
  // rule). Returns the bytes moved: the sum of nbytes() of what was not already there.
  std::size_t to(Device device, bool non_blocking = false);
  // Converts floating parameters, gradients and buffers to `dtype` (integer buffers such as
  // num_batches_tracked keep theirs). Float16 and BFloat16 are storage: a model converted to them saves and
  // loads at 2 bytes a parameter, and runs again after to(DType::Float32).
  void to(DType dtype);
  // The device of the parameters and buffers. Throws InvalidArgument when they are spread over
  // several devices or the module holds none.
  Device device() const;

  // --- modes --------------------------------------------------------------------------------------
  Module& train(bool mode = true);  // this module and every child
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }

  // Forget every parameter's gradient (set_to_none, PyTorch 2's default) or fill it with zeros.
  void zero_grad(bool set_to_none = true);

 protected:
  // Register `tensor` (a fresh leaf) as a parameter; returns it with requires_grad set.
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check_new_name(name);
    FERRY_CHECK(module != nullptr, InvalidArgument, "register_module(\"", name, "\"): the module is null");
    children_.emplace_back(name, module);
    return module;
  }

 private:
  void check_new_name(const std::string& name) const;
  void collect(const std::string& prefix, bool parameters, bool buffers, bool recurse, NamedTensors& out) const;
  void print(std::string& out, int indent) const;

  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace ferry::nn
