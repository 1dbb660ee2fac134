// ferry/lr_scheduler.h — learning-rate schedules with PyTorch's exact arithmetic (torch.optim.lr_scheduler, 1.13):
// each step() computes the next rate from the optimizer's current one by the same chainable formula, in double,
// so a ferry run and a PyTorch run see the same rates to the last bit (tested against torch's values). The rate is
// a host number: setting it is no sync (an SGD with lr_on_device writes it to the device, behind the queued work).
// Not here: the optimizers (ferry/optim.h); `ferry train`'s own cosine schedule (ferry/trainer.h).
//
//   optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
//   optim::CosineAnnealingLR schedule(sgd, /*t_max=*/epochs);
//   for (epoch ...) { for (batch ...) { ...; sgd.step(); } schedule.step(); }
//
// Resuming: make the scheduler again on the restored optimizer and load_state_dict(the saved state_dict()), or call
// step() last_epoch() times; either way the rates are the unbroken run's bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ferry/optim.h"

namespace ferry::optim {

// The schedules' common part: step() moves last_epoch on by one and sets the optimizer's learning rates, each
// parameter group's from its own (as PyTorch's base_lrs). Constructing one sets the rates for epoch 0 (PyTorch's
// initial step), starting from the optimizer's initial_learning_rate(group). Refusals are InvalidArgument, named as
// PyTorch's arguments.
// A schedule's progress by name (PyTorch's scheduler state_dict): numbers, exact in double, for a checkpoint's
// metadata (metadata_text, ferry/checkpoint.h) or any other store.
using SchedulerState = std::map<std::string, double>;

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // After an epoch (or a batch, for per-step schedules), after optimizer.step(): the rate of the next one.
  virtual void step();
  double last_lr() const { return last_lrs_.at(0); }         // PyTorch's get_last_lr()[0]
  const std::vector<double>& last_lrs() const { return last_lrs_; }  // get_last_lr(): one per group
  std::int64_t last_epoch() const { return last_epoch_; }    // 0 after construction
  double base_lr() const { return base_lrs_.at(0); }         // the optimizer's initial learning rate (group 0's)
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return optimizer_; }
  // "last_epoch", "step_count", "base_lr.<group>", "last_lr.<group>" (SequentialLR: each schedule's under
  // "scheduler.<i>."). The function of a LambdaLR is not kept: make it again with the same one.
  virtual SchedulerState state_dict() const;
  // Takes a state_dict() of a scheduler of the same kind on an optimizer with as many groups, and sets the
  // optimizer's rates to its last ones (ferry's optimizer state holds no rates). Throws InvalidArgument naming a
  // missing key or a group count that differs; nothing changes then.
  virtual void load_state_dict(const SchedulerState& state);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // PyTorch's _initial_step(): the derived constructor's last statement.
  void initial_step();
  // A group's next rate from its current one and its base rate (PyTorch's get_lr(), the chainable form), at
  // last_epoch_.
  virtual double chained_lr(double current, double base) const = 0;
  // A group's rate at last_epoch_ from its base rate alone (PyTorch's _get_closed_form_lr); by default the
  // chained form from the current rate.
  virtual double closed_form_lr(double current, double base) const { return chained_lr(current, base); }

  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_ = 0;

 private:
  friend class SequentialLR;
  void set_lrs(const std::vector<double>& lrs);
  void restart_at_zero();  // PyTorch's step(0), which SequentialLR uses at a milestone: the closed form at epoch 0
  std::vector<double> last_lrs_;
};

// lr * gamma every step_size epochs.
class StepLR final : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1);

 private:
  double chained_lr(double current, double base) const override;
  double closed_form_lr(double current, double base) const override;
  std::int64_t step_size_;
  double gamma_;
};

// lr * gamma at each milestone (an epoch listed k times multiplies by gamma^k).
class MultiStepLR final : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<std::int64_t> milestones, double gamma = 0.1);

 private:
  double chained_lr(double current, double base) const override;
  double closed_form_lr(double current, double base) const override;
  std::vector<std::int64_t> milestones_;  // sorted
  double gamma_;
};

// lr * gamma every epoch.
class ExponentialLR final : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);

 private:
  double chained_lr(double current, double base) const override;
  double closed_form_lr(double current, double base) const override;
  double gamma_;
};

// eta_min + (base - eta_min)(1 + cos(pi t / t_max)) / 2, and back up after t_max (SGDR without restarts).
class CosineAnnealingLR final : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, std::int64_t t_max, double eta_min = 0);

 private:
  double chained_lr(double current, double base) const override;
  double closed_form_lr(double current, double base) const override;
  std::int64_t t_max_;
  double eta_min_;
};

// A linear ramp of the factor from start_factor to end_factor over total_iters epochs (a warmup), then constant.
class LinearLR final : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, std::int64_t total_iters = 5);

 private:
  double chained_lr(double current, double base) const override;
  double closed_form_lr(double current, double base) const override;
  double start_factor_, end_factor_;
  std::int64_t total_iters_;
};

// base_lr * factor(epoch), for any factor.
class LambdaLR final : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(std::int64_t epoch)> factor);

 private:
  double chained_lr(double current, double base) const override;
  std::function<double(std::int64_t)> factor_;
};

// One schedule after another: schedulers[i + 1] takes over at milestones[i] (restarted at its epoch 0), as
// PyTorch's SequentialLR, e.g. a LinearLR warmup then a CosineAnnealingLR. All on the same optimizer.
class SequentialLR final : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<std::int64_t> milestones);
  void step() override;  // the scheduler of this epoch steps
  SchedulerState state_dict() const override;
  void load_state_dict(const SchedulerState& state) override;

 private:
  double chained_lr(double current, double) const override { return current; }  // unused: the schedulers step
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<std::int64_t> milestones_;
};

// Cuts the rate by `factor` when a metric stops improving for more than `patience` epochs (PyTorch's
// ReduceLROnPlateau): step(metric) after each evaluation. The metric is a host number: reading it from the device
// is the caller's one sync.
struct ReduceLROnPlateauOptions {
  bool maximize = false;     // mode "max": higher is better (accuracy); default "min" (a loss)
  double factor = 0.1;       // new lr = lr * factor (< 1)
  std::int64_t patience = 10;  // epochs without improvement before a cut
  double threshold = 1e-4;   // what counts as an improvement: relative (best * (1 -+ threshold)) or absolute
  bool relative_threshold = true;
  std::int64_t cooldown = 0;  // epochs after a cut during which bad epochs are not counted
  double min_lr = 0;
  double eps = 1e-8;          // a cut smaller than this is not made
};

// Each parameter group's rate is cut by the same factor, down to min_lr.
class ReduceLROnPlateau {
 public:
  explicit ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options = {});
  void step(double metric);
  double last_lr() const { return optimizer_.learning_rate(); }  // group 0's
  std::int64_t last_epoch() const { return last_epoch_; }
  std::int64_t bad_epochs() const { return bad_epochs_; }
  double best() const { return best_; }
  // "last_epoch", "best", "bad_epochs", "cooldown_counter", "lr.<group>"; load_state_dict also sets the
  // optimizer's rates (throws InvalidArgument as LRScheduler's).
  SchedulerState state_dict() const;
  void load_state_dict(const SchedulerState& state);

 private:
  bool is_better(double value) const;
  Optimizer& optimizer_;
  ReduceLROnPlateauOptions options_;
  double best_;
  std::int64_t bad_epochs_ = 0, cooldown_counter_ = 0, last_epoch_ = 0;
};

}  // namespace ferry::optim
