// lr_scheduler.cpp — PyTorch 1.13's schedules (torch/optim/lr_scheduler.py), formula for formula: the chainable
// get_lr() of each, the closed form where PyTorch has one (SequentialLR restarts a schedule with it), and
// ReduceLROnPlateau's counting. Host arithmetic in double only, compiled without multiply-add contraction
// (src/CMakeLists.txt), so each operation rounds as Python's does.
#include "ferry/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "ferry/error.h"

namespace ferry::optim {

// --- the common part ---------------------------------------------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (std::size_t g = 0; g < optimizer.group_count(); ++g) base_lrs_.push_back(optimizer.initial_learning_rate(g));
}

void LRScheduler::set_lrs(const std::vector<double>& lrs) {
  for (std::size_t g = 0; g < lrs.size(); ++g) optimizer_.set_group_learning_rate(g, lrs[g]);
  last_lrs_ = lrs;
}

void LRScheduler::initial_step() {
  step_count_ = 0;
  step();
}

void LRScheduler::step() {
  ++step_count_;
  ++last_epoch_;
  std::vector<double> lrs;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g)
    lrs.push_back(chained_lr(optimizer_.group_learning_rate(g), base_lrs_[g]));
  set_lrs(lrs);
}

void LRScheduler::restart_at_zero() {
  ++step_count_;
  last_epoch_ = 0;
  std::vector<double> lrs;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g)
    lrs.push_back(closed_form_lr(optimizer_.group_learning_rate(g), base_lrs_[g]));
  set_lrs(lrs);
}

// --- state_dict ---------------------------------------------------------------------------------------------

namespace {
double entry(const SchedulerState& state, const std::string& key, const char* who) {
  const auto it = state.find(key);
  FERRY_CHECK(it != state.end(), InvalidArgument, who, " load_state_dict: no \"", key, "\" in the state given");
  return it->second;
}

// Every "<prefix>.<g>" entry of the state, g = 0, 1, ...: as many as the optimizer has groups.
std::vector<double> per_group(const SchedulerState& state, const std::string& prefix, std::size_t groups,
                              const char* who) {
  std::vector<double> out;
  for (std::size_t g = 0; g < groups; ++g) out.push_back(entry(state, prefix + "." + std::to_string(g), who));
  FERRY_CHECK(state.count(prefix + "." + std::to_string(groups)) == 0, InvalidArgument, who,
              " load_state_dict: the state has more than this optimizer's ", groups, " parameter groups");
  return out;
}

// Throws as load_state_dict would, changing nothing: what every LRScheduler state holds.
void check_common(const SchedulerState& state, std::size_t groups, const char* who) {
  entry(state, "last_epoch", who);
  entry(state, "step_count", who);
  per_group(state, "base_lr", groups, who);
  per_group(state, "last_lr", groups, who);
}

SchedulerState with_prefix(const SchedulerState& state, const std::string& prefix) {
  SchedulerState out;
  for (const auto& [key, value] : state)
    if (key.rfind(prefix, 0) == 0) out.emplace(key.substr(prefix.size()), value);
  return out;
}
}  // namespace

SchedulerState LRScheduler::state_dict() const {
  SchedulerState state{{"last_epoch", static_cast<double>(last_epoch_)},
                       {"step_count", static_cast<double>(step_count_)}};
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
    state["base_lr." + std::to_string(g)] = base_lrs_[g];
    state["last_lr." + std::to_string(g)] = last_lrs_[g];
  }
  return state;
}

void LRScheduler::load_state_dict(const SchedulerState& state) {
  const char* who = "LRScheduler";
  const auto last_epoch = static_cast<std::int64_t>(entry(state, "last_epoch", who));
  const auto step_count = static_cast<std::int64_t>(entry(state, "step_count", who));
  std::vector<double> base = per_group(state, "base_lr", optimizer_.group_count(), who);
  std::vector<double> last = per_group(state, "last_lr", optimizer_.group_count(), who);
  last_epoch_ = last_epoch;
  step_count_ = step_count;
  base_lrs_ = std::move(base);
  set_lrs(last);
}

SchedulerState SequentialLR::state_dict() const {
  SchedulerState state = LRScheduler::state_dict();
  for (std::size_t i = 0; i < schedulers_.size(); ++i) {
    for (const auto& [key, value] : schedulers_[i]->state_dict())
      state["scheduler." + std::to_string(i) + "." + key] = value;
  }
  return state;
}

