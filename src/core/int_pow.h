// int_pow.h — an integer raised to an integer power in the integer's own wrapping arithmetic (PyTorch's pow of
// integer tensors), shared by the cpu kernels (src/cpu/host_kernels.cpp) and the cuda ones (src/cuda/binary.cu)
// so both give the same value; exact where double's pow would round (3^39 > 2^53).
#pragma once

#include <type_traits>

#include "host_device.h"

namespace ferry::detail {

// base^exponent by squaring, wrapping as two's complement. A negative exponent gives 1 / base^|exponent| truncated:
// 1 for base 1, +-1 for base -1, and 0 otherwise (base 0 too, where PyTorch's cpu and cuda disagree).
template <typename T>
FERRY_HOST_DEVICE inline T int_pow(T base, T exponent) {
  using U = std::make_unsigned_t<T>;
  if constexpr (std::is_signed_v<T>) {
    if (exponent < 0) {
      if (base == 1) return T(1);
      if (base == -1) return (exponent & 1) ? T(-1) : T(1);
      return T(0);
    }
  }
  U result = 1, square = static_cast<U>(base), e = static_cast<U>(exponent);
  while (e != 0) {
    if (e & 1U) result = static_cast<U>(result * square);
    square = static_cast<U>(square * square);
    e = static_cast<U>(e >> 1U);
  }
  return static_cast<T>(result);
}

}  // namespace ferry::detail
