// step_graph.cpp — capture a step once, replay it for every batch of its shape (ferry/step_graph.h).
#include "ferry/step_graph.h"

#include "ferry/error.h"
#include "ferry/factories.h"

namespace ferry {

StepGraph::StepGraph(std::vector<Tensor> parameters, Body body, StepGraphOptions options)
    : parameters_(std::move(parameters)), body_(std::move(body)), options_(options) {
  if (!options_.enabled) not_captured_ = "graphs are off";
  FERRY_CHECK(options_.warmup_steps >= 1, InvalidArgument, "StepGraph needs at least one warm-up step, got ",
              options_.warmup_steps);
}

Tensor StepGraph::run_eagerly(const Tensor& images, const Tensor& labels) {
  for (const Tensor& p : parameters_) p.set_grad(Tensor());
  ++eager_steps_;
  return body_(images, labels);
}

void StepGraph::capture(const Tensor& images, const Tensor& labels) {
  // Nothing made before the capture may be freed inside it: the gradients go first, and the inputs are
  // tensors of our own that later batches are copied into.
  for (const Tensor& p : parameters_) p.set_grad(Tensor());
  static_images_ = empty(images.shape(), {.device = images.device(), .dtype = images.dtype()});
  static_labels_ = empty(labels.shape(), {.device = labels.device(), .dtype = labels.dtype()});
  graph_ = std::make_unique<Graph>(images.device());
  graph_->capture([&] { static_loss_ = body_(static_images_, static_labels_); });
  static_grads_.clear();
  captured_storage_.clear();
  for (const Tensor& p : parameters_) {
    static_grads_.push_back(p.grad());
    captured_storage_.push_back(p.data_ptr());
  }
}

Tensor StepGraph::run(const Tensor& images, const Tensor& labels) {
  if (!not_captured_.empty() || images.device().is_cpu()) return run_eagerly(images, labels);
  if (captured()) {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      if (parameters_[i].data_ptr() == captured_storage_[i]) continue;
      // The graph's kernels would read and write the parameter's old (freed) memory: drop it, capture again.
      graph_.reset();
      static_images_ = static_labels_ = static_loss_ = Tensor();
      static_grads_.clear();
      captured_storage_.clear();
      warm_ = 0;
      ++recaptures_;
      break;
    }
  }
  if (!captured()) {
    if (images.shape() != images_shape_ || labels.shape() != labels_shape_) {  // a new shape to warm up
      images_shape_ = images.shape();
      labels_shape_ = labels.shape();
      warm_ = 0;
    }
    if (warm_ < options_.warmup_steps) {
      ++warm_;
      return run_eagerly(images, labels);
    }
    if (!graph_capture_supported(images.device())) {
      not_captured_ = images.device().str() + " cannot capture graphs";
      return run_eagerly(images, labels);
    }
    try {
      capture(images, labels);
    } catch (const Error& e) {  // not capturable (or the device refused): say why once, run eagerly from now on
      not_captured_ = e.what();
      graph_.reset();
      static_images_ = static_labels_ = static_loss_ = Tensor();
      return run_eagerly(images, labels);
    }
  }
  if (images.shape() != images_shape_ || labels.shape() != labels_shape_ || images.device() != graph_->device())
    return run_eagerly(images, labels);  // e.g. the shorter last batch of an epoch
  // A batch written into the graph's inputs already (the same storage, shape and dtype) is not copied again.
  const auto is_input = [](const Tensor& batch, const Tensor& input) {
    return batch.data_ptr() == input.data_ptr() && batch.shape() == input.shape() && batch.dtype() == input.dtype() &&
           batch.is_contiguous();
  };
  if (!is_input(images, static_images_)) static_images_.copy_(images);
  if (!is_input(labels, static_labels_)) static_labels_.copy_(labels);
  for (std::size_t i = 0; i < parameters_.size(); ++i) parameters_[i].set_grad(static_grads_[i]);
  graph_->replay();
  return static_loss_;
}

std::string StepGraph::describe() const {
  if (captured()) {
    const std::string kinds = graph_->composition();
    return detail::concat("one graph of ", operations(), " operations", kinds.empty() ? "" : " (" + kinds + ")", " on ",
                          graph_->device().str(), ", replayed ",
                          replays(), " times; ", eager_steps_, " steps eager (warm-up and other batch shapes)",
                          recaptures_ > 0 ? detail::concat("; captured again ", recaptures_,
                                                           " time(s) after the parameters moved")
                                          : std::string());
  }
  if (!not_captured_.empty()) return "no graph: " + not_captured_;
  return detail::concat("no graph yet (", eager_steps_, " eager steps)");
}

}  // namespace ferry
