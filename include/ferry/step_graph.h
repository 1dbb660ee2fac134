// ferry/step_graph.h — a training step (forward, loss, backward and the optimizer's update) captured once as a
// graph (ferry/graph.h) and replayed for every batch of the same shape: on cuda one launch instead of the
// hundreds of kernels a step enqueues, so a small model's step is no longer bound by the host's launch rate.
// Not here: the loop (ferry/trainer.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/graph.h"
#include "ferry/tensor.h"

namespace ferry {

struct StepGraphOptions {
  bool enabled = true;        // false: every step runs as written (eagerly)
  int warmup_steps = 2;       // eager steps of the captured shape first (library plans, optimizer state)
};

class StepGraph {
 public:
  // body(images, labels): forward, loss, backward, and the update if wanted; returns the loss. It may also
  // update tensors made before the first run() in place (parameters, momentum buffers, running sums); it must
  // not replace them, sync, copy or draw random numbers (ferry/graph.h). An update inside the body must read
  // its per-step numbers from the device: SGD with SGDOptions.lr_on_device, its learning rate set before each
  // run() (other optimizers refuse the capture, and the step runs eagerly). `parameters` are the model's: their
  // gradients are cleared before each step and, when replaying, pointed at the graph's gradient tensors, so
  // code after run() (an update outside the body, gradient clipping) reads them as after an eager step.
  // What the body's host code decides is fixed at capture (training or eval mode, which layers run, scalars
  // such as a loss weight): a replay repeats the device work only.
  using Body = std::function<Tensor(const Tensor& images, const Tensor& labels)>;
  StepGraph(std::vector<Tensor> parameters, Body body, StepGraphOptions options = {});

  // One step on this batch (on the graph's device). The first batch shape seen after `warmup_steps` eager
  // steps of it is captured; later batches of that shape replay it, others run eagerly. Returns the loss:
  // when replayed, the graph's own tensor, overwritten by the next replay. A parameter whose storage changed
  // since the capture (Module::to() there and back, which keeps the tensor but replaces its memory) drops the
  // graph, whose kernels point at the old memory: the step runs eagerly and is warmed up and captured again.
  Tensor run(const Tensor& images, const Tensor& labels);

  // The graph's own input tensors (images, labels; undefined until captured). run() copies each batch into
  // them; a batch written there already (index_select_out, DataLoader::next_into) is not copied again, so a
  // replay is the graph's launch alone.
  std::pair<Tensor, Tensor> inputs() const { return {static_images_, static_labels_}; }

  bool captured() const { return graph_ && graph_->captured(); }
  std::int64_t replays() const { return graph_ ? graph_->replays() : 0; }
  std::int64_t eager_steps() const { return eager_steps_; }
  std::int64_t operations() const { return graph_ ? graph_->operations() : 0; }
  // One line: "one graph of 942 operations on sim:0, replayed 5 times; 3 steps eager (...)", or why there is none.
  std::string describe() const;

 private:
  Tensor run_eagerly(const Tensor& images, const Tensor& labels);
  void capture(const Tensor& images, const Tensor& labels);

  std::vector<Tensor> parameters_;
  Body body_;
  StepGraphOptions options_;
  std::string not_captured_;  // why there is no graph ("" while it may still come)
  Shape images_shape_, labels_shape_;  // the shape being warmed up or captured
  int warm_ = 0;
  std::unique_ptr<Graph> graph_;
  Tensor static_images_, static_labels_, static_loss_;
  std::vector<Tensor> static_grads_;  // one per parameter (undefined where backward gave none)
  std::vector<const void*> captured_storage_;  // each parameter's data_ptr() when the graph was captured
  std::int64_t recaptures_ = 0;       // graphs dropped because a parameter's storage changed
  std::int64_t eager_steps_ = 0;
};

}  // namespace ferry
