// ferry/trainer.h — the training loop of `ferry train`: the fmnist CNN on Fashion-MNIST on any
// device, data placed as asked, the loss read back only at log steps, checkpoints, and the time
// split into transfer / compute / sync. Not here: the CLI (tools/ferry), the model's layers (nn).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "ferry/dataloader.h"
#include "ferry/dataset.h"
#include "ferry/nn/sequential.h"

namespace ferry::dist { class ProcessGroup; }
namespace ferry::optim { class Optimizer; }

namespace ferry {

struct TrainOptions {
  Device device = kCPU;
  std::int64_t epochs = 5;
  std::int64_t batch_size = 128;
  // Gradient accumulation: each step's batch (a data-parallel rank's slice of it) runs forward and backward in
  // this many micro-batches, as equal as can be, whose gradients add up before the one update. The loss of each
  // is weighted by its share of the batch, so the update is the whole batch's (to rounding; BatchNorm normalizes
  // each micro-batch by its own statistics, as in PyTorch), with the activation memory of one micro-batch.
  // Data-parallel: the first accumulate - 1 backward passes run under no_sync(), so a step is still one all-reduce.
  std::int64_t accumulate = 1;
  // Before each update, scale the gradients so that their joint 2-norm is at most this (nn::utils::clip_grad_norm_,
  // on the device: no read); the norm before clipping is logged beside the loss, in the same read. 0: no clipping.
  double clip_grad_norm = 0;
  // "sgd" (momentum, L2 weight decay on every parameter) or "adamw" (decoupled weight decay on the weight matrices
  // and convolution kernels only, none on biases and BatchNorm: two parameter groups; momentum unused). When the step
  // is captured as a graph, AdamW is capturable (its step counts and learning rate on the device).
  std::string optimizer = "sgd";
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  std::string schedule = "cosine";  // "cosine" (to 0 over the run) or "constant"
  std::int64_t warmup_steps = 0;     // the first steps ramp the rate up linearly: lr * (step + 1) / warmup_steps
  std::uint64_t seed = 0;
  std::int64_t log_every = 100;  // steps between loss read-backs (each is one host sync)
  Placement placement = Placement::Resident;
  std::int64_t max_steps = -1;   // stop after this many optimizer steps in all (-1: run every epoch)
  std::string checkpoint_path;   // written at each epoch end and at the stop
  std::int64_t checkpoint_every = 0;  // also every N steps (each a host sync and a copy of the state); 0: never
  std::string resume_path;
  std::string metrics_path;      // JSON lines
  bool progress_bar = true;      // on a terminal; plain lines otherwise
  // Capture the step (forward, loss, backward) as a graph and replay it (ferry/step_graph.h): "auto" on cuda,
  // "on" on cuda or sim, "off" never. Data-parallel steps are never captured.
  std::string graphs = "auto";
  std::string model_name = "fmnist";  // what the log and the checkpoint's settings call the model
  // Data-parallel (ferry train --ddp): with a group, batch_size is the global batch B and each rank trains
  // on its B/N slice (N must divide B); gradients are averaged across ranks before each step; rank 0 alone
  // writes checkpoints and metrics (pass the other ranks a silent `out`). nullptr: one process.
  dist::ProcessGroup* process_group = nullptr;
  std::int64_t bucket_bytes = 25 * 1024 * 1024;  // bytes per gradient bucket (PyTorch's 25 MiB)
  // The dtype gradients cross the wire in: Float32 as computed, BFloat16 / Float16 compressed (half the bytes;
  // DDPOptions::allreduce_dtype says what that rounds).
  DType allreduce_dtype = DType::Float32;
  std::int64_t check_replicas_every = 0;         // steps between replica checks; 0: each epoch end and the stop
  // Only algorithms that sum in a fixed order, for the run (ferry/determinism.h): what a cuda run needs to give the
  // same bits twice and to --resume bit for bit. Also on when the process-wide switch is, or when the checkpoint
  // resumed from was written by a deterministic run.
  bool deterministic = false;
  // Set to a nonzero value (a signal number: `ferry train` sets it from its SIGINT / SIGTERM handler) to stop after
  // the step in progress, as --max-steps would: the checkpoint is written where the run stopped and --resume
  // continues it bit for bit. Data-parallel ranks agree at the next log step or epoch end, so all stop at the same
  // step even when only one was signalled. nullptr: never asked.
  const std::atomic<int>* stop_request = nullptr;
};

struct EpochStats {
  std::int64_t epoch = 0;
  double train_loss = 0;      // mean over the epoch's samples
  double train_accuracy = 0;  // 0..1
  double test_accuracy = 0;   // 0..1
  double seconds = 0;         // training time of the epoch (without the test pass)
};

struct TrainResult {
  Device device;
  std::int64_t epochs = 0;         // epochs completed
  std::int64_t steps = 0;          // optimizer steps taken in all (those before a resume included)
  std::int64_t steps_run = 0;      // of them, the steps this call took
  double test_accuracy = NAN;      // after the last epoch; NaN when no epoch ended in this call
  double seconds_per_epoch = NAN;  // mean training time of the whole epochs this call ran; NaN when none
  double t_transfer_s = 0, t_compute_s = 0, t_sync_s = 0;  // host time in each phase
  std::int64_t syncs = 0;
  std::int64_t bytes_host_to_device = 0, bytes_device_to_host = 0;
  std::vector<EpochStats> history;
  std::vector<std::pair<std::int64_t, double>> loss_curve;  // (step, loss) at log steps
  std::vector<double> grad_norms;  // with clip_grad_norm: the gradients' 2-norm before clipping, at the same steps
  // The captured step (graphs on): replays, operations in the graph, and one line saying so or why not.
  std::int64_t graph_replays = 0, graph_operations = 0;
  std::string graph;
  bool deterministic = false;  // the run used deterministic algorithms only
  int stopped_by = 0;          // the stop_request value that ended the run early (0: it ran to its end)
  // Data-parallel runs only (world_size 1 otherwise).
  int world_size = 1;
  std::string comm_backend;                   // "mpi", "nccl"
  std::int64_t parameters = 0;                // P, elements
  std::int64_t gradient_bytes_per_step = 0;   // bytes all-reduced per step on each rank (every bucket)
  DType allreduce_dtype = DType::Float32;     // what those bytes hold
  std::int64_t collectives = 0;               // collectives this rank took part in
  std::int64_t collective_bytes = 0;          // their payload in all, bytes
  double collective_s = 0;                    // launch to completion, summed (overlaps compute)
  double t_comm_s = 0;                        // host blocked waiting for gradients after backward
  std::int64_t replica_checks = 0;            // check_replicas() calls, all passed
};

// The `fmnist` workload of DESIGN.md: 3 x [Conv3x3 pad 1, BatchNorm2d, ReLU, MaxPool 2] with 32, 64,
// 128 channels, Flatten, Linear 1152 -> 10. Parameters drawn from the generator on options.device.
std::shared_ptr<nn::Sequential> make_fmnist_model(const TensorOptions& options = {});
// DESIGN.md's cnn family: 3 x [Conv3x3 pad 1, BatchNorm2d, ReLU, MaxPool 2] with 32, 64, 128 channels, Flatten,
// Linear -> 10, for (in_channels, side, side) images: fmnist is (1, 28), the cnn workload (3, 32).
std::shared_ptr<nn::Sequential> make_cnn_model(std::int64_t in_channels, std::int64_t side, const TensorOptions& options = {});

// The `mlp` workload of DESIGN.md on 28 x 28 images: Flatten, Linear 784 -> 1024, ReLU, Linear 1024 -> 1024,
// ReLU, Linear 1024 -> 10. No BatchNorm, no dropout: data-parallel runs match one process to rounding.
std::shared_ptr<nn::Sequential> make_mlp_model(const TensorOptions& options = {});

// The model `ferry train --model NAME` trains on Fashion-MNIST's 28 x 28 images: "fmnist" or "mlp". Any other
// name is an InvalidArgument that lists these.
std::shared_ptr<nn::Sequential> make_model(const std::string& name, const TensorOptions& options = {});

// Fraction of `loader`'s samples that `model` classifies right (eval mode, no grad, one sync).
double evaluate_accuracy(nn::Module& model, DataLoader& loader);
// How `model` classifies `loader`'s samples: a (classes, classes) int64 cpu tensor, row = true label, column =
// the predicted class (argmax), so its trace over its sum is the accuracy. Counted on the device (scatter_add) and
// read back once (one sync, "confusion matrix" in the ledger); eval mode, no grad. A label or prediction outside
// [0, classes) is an error (on a GPU at that read).
Tensor confusion_matrix(nn::Module& model, DataLoader& loader, std::int64_t classes);

// The learning rate of optimizer step `step` (0-based) of `total_steps`: a linear warmup over the first
// options.warmup_steps (lr (step + 1) / warmup), then options.lr, or with the cosine schedule
// lr (1 + cos(pi (step - warmup) / (total - warmup))) / 2, falling to 0 at the end.
double scheduled_learning_rate(const TrainOptions& options, std::int64_t step, std::int64_t total_steps);

// The options' values, checked before any work (train() does it first; ferry train before it reads the data):
// InvalidArgument naming the flag of ferry train that sets the value.
void check_train_options(const TrainOptions& options);

// Trains `model` on `train_set`, testing on `test_set` after each epoch. Progress and per-epoch lines
// go to `out`. Throws on non-finite loss (naming the step; the last checkpoint is kept).
// The optimizer train() makes from options.optimizer: SGD over every parameter (lr_on_device when the step is
// captured as a graph), or AdamW with the weight decay on the weight matrices and kernels only (dim >= 2, group 0)
// and none on biases and BatchNorm's scale and shift (group 1), as timm and nanoGPT (capturable when the step is
// captured).
std::unique_ptr<optim::Optimizer> make_train_optimizer(const TrainOptions& options, const nn::Module& model,
                                                       bool graphs);

TrainResult train(nn::Module& model, const Dataset& train_set, const Dataset& test_set, const TrainOptions& options,
                  std::ostream& out);

}  // namespace ferry
