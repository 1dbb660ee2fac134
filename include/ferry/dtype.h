// ferry/dtype.h — element types: their names, sizes and parsing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/half.h"

namespace ferry {

// Float16 and BFloat16 (ferry/half.h) are storage types: tensors of them are made, filled, converted, moved,
// printed and saved like any other, and arithmetic on them asks for a conversion to float32 first.
enum class DType : std::uint8_t { Float32, Float64, Int32, Int64, UInt8, Bool, Float16, BFloat16 };

constexpr std::size_t element_size(DType dtype) {  // bytes per element
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::UInt8: return 1;
    case DType::Bool: return 1;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
  }
  return 0;
}

constexpr bool is_floating(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Float16 || dtype == DType::BFloat16;
}
// The 16-bit floating types, which ferry stores and converts but does not compute in.
constexpr bool is_storage_only(DType dtype) { return dtype == DType::Float16 || dtype == DType::BFloat16; }

// "float32", "int64", "float16", "bfloat16", ... (PyTorch's names without the "torch." prefix).
std::string_view dtype_name(DType dtype);
// Accepts "float32"/"float"/"f32", "float64"/"double"/"f64", "int32", "int64"/"long", "uint8", "bool",
// "float16"/"half"/"f16", "bfloat16"/"bf16".
// Throws InvalidArgument listing the accepted names.
DType parse_dtype(std::string_view name);

// Throws DTypeMismatch for an op that was handed a storage-only tensor: what it was, and the conversion to write.
// `op` names the op ("matmul"); empty when the caller does not know it.
[[noreturn]] void throw_storage_only(DType dtype, std::string_view op);

// Type promotion for binary ops: float64 > float32 > float16, bfloat16 > int64 > int32 > uint8 > bool; float16 with
// bfloat16 gives float32 (neither holds the other), as in PyTorch.
DType promote_types(DType a, DType b);
// PyTorch's promotion of a dimensioned operand with a 0-d one (torch.result_type): the 0-d dtype counts only when
// its category (bool < integer < floating) is higher. float32 with 0-d float64 -> float32; int32 with 0-d int64
// -> int32; int64 with 0-d float64 -> float64; bool with 0-d uint8 -> uint8.
DType promote_with_zero_dim(DType dimensioned, DType zero_dim);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<double>() { return DType::Float64; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::Int32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::Int64; }
template <> constexpr DType dtype_of<std::uint8_t>() { return DType::UInt8; }
template <> constexpr DType dtype_of<bool>() { return DType::Bool; }
template <> constexpr DType dtype_of<Float16>() { return DType::Float16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BFloat16; }

}  // namespace ferry
