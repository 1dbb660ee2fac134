// dispatch.h — turn a runtime DType into a C++ type for a templated kernel body:
//   dispatch(t.dtype, [&](auto tag) { using T = typename decltype(tag)::type; ... });
#pragma once

#include <cstdint>
#include <utility>

#include "ferry/dtype.h"
#include "ferry/error.h"

namespace ferry::cpu {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
decltype(auto) dispatch(DType dtype, F&& body) {
  switch (dtype) {
    case DType::Float32: return body(TypeTag<float>{});
    case DType::Float64: return body(TypeTag<double>{});
    case DType::Int32: return body(TypeTag<std::int32_t>{});
    case DType::Int64: return body(TypeTag<std::int64_t>{});
    case DType::UInt8: return body(TypeTag<std::uint8_t>{});
    case DType::Bool: return body(TypeTag<bool>{});
    case DType::Float16:
    case DType::BFloat16: throw_storage_only(dtype, "");
  }
  throw InternalError("unknown dtype in dispatch");
}

// Every dtype, the 16-bit storage types included: for the kernels that only move and convert values (copies,
// conversions, fill, arange, random draws), through cast_to.
template <typename F>
decltype(auto) dispatch_with_storage(DType dtype, F&& body) {
  switch (dtype) {
    case DType::Float16: return body(TypeTag<Float16>{});
    case DType::BFloat16: return body(TypeTag<BFloat16>{});
    default: return dispatch(dtype, std::forward<F>(body));
  }
}

// Floating types only; other dtypes are a DTypeMismatch naming the op.
template <typename F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& body) {
  switch (dtype) {
    case DType::Float32: return body(TypeTag<float>{});
    case DType::Float64: return body(TypeTag<double>{});
    default:
      if (is_storage_only(dtype)) throw_storage_only(dtype, op);
      throw DTypeMismatch(detail::concat(op, ": expected float32 or float64, got ", dtype_name(dtype)));
  }
}

}  // namespace ferry::cpu
