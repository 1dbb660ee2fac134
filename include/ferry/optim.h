// ferry/optim.h — optimizers with PyTorch's exact update rules: SGD (momentum, dampening, nesterov, weight
// decay), Adam and AdamW (optionally amsgrad), RMSprop and Adagrad. State lives on each parameter's device;
// updates are in-place tensor ops under NoGradGuard (no host loops, no host syncs). Not here: learning-rate
// schedules (ferry/lr_scheduler.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/nn/module.h"
#include "ferry/tensor.h"

namespace ferry::optim {

using NamedTensors = nn::NamedTensors;

// Parameters with their own learning rate and weight decay (PyTorch's param_groups); an unset value is the
// optimizer's option. The usual use: no weight decay for biases and norm layers.
//   optim::AdamW adamw({{.params = matrices}, {.params = others, .weight_decay = 0.0}}, {.lr = 3e-4});
struct ParamGroup {
  std::vector<Tensor> params = {};  // (the initializers let {.params = ...} leave the rest out without a warning)
  std::optional<double> lr = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> parameters);  // one group
  // Parameters are numbered across the groups in order (state_dict's "state.<i>", as PyTorch). Throws
  // InvalidArgument for an empty group, a parameter in two groups, or a negative lr or weight_decay.
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (parameters without one are skipped, as in
  // PyTorch). Throws DeviceMismatch when a parameter and its gradient or its state sit on different
  // devices (e.g. the model moved after the state was made: see to()).
  virtual void step() = 0;
  // Forget gradients (set_to_none, PyTorch 2's default) or fill them with zeros.
  void zero_grad(bool set_to_none = true);

  // The state as named tensors "state.<i>.<name>" (i = the parameter's index in the list given to the
  // constructor; names as PyTorch's: momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq, square_avg, grad_avg,
  // sum, step).
  // Values alias the live state (no copy). Parameters without state yet have no entries.
  NamedTensors state_dict() const;
  // Copies each entry into the state (made where missing), on the parameter's device. Throws
  // InvalidArgument for an unknown name, a parameter index out of range, or a shape mismatch.
  void load_state_dict(const NamedTensors& state);
  // Moves the state to each parameter's current device (call after model.to() once state exists).
  // Returns the bytes moved.
  std::size_t to_parameter_devices();

  const std::vector<Tensor>& parameters() const { return parameters_; }  // every group's, in order
  // The first group's learning rate (the only one's, without groups).
  double learning_rate() const { return group_learning_rate(0); }
  // Sets every group's learning rate to `lr` (options.lr too).
  virtual void set_learning_rate(double lr);
  // The learning rate before any schedule changed it (PyTorch's param_group["initial_lr"]): the first call records
  // learning_rate(), later calls return that value. Learning-rate schedulers (ferry/lr_scheduler.h) start from it,
  // so that a second scheduler made on this optimizer starts where the first did, not where it moved the rate.
  double initial_learning_rate() { return initial_learning_rate(0); }

  // --- parameter groups (one, numbered 0, when the optimizer was given a list of tensors) -------------
  std::size_t group_count() const { return groups_.size(); }
  std::vector<Tensor> group_parameters(std::size_t group) const;
  double group_learning_rate(std::size_t group) const;  // its own, else options.lr
  double group_weight_decay(std::size_t group) const;   // its own, else options.weight_decay
  // With one group this is set_learning_rate(lr). Throws InvalidArgument for a group out of range.
  void set_group_learning_rate(std::size_t group, double lr);
  // initial_learning_rate() of each group: all recorded at the first call of either.
  double initial_learning_rate(std::size_t group);

 protected:
  // Per-parameter state: tensors on the parameter's device, in the order they were made, and a step
  // count kept on the host (the bias corrections need it there; reading it back from a device would be
  // a sync per step). state_dict() exports the count as PyTorch does: a 0-d float32 cpu tensor "step".
  // (Adam with capturable counts on the device instead: a float64 state tensor "step".)
  struct ParameterState {
    NamedTensors tensors;
    std::int64_t step = 0;
  };
  // The state tensor `name` of parameter i, made as zeros like the parameter when absent (`created`
  // says which).
  Tensor& state_tensor(std::size_t i, const std::string& name, bool* created = nullptr);
  bool has_state(std::size_t i, const std::string& name) const;
  // For a fused step: the parameters with a gradient (`order`) and their gradients (contiguous) when one backend
  // call can take them all (one device and dtype; every parameter and state tensor contiguous; each gradient of its
  // parameter's dtype and shape). False otherwise, having changed nothing but the two lists.
  bool fusable(const char* op, std::vector<std::size_t>& order, std::vector<Tensor>& grads) const;
  // Before a step changes anything: every parameter with a gradient has its gradient and its state on its own
  // device, else DeviceMismatch naming both (and to_parameter_devices() when the state was left behind). So a
  // step that throws has updated nothing.
  void check_step_devices(const char* op) const;
  // The state tensor `name` of parameter i as it starts (state_tensor makes it when absent): zeros like the
  // parameter unless the optimizer says otherwise.
  virtual Tensor make_state(std::size_t i, const std::string& name) const;
  // After set_learning_rate or set_group_learning_rate changed a rate (Adam's capturable writes it to the device).
  virtual void learning_rates_changed() {}
  // The tensor names this optimizer keeps, to validate load_state_dict.
  virtual std::vector<std::string> state_names() const = 0;
  // Whether state_dict() carries a "step" entry per parameter.
  virtual bool counts_steps() const { return false; }
  // The options the groups fall back on: the derived optimizer's options.lr and options.weight_decay, and how
  // set_learning_rate writes options.lr.
  virtual double default_learning_rate() const = 0;
  virtual void set_default_learning_rate(double lr) = 0;
  virtual double default_weight_decay() const = 0;
  // For the derived constructor: with one group, the group's own lr and weight_decay become the options (so that
  // group 0's rate and options.lr are one number).
  void adopt_group_options(double& lr, double& weight_decay);
  // For set_learning_rate: every group takes options.lr again.
  void forget_group_learning_rates();
  // The group of parameter i.
  std::size_t group_of(std::size_t i) const { return group_of_[i]; }

  std::vector<Tensor> parameters_;
  std::vector<ParameterState> state_;

 private:
  struct Group {
    std::size_t first = 0, count = 0;  // parameters_[first, first + count)
    std::optional<double> lr, weight_decay;
  };
  void check_group(std::size_t group) const;  // InvalidArgument when out of range
  std::vector<Group> groups_;
  std::vector<std::size_t> group_of_;  // per parameter
  std::vector<double> initial_lrs_;    // per group; empty: not recorded yet
};

// A host number kept in a float64 scalar on a device for a step captured in a graph (ferry/step_graph.h) to read
// as it runs: SGD's and Adam's learning rate with lr_on_device / capturable. Written with a fill (queued behind the
// device's work: no copy, no sync) when the number or the device changed; writing is refused inside a capture (a
// replay would repeat the captured value).
class DeviceNumber {
 public:
  // The scalar on `device` holding `value`, written first if it holds another (`what` names the write in the
  // GraphCaptureError a capture gets).
  const double* get(Device device, double value, const char* what);
  bool defined() const { return tensor_.defined(); }
  Device device() const { return tensor_.device(); }

