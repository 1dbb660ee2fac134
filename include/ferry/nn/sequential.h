// ferry/nn/sequential.h — Sequential: children named "0", "1", ... run in order, so state_dict names
// match PyTorch's nn.Sequential ("0.weight", "1.running_mean"). Not here: the layers.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

#include "ferry/nn/module.h"

namespace ferry::nn {

class Sequential : public Module {
 public:
  Sequential() = default;
  // Sequential(Linear(4, 3), ReLU(), Linear(3, 2)): modules by value (moved in) or as shared_ptr.
  template <typename... Modules>
  explicit Sequential(Modules&&... modules) {
    (push_back(std::forward<Modules>(modules)), ...);
  }

  void push_back(std::shared_ptr<Module> module);
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Module, std::decay_t<M>> &&
                                                    !std::is_lvalue_reference_v<M>>>
  void push_back(M&& module) {
    push_back(std::shared_ptr<Module>(std::make_shared<std::decay_t<M>>(std::move(module))));
  }

  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "Sequential"; }

  std::size_t size() const { return named_children().size(); }
  Module& operator[](std::size_t index) const;
  // The child at `index` as its layer type; throws InvalidArgument when it is another type.
  template <typename M>
  M& at(std::size_t index) const {
    auto* module = dynamic_cast<M*>(&(*this)[index]);
    FERRY_CHECK(module != nullptr, InvalidArgument, "Sequential::at(", index, "): child is a ",
                (*this)[index].type_name(), ", not the type asked for");
    return *module;
  }
};

}  // namespace ferry::nn
