// checks.h — the argument checks the nn functions share (functional.cpp, composed_layers.cpp, attention.cpp).
#pragma once

#include "ferry/error.h"
#include "ferry/tensor.h"

namespace ferry::nn {

// DTypeMismatch unless `t` is float32 or float64: "<op>: expected a float32 or float64 <what>, got int64"; a
// float16 or bfloat16 tensor is told how to convert (throw_storage_only).
inline void check_floating(const char* op, const Tensor& t, const char* what = "input") {
  FERRY_CHECK(is_floating(t.dtype()), DTypeMismatch, op, ": expected a float32 or float64 ", what, ", got ",
              dtype_name(t.dtype()));
  if (is_storage_only(t.dtype())) throw_storage_only(t.dtype(), op);
}

// InvalidArgument unless 0 <= p <= 1 (PyTorch's message): every dropout layer and function.
inline void check_dropout_probability(double p) {
  FERRY_CHECK(p >= 0 && p <= 1, InvalidArgument, "dropout probability has to be between 0 and 1, but got ", p);
}

}  // namespace ferry::nn
