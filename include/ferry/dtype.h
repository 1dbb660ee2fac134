// ferry/dtype.h — element types: their names, sizes and parsing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry {

enum class DType : std::uint8_t { Float32, Float64, Int32, Int64, UInt8, Bool };

constexpr std::size_t element_size(DType dtype) {  // bytes per element
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::UInt8: return 1;
    case DType::Bool: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType dtype) { return dtype == DType::Float32 || dtype == DType::Float64; }

// "float32", "int64", ... (PyTorch's names without the "torch." prefix).
std::string_view dtype_name(DType dtype);
// Accepts "float32"/"float"/"f32", "float64"/"double"/"f64", "int32", "int64"/"long", "uint8", "bool".
// Throws InvalidArgument listing the accepted names.
DType parse_dtype(std::string_view name);

// Type promotion for binary ops: float64 > float32 > int64 > int32 > uint8 > bool.
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

}  // namespace ferry