void SequentialLR::load_state_dict(const SchedulerState& state) {
  check_common(state, optimizer_.group_count(), "SequentialLR");
  std::vector<SchedulerState> parts;  // every part checked before anything changes
  for (std::size_t i = 0; i < schedulers_.size(); ++i) {
    parts.push_back(with_prefix(state, "scheduler." + std::to_string(i) + "."));
    check_common(parts.back(), optimizer_.group_count(), "SequentialLR");
  }
  for (std::size_t i = 0; i < schedulers_.size(); ++i) schedulers_[i]->load_state_dict(parts[i]);
  LRScheduler::load_state_dict(state);  // last: the rates of this epoch
}

SchedulerState ReduceLROnPlateau::state_dict() const {
  SchedulerState state{{"last_epoch", static_cast<double>(last_epoch_)},
                       {"best", best_},
                       {"bad_epochs", static_cast<double>(bad_epochs_)},
                       {"cooldown_counter", static_cast<double>(cooldown_counter_)}};
  for (std::size_t g = 0; g < optimizer_.group_count(); ++g)
    state["lr." + std::to_string(g)] = optimizer_.group_learning_rate(g);
  return state;
}

void ReduceLROnPlateau::load_state_dict(const SchedulerState& state) {
  const char* who = "ReduceLROnPlateau";
  const auto last_epoch = static_cast<std::int64_t>(entry(state, "last_epoch", who));
  const double best = entry(state, "best", who);
  const auto bad_epochs = static_cast<std::int64_t>(entry(state, "bad_epochs", who));
  const auto cooldown_counter = static_cast<std::int64_t>(entry(state, "cooldown_counter", who));
  const std::vector<double> lrs = per_group(state, "lr", optimizer_.group_count(), who);
  last_epoch_ = last_epoch;
  best_ = best;
  bad_epochs_ = bad_epochs;
  cooldown_counter_ = cooldown_counter;
  for (std::size_t g = 0; g < lrs.size(); ++g) optimizer_.set_group_learning_rate(g, lrs[g]);
}

// --- StepLR, MultiStepLR, ExponentialLR -----------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  FERRY_CHECK(step_size >= 1, InvalidArgument, "StepLR: step_size must be at least 1, got ", step_size);
  initial_step();
}
double StepLR::chained_lr(double current, double) const {
  return last_epoch_ == 0 || last_epoch_ % step_size_ != 0 ? current : current * gamma_;
}
double StepLR::closed_form_lr(double, double base) const {
  return base * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_));
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<std::int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}
double MultiStepLR::chained_lr(double current, double) const {
  const auto times = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  return times == 0 ? current : current * std::pow(gamma_, static_cast<double>(times));
}
double MultiStepLR::closed_form_lr(double, double base) const {
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  return base * std::pow(gamma_, static_cast<double>(passed));
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma) : LRScheduler(optimizer), gamma_(gamma) {
  initial_step();
}
double ExponentialLR::chained_lr(double current, double) const { return last_epoch_ == 0 ? current : current * gamma_; }
double ExponentialLR::closed_form_lr(double, double base) const {
  return base * std::pow(gamma_, static_cast<double>(last_epoch_));
}

// --- CosineAnnealingLR ------------------------------------------------------------------------------------

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, std::int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  FERRY_CHECK(t_max >= 1, InvalidArgument, "CosineAnnealingLR: T_max must be at least 1, got ", t_max);
  initial_step();
}
double CosineAnnealingLR::chained_lr(double current, double base) const {
  constexpr double pi = std::numbers::pi;
  const auto t = static_cast<double>(last_epoch_), t_max = static_cast<double>(t_max_);
  if (last_epoch_ == 0) return current;
  if ((last_epoch_ - 1 - t_max_) % (2 * t_max_) == 0)  // the bottom: the step back up
    return current + (base - eta_min_) * (1 - std::cos(pi / t_max)) / 2;
  return (1 + std::cos(pi * t / t_max)) / (1 + std::cos(pi * (t - 1) / t_max)) * (current - eta_min_) + eta_min_;
}
double CosineAnnealingLR::closed_form_lr(double, double base) const {
  constexpr double pi = std::numbers::pi;
  return eta_min_ + (base - eta_min_) *
                        (1 + std::cos(pi * static_cast<double>(last_epoch_) / static_cast<double>(t_max_))) / 2;
}

