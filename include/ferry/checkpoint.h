// ferry/checkpoint.h — training checkpoints as safetensors files: the model's state_dict under
// PyTorch's names (so PyTorch loads the weights), the optimizer state under "optimizer.", and the
// generator, progress and run settings in __metadata__. Written atomically. Not here: the format.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "ferry/nn/module.h"
#include "ferry/optim.h"
#include "ferry/random.h"

namespace ferry {

struct TrainingProgress {
  std::int64_t epoch = 0;          // the epoch in progress (0-based)
  std::int64_t batch_in_epoch = 0; // batches of that epoch already done
  std::int64_t global_step = 0;    // optimizer steps taken in all
};

struct CheckpointContents {
  TrainingProgress progress;
  GeneratorState generator;
  std::map<std::string, std::string> settings;  // the run's settings ("lr", "batch", ...)
};

// Saves the model (parameters and buffers), the optimizer's state, the generator and progress.
// Tensors are copied to the host through the transfer door (label "checkpoint").
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const CheckpointContents& contents);

// Loads into `model` (strict: every tensor must be there with its shape) and, when given, into
// `optimizer`; returns progress, generator state and settings. Does not set the global generator:
// the caller decides. Throws FormatError (malformed file), IoError, or nn::StateDictError.
CheckpointContents load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer);

// A checkpoint's progress, generator state and settings, its tensors loaded nowhere: which model and options
// wrote it, before a model is built for it (`ferry train --resume`, `ferry eval`). Throws as load_checkpoint.
CheckpointContents read_checkpoint_contents(const std::string& path);

// The tensors of a safetensors file as host tensors, by name (for `ferry inspect`, tools, tests).
nn::NamedTensors read_tensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace ferry
