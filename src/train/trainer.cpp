// trainer.cpp — the loop: batches from the loader, forward, cross-entropy, backward, SGD step; the
// loss and accuracy summed on the device and read back only at log steps and epoch ends.
#include "ferry/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../core/internal.h"
#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/checkpoint.h"
#include "ferry/determinism.h"
#include "ferry/dist/ddp.h"
#include "ferry/dist/process_group.h"
#include "ferry/dist/sampler.h"
#include "ferry/factories.h"
#include "ferry/ledger.h"
#include "ferry/nn/activation.h"
#include "ferry/nn/batchnorm.h"
#include "ferry/nn/clip_grad.h"
#include "ferry/nn/conv.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/pooling.h"
#include "ferry/ops.h"
#include "ferry/optim.h"
#include "ferry/phase.h"
#include "ferry/random.h"
#include "ferry/readback.h"
#include "ferry/step_graph.h"

namespace ferry {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A one-line progress bar on a terminal (stderr); nothing otherwise (log lines carry the news).
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && isatty(STDERR_FILENO)) {}
  void update(std::int64_t epoch, std::int64_t epochs, std::int64_t done, std::int64_t total, double images_per_s,
              double eta_s, double last_loss) {
    if (!enabled_) return;
    const int width = 30;
    const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\r epoch %lld/%lld [%s%s] %lld/%lld  %.0f img/s  ETA %.0fs  loss %.4f ",
                 static_cast<long long>(epoch + 1), static_cast<long long>(epochs), std::string(filled, '=').c_str(),
                 std::string(width - filled, ' ').c_str(), static_cast<long long>(done), static_cast<long long>(total),
                 images_per_s, eta_s, last_loss);
    std::fflush(stderr);
    shown_ = true;
  }
  bool enabled() const { return enabled_; }
  void clear() {
    if (enabled_ && shown_) std::fprintf(stderr, "\r%*s\r", 110, "");
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
};

// Sums of host numbers over every rank (one small all-reduce, on the group's device).
std::vector<double> sum_over_ranks(dist::ProcessGroup& group, const std::vector<double>& values) {
  Tensor packed = from_vector(values, {static_cast<std::int64_t>(values.size())}, {.dtype = DType::Float64});
  if (!group.device().is_cpu()) packed = packed.to(group.device());
  group.all_reduce(packed, dist::ReduceOp::Sum, "epoch totals");
  return packed.cpu().to_vector<double>();
}


}  // namespace

std::shared_ptr<nn::Sequential> make_cnn_model(std::int64_t in_channels, std::int64_t side, const TensorOptions& options) {
  auto model = std::make_shared<nn::Sequential>();
  std::int64_t in = in_channels;
  for (std::int64_t out : {32, 64, 128}) {
    model->push_back(std::make_shared<nn::Conv2d>(in, out, 3, nn::Conv2dOptions{.padding = 1}, options));
    model->push_back(std::make_shared<nn::BatchNorm2d>(out, nn::BatchNormOptions{}, options));
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::MaxPool2d>(2));
    in = out;
  }
  const std::int64_t pooled = side / 2 / 2 / 2;  // three 2x2 poolings, floor: 28 -> 3, 32 -> 4
  model->push_back(std::make_shared<nn::Flatten>());
  model->push_back(std::make_shared<nn::Linear>(128 * pooled * pooled, 10, true, options));
  return model;
}

std::shared_ptr<nn::Sequential> make_fmnist_model(const TensorOptions& options) { return make_cnn_model(1, 28, options); }

std::shared_ptr<nn::Sequential> make_mlp_model(const TensorOptions& options) {
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Flatten>());
  model->push_back(std::make_shared<nn::Linear>(28 * 28, 1024, true, options));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(1024, 1024, true, options));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(1024, 10, true, options));
  return model;
}

std::shared_ptr<nn::Sequential> make_model(const std::string& name, const TensorOptions& options) {
  if (name == "fmnist") return make_fmnist_model(options);
  if (name == "mlp") return make_mlp_model(options);
  throw InvalidArgument(detail::concat("Unknown model '", detail::printable(name), "': expected fmnist or mlp"));
}

double evaluate_accuracy(nn::Module& model, DataLoader& loader) {
  const bool was_training = model.is_training();
  model.eval();
  autograd::NoGradGuard no_grad;
  Tensor correct = zeros({}, {.device = loader.options().device, .dtype = DType::Int64});
  loader.start_epoch(0);
  Batch batch;
  while (loader.next(batch)) correct = correct + sum(eq(argmax(model(batch.images), 1), batch.labels));
  model.train(was_training);
  return static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(loader.size());
}

