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

  // forward() runs its children in stages: a child alone, or, with fused activations on
  // (functional::fused_activations()), a child with the ReLU after it (2 children) or the ReLU and a 2x2/2 max
  // pooling after it (3 children) in one call. stage_length(i): how many children the stage starting at child i
  // takes; forward_stage(i, x): that stage on x. forward() is these in order (bench/cuda_layer_bench times each).
  std::size_t stage_length(std::size_t first) const;
  Tensor forward_stage(std::size_t first, const Tensor& input);

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
