// dtype.cpp — names, parsing and promotion of element types.
#include "ferry/dtype.h"

#include "ferry/error.h"

namespace ferry {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "float" || name == "f32") return DType::Float32;
  if (name == "float64" || name == "double" || name == "f64") return DType::Float64;
  if (name == "int32" || name == "int" || name == "i32") return DType::Int32;
  if (name == "int64" || name == "long" || name == "i64") return DType::Int64;
  if (name == "uint8" || name == "u8") return DType::UInt8;
  if (name == "bool") return DType::Bool;
  throw InvalidArgument(detail::concat("Unknown dtype '", name,
                                       "'. Expected one of: float32, float64, int32, int64, uint8, bool"));
}

DType promote_types(DType a, DType b) {
  auto rank = [](DType t) {
    switch (t) {
      case DType::Bool: return 0;
      case DType::UInt8: return 1;
      case DType::Int32: return 2;
      case DType::Int64: return 3;
      case DType::Float32: return 4;
      case DType::Float64: return 5;
    }
    return 0;
  };
  return rank(a) >= rank(b) ? a : b;
}

DType promote_with_zero_dim(DType dimensioned, DType zero_dim) {
  auto category = [](DType t) { return t == DType::Bool ? 0 : is_floating(t) ? 2 : 1; };
  return category(zero_dim) > category(dimensioned) ? promote_types(dimensioned, zero_dim) : dimensioned;
}

}  // namespace ferry
