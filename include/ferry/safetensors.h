// ferry/safetensors.h — safetensors files (checkpoints) as bytes: read, validate, write atomically.
// Not here: Tensor. An entry is a name, dtype, shape and raw little-endian bytes; tensors adapt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/dtype.h"

namespace ferry {

// Format (https://github.com/huggingface/safetensors):
//   8 bytes   N, the header length, little-endian u64
//   N bytes   UTF-8 JSON object, padded at the end with spaces to a multiple of 8 bytes:
//               {"__metadata__": {"k": "v", ...},
//                "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
//   the rest  the data buffer; data_offsets are relative to its start, tensors tile it exactly
// dtypes: F32 = Float32, F64 = Float64, F16 = Float16, BF16 = BFloat16, I32 = Int32, I64 = Int64, U8 = UInt8,
// BOOL = Bool.

inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;  // the reference's limit

struct SafetensorsEntry {
  std::string name;                 // e.g. "0.weight" (PyTorch state_dict names)
  DType dtype = DType::Float32;
  std::vector<std::int64_t> shape;  // {} is a 0-d tensor (one element)
  std::vector<std::byte> bytes;     // row-major, little-endian; numel() * element_size(dtype)

  std::int64_t numel() const;  // product of shape; 1 for a 0-d tensor
};

struct SafetensorsFile {
  std::vector<SafetensorsEntry> entries;        // in file order (header order; equals data order
                                                // for files ferry and the reference write)
  std::map<std::string, std::string> metadata;  // "__metadata__"; empty map = none written

  // nullptr when absent.
  const SafetensorsEntry* find(std::string_view name) const;
  SafetensorsEntry* find(std::string_view name);
  // Throws InvalidArgument naming the missing tensor when absent.
  const SafetensorsEntry& at(std::string_view name) const;
};

// The safetensors name of a dtype: "F32", "F64", "F16", "BF16", "I32", "I64", "U8", "BOOL".
std::string_view safetensors_dtype_name(DType dtype);

// Parses and validates a whole file held in memory. Pure: touches nothing but [data, data + size).
// source_name only labels error messages (a path, "<buffer>"). Throws FormatError for any input
// that is not a valid safetensors file (each rule has its own message naming the numbers).
SafetensorsFile parse_safetensors(const std::byte* data, std::size_t size,
                                  std::string_view source_name = "<buffer>");

// Reads path whole and parses it. IoError (path + strerror) when it cannot be read; FormatError
// when it is malformed.
SafetensorsFile read_safetensors(const std::string& path);

// The exact bytes write_safetensors puts in a file: deterministic (same input, same bytes).
// Tensors are laid out contiguously in entries order; "__metadata__" comes first in the header
// when metadata is not empty. Throws InvalidArgument for a file that could not be read back
// (bytes that disagree with shape x dtype, duplicate or reserved names, invalid UTF-8).
std::vector<std::byte> serialize_safetensors(const SafetensorsFile& file);

// Writes serialize_safetensors(file) to path atomically: a unique temporary file in the same
// folder, fflush + fsync, rename over path, fsync the folder. path never holds a partial file. On
// failure the temporary file is removed, path is left as it was, and IoError names path + strerror.
// A symlink at path is followed (the file it names is replaced; the link stays); see atomic_write_target.
void write_safetensors(const std::string& path, const SafetensorsFile& file);

// The file an atomic write of `path` replaces: symlinks followed to the end (a dangling one to the file it
// names). A target that exists and is a device (such as /dev/null), a pipe or a socket is an InvalidArgument
// naming what it is: the rename would put a file in its place. (rename() never replaces a folder: an IoError.)
std::string atomic_write_target(const std::string& path);

}  // namespace ferry