Tensor confusion_matrix(nn::Module& model, DataLoader& loader, std::int64_t classes) {
  FERRY_CHECK(classes >= 1, InvalidArgument, "confusion_matrix: classes must be at least 1, got ", classes);
  const bool was_training = model.is_training();
  model.eval();
  autograd::NoGradGuard no_grad;
  const Device device = loader.options().device;
  Tensor counts = zeros({classes * classes}, {.device = device, .dtype = DType::Int64});  // row-major (label, guess)
  loader.start_epoch(0);
  Batch batch;
  while (loader.next(batch)) {
    const Tensor logits = model(batch.images);
    FERRY_CHECK(logits.dim() == 2 && logits.size(1) == classes, ShapeMismatch, "confusion_matrix: the model gave ",
                shape_str(logits.shape()), " for ", batch.labels.numel(), " samples; expected (N, ", classes, ")");
    const Tensor guess = argmax(logits, 1);
    const Tensor cell = add(mul(batch.labels, static_cast<double>(classes)), guess);
    counts = scatter_add(counts, 0, cell, ones_like(cell));
  }
  model.train(was_training);
  return detail::host_copy(counts, "confusion matrix").reshape({classes, classes});
}

double scheduled_learning_rate(const TrainOptions& o, std::int64_t step, std::int64_t total_steps) {
  if (step < o.warmup_steps) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  const std::int64_t span = total_steps - o.warmup_steps;  // the steps after the warmup
  if (o.schedule == "constant" || span <= 0) return o.lr;
  return o.lr * 0.5 *
         (1.0 + std::cos(M_PI * static_cast<double>(step - o.warmup_steps) / static_cast<double>(span)));
}

void check_train_options(const TrainOptions& o) {
  FERRY_CHECK(o.epochs >= 1, InvalidArgument, "--epochs must be at least 1, got ", o.epochs);
  FERRY_CHECK(o.batch_size >= 1, InvalidArgument, "--batch must be at least 1, got ", o.batch_size);
  FERRY_CHECK(o.accumulate >= 1, InvalidArgument, "--accumulate must be at least 1, got ", o.accumulate);
  const int world = o.process_group ? o.process_group->world_size() : 1;  // (the sampler says if N does not divide B)
  FERRY_CHECK(o.batch_size % world != 0 || o.accumulate <= o.batch_size / world, InvalidArgument, "--accumulate ",
              o.accumulate, " splits each step's ", o.batch_size / world, " images", world > 1 ? " (on each rank)" : "",
              " into that many micro-batches: it can be at most ", o.batch_size / world);
  FERRY_CHECK(o.clip_grad_norm >= 0 && std::isfinite(o.clip_grad_norm), InvalidArgument,
              "--clip-grad-norm must be a number > 0 (1 is usual), or 0 for none; got ", o.clip_grad_norm);
  FERRY_CHECK(o.warmup_steps >= 0, InvalidArgument, "--warmup-steps must be at least 0, got ", o.warmup_steps);
  FERRY_CHECK(o.log_every >= 1, InvalidArgument, "--log-every must be at least 1, got ", o.log_every);
  FERRY_CHECK(o.lr > 0 && std::isfinite(o.lr), InvalidArgument, "--lr must be a positive number, got ", o.lr);
  FERRY_CHECK(o.momentum >= 0 && std::isfinite(o.momentum), InvalidArgument,
              "--momentum must be a number >= 0 (0.9 is usual), got ", o.momentum);
  FERRY_CHECK(o.weight_decay >= 0 && std::isfinite(o.weight_decay), InvalidArgument,
              "--weight-decay must be a number >= 0, got ", o.weight_decay);
  FERRY_CHECK(o.schedule == "cosine" || o.schedule == "constant", InvalidArgument,
              "--schedule must be cosine or constant, got '", o.schedule, "'");
  FERRY_CHECK(o.graphs == "auto" || o.graphs == "on" || o.graphs == "off", InvalidArgument,
              "--graphs must be auto, on or off, got '", o.graphs, "'");
  FERRY_CHECK(o.optimizer == "sgd" || o.optimizer == "adamw", InvalidArgument,
              "--optimizer must be sgd or adamw, got '", detail::printable(o.optimizer), "'");
  FERRY_CHECK(o.graphs != "on" || !o.device.is_cpu(), InvalidArgument,
              "--graphs on captures steps on cuda or sim; the cpu runs every step eagerly (use --graphs auto or off)");
}

std::unique_ptr<optim::Optimizer> make_train_optimizer(const TrainOptions& o, const nn::Module& model, bool graphs) {
  if (o.optimizer == "sgd") {
    return std::make_unique<optim::SGD>(
        model.parameters(), optim::SGDOptions{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay,
                                              .lr_on_device = graphs});
  }
  std::vector<optim::ParamGroup> groups(2);
  groups[1].weight_decay = 0.0;
  for (const Tensor& p : model.parameters()) groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
  if (groups[1].params.empty()) groups.pop_back();
  if (groups[0].params.empty()) groups.erase(groups.begin());
  return std::make_unique<optim::AdamW>(
      std::move(groups), optim::AdamWOptions{.lr = o.lr, .weight_decay = o.weight_decay, .capturable = graphs});
}

