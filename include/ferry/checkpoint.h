// ferry/checkpoint.h — training checkpoints as safetensors files: the model's state_dict under
// PyTorch's names (so PyTorch loads the weights), the optimizer state under "optimizer.", and the
// generator, progress and run settings in __metadata__. Written atomically. Not here: the format.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "ferry/nn/module.h"
#include "ferry/optim.h"
#include "ferry/random.h"

namespace ferry {

// The running sums of an epoch stopped part-way, so that the resumed run reports the epoch's loss and accuracy
// over all its batches, as the unbroken run does.
struct EpochSums {
  double loss_sum = 0;       // the batches' mean losses, summed (a float32 sum, kept exactly)
  std::int64_t correct = 0;  // right predictions
  std::int64_t seen = 0;     // samples trained on
};

struct TrainingProgress {
  std::int64_t epoch = 0;          // the epoch in progress (0-based)
  std::int64_t batch_in_epoch = 0; // batches of that epoch already done
  std::int64_t global_step = 0;    // optimizer steps taken in all
  // That epoch's sums so far; unset at an epoch end, in data-parallel runs (each rank has its own) and in files
  // written before ferry kept them.
  std::optional<EpochSums> epoch_sums{};
};

struct CheckpointContents {
  TrainingProgress progress{};
  GeneratorState generator{};
  std::map<std::string, std::string> settings{};  // the run's settings ("lr", "batch", ...)
};

// A double as the shortest text that reads back as the same double ("0.05", not std::to_string's "0.050000"),
// for settings kept in a checkpoint's metadata.
std::string metadata_text(double value);

// Saves the model (parameters and buffers), the optimizer's state, the generator and progress.
// Tensors are copied to the host through the transfer door (label "checkpoint").
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const CheckpointContents& contents);

// Loads into `model` (strict: every tensor must be there with its shape) and, when given, into
// `optimizer`; returns progress, generator state and settings. Does not set the global generator:
// the caller decides. Throws FormatError (malformed file), IoError, or nn::StateDictError.
CheckpointContents load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer);
// The same for a file already read by read_tensors (`ferry eval` reads it once to learn what it holds);
// `path` names it in errors.
CheckpointContents load_checkpoint(const nn::NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                                   const std::string& path, nn::Module& model, optim::Optimizer* optimizer);

// A checkpoint's progress, generator state and settings, its tensors loaded nowhere: which model and options
// wrote it, before a model is built for it (`ferry train --resume`, `ferry eval`). Throws as load_checkpoint.
CheckpointContents read_checkpoint_contents(const std::string& path);

// The tensors of a safetensors file as host tensors, by name (for `ferry inspect`, tools, tests).
nn::NamedTensors read_tensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);
// Writes tensors (any device, any dtype; e.g. a model's state_dict() after to(DType::BFloat16)) to a safetensors
// file that PyTorch's safetensors.torch.load_file reads, atomically as write_safetensors does. Names must be
// unique and not "__metadata__" (InvalidArgument).
void write_tensors(const std::string& path, const nn::NamedTensors& tensors,
                   const std::map<std::string, std::string>& metadata = {});

}  // namespace ferry
