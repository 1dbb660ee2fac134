// engine.cpp — grad mode, recording nodes, and the backward pass (reverse topological order).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/ops.h"

namespace ferry::autograd {

namespace {
thread_local bool t_grad_enabled = true;
bool g_detect_anomaly = false;

bool all_finite(const Tensor& t) {
  if (!is_floating(t.dtype()) || t.numel() == 0) return true;
  NoGradGuard no_grad;
  // |x| < inf is false for NaN and for +-Inf.
  return ferry::sum(logical_not(lt(abs(t), INFINITY))).item<std::int64_t>() == 0;
}

// Post-accumulate hooks by leaf. The weak pointer tells a live leaf from a freed one whose address
// was reused; `g_hook_count` keeps backward free of the lock while no hook is registered.
struct HookEntry {
  std::uint64_t handle = 0;
  std::weak_ptr<TensorImpl> leaf;
  PostAccumulateGradHook hook;
};
std::mutex g_hooks_mutex;
std::unordered_map<const TensorImpl*, std::vector<HookEntry>> g_hooks;
std::uint64_t g_next_hook_handle = 1;
std::atomic<std::size_t> g_hook_count{0};

void run_post_accumulate_hooks(const Tensor& leaf) {
  if (g_hook_count.load(std::memory_order_relaxed) == 0) return;
  std::vector<PostAccumulateGradHook> hooks;
  {
    std::lock_guard lock(g_hooks_mutex);
    auto found = g_hooks.find(leaf.impl());
    if (found == g_hooks.end()) return;
    for (const HookEntry& entry : found->second) {
      if (entry.leaf.lock() == leaf.impl_ptr()) hooks.push_back(entry.hook);
    }
  }
  for (const auto& hook : hooks) hook(leaf);  // outside the lock: a hook may register or remove hooks
}
}  // namespace

std::uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook) {
  FERRY_CHECK(leaf.defined() && leaf.requires_grad() && leaf.is_leaf(), InvalidArgument,
              "register_post_accumulate_grad_hook(): expected a leaf tensor that requires grad");
  FERRY_CHECK(hook != nullptr, InvalidArgument, "register_post_accumulate_grad_hook(): the hook is empty");
  std::lock_guard lock(g_hooks_mutex);
  auto& entries = g_hooks[leaf.impl()];
  // Entries of a freed leaf at the same address are stale: drop them.
  std::erase_if(entries, [&](const HookEntry& e) {
    const bool stale = e.leaf.lock() != leaf.impl_ptr();
    if (stale) g_hook_count.fetch_sub(1, std::memory_order_relaxed);
    return stale;
  });
  const std::uint64_t handle = g_next_hook_handle++;
  entries.push_back({handle, leaf.impl_ptr(), std::move(hook)});
  g_hook_count.fetch_add(1, std::memory_order_relaxed);
  return handle;
}

void remove_post_accumulate_grad_hook(std::uint64_t handle) {
  std::lock_guard lock(g_hooks_mutex);
  for (auto it = g_hooks.begin(); it != g_hooks.end(); ++it) {
    auto& entries = it->second;
    const auto before = entries.size();
    std::erase_if(entries, [&](const HookEntry& e) { return e.handle == handle; });
    if (entries.size() != before) {
      g_hook_count.fetch_sub(before - entries.size(), std::memory_order_relaxed);
      if (entries.empty()) g_hooks.erase(it);
      return;
    }
  }
}

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }
void set_detect_anomaly(bool enabled) { g_detect_anomaly = enabled; }
bool detect_anomaly() { return g_detect_anomaly; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs) if (t->requires_grad()) return true;
  return false;
}
bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : inputs) if (t.requires_grad()) return true;
  return false;
}