 private:
  Tensor tensor_;  // float64, shape ()
  double written_ = 0;
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
  // One backend call updates every parameter (one kernel launch on cuda, instead of about six per
  // parameter), with the same roundings as the op-by-op step; false runs op by op. Parameters of
  // several devices or dtypes, or non-contiguous ones, always go op by op.
  bool fused = true;
  // Keep the learning rate in a one-element float64 tensor on the parameters' device, written by
  // set_learning_rate (a fill: no copy, no sync) and read by the fused step as it runs, so a step
  // captured in a graph (ferry/graph.h) follows the schedule on every replay. Needs the fused step.
  bool lr_on_device = false;
};

// d = grad (+ weight_decay * param); with momentum: buf = d on the first step, else
// buf = momentum * buf + (1 - dampening) * d; d = nesterov ? d + momentum * buf : buf;
// param -= lr * d.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> parameters, const SGDOptions& options);
  // lr_on_device needs a single group.
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options);
  void step() override;
  // With lr_on_device the value is also written to the device (not allowed inside a capture: a replay
  // would repeat the value; set it before each replay instead).
  void set_learning_rate(double lr) override;

  SGDOptions options;

 protected:
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
  double default_learning_rate() const override { return options.lr; }
  void set_default_learning_rate(double lr) override { options.lr = lr; }
  double default_weight_decay() const override { return options.weight_decay; }

 private:
  void check_options();
  bool step_fused();  // false (having changed nothing) when the parameters do not allow one call per group
  // The fused update of one group's parameters `order` (indices into parameters_) with their gradients.
  void step_fused_group(Device device, const std::vector<std::size_t>& order, const std::vector<Tensor>& grads,
                        std::size_t group);
  DeviceNumber lr_on_device_;  // lr_on_device: options.lr on the parameters' device
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // Adam: added to the gradient; AdamW: decoupled (param *= 1 - lr * wd)
  bool amsgrad = false;
  bool maximize = false;
  // One backend call per parameter group updates every parameter and its moments (one kernel launch on cuda,
  // instead of about twelve per parameter), with the same roundings as the op-by-op step; false runs op by op.
  // Parameters of several devices or dtypes, or non-contiguous ones, always go op by op.
  bool fused = true;
  // Keep what changes from step to step on the parameters' device (PyTorch's capturable), so that a step captured
  // in a graph (ferry/step_graph.h) follows it on every replay: each parameter's step count (state "step", a
  // float64 scalar there, counted by the step's kernel), each group's learning rate (a float64 scalar written by
  // set_learning_rate and set_group_learning_rate: a fill, no sync), and the bias corrections in a table by step
  // made with the host's std::pow, so that the update has the bits of the step without it. Needs the fused step
  // (parameters with gradients on one device, of one dtype, contiguous). Fixed at construction.
  bool capturable = false;
};

