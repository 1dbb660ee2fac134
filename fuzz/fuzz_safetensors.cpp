// fuzz/fuzz_safetensors.cpp — libFuzzer target: parse_safetensors over any bytes; only a one-line FormatError may escape, what
// parses round-trips through serialize_safetensors and becomes host tensors (as `ferry inspect` does). Not here: files on disk.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ferry/factories.h"
#include "ferry/safetensors.h"
#include "ferry/tensor.h"
#include "fuzz_common.h"

namespace {

void check_same(const ferry::SafetensorsFile& a, const ferry::SafetensorsFile& b) {
  using ferry::fuzz::check;
  check(a.metadata == b.metadata, "metadata changed in a write/read round trip");
  check(a.entries.size() == b.entries.size(), "entry count changed in a write/read round trip");
  for (std::size_t i = 0; i < a.entries.size(); ++i) {
    check(a.entries[i].name == b.entries[i].name, "an entry name changed in a round trip", a.entries[i].name);
    check(a.entries[i].dtype == b.entries[i].dtype, "a dtype changed in a round trip", a.entries[i].name);
    check(a.entries[i].shape == b.entries[i].shape, "a shape changed in a round trip", a.entries[i].name);
    check(a.entries[i].bytes == b.entries[i].bytes, "tensor bytes changed in a round trip", a.entries[i].name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  ferry::SafetensorsFile file;
  try {
    file = ferry::parse_safetensors(bytes, size, "fuzz.safetensors");
  } catch (const ferry::FormatError& error) {
    ferry::fuzz::check_error_message(error);
    return 0;
  } catch (const ferry::Error& error) {
    ferry::fuzz::finding("parse_safetensors threw a ferry::Error that is not a FormatError", error.what());
  }
  // Accepted: every entry's bytes agree with its shape, and the file survives a write/read round trip.
  // Nothing below may throw: an exception here escapes the target and is a finding.
  std::size_t total = 0;
  for (const ferry::SafetensorsEntry& entry : file.entries) {
    const auto count = static_cast<std::size_t>(entry.numel());
    ferry::fuzz::check(entry.bytes.size() == count * ferry::element_size(entry.dtype),
                       "an accepted entry whose bytes disagree with its shape", entry.name);
    total += entry.bytes.size();
  }
  ferry::fuzz::check(total <= size, "accepted entries hold more bytes than the file");
  const std::vector<std::byte> written = ferry::serialize_safetensors(file);
  check_same(file, ferry::parse_safetensors(written.data(), written.size(), "round trip"));

  // What read_tensors (ferry inspect, load_checkpoint) does next: each entry becomes a host tensor. A shape
  // a tensor cannot have (more than 8 dimensions, say) may be refused, with a one-line InvalidArgument.
  for (const ferry::SafetensorsEntry& entry : file.entries) {
    try {
      const ferry::Tensor tensor = ferry::empty(entry.shape, {.dtype = entry.dtype});
      ferry::fuzz::check(tensor.nbytes() == entry.bytes.size() && tensor.shape() == entry.shape,
                         "a tensor made from an entry disagrees with it", entry.name);
      if (!entry.bytes.empty()) std::memcpy(tensor.data_ptr(), entry.bytes.data(), entry.bytes.size());
      ferry::fuzz::check(tensor.is_contiguous(), "a tensor made from an entry is not contiguous", entry.name);
    } catch (const ferry::InvalidArgument& error) {
      ferry::fuzz::check_error_message(error);
    }
  }
  return 0;
}