TrainResult train(nn::Module& model, const Dataset& train_set, const Dataset& test_set, const TrainOptions& o,
                  std::ostream& out) {
  check_train_options(o);
  Ledger& ledger = Ledger::global();
  const auto ledger_start = ledger.totals();
  dist::ProcessGroup* group = o.process_group;  // data-parallel when set; everything below is as before otherwise
  const bool is_rank0 = group == nullptr || group->rank() == 0;
  std::unique_ptr<dist::DistributedSampler> sampler;
  if (group) sampler = std::make_unique<dist::DistributedSampler>(o.batch_size, group->world_size(), group->rank());
  const std::int64_t local_batch = sampler ? sampler->local_batch() : o.batch_size;  // images per step on this rank

  const std::size_t moved = model.to(o.device);
  // On cuda (or sim when asked) the step is captured as a graph after two eager steps and replayed; the
  // shorter last batch of an epoch runs eagerly. Data-parallel steps stay eager (their all-reduces overlap
  // backward from hooks). A captured update reads the learning rate from the device, written before each step
  // (AdamW its step counts too, counted there).
  const bool want_graphs = o.graphs == "on" ? !o.device.is_cpu() : o.graphs == "auto" && o.device.is_cuda();
  const bool graphs = want_graphs && group == nullptr;
  const std::unique_ptr<optim::Optimizer> optimizer_owner = make_train_optimizer(o, model, graphs);
  optim::Optimizer& optimizer = *optimizer_owner;
  TrainingProgress progress;
  bool deterministic = o.deterministic || deterministic_algorithms();
  if (!o.resume_path.empty()) {
    const CheckpointContents contents = load_checkpoint(o.resume_path, model, &optimizer);
    progress = contents.progress;
    // Within an epoch, the batches already taken are counted in the checkpoint's batches of its data.
    if (progress.batch_in_epoch > 0) {
      const auto setting = [&](const char* key) {
        const auto it = contents.settings.find(key);
        return it == contents.settings.end() ? std::string() : detail::printable(it->second);
      };
      const std::string batch = setting("batch"), images = setting("train_images");
      FERRY_CHECK((batch.empty() || batch == std::to_string(o.batch_size)) &&
                      (images.empty() || images == std::to_string(train_set.size())),
                  InvalidArgument, "The checkpoint '", o.resume_path, "' stopped in epoch ", progress.epoch + 1,
                  " after ", progress.batch_in_epoch, " batches of ", batch.empty() ? "?" : batch, " over ",
                  images.empty() ? "?" : images, " training images; this run has batches of ", o.batch_size,
                  " over ", train_set.size(), ", so it cannot continue that epoch: resume with --batch ",
                  batch.empty() ? "?" : batch, " and the same data, or from a checkpoint written at an epoch end");
    }
    set_generator_state(contents.generator);
    out << "resumed from " << o.resume_path << " at epoch " << progress.epoch + 1 << ", batch "
        << progress.batch_in_epoch << " (step " << progress.global_step << ")\n";
    if (progress.epoch >= o.epochs) {
      out << "the run has done its " << o.epochs << " epochs: nothing to train (--epochs " << progress.epoch + 1
          << " or more trains on)\n";
    }
    // Continuing bit for bit needs the algorithms the checkpoint's run used.
    const auto written = contents.settings.find("deterministic");
    if (written != contents.settings.end() && written->second == "true" && !deterministic) {
      deterministic = true;
      out << "deterministic algorithms: on, as in the run that wrote the checkpoint\n";
    } else if (!deterministic && o.device.is_cuda()) {
      out << "note: on cuda, --resume continues bit for bit only when both runs use --deterministic (cuDNN "
             "chooses its algorithms by timing them, and some add with atomics)\n";
    }
  }
  const DeterministicAlgorithmsGuard deterministic_guard(deterministic);

  DataLoader train_loader(train_set, {.batch_size = o.batch_size, .shuffle = true, .seed = o.seed,
                                      .placement = o.placement, .device = o.device});
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (group) {
    FERRY_CHECK(test_set.size() >= group->world_size(), InvalidArgument, "The test set (", test_set.size(),
                " images) is smaller than the ", group->world_size(), " ranks that evaluate it");
    ddp = std::make_unique<dist::DistributedDataParallel>(
        model, *group, dist::DDPOptions{.bucket_bytes = o.bucket_bytes, .allreduce_dtype = o.allreduce_dtype});
  }
  DataLoader test_loader(group ? dist::DistributedSampler::shard(test_set, group->world_size(), group->rank())
                               : test_set,
                         {.batch_size = 1000, .shuffle = false, .placement = o.placement == Placement::Resident
                                                                                            ? Placement::Resident
                                                                                            : Placement::PerStep,
                                    .device = o.device});
  const std::int64_t steps_per_epoch = train_loader.batches_per_epoch();
  const std::int64_t total_steps = o.epochs * steps_per_epoch;
  out << "ferry train: " << (o.model_name == "fmnist" ? std::string("fmnist CNN") : o.model_name) << " ("
      << model.parameter_count() << " parameters, " << moved
      << " bytes moved to " << o.device.str() << "), " << train_set.size() << " training / " << test_set.size()
      << " test images, batch " << o.batch_size << ", " << steps_per_epoch << " steps per epoch, placement "
      << placement_name(o.placement);
  if (train_loader.resident_bytes() > 0) out << " (" << train_loader.resident_bytes() << " bytes resident)";
  out << "\n";
  if (o.accumulate > 1) {
    const std::int64_t smallest = local_batch / o.accumulate, largest = smallest + (local_batch % o.accumulate != 0);
    out << "gradient accumulation: each step's " << local_batch << " images" << (group ? " per rank" : "") << " in "
        << o.accumulate << " micro-batches of " << (smallest == largest ? std::to_string(smallest)
                                                                       : detail::concat(smallest, "-", largest))
        << ", their gradients summed before the update\n";
  }
  if (is_rank0) {  // which vendor libraries run the layers here (cuda: cuBLAS, cuDNN or why not)
    const std::string libraries = backend(o.device).properties(o.device.index).libraries;
    if (!libraries.empty()) out << o.device.str() << " runs on " << libraries << "\n";
    if (deterministic) out << "deterministic algorithms only (fixed summation order; --resume continues bit for bit)\n";
  }
  if (ddp) {
    out << "data-parallel: " << group->world_size() << " ranks (" << dist::comm_backend_name(group->backend())
        << " backend), global batch " << o.batch_size << " = " << group->world_size() << " x "
        << sampler->local_batch() << " per rank, gradients in " << ddp->plan().buckets.size() << " bucket"
        << (ddp->plan().buckets.size() == 1 ? "" : "s") << " of at most " << o.bucket_bytes << " bytes ("
        << ddp->stats().gradient_bytes << " bytes all-reduced per step"
        << (o.allreduce_dtype == DType::Float32 ? "" : detail::concat(", in ", dtype_name(o.allreduce_dtype))) << ")\n";
  }

  std::ofstream metrics;
  if (!o.metrics_path.empty() && is_rank0) {
    metrics.open(o.metrics_path, std::ios::app);
    FERRY_CHECK(metrics.good(), IoError, "Cannot open metrics file '", o.metrics_path, "' for writing");
  }
  // The epoch's running sums: made once and zeroed each epoch (a captured step adds into them), read at epoch ends.
  Tensor loss_sum = zeros({}, {.device = o.device});                       // summed on the device
  Tensor correct = zeros({}, {.device = o.device, .dtype = DType::Int64});  // right predictions
  std::int64_t seen = 0;                                                   // samples this rank trained on
  // The step the checkpoint file holds now: the one written last in this run, or the one this run resumed from when
  // it writes where it read; -1: none yet.
  std::int64_t saved_step =
      !o.checkpoint_path.empty() && o.resume_path == o.checkpoint_path ? progress.global_step : -1;
  auto save = [&](const TrainingProgress& at) {
    if (o.checkpoint_path.empty() || !is_rank0) return;
    CheckpointContents contents;
    contents.progress = at;
    contents.progress.epoch_sums.reset();
    contents.generator = generator_state();
    contents.settings = {{"model", o.model_name}, {"optimizer", o.optimizer}, {"lr", metadata_text(o.lr)},
                         {"momentum", metadata_text(o.momentum)},
                         {"weight_decay", metadata_text(o.weight_decay)}, {"batch", std::to_string(o.batch_size)},
                         {"accumulate", std::to_string(o.accumulate)},
                         {"clip_grad_norm", metadata_text(o.clip_grad_norm)}, {"epochs", std::to_string(o.epochs)},
                         {"seed", std::to_string(o.seed)},
                         {"schedule", o.schedule}, {"warmup_steps", std::to_string(o.warmup_steps)},
                         {"placement", std::string(placement_name(o.placement))},
                         {"deterministic", deterministic ? "true" : "false"},
                         {"train_images", std::to_string(train_set.size())},
                         {"test_images", std::to_string(test_set.size())}};
    // Stopped within an epoch (one process): that epoch's running sums, so that the resumed run reports the
    // epoch's loss and accuracy over all its batches, as the unbroken run does (the float's exact text).
    if (at.batch_in_epoch > 0 && group == nullptr) {
      contents.progress.epoch_sums =
          EpochSums{.loss_sum = loss_sum.item<float>(), .correct = correct.item<std::int64_t>(), .seen = seen};
    }
    save_checkpoint(o.checkpoint_path, model, &optimizer, contents);
    saved_step = at.global_step;
  };
  // For an error that stops the run: where its work was kept ("" when no checkpoint was written this run).
  auto last_good_checkpoint = [&]() -> std::string {
    if (saved_step < 0) return "";
    return detail::concat("; the last good checkpoint, at step ", saved_step, ", is '",
                          detail::printable(o.checkpoint_path), "'");
  };
  // A resumed epoch starts from the sums its checkpoint kept, so that its loss and accuracy cover all its batches,
  // as in the unbroken run. Checkpoints without them (data-parallel runs, older files) leave the sums at zero, and
  // the epoch's line then says that it covers only the batches of this run.
  bool partial_epoch_sums = false;
  auto restore_epoch_sums = [&](const std::optional<EpochSums>& sums) {
    if (!sums) {
      partial_epoch_sums = true;
      return;
    }
    loss_sum.fill_(sums->loss_sum);
    correct.fill_(static_cast<double>(sums->correct));
    seen = sums->seen;
  };

  TrainResult result;
  result.device = o.device;
  result.deterministic = deterministic;
  result.steps = progress.global_step;
  ProgressBar bar(o.progress_bar && is_rank0);
  double transfer_s = 0, compute_s = 0, sync_s = 0, train_seconds = 0, comm_s = 0;
  const int world = group ? group->world_size() : 1;
  auto check_replicas = [&] {
    if (!ddp) return;
    ddp->check_replicas();
    result.replica_checks += 1;
  };
  std::int64_t timed_epochs = 0;
  // A stop asked for (options.stop_request, set by a signal handler): one process stops before its next step; the
  // ranks of a data-parallel run first agree (a small all-reduce at log steps and epoch ends) so that all of them
  // stop after the same step and the checkpoint holds it.
  auto stop_asked = [&]() -> int { return o.stop_request ? o.stop_request->load(std::memory_order_relaxed) : 0; };
  auto agree_on_stop = [&]() -> int {  // the signal the asking ranks got (0: none asked)
    const int own = stop_asked();
    const std::vector<double> asked = sum_over_ranks(*group, {own != 0 ? 1.0 : 0.0, static_cast<double>(own)});
    if (asked[0] == 0) return 0;
    return own != 0 ? own : static_cast<int>(std::lround(asked[1] / asked[0]));
  };
  int stop_agreed = 0;  // data-parallel: every rank stops before its next step
  const std::string written_to = o.checkpoint_path.empty() ? "" : "; checkpoint written to " + o.checkpoint_path;
  // The step: forward, loss, backward (data-parallel: the gradients averaged) and the update. The running sums
  // (loss_sum, correct, above) are updated in place, so a captured graph keeps adding into the same tensors.
  double loss_weight = 1;  // data-parallel: this rank's slice of the global batch
  // With --accumulate K the batch goes through forward and backward in K micro-batches (rows [begin, begin + count)),
  // each loss weighted by count / n so that the gradients add up to the batch's; data-parallel, the first K - 1
  // backward passes keep their gradients local (no_sync) and the last one's all-reduce carries the sums.
  auto training_step = [&](const Tensor& images, const Tensor& labels) {
    const std::int64_t n = labels.numel();
    const std::int64_t pieces = std::min(o.accumulate, n);
    Tensor batch_loss;  // the mean over this rank's batch
    for (std::int64_t piece = 0, begin = 0; piece < pieces; ++piece) {
      const std::int64_t count = n / pieces + (piece < n % pieces ? 1 : 0);
      const Tensor x = pieces == 1 ? images : images.narrow(0, begin, count);
      const Tensor y = pieces == 1 ? labels : labels.narrow(0, begin, count);
      begin += count;
      const double share = static_cast<double>(count) / static_cast<double>(n);
      std::optional<dist::DistributedDataParallel::NoSync> local_only;
      if (ddp && piece + 1 < pieces) local_only.emplace(*ddp);
      Tensor logits = ddp ? ddp->forward(x) : model(x);
      Tensor loss = nn::cross_entropy(logits, y);
      const double weight = loss_weight * share;
      (weight == 1 ? loss : mul(loss, weight)).backward();
      autograd::NoGradGuard no_grad;
      loss_sum.add_(loss.detach(), static_cast<double>(count));
      correct.add_(sum(eq(argmax(logits.detach(), 1), y)));
      batch_loss = pieces == 1 ? loss.detach() : piece == 0 ? mul(loss.detach(), share)
                                                            : add(batch_loss, mul(loss.detach(), share));
    }
    if (ddp) {  // the buckets backward did not finish, and the averaged gradients into .grad
      const auto comm_start = Clock::now();
      ddp->finish_gradient_sync();
      comm_s += seconds_since(comm_start);
    }
    if (o.clip_grad_norm == 0) {
      optimizer.step();
      return batch_loss;
    }
    const Tensor grad_norm = nn::utils::clip_grad_norm_(model.parameters(), o.clip_grad_norm);
    optimizer.step();
    return stack({batch_loss.reshape({}), grad_norm.to(batch_loss.dtype())});  // (loss, norm): one read for both
  };
  StepGraph step_graph(model.parameters(), training_step, {.enabled = graphs});
  // Logging: the loss of a log step is copied to the host behind that step and read one step later (a stall
  // then waits for that copy alone while the next step keeps the device busy).
  struct LoggedStep {
    std::int64_t step = 0, epoch = 0, batch_index = 0;
    double lr = 0;
  } logged;
  PendingRead pending_loss;
  Clock::time_point epoch_start = Clock::now();
  // One JSON line, flushed (a reader tailing the file sees each line when it is logged) and checked: a full disk
  // stops the run with the last checkpoint kept, rather than losing the metrics without a word.
  auto write_metrics = [&](const nlohmann::json& line) {
    metrics << line.dump() << std::endl;
    FERRY_CHECK(!metrics.fail(), IoError, "Writing the metrics to '", detail::printable(o.metrics_path),
                "' failed (disk full?); stopping", last_good_checkpoint());
  };
  auto report_loss = [&](const std::vector<double>& read) {  // the loss, and with clipping the gradients' norm
    const double last_loss = read.front();
    const double grad_norm = read.size() > 1 ? read[1] : NAN;
    FERRY_CHECK(std::isfinite(last_loss), Error, "The loss became ", last_loss, " at step ", logged.step, " (epoch ",
                logged.epoch + 1, "); stopping", last_good_checkpoint());
    result.loss_curve.emplace_back(logged.step, last_loss);
    if (read.size() > 1) result.grad_norms.push_back(grad_norm);
    const double elapsed = seconds_since(epoch_start);
    const double rate = static_cast<double>(seen * world) / std::max(elapsed, 1e-9);
    const double eta = static_cast<double>((total_steps - logged.step) * o.batch_size) / std::max(rate, 1e-9);
    bar.update(logged.epoch, o.epochs, logged.batch_index + 1, steps_per_epoch, rate, eta, last_loss);
    if (!bar.enabled()) {
      out << "  epoch " << logged.epoch + 1 << " step " << logged.batch_index + 1 << "/" << steps_per_epoch
          << "  loss " << std::fixed << std::setprecision(4) << last_loss;
      if (read.size() > 1) out << "  grad norm " << std::setprecision(3) << grad_norm;
      out << "  " << std::setprecision(0) << rate << " img/s\n" << std::defaultfloat;
    }
    if (metrics.is_open()) {
      nlohmann::json line{{"kind", "step"}, {"epoch", logged.epoch + 1}, {"step", logged.step}, {"loss", last_loss},
                          {"lr", logged.lr}, {"images_per_s", rate}};
      if (read.size() > 1) line["grad_norm"] = grad_norm;
      write_metrics(line);
    }
  };
  auto read_logged_loss = [&] {
    Phase read(PhaseKind::Sync, o.device, "logged loss");
    const std::vector<double> value = pending_loss.wait().to_vector<double>();
    read.end();
    sync_s += read.elapsed_ms() / 1e3;
    report_loss(value);
  };
  model.train();
  for (std::int64_t epoch = progress.epoch; epoch < o.epochs; ++epoch) {
    epoch_start = Clock::now();
    train_loader.start_epoch(epoch, epoch == progress.epoch ? progress.batch_in_epoch : 0);
    loss_sum.zero_();
    correct.zero_();
    seen = 0;
    if (epoch == progress.epoch && progress.batch_in_epoch > 0) restore_epoch_sums(progress.epoch_sums);
    std::int64_t batches = 0;
    // Batches of this epoch done so far, those before a resume included: where a checkpoint written now resumes.
    auto batch_in_epoch = [&] { return batches + (epoch == progress.epoch ? progress.batch_in_epoch : 0); };
    bool stopped = false;
    while (true) {
      if (o.max_steps >= 0 && result.steps >= o.max_steps) {
        stopped = true;
        break;
      }
      if (const int asked = ddp ? stop_agreed : stop_asked(); asked != 0) {
        result.stopped_by = asked;
        stopped = true;
        break;
      }
      // The step and its phases go to the ledger's phase log too: --trace draws them beside the copies and syncs.
      const Step step_scope(result.steps);
      Batch batch;
      Phase fetch(PhaseKind::Transfer, o.device, "batch");
      // Once the step is a graph, a resident batch is gathered straight into the graph's inputs (no copy).
      const auto [graph_images, graph_labels] = step_graph.inputs();
      const bool more = graph_images.defined() ? train_loader.next_into(batch, graph_images, graph_labels)
                                               : train_loader.next(batch);
      fetch.end();
      transfer_s += fetch.elapsed_ms() / 1e3;
      if (!more) break;
      loss_weight = 1;
      if (sampler && !sampler->take(Batch(batch), batch, &loss_weight)) continue;  // a short last batch: all skip it
      Phase compute(PhaseKind::Compute, o.device, "forward, backward, update");
      optimizer.set_learning_rate(scheduled_learning_rate(o, result.steps, total_steps));
      Tensor loss = step_graph.run(batch.images, batch.labels);
      compute.end();
      compute_s += compute.elapsed_ms() / 1e3;
      seen += batch.labels.numel();
      ++batches;
      ++result.steps;
      if (ddp && o.check_replicas_every > 0 && result.steps % o.check_replicas_every == 0) check_replicas();
      if (pending_loss.pending()) read_logged_loss();  // the last log step's loss, now that this step is queued
      if (result.steps % o.log_every == 0) {  // the only per-step host read, once per log_every steps
        logged = {result.steps, epoch, batch.index, optimizer.learning_rate()};
        if (ddp) {  // the mean over every rank's slice (the all-reduce is a blocking collective anyway)
          Phase read(PhaseKind::Sync, o.device, "logged loss");
          Tensor mean_loss = loss.reshape({-1}).clone();  // the norm, the same on every rank, averages to itself
          group->all_reduce(mean_loss, dist::ReduceOp::Avg, "logged loss");
          const std::vector<double> value = mean_loss.to_vector<double>();
          if (o.stop_request) stop_agreed = agree_on_stop();
          read.end();
          sync_s += read.elapsed_ms() / 1e3;
          report_loss(value);
        } else {  // queued behind this step; read when the next one is queued, so the device never waits
          pending_loss = PendingRead(loss, "logged loss");
        }
      }
      if (o.checkpoint_every > 0 && result.steps % o.checkpoint_every == 0) {  // what a kill -9 cannot take away
        Phase keep(PhaseKind::Sync, o.device, "checkpoint");
        save({epoch, batch_in_epoch(), result.steps});
        keep.end();
        sync_s += keep.elapsed_ms() / 1e3;
      }
    }
    if (pending_loss.pending()) read_logged_loss();
    bar.clear();
    if (stopped) {
      // The steps since the last log step were never read back: one read of their sum, so that a loss that went
      // non-finite there stops the run before its checkpoint holds the damage (one sync, once per run).
      const double partial_loss =
          seen == 0 ? 0.0 : group ? sum_over_ranks(*group, {loss_sum.item<double>()})[0] : loss_sum.item<double>();
      FERRY_CHECK(std::isfinite(partial_loss), Error, "The training loss became ", partial_loss, " in epoch ",
                  epoch + 1, ", by step ", result.steps, "; stopping", last_good_checkpoint());
      check_replicas();
      save({epoch, batch_in_epoch(), result.steps});
      if (result.stopped_by == 0) {
        out << "stopped after " << result.steps << (result.steps == 1 ? " step" : " steps") << " (--max-steps)\n";
      } else {
        out << "stopped on request (signal " << result.stopped_by << ") after " << result.steps
            << (result.steps == 1 ? " step" : " steps") << ", in epoch "
            << epoch + 1 << " at batch " << batch_in_epoch() << " of " << steps_per_epoch << written_to << "\n";
      }
      break;
    }
    // Epoch end: one sync for the sums, then the test pass.
    Phase sums(PhaseKind::Sync, o.device, "epoch sums");
    EpochStats stats;
    stats.epoch = epoch + 1;
    if (group) {  // every rank's sums
      const std::vector<double> totals = sum_over_ranks(
          *group, {loss_sum.item<double>(), static_cast<double>(correct.item<std::int64_t>()), static_cast<double>(seen)});
      stats.train_loss = totals[2] > 0 ? totals[0] / totals[2] : NAN;
      stats.train_accuracy = totals[2] > 0 ? totals[1] / totals[2] : NAN;
    } else {
      stats.train_loss = seen ? loss_sum.item<double>() / static_cast<double>(seen) : NAN;
      stats.train_accuracy = seen ? static_cast<double>(correct.item<std::int64_t>()) / static_cast<double>(seen) : NAN;
    }
    sums.end();
    sync_s += sums.elapsed_ms() / 1e3;
    stats.seconds = seconds_since(epoch_start);
    const bool full_epoch = epoch != progress.epoch || progress.batch_in_epoch == 0;
    if (full_epoch) {
      train_seconds += stats.seconds;
      ++timed_epochs;
    }
    // A run stopped after an epoch's last step (--max-steps, a signal) and resumed from there has no step left in
    // that epoch: its training sums are in the first run's log; the test pass and the checkpoint follow as usual.
    const bool resumed_at_epoch_end = seen == 0 && epoch == progress.epoch && progress.batch_in_epoch > 0;
    FERRY_CHECK(resumed_at_epoch_end || std::isfinite(stats.train_loss), Error, "The mean training loss of epoch ",
                epoch + 1, " is ", stats.train_loss, "; stopping", last_good_checkpoint());
    if (ddp) {  // each rank tests its shard with rank 0's BatchNorm statistics; the counts are summed
      ddp->broadcast_buffers();
      const double shard_correct = std::round(evaluate_accuracy(model, test_loader) * static_cast<double>(test_loader.size()));
      stats.test_accuracy = sum_over_ranks(*group, {shard_correct})[0] / static_cast<double>(test_set.size());
      check_replicas();
    } else {
      stats.test_accuracy = evaluate_accuracy(model, test_loader);
    }
    result.history.push_back(stats);
    result.epochs = epoch + 1;
    result.test_accuracy = stats.test_accuracy;
    if (resumed_at_epoch_end) {
      out << "epoch " << stats.epoch << "/" << o.epochs << "  (every step of it ran before the resume)  test acc "
          << std::fixed << std::setprecision(2) << 100 * stats.test_accuracy << " %\n" << std::defaultfloat;
    } else {
      const bool partial = partial_epoch_sums && epoch == progress.epoch;
      out << "epoch " << stats.epoch << "/" << o.epochs
          << (partial ? detail::concat(" (train loss and accuracy over its batches ", progress.batch_in_epoch + 1,
                                       "-", batch_in_epoch(), ", this run's)")
                      : std::string())
          << "  train loss " << std::fixed << std::setprecision(4) << stats.train_loss << "  train acc " << std::setprecision(2) << 100 * stats.train_accuracy
          << " %  test acc " << 100 * stats.test_accuracy << " %  " << std::setprecision(1) << stats.seconds << " s\n"
          << std::defaultfloat;
    }
    if (metrics.is_open()) {
      write_metrics({{"kind", "epoch"}, {"epoch", stats.epoch}, {"train_loss", stats.train_loss},
                     {"train_accuracy", stats.train_accuracy}, {"test_accuracy", stats.test_accuracy},
                     {"seconds", stats.seconds}});
    }
    save({epoch + 1, 0, result.steps});
    if (const int asked = ddp && o.stop_request ? agree_on_stop() : stop_asked(); asked != 0 && epoch + 1 < o.epochs) {
      result.stopped_by = asked;
      out << "stopped on request (signal " << asked << ") at the end of epoch " << epoch + 1 << written_to << "\n";
      break;
    }
  }

  const auto totals = ledger.totals();
  result.seconds_per_epoch = timed_epochs ? train_seconds / static_cast<double>(timed_epochs) : NAN;
  result.steps_run = result.steps - progress.global_step;
  result.t_transfer_s = transfer_s;
  result.t_compute_s = compute_s;
  result.t_sync_s = sync_s;
  result.syncs = totals.syncs - ledger_start.syncs;
  result.bytes_host_to_device = totals.bytes_host_to_device - ledger_start.bytes_host_to_device;
  result.bytes_device_to_host = totals.bytes_device_to_host - ledger_start.bytes_device_to_host;
  result.parameters = model.parameter_count();
  result.graph_replays = step_graph.replays();
  result.graph_operations = step_graph.operations();
  if (graphs) result.graph = step_graph.describe();
  if (ddp) {
    result.world_size = world;
    result.comm_backend = std::string(dist::comm_backend_name(group->backend()));
    result.gradient_bytes_per_step = ddp->stats().gradient_bytes;
    result.allreduce_dtype = ddp->allreduce_dtype();
    result.collectives = totals.collectives - ledger_start.collectives;
    result.collective_bytes = totals.collective_bytes - ledger_start.collective_bytes;
    result.collective_s = (totals.collective_ms - ledger_start.collective_ms) / 1e3;
    result.t_comm_s = comm_s;
    result.t_compute_s = compute_s - comm_s;  // the wait for gradients is communication, not compute
  }
  return result;
}

}  // namespace ferry
