// fuzz/fuzz_idx.cpp — libFuzzer target: the idx reader in memory (parse_idx) and through zlib (read_idx_gz); only a one-line
// FormatError may escape, shapes agree with the data, and on plain bytes both readers agree. Not here: Fashion-MNIST's checks.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "ferry/idx.h"
#include "fuzz_common.h"

namespace {

void check_array(const ferry::IdxArray& array) {
  using ferry::fuzz::check;
  check(!array.shape.empty() && array.shape.size() <= 4, "an accepted idx array of rank outside 1..4");
  for (const std::int64_t dim : array.shape) check(dim > 0, "an accepted idx array with a dimension <= 0");
  check(array.numel() == static_cast<std::int64_t>(array.data.size()), "idx data size disagrees with its shape");
}

// The input as a file: a memfd, so that each run touches no disk. read_idx_gz reads it through zlib,
// which decompresses gzip and passes anything else through as is.
std::optional<ferry::IdxArray> read_through_file(const std::uint8_t* data, std::size_t size) {
  static const int fd = ::memfd_create("ferry-fuzz-idx", 0);
  if (fd < 0) ferry::fuzz::finding("memfd_create failed");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    ferry::fuzz::finding("writing the memfd failed");
  try {
    return ferry::read_idx_gz("/proc/self/fd/" + std::to_string(fd));
  } catch (const ferry::FormatError& error) {
    ferry::fuzz::check_error_message(error);
    return std::nullopt;
  } catch (const ferry::Error& error) {
    ferry::fuzz::finding("read_idx_gz threw a ferry::Error that is not a FormatError", error.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::optional<ferry::IdxArray> in_memory;
  try {
    in_memory = ferry::parse_idx(data, size, "fuzz.idx");
    check_array(*in_memory);
  } catch (const ferry::FormatError& error) {
    ferry::fuzz::check_error_message(error);
  } catch (const ferry::Error& error) {
    ferry::fuzz::finding("parse_idx threw a ferry::Error that is not a FormatError", error.what());
  }

  const std::optional<ferry::IdxArray> from_file = read_through_file(data, size);
  if (from_file) check_array(*from_file);
  const bool gzip = size >= 2 && data[0] == 0x1F && data[1] == 0x8B;
  if (!gzip) {
    ferry::fuzz::check(in_memory.has_value() == from_file.has_value(),
                       in_memory ? "parse_idx accepts plain bytes that read_idx_gz rejects"
                                 : "read_idx_gz accepts plain bytes that parse_idx rejects");
    if (in_memory)
      ferry::fuzz::check(in_memory->shape == from_file->shape && in_memory->data == from_file->data,
                         "parse_idx and read_idx_gz read the same plain bytes differently");
  }
  return 0;
}
