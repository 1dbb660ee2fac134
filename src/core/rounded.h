// rounded.h — one arithmetic operation rounded to T on its own, never fused into a multiply-add: what the composed
// ops' separate kernels do, so that a fused kernel which takes the same operations in the same order gives their
// bits. On a card the _rn intrinsics (which nvcc never contracts); on the host the plain operator, in files built
// with -ffp-contract=off (src/CMakeLists.txt). Shared by the rules both devices run (sgd_rule.h, adam_rule.h) and
// the cuda kernels of fused layers (gelu.cu, layer_norm.cu).
#pragma once

#include <cmath>

#include "host_device.h"

namespace ferry::detail {

template <typename T>
FERRY_HOST_DEVICE inline T rounded_mul(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return __fmul_rn(a, b);
  else return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

template <typename T>
FERRY_HOST_DEVICE inline T rounded_add(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return __fadd_rn(a, b);
  else return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

template <typename T>
FERRY_HOST_DEVICE inline T rounded_sub(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return __fsub_rn(a, b);
  else return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

template <typename T>
FERRY_HOST_DEVICE inline T rounded_div(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return __fdiv_rn(a, b);
  else return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

template <typename T>
FERRY_HOST_DEVICE inline T rounded_sqrt(T a) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) return __fsqrt_rn(a);
  else return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace ferry::detail