void record(const char* name, std::vector<Tensor> inputs, Tensor& output,
            std::function<std::vector<Tensor>(const Tensor& grad_output)> backward, Saved saved, int inputs_read) {
  // Anomaly mode reads each output back (a sync): not inside a graph capture, where a sync is refused; a replay
  // is checked by nothing.
  if (g_detect_anomaly && !detail::capture_active() && !all_finite(output)) {
    throw Error(detail::concat("Anomaly: the output of '", name, "' holds NaN or Inf (shape ",
                               shape_str(output.shape()), ")"));
  }
  auto node = std::make_shared<Node>(name, std::move(inputs), std::move(backward));
  const auto note = [&node](const Tensor& t, std::string what) {
    if (t.defined() && t.impl()->storage) {
      node->saved.push_back({t.impl()->storage, t.impl()->storage->version(),
                             what + " (shape " + shape_str(t.shape()) + ")"});
    }
  };
  const auto bits = static_cast<std::uint8_t>(saved);
  if (bits & static_cast<std::uint8_t>(Saved::Inputs)) {
    const std::size_t read = inputs_read < 0 ? node->inputs.size()
                                             : std::min(node->inputs.size(), static_cast<std::size_t>(inputs_read));
    for (std::size_t i = 0; i < read; ++i) note(node->inputs[i], "input " + std::to_string(i));
  }
  if (bits & static_cast<std::uint8_t>(Saved::Output)) note(output, "output");
  output.impl()->requires_grad = true;
  output.impl()->grad_fn = std::move(node);
}

namespace {
// Before a node's backward: refuse when a tensor it saved was written in place since (its values are not the
// ones the forward pass used, so the gradient would be wrong).
void check_saved_versions(const Node& node) {
  for (const Node::SavedVersion& s : node.saved) {
    FERRY_CHECK(s.storage->version() == s.version, InvalidArgument,
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                "the ", s.what, " of '", node.name, "' is at version ", s.storage->version(), "; expected version ",
                s.version, ". Write into a clone() instead, or do the in-place update after backward()");
  }
}
}  // namespace

Node::~Node() {
  // Each node whose last owner is this graph's teardown goes on a list instead of being destroyed inside its
  // consumer's destructor. The backward function goes first: its captures may hold the last other reference to
  // an input.
  std::vector<std::shared_ptr<Node>> pending;
  auto release = [&pending](Node& node) {
    node.backward = nullptr;
    for (Tensor& input : node.inputs) {
      const std::shared_ptr<TensorImpl>& impl = input.impl_ptr();
      if (impl && impl.use_count() == 1 && impl->grad_fn && impl->grad_fn.use_count() == 1)
        pending.push_back(std::move(impl->grad_fn));
    }
    node.inputs.clear();
  };
  release(*this);
  while (!pending.empty()) {
    std::shared_ptr<Node> node = std::move(pending.back());
    pending.pop_back();
    release(*node);  // its inputs' nodes join the list; it is then freed with nothing left to free below it
  }
}

Tensor reduce_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int extra = grad.dim() - static_cast<int>(shape.size());
  std::vector<int> dims;
  for (int d = 0; d < grad.dim(); ++d) {
    if (d < extra || (shape[d - extra] == 1 && grad.shape()[d] != 1)) dims.push_back(d);
  }
  Tensor reduced = dims.empty() ? grad : ferry::sum(grad, dims, true);
  return reduced.reshape(shape);
}