// --- LinearLR, LambdaLR -------------------------------------------------------------------------------------

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, std::int64_t total_iters)
    : LRScheduler(optimizer), start_factor_(start_factor), end_factor_(end_factor), total_iters_(total_iters) {
  FERRY_CHECK(start_factor > 0 && start_factor <= 1, InvalidArgument,
              "LinearLR: start_factor must be in (0, 1], got ", start_factor);
  FERRY_CHECK(end_factor >= 0 && end_factor <= 1, InvalidArgument, "LinearLR: end_factor must be in [0, 1], got ",
              end_factor);
  FERRY_CHECK(total_iters >= 1, InvalidArgument, "LinearLR: total_iters must be at least 1, got ", total_iters);
  initial_step();
}
double LinearLR::chained_lr(double current, double) const {
  if (last_epoch_ == 0) return current * start_factor_;
  if (last_epoch_ > total_iters_) return current;
  const double slope = end_factor_ - start_factor_;
  return current * (1. + slope / (static_cast<double>(total_iters_) * start_factor_ +
                                  static_cast<double>(last_epoch_ - 1) * slope));
}
double LinearLR::closed_form_lr(double, double base) const {
  return base * (start_factor_ + (end_factor_ - start_factor_) *
                                         static_cast<double>(std::min(total_iters_, last_epoch_)) /
                                         static_cast<double>(total_iters_));
}

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(std::int64_t)> factor)
    : LRScheduler(optimizer), factor_(std::move(factor)) {
  FERRY_CHECK(static_cast<bool>(factor_), InvalidArgument, "LambdaLR: the factor function is empty");
  initial_step();
}
double LambdaLR::chained_lr(double, double base) const { return base * factor_(last_epoch_); }

// --- SequentialLR -------------------------------------------------------------------------------------------

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<std::int64_t> milestones)
    : LRScheduler(optimizer), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  FERRY_CHECK(!schedulers_.empty(), InvalidArgument, "SequentialLR: no schedulers given");
  for (std::size_t i = 0; i < schedulers_.size(); ++i) {
    FERRY_CHECK(schedulers_[i] != nullptr, InvalidArgument, "SequentialLR: scheduler ", i, " is null");
    FERRY_CHECK(&schedulers_[i]->optimizer() == &optimizer, InvalidArgument,
                "SequentialLR expects all schedulers to belong to the same optimizer, but scheduler ", i,
                " belongs to another");
  }
  FERRY_CHECK(milestones_.size() + 1 == schedulers_.size(), InvalidArgument, "SequentialLR expects one milestone "
              "fewer than schedulers, but got ", schedulers_.size(), " schedulers and ", milestones_.size(),
              " milestones");
  FERRY_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()), InvalidArgument,
              "SequentialLR: the milestones must be in increasing order");
  // As PyTorch: back to the initial rate, each schedule one epoch back, and the first one's initial step again.
  last_epoch_ = 0;
  for (std::size_t g = 0; g < base_lrs_.size(); ++g) optimizer.set_group_learning_rate(g, base_lrs_[g]);
  for (auto& scheduler : schedulers_) scheduler->last_epoch_ -= 1;
  schedulers_.front()->initial_step();
  set_lrs(schedulers_.front()->last_lrs());
}

void SequentialLR::step() {
  ++last_epoch_;
  const auto index = static_cast<std::size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin());
  LRScheduler& scheduler = *schedulers_[index];
  if (index > 0 && milestones_[index - 1] == last_epoch_) {
    scheduler.restart_at_zero();
  } else {
    scheduler.step();
  }
  set_lrs(scheduler.last_lrs());
}

// --- ReduceLROnPlateau ----------------------------------------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, ReduceLROnPlateauOptions options)
    : optimizer_(optimizer), options_(options),
      best_(options.maximize ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity()) {
  FERRY_CHECK(options.factor < 1.0, InvalidArgument, "ReduceLROnPlateau: factor should be < 1.0, got ",
              options.factor);
  FERRY_CHECK(options.patience >= 0 && options.cooldown >= 0, InvalidArgument,
              "ReduceLROnPlateau: patience and cooldown must be >= 0, got ", options.patience, " and ",
              options.cooldown);
}

bool ReduceLROnPlateau::is_better(double value) const {
  const double t = options_.threshold;
  if (options_.maximize) return options_.relative_threshold ? value > best_ * (t + 1) : value > best_ + t;
  return options_.relative_threshold ? value < best_ * (1 - t) : value < best_ - t;
}

void ReduceLROnPlateau::step(double metric) {
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    bad_epochs_ = 0;
  } else {
    ++bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    bad_epochs_ = 0;
  }
  if (bad_epochs_ > options_.patience) {
    for (std::size_t g = 0; g < optimizer_.group_count(); ++g) {
      const double old_lr = optimizer_.group_learning_rate(g);
      const double new_lr = std::max(old_lr * options_.factor, options_.min_lr);
      if (old_lr - new_lr > options_.eps) optimizer_.set_group_learning_rate(g, new_lr);
    }
    cooldown_counter_ = options_.cooldown;
    bad_epochs_ = 0;
  }
}

}  // namespace ferry::optim