// PyTorch's Adam: t += 1; g (+ wd * p); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// denom = sqrt(v) / sqrt(1 - b2^t) + eps (v -> max(v_max, v) with amsgrad); p -= lr / (1 - b1^t) * m / denom.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> parameters, const AdamOptions& options = {});
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options = {});
  void step() override;

  AdamOptions options;

 protected:
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled_weight_decay);
  std::vector<std::string> state_names() const override;
  bool counts_steps() const override { return !capturable_; }  // capturable: "step" is a state tensor
  Tensor make_state(std::size_t i, const std::string& name) const override;
  // capturable: each group's rate written to the device (not allowed inside a capture: a replay would repeat the
  // captured rate; set it before each replay instead).
  void learning_rates_changed() override;
  double default_learning_rate() const override { return options.lr; }
  void set_default_learning_rate(double lr) override { options.lr = lr; }
  double default_weight_decay() const override { return options.weight_decay; }

 private:
  void check_options();
  // One backend call per group and step count (capturable: per group); false (having changed nothing) when the
  // parameters do not allow it.
  bool step_fused();
  // capturable: the bias corrections by step on `device`, made (not inside a capture) when missing or stale.
  const double* bias_correction_table(Device device);

  bool decoupled_weight_decay_ = false;
  bool capturable_ = false;              // options.capturable at construction
  std::vector<DeviceNumber> lr_on_device_;  // capturable: each group's rate on the parameters' device
  // capturable: float64 (rows, 2) on the parameters' device; row t (t >= 1): 1 - beta1^t, sqrt(1 - beta2^t) as the
  // host computes them; the last row is the first t where both are 1 (later steps read it).
  Tensor bias_corrections_;
  double table_beta1_ = -1, table_beta2_ = -1;  // the betas bias_corrections_ was made for
};

// AdamW's options: Adam's, with PyTorch's AdamW default weight decay, 1e-2 (its own struct, so that
// AdamW(params, {.lr = 1e-3}) keeps that default; an AdamOptions would bring 0).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: param *= 1 - lr * weight_decay before the Adam update
  bool amsgrad = false;
  bool maximize = false;
  bool fused = true;  // as AdamOptions::fused
  bool capturable = false;  // as AdamOptions::capturable
};

// AdamW: Adam with decoupled weight decay.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> parameters, const AdamWOptions& options = {})
      : AdamW(std::vector<ParamGroup>{ParamGroup{.params = std::move(parameters)}}, options) {}
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options = {})
      : Adam(std::move(groups),
             AdamOptions{.lr = options.lr, .beta1 = options.beta1, .beta2 = options.beta2, .eps = options.eps,
                         .weight_decay = options.weight_decay, .amsgrad = options.amsgrad,
                         .maximize = options.maximize, .fused = options.fused, .capturable = options.capturable},
             true) {}
};

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;  // the smoothing constant of the squared-gradient average
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;  // divide by the gradient's estimated variance (subtract the squared mean gradient)
  bool maximize = false;
};

// PyTorch's RMSprop: g (+ wd * p); v = alpha v + (1 - alpha) g^2; centered: a = alpha a + (1 - alpha) g and
// denom = sqrt(v - a^2) + eps, else sqrt(v) + eps; momentum: buf = momentum buf + g / denom, p -= lr buf;
// else p -= lr g / denom. Op by op (about eight launches per parameter on cuda).
class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> parameters, const RMSpropOptions& options = {})
      : RMSprop(std::vector<ParamGroup>{ParamGroup{.params = std::move(parameters)}}, options) {}
  RMSprop(std::vector<ParamGroup> groups, const RMSpropOptions& options = {});
  void step() override;

  RMSpropOptions options;

 protected:
  std::vector<std::string> state_names() const override { return {"square_avg", "momentum_buffer", "grad_avg"}; }
  bool counts_steps() const override { return true; }
  double default_learning_rate() const override { return options.lr; }
  void set_default_learning_rate(double lr) override { options.lr = lr; }
  double default_weight_decay() const override { return options.weight_decay; }

 private:
  void check_options();
};

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0;  // step t uses lr / (1 + (t - 1) lr_decay)
  double weight_decay = 0;
  double initial_accumulator_value = 0;  // the sum of squares starts here
  double eps = 1e-10;
  bool maximize = false;
};

// PyTorch's Adagrad: t += 1; g (+ wd * p); sum += g^2; p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(sum) + eps).
// The sum is made at the first step (PyTorch makes it in the constructor; the values are the same).
class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> parameters, const AdagradOptions& options = {})
      : Adagrad(std::vector<ParamGroup>{ParamGroup{.params = std::move(parameters)}}, options) {}
  Adagrad(std::vector<ParamGroup> groups, const AdagradOptions& options = {});
  void step() override;

  AdagradOptions options;

 protected:
  std::vector<std::string> state_names() const override { return {"sum"}; }
  bool counts_steps() const override { return true; }
  double default_learning_rate() const override { return options.lr; }
  void set_default_learning_rate(double lr) override { options.lr = lr; }
  double default_weight_decay() const override { return options.weight_decay; }

 private:
  void check_options();
};

}  // namespace ferry::optim