namespace {
// A gradient being summed, and whether this backward made it (a sum, or the zeros under slices): only then may
// more be added in place. A gradient as a node returned it may alias another (add's backward gives one tensor to
// both inputs), so the first sum into it makes a new tensor.
struct GradSum {
  Tensor grad;
  bool owned = false;
};

void accumulate(GradSum& slot, const Tensor& grad) {
  if (!slot.grad.defined()) {
    slot.grad = grad;
    slot.owned = false;
  } else if (slot.owned && grad.shape() == slot.grad.shape() && grad.dtype() == slot.grad.dtype()) {
    slot.grad.add_(grad);
  } else {
    slot.grad = add(slot.grad, grad);
    slot.owned = true;
  }
}

// Adds `grad`, the gradient of a narrow view, into its slice of the input's gradient `slot` (made as zeros of the
// input's shape by the first slice to arrive; copied first when a node made it).
void accumulate_slice(GradSum& slot, const Node::Slice& slice, const Tensor& grad) {
  if (slot.grad.defined() && (slot.grad.dtype() != grad.dtype() || slot.grad.shape() != slice.from)) {
    Tensor full = zeros(slice.from, {.device = grad.device(), .dtype = grad.dtype()});  // the plain way
    full.narrow(slice.dim, slice.start, slice.length).copy_(grad);
    accumulate(slot, full);
    return;
  }
  if (!slot.grad.defined()) {
    slot.grad = zeros(slice.from, {.device = grad.device(), .dtype = grad.dtype()});
  } else if (!slot.owned) {
    slot.grad = slot.grad.clone();
  }
  slot.owned = true;
  slot.grad.narrow(slice.dim, slice.start, slice.length).add_(grad);
}

// Runs a tensor's register_hook() hooks on its gradient, in order; each may replace it.
Tensor run_tensor_hooks(const TensorImpl& impl, Tensor grad) {
  if (!impl.hooks) return grad;
  const std::vector<GradHooks::Entry> entries = impl.hooks->entries;  // a hook may add or remove hooks
  for (const GradHooks::Entry& entry : entries) {
    Tensor replaced = entry.hook(grad);
    if (!replaced.defined()) continue;
    FERRY_CHECK(replaced.shape() == grad.shape(), ShapeMismatch, "backward(): hook ", entry.handle,
                " changed the gradient's shape from ", shape_str(grad.shape()), " to ", shape_str(replaced.shape()));
    FERRY_CHECK(replaced.dtype() == grad.dtype(), DTypeMismatch, "backward(): hook ", entry.handle,
                " changed the gradient's dtype from ", dtype_name(grad.dtype()), " to ", dtype_name(replaced.dtype()));
    FERRY_CHECK(replaced.device() == grad.device(), DeviceMismatch, "backward(): hook ", entry.handle,
                " moved the gradient from ", grad.device().str(), " to ", replaced.device().str());
    grad = std::move(replaced);
  }
  return grad;
}

// Adds `grad` into .grad of `t` (a leaf, or a tensor that retains its gradient). A fresh gradient nobody else
// holds is kept as is; one that may alias another tensor (an expand, the seed, a gradient passed on to an op
// too) is copied first.
void accumulate_into_grad(const Tensor& t, Tensor grad) {
  if (grad.shape() != t.shape()) grad = grad.reshape(t.shape());
  if (grad.dtype() != t.dtype()) grad = grad.to(t.dtype());
  Tensor existing = t.grad();
  if (existing.defined()) {
    existing.add_(grad);
  } else {
    const bool owned = grad.impl_ptr().use_count() == 1 && grad.storage().use_count() == 1 && grad.is_contiguous();
    t.set_grad(owned ? grad : grad.clone());
  }
}

// A leaf's whole gradient of this backward: its hooks, then .grad, then the post-accumulate hooks.
void finish_leaf(const Tensor& leaf, Tensor grad) {
  grad = run_tensor_hooks(*leaf.impl(), std::move(grad));
  accumulate_into_grad(leaf, std::move(grad));
  run_post_accumulate_hooks(leaf);
}

// Gradient flowing into a leaf, summed until the last node that uses the leaf has run.
struct LeafSlot {
  Tensor leaf;
  GradSum grad;
  int remaining = 0;  // nodes of this backward still to pass their gradient (one count per edge)
};
}  // namespace

