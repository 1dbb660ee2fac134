// ferry/autograd.h — define-by-run reverse mode: each op that sees an input requiring grad records
// a Node; Tensor::backward() walks the nodes in reverse topological order. No double backward.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ferry/tensor.h"

namespace ferry::autograd {

// One recorded op: its inputs (edges to where gradients flow) and how to turn the gradient of its
// output into gradients of its inputs (undefined Tensor = no gradient for that input).
// What a node's backward reads of its own inputs and output (its lambda keeps them): autograd notes their
// storage's version when recording, and backward refuses to run on memory written in place since, as PyTorch
// does, instead of computing a wrong gradient from the new values.
enum class Saved : std::uint8_t { Nothing = 0, Inputs = 1, Output = 2, InputsAndOutput = 3 };

struct Node {
  std::string name;            // the op, for error messages and anomaly mode
  std::vector<Tensor> inputs;  // kept alive until backward has run
  std::function<std::vector<Tensor>(const Tensor& grad_output)> backward;
  struct SavedVersion {
    std::shared_ptr<Storage> storage;
    std::uint64_t version = 0;  // storage->version() when recorded
    std::string what;           // "input 1 (shape [4, 3])", "output (shape [4])"
  };
  std::vector<SavedVersion> saved;
  // The tensor this node made, set only when it has hooks or retains its gradient (register_hook, retain_grad):
  // backward runs them on the gradient flowing into this node.
  std::weak_ptr<TensorImpl> output;
  // Set by narrow (and so select, chunk, split): the view is [start, start + length) of dim `dim` of an input of
  // shape `from`. backward then adds the gradient into that slice of the input's gradient, made once (zeros) for
  // every slice of it, instead of `backward` making a zero tensor of the input's whole shape per slice and adding
  // it: a loop over the L steps of a sequence costs O(L) instead of O(L^2).
  struct Slice {
    Shape from;
    int dim = 0;
    std::int64_t start = 0, length = 0;
  };
  std::optional<Slice> slice;
  Node() = default;
  Node(std::string name, std::vector<Tensor> inputs, std::function<std::vector<Tensor>(const Tensor&)> backward)
      : name(std::move(name)), inputs(std::move(inputs)), backward(std::move(backward)) {}
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  // Frees the nodes only this one kept alive with a loop, not by recursion: a graph of 10^5 ops dropped without
  // backward would otherwise overflow the stack (PyTorch's deleteNode does the same).
  ~Node();
};

// A tensor's gradient hooks (Tensor::register_hook) and whether it keeps its gradient (Tensor::retain_grad).
struct GradHooks {
  struct Entry {
    unsigned handle = 0;
    std::function<Tensor(const Tensor&)> hook;  // returns the replacement gradient, or an undefined Tensor
  };
  std::vector<Entry> entries;
  unsigned next_handle = 0;
  bool retains_grad = false;
};

bool grad_enabled();
void set_grad_enabled(bool enabled);

// While alive, ops record no history (PyTorch's torch::NoGradGuard).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when grad mode is on and any input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Attach a node to `output` (which then requires grad). Call only when needs_grad(inputs).
// `saved`: what the backward function reads of the inputs and the output (see Saved); `inputs_read`: with
// Saved::Inputs, how many of the inputs, from the first, it reads (linear's backward reads input and weight, not the
// bias: 2); -1 for all.
void record(const char* name, std::vector<Tensor> inputs, Tensor& output,
            std::function<std::vector<Tensor>(const Tensor& grad_output)> backward, Saved saved = Saved::Nothing,
            int inputs_read = -1);

// Sum `grad` down to `shape` (undoing broadcasting).
Tensor reduce_to_shape(const Tensor& grad, const Shape& shape);

// Run backward from `root` with d(root)/d(root) = gradient. Each leaf's gradient is summed over every path that
// reaches it before it touches .grad, so its hooks see it once per backward. retain_graph keeps the graph for
// another backward.
void run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph = false);

// A hook called right after backward has written or accumulated a gradient into a leaf's .grad: once per
// backward that reaches the leaf (a leaf used twice in the forward pass sees the sum of both gradients, once,
// after the last op that used it has passed its gradient back), on the thread running backward, with grad mode
// off. DistributedDataParallel uses it to start the all-reduce of a
// gradient bucket while the rest of backward runs (PyTorch's register_post_accumulate_grad_hook).
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;
// Registers `hook` on `leaf` (a tensor that requires grad and has no grad_fn). Hooks run in the order
// registered. Returns a handle for remove_post_accumulate_grad_hook.
std::uint64_t register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);
// Removes a hook; a handle already removed (or never given) is ignored.
void remove_post_accumulate_grad_hook(std::uint64_t handle);

// Anomaly mode: every op checks its output, and backward every gradient, for NaN/Inf and throws
// naming the first op where it appeared (each check reads a value back: a sync per op; ops inside a graph
// capture are not checked, as a capture allows no sync).
void set_detect_anomaly(bool enabled);
bool detect_anomaly();

}  // namespace ferry::autograd
