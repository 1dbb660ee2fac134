// half_sum.h — the sum of two float16 or bfloat16 buffers for the host all-reduces: each pair widened to float32,
// added, rounded back to nearest even, as NCCL does for these types at each hop of its ring. One rounding per
// addition, so a sum over N ranks is rounded N - 1 times (docs/distributed.md says what that costs a gradient).
// Not here: the conversions themselves (ferry/half.h, ../cpu/half_convert.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../cpu/half_convert.h"
#include "ferry/half.h"

namespace ferry::dist::detail {

// destination[i] = T(float(destination[i]) + float(source[i])) for i < count; T is Float16 or BFloat16.
template <typename T>
void add_into_half(T* destination, const T* source, std::int64_t count) {
  constexpr std::int64_t kBlock = 512;  // elements widened at a time: two blocks of floats stay in L1
  float a[kBlock], b[kBlock];
  for (std::int64_t begin = 0; begin < count; begin += kBlock) {
    const std::int64_t n = std::min(kBlock, count - begin);
    if constexpr (std::is_same_v<T, Float16>) {
      cpu::widen_from_half(a, destination + begin, n);
      cpu::widen_from_half(b, source + begin, n);
      for (std::int64_t i = 0; i < n; ++i) a[i] += b[i];
      cpu::narrow_to_half(destination + begin, a, n);
    } else {
      for (std::int64_t i = 0; i < n; ++i) a[i] = static_cast<float>(destination[begin + i]);
      for (std::int64_t i = 0; i < n; ++i) a[i] += static_cast<float>(source[begin + i]);
      for (std::int64_t i = 0; i < n; ++i) destination[begin + i] = T(a[i]);
    }
  }
}

}  // namespace ferry::dist::detail
