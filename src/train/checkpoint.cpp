// checkpoint.cpp — tensors <-> safetensors entries, and the metadata that makes a resume exact.
#include "ferry/checkpoint.h"

#include <charconv>
#include <cstring>

#include "../core/internal.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/safetensors.h"

namespace ferry {

namespace {
constexpr const char* kOptimizerPrefix = "optimizer.";

SafetensorsEntry to_entry(const std::string& name, const Tensor& tensor) {
  Tensor host = tensor.detach().contiguous();
  if (!host.device().is_cpu()) host = detail::transfer(host, kCPU, false, "checkpoint");
  SafetensorsEntry entry;
  entry.name = name;
  entry.dtype = host.dtype();
  entry.shape = host.shape();
  entry.bytes.resize(host.nbytes());
  if (host.nbytes() > 0) std::memcpy(entry.bytes.data(), host.data_ptr(), host.nbytes());
  return entry;
}

Tensor from_entry(const SafetensorsEntry& entry) {
  Tensor t = empty(entry.shape, {.dtype = entry.dtype});
  if (!entry.bytes.empty()) std::memcpy(t.data_ptr(), entry.bytes.data(), entry.bytes.size());
  return t;
}

std::int64_t metadata_int(const std::map<std::string, std::string>& metadata, const std::string& key,
                          const std::string& path) {
  auto it = metadata.find(key);
  FERRY_CHECK(it != metadata.end(), FormatError, "Checkpoint '", path, "' lacks the metadata key '", key,
              "' (was it written by `ferry train --checkpoint`?)");
  try {
    std::size_t used = 0;
    const long long value = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return value;
  } catch (const std::exception&) {
    throw FormatError(detail::concat("Checkpoint '", detail::printable(path), "': metadata '", key,
                                     "' is not an integer: '", detail::printable(it->second), "'"));
  }
}

// A double written as its shortest exact text (std::to_chars), read back to the same bits.
double metadata_double(const std::string& text, const std::string& key, const std::string& path) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  FERRY_CHECK(error == std::errc() && end == text.data() + text.size(), FormatError, "Checkpoint '",
              detail::printable(path), "': metadata '", key, "' is not a number: '", detail::printable(text), "'");
  return value;
}

CheckpointContents contents_from_metadata(const std::map<std::string, std::string>& metadata, const std::string& path) {
  CheckpointContents contents;
  contents.progress.epoch = metadata_int(metadata, "epoch", path);
  contents.progress.batch_in_epoch = metadata_int(metadata, "batch_in_epoch", path);
  contents.progress.global_step = metadata_int(metadata, "global_step", path);
  contents.generator.seed = static_cast<std::uint64_t>(metadata_int(metadata, "generator_seed", path));
  contents.generator.offset = static_cast<std::uint64_t>(metadata_int(metadata, "generator_offset", path));
  if (const auto loss = metadata.find("epoch_loss_sum"); loss != metadata.end()) {
    contents.progress.epoch_sums = EpochSums{.loss_sum = metadata_double(loss->second, "epoch_loss_sum", path),
                                             .correct = metadata_int(metadata, "epoch_correct", path),
                                             .seen = metadata_int(metadata, "epoch_seen", path)};
  }
  contents.settings = metadata;
  return contents;
}
}  // namespace

std::string metadata_text(double value) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof text, value);
  FERRY_ASSERT(error == std::errc(), "a double's shortest text fits in 32 characters");
  return std::string(text, end);
}

void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const CheckpointContents& contents) {
  SafetensorsFile file;
  for (const auto& [name, tensor] : model.state_dict()) file.entries.push_back(to_entry(name, tensor));
  if (optimizer) {
    for (const auto& [name, tensor] : optimizer->state_dict())
      file.entries.push_back(to_entry(kOptimizerPrefix + name, tensor));
  }
  file.metadata = contents.settings;
  file.metadata["format"] = "ferry-checkpoint-1";
  file.metadata["epoch"] = std::to_string(contents.progress.epoch);
  file.metadata["batch_in_epoch"] = std::to_string(contents.progress.batch_in_epoch);
  file.metadata["global_step"] = std::to_string(contents.progress.global_step);
  file.metadata["generator_seed"] = std::to_string(contents.generator.seed);
  file.metadata["generator_offset"] = std::to_string(contents.generator.offset);
  for (const char* key : {"epoch_loss_sum", "epoch_correct", "epoch_seen"}) file.metadata.erase(key);
  if (const std::optional<EpochSums>& sums = contents.progress.epoch_sums) {
    file.metadata["epoch_loss_sum"] = metadata_text(sums->loss_sum);
    file.metadata["epoch_correct"] = std::to_string(sums->correct);
    file.metadata["epoch_seen"] = std::to_string(sums->seen);
  }
  write_safetensors(path, file);
}

void write_tensors(const std::string& path, const nn::NamedTensors& tensors,
                   const std::map<std::string, std::string>& metadata) {
  SafetensorsFile file;
  file.metadata = metadata;
  for (const auto& [name, tensor] : tensors) file.entries.push_back(to_entry(name, tensor));
  write_safetensors(path, file);
}

nn::NamedTensors read_tensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const SafetensorsFile file = read_safetensors(path);
  nn::NamedTensors tensors;
  for (const SafetensorsEntry& entry : file.entries) tensors.emplace_back(entry.name, from_entry(entry));
  if (metadata) *metadata = file.metadata;
  return tensors;
}

CheckpointContents load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer) {
  std::map<std::string, std::string> metadata;
  const nn::NamedTensors tensors = read_tensors(path, &metadata);
  return load_checkpoint(tensors, metadata, path, model, optimizer);
}

CheckpointContents load_checkpoint(const nn::NamedTensors& tensors, const std::map<std::string, std::string>& metadata,
                                   const std::string& path, nn::Module& model, optim::Optimizer* optimizer) {
  nn::NamedTensors model_state, optimizer_state;
  for (const auto& [name, tensor] : tensors) {
    if (name.rfind(kOptimizerPrefix, 0) == 0) optimizer_state.emplace_back(name.substr(std::strlen(kOptimizerPrefix)), tensor);
    else model_state.emplace_back(name, tensor);
  }
  try {
    model.load_state_dict(model_state, true);
  } catch (const nn::StateDictError& e) {  // PyTorch's several lines, as one that names the file and the model
    const auto names = [](const std::vector<std::string>& all) {
      std::string text;
      for (std::size_t i = 0; i < all.size() && i < 3; ++i) text += (i ? ", " : " (") + all[i];
      if (all.size() > 3) text += detail::concat(", and ", all.size() - 3, " more");
      return all.empty() ? text : text + ")";
    };
    const auto model_name = metadata.find("model");
    throw nn::StateDictError(
        detail::concat("Checkpoint '", detail::printable(path), "' does not fit the model being loaded",
                       model_name == metadata.end() ? std::string()
                                                    : " (the file says '" + detail::printable(model_name->second) + "')",
                       ": ", e.missing_keys().size(), " tensor(s) missing", names(e.missing_keys()), ", ",
                       e.unexpected_keys().size(), " not in the model", names(e.unexpected_keys()), ", ",
                       e.mismatched_keys().size(), " of another shape", names(e.mismatched_keys())),
        e.missing_keys(), e.unexpected_keys(), e.mismatched_keys());
  }
  if (optimizer) optimizer->load_state_dict(optimizer_state);
  return contents_from_metadata(metadata, path);
}

CheckpointContents read_checkpoint_contents(const std::string& path) {
  return contents_from_metadata(read_safetensors(path).metadata, path);
}

}  // namespace ferry