void run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph) {
  FERRY_CHECK(root.requires_grad(), InvalidArgument,
              "backward(): the tensor does not require grad and has no grad_fn (did you forget "
              "requires_grad_() on a leaf, or run the forward pass under NoGradGuard?)");
  Tensor seed = gradient;
  if (!seed.defined()) {
    FERRY_CHECK(root.numel() == 1, InvalidArgument, "backward(): grad can be implicitly created only for scalar ",
                "outputs; this one has shape ", shape_str(root.shape()), ": pass a gradient of that shape");
    seed = ones(root.shape(), {.device = root.device(), .dtype = root.dtype()});
  }
  FERRY_CHECK(seed.shape() == root.shape(), ShapeMismatch, "backward(): gradient shape ", shape_str(seed.shape()),
              " does not match the output's ", shape_str(root.shape()));
  check_same_device("backward", {&root, &seed});
  NoGradGuard no_grad;
  // A gradient of another dtype is cast to the output's, as PyTorch does (each op's backward sees its own dtype).
  if (seed.dtype() != root.dtype()) seed = seed.to(root.dtype());

  Node* root_node = root.impl()->grad_fn.get();
  if (!root_node) {
    finish_leaf(root, std::move(seed));
    return;
  }

  // Topological order by depth-first search from the root. The order holds the nodes alive: freeing
  // a node's inputs below may drop the last reference to a node not yet run.
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<std::shared_ptr<Node>, std::size_t>> stack{{root.impl()->grad_fn, 0}};
  seen.insert(root_node);
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      const Tensor& input = node->inputs[next++];
      const std::shared_ptr<Node> child = input.defined() ? input.impl()->grad_fn : nullptr;
      if (child && seen.insert(child.get()).second) stack.push_back({child, 0});
    } else {
      order.push_back(std::move(node));
      stack.pop_back();
    }
  }

  // Each leaf that requires grad, with how many edges of the graph lead to it: its gradient is complete (and
  // its hooks run) when the last node using it has run, not at the end of backward, so that DDP can start a
  // bucket's all-reduce while the rest of backward runs.
  std::unordered_map<const TensorImpl*, LeafSlot> leaves;
  for (const auto& node : order) {
    for (const Tensor& input : node->inputs) {
      if (!input.defined() || !input.requires_grad() || input.impl()->grad_fn) continue;
      LeafSlot& slot = leaves[input.impl()];
      if (!slot.leaf.defined()) slot.leaf = input;
      slot.remaining += 1;
    }
  }
  // After `node` has run (or been skipped, with no gradient reaching it): one fewer edge to wait for per leaf.
  auto edge_done = [&leaves](const Tensor& input, Tensor grad) {
    if (!input.defined() || !input.requires_grad() || input.impl()->grad_fn) return;
    auto found = leaves.find(input.impl());
    LeafSlot& slot = found->second;
    if (grad.defined()) accumulate(slot.grad, grad);
    if (--slot.remaining == 0) {
      if (slot.grad.grad.defined()) finish_leaf(slot.leaf, std::move(slot.grad.grad));
      leaves.erase(found);
    }
  };

  // After a node's backward: free what the graph held, as it runs once (unless retain_graph).
  auto release = [retain_graph](Node& node) {
    if (retain_graph) return;
    node.inputs.clear();
    node.backward = nullptr;
    node.saved.clear();
  };
  std::unordered_map<Node*, GradSum> pending;  // gradient flowing into each node's output
  pending[root_node].grad = seed;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = it->get();
    auto found = pending.find(node);
    if (found == pending.end()) {
      for (const Tensor& input : node->inputs) edge_done(input, Tensor());
      continue;
    }
    FERRY_CHECK(node->backward != nullptr, InvalidArgument, "backward(): trying to backward through the graph a ",
                "second time (at '", node->name, "'), but its saved tensors were freed after the first backward. ",
                "Pass retain_graph = true to the first backward() to backward through it again");
    check_saved_versions(*node);
    std::vector<Tensor> grads;
    {
      Tensor grad_output = std::move(found->second.grad);
      pending.erase(found);
      if (const std::shared_ptr<TensorImpl> output = node->output.lock()) {
        grad_output = run_tensor_hooks(*output, std::move(grad_output));
        if (output->hooks && output->hooks->retains_grad) accumulate_into_grad(Tensor(output), grad_output);
      }
      Node* slice_of = node->slice && node->inputs.size() == 1 && node->inputs[0].defined() &&
                               node->inputs[0].requires_grad()
                           ? node->inputs[0].impl()->grad_fn.get()
                           : nullptr;
      if (slice_of && grad_output.dtype() == node->inputs[0].dtype()) {  // a narrow of a non-leaf: add in place
        if (g_detect_anomaly && !all_finite(grad_output)) {
          throw Error(detail::concat("Anomaly: the gradient that '", node->name, "' passes to its input 0 holds ",
                                     "NaN or Inf (shape ", shape_str(grad_output.shape()), ")"));
        }
        accumulate_slice(pending[slice_of], *node->slice, grad_output);
        release(*node);
        continue;
      }
      grads = node->backward(grad_output);
    }
    FERRY_ASSERT(grads.size() == node->inputs.size(), "node '", node->name, "' returned ", grads.size(),
                 " gradients for ", node->inputs.size(), " inputs");
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const Tensor& input = node->inputs[i];
      if (!input.defined() || !input.requires_grad()) continue;
      if (grads[i].defined() && g_detect_anomaly && !all_finite(grads[i])) {
        throw Error(detail::concat("Anomaly: the gradient that '", node->name, "' passes to its input ", i,
                                   " holds NaN or Inf (shape ", shape_str(grads[i].shape()), ")"));
      }
      if (Node* child = input.impl()->grad_fn.get()) {
        if (grads[i].defined()) accumulate(pending[child], grads[i]);
      } else {
        edge_done(input, std::move(grads[i]));
      }
    }
    release(*node);
  }
}

}  // namespace ferry::autograd
