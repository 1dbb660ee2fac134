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
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
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
  if (name == "float16" || name == "half" || name == "f16") return DType::Float16;
  if (name == "bfloat16" || name == "bf16") return DType::BFloat16;
  throw InvalidArgument(detail::concat("Unknown dtype '", name, "'. Expected one of: float32, float64, int32, int64, "
                                       "uint8, bool, float16, bfloat16"));
}

void throw_storage_only(DType dtype, std::string_view op) {
  const char* enumerator = dtype == DType::Float16 ? "Float16" : "BFloat16";
  throw DTypeMismatch(detail::concat(op, op.empty() ? "" : ": ", dtype_name(dtype), " is a storage type in ferry: ",
                                     "tensors of it convert, move and save, but ops compute in float32; write ",
                                     "x.to(DType::Float32) first (and .to(DType::", enumerator,
                                     ") after, to store the result at 2 bytes an element)"));
}

DType promote_types(DType a, DType b) {
  if ((a == DType::Float16 && b == DType::BFloat16) || (a == DType::BFloat16 && b == DType::Float16)) {
    return DType::Float32;
  }
  auto rank = [](DType t) {
    switch (t) {
      case DType::Bool: return 0;
      case DType::UInt8: return 1;
      case DType::Int32: return 2;
      case DType::Int64: return 3;
      case DType::Float16: return 4;
      case DType::BFloat16: return 4;
      case DType::Float32: return 5;
      case DType::Float64: return 6;
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
