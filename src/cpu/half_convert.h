// half_convert.h — float32 <-> float16 over contiguous runs with the F16C instructions (x86-64-v3), eight
// elements an instruction: the scalar conversion of ferry/half.h is exact but branchy (~0.6 GB/s measured), the
// hardware's is the same rounding (IEEE round to nearest even) at memory speed. NaN lanes are rewritten as the
// scalar path writes them (0x7e00 | sign), so that every path and every device gives one set of bits.
// Not here: bfloat16 (the compiler vectorises its integer rounding) or strided operands (the generic loop).
#pragma once

#include <cstdint>

#include "ferry/half.h"

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#endif

namespace ferry::cpu {

// out[i] = Float16(in[i]) for i < n.
inline void narrow_to_half(Float16* out, const float* in, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (const int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)); nan != 0) {
      for (int j = 0; j < 8; ++j)
        if (nan & (1 << j)) out[i + j] = Float16(in[i + j]);  // the hardware keeps payload bits; ferry does not
    }
  }
#endif
  for (; i < n; ++i) out[i] = Float16(in[i]);
}

// out[i] = float(in[i]) for i < n (exact; NaN payloads kept, as the scalar conversion keeps them).
inline void widen_from_half(float* out, const Float16* in, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
#endif
  for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

}  // namespace ferry::cpu
