// ferry/nn/module_list.h — ModuleList: children named "0", "1", ... held in order, with no forward of its own
// (the owner decides how to call them), so a model's repeated blocks get PyTorch's nn.ModuleList names in its
// state_dict ("blocks.0.attn.in_proj_weight"). Not here: Sequential (ferry/nn/sequential.h), which runs its
// children in order.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ferry/nn/module.h"

namespace ferry::nn {

class ModuleList : public Module {
 public:
  ModuleList() = default;
  // ModuleList(Linear(4, 4), Linear(4, 4)): modules by value (moved in) or as shared_ptr.
  template <typename... Modules>
  explicit ModuleList(Modules&&... modules) {
    (push_back(std::forward<Modules>(modules)), ...);
  }

  // Appends `module` as child "<size()>"; returns it, typed as given.
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    static_assert(std::is_base_of_v<Module, M>, "ModuleList holds modules");
    return register_module(std::to_string(size()), std::move(module));
  }
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Module, std::decay_t<M>> &&
                                                    !std::is_lvalue_reference_v<M>>>
  std::shared_ptr<std::decay_t<M>> push_back(M&& module) {
    return push_back(std::make_shared<std::decay_t<M>>(std::move(module)));
  }

  // A ModuleList only holds its children; calling it throws InvalidArgument (PyTorch: NotImplementedError).
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ModuleList"; }

  std::size_t size() const { return named_children().size(); }
  bool empty() const { return size() == 0; }
  // The child at `index`; throws InvalidArgument when out of range.
  Module& operator[](std::size_t index) const;
  // The child at `index` as its layer type; throws InvalidArgument when it is another type.
  template <typename M>
  M& at(std::size_t index) const {
    auto* module = dynamic_cast<M*>(&(*this)[index]);
    FERRY_CHECK(module != nullptr, InvalidArgument, "ModuleList::at(", index, "): child is a ",
                (*this)[index].type_name(), ", not the type asked for");
    return *module;
  }
  // The children in order, for range-for: `for (const auto& block : blocks.children()) x = (*block)(x);`.
  std::vector<std::shared_ptr<Module>> children() const;
};

}  // namespace ferry::nn
