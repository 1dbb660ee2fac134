// max_pool_2x2.h — one output row of 2x2 stride-2 max pooling without padding (the CNNs' pooling) over host
// memory: values and window-order argmax, float32 eight outputs at a time with AVX2; a row holding a NaN is
// redone in window order (max_pool_2x2_row_in_window_order). Not here: other pooling shapes (host_kernels.cpp).
#pragma once

#include <cstdint>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace ferry::cpu {

// Per output x of the row: the winner of (a, b) = top[2x], top[2x + 1] and of (c, d) = bottom[2x],
// bottom[2x + 1], then of the two, with strict comparisons: the first maximum in window order, as PyTorch
// picks it. Written as selects, with no data-dependent branch (on activations which element wins is a coin
// toss). `arg` gets plane indices: `base` is the top row's offset in the plane (2 y width). Returns whether the
// row's windows hold a NaN, in which case `out` and `arg` are not yet right for it.
template <typename T>
bool max_pool_2x2_row_scalar(const T* top, const T* bottom, T* out, std::int64_t* arg, std::int64_t ow,
                             std::int64_t base, std::int64_t width) {
  bool nan = false;
  for (std::int64_t xo = 0; xo < ow; ++xo) {
    const T a = top[2 * xo], b = top[2 * xo + 1], c = bottom[2 * xo], d = bottom[2 * xo + 1];
    nan |= (a != a) | (b != b) | (c != c) | (d != d);
    const bool right_top = b > a, right_bottom = d > c;
    const T upper = right_top ? b : a, lower = right_bottom ? d : c;
    const std::int64_t upper_index = base + 2 * xo + right_top;
    const std::int64_t lower_index = base + width + 2 * xo + right_bottom;
    const bool take_lower = lower > upper;
    out[xo] = take_lower ? lower : upper;
    arg[xo] = take_lower ? lower_index : upper_index;
  }
  return nan;
}

template <typename T>
bool max_pool_2x2_row(const T* top, const T* bottom, T* out, std::int64_t* arg, std::int64_t ow, std::int64_t base,
                      std::int64_t width) {
  return max_pool_2x2_row_scalar(top, bottom, out, arg, ow, base, width);
}

// The same row in window order, for a row whose windows hold a NaN: the first NaN wins over everything after it.
template <typename T>
void max_pool_2x2_row_in_window_order(const T* top, const T* bottom, T* out, std::int64_t* arg, std::int64_t ow,
                                      std::int64_t base, std::int64_t width) {
  auto better = [](T v, T best) { return (best == best) & ((v > best) | (v != v)); };
  for (std::int64_t xo = 0; xo < ow; ++xo) {
    const T window[4] = {top[2 * xo], top[2 * xo + 1], bottom[2 * xo], bottom[2 * xo + 1]};
    const std::int64_t index[4] = {base + 2 * xo, base + 2 * xo + 1, base + width + 2 * xo, base + width + 2 * xo + 1};
    int best = 0;
    for (int i = 1; i < 4; ++i) {
      if (better(window[i], window[best])) best = i;
    }
    out[xo] = window[best];
    arg[xo] = index[best];
  }
}

#if defined(__AVX2__)
// float32: the same selects on eight outputs at once. The even and odd elements of 16 inputs are split with
// two shuffles (which leave the outputs in the order 0 1 4 5 2 3 6 7) and one 64-bit permute (back to 0..7).
// A row's last block loads and stores through masks, so no element past the row is read or written. The
// measured scalar loop ran at ~10 GB/s here, against ~45 GB/s for `add`: bound by its ~25 instructions per
// output, not by memory.
template <>
inline bool max_pool_2x2_row<float>(const float* top, const float* bottom, float* out, std::int64_t* arg,
                                    std::int64_t ow, std::int64_t base, std::int64_t width) {
  if (base + width + 2 * ow > std::numeric_limits<std::int32_t>::max()) return max_pool_2x2_row_scalar(top, bottom, out, arg, ow, base, width);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lane64 = _mm256_setr_epi64x(0, 1, 2, 3);
  const __m256i row_width = _mm256_set1_epi32(static_cast<int>(width));
  __m256 unordered = _mm256_setzero_ps();
  auto evens = [](__m256 lo, __m256 hi) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
  };
  auto odds = [](__m256 lo, __m256 hi) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
  };
  for (std::int64_t xo = 0; xo < ow; xo += 8) {
    const int n = static_cast<int>(ow - xo < 8 ? ow - xo : 8);  // outputs in this block
    const __m256i in_lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n), lane);
    const __m256i in_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * n - 8), lane);
    const float* t = top + 2 * xo;
    const float* u = bottom + 2 * xo;
    const __m256 t0 = _mm256_maskload_ps(t, in_lo), t1 = _mm256_maskload_ps(t + 8, in_hi);
    const __m256 u0 = _mm256_maskload_ps(u, in_lo), u1 = _mm256_maskload_ps(u + 8, in_hi);
    const __m256 a = evens(t0, t1), b = odds(t0, t1), c = evens(u0, u1), d = odds(u0, u1);
    unordered = _mm256_or_ps(unordered, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q)));
    const __m256 right_top = _mm256_cmp_ps(b, a, _CMP_GT_OQ), right_bottom = _mm256_cmp_ps(d, c, _CMP_GT_OQ);
    const __m256 upper = _mm256_blendv_ps(a, b, right_top), lower = _mm256_blendv_ps(c, d, right_bottom);
    const __m256 take_lower = _mm256_cmp_ps(lower, upper, _CMP_GT_OQ);
    // Offsets in the window: 0 or 1 in the top row, width or width + 1 in the bottom (a true mask is -1).
    const __m256i upper_offset = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_castps_si256(right_top));
    const __m256i lower_offset = _mm256_sub_epi32(row_width, _mm256_castps_si256(right_bottom));
    const __m256i offset = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(upper_offset), _mm256_castsi256_ps(lower_offset), take_lower));
    const __m256i corner = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(base + 2 * xo)), _mm256_add_epi32(lane, lane));
    const __m256i index = _mm256_add_epi32(corner, offset);
    const __m256i out_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
    _mm256_maskstore_ps(out + xo, out_mask, _mm256_blendv_ps(upper, lower, take_lower));
    _mm256_maskstore_epi64(reinterpret_cast<long long*>(arg + xo), _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), lane64),
                           _mm256_cvtepi32_epi64(_mm256_castsi256_si128(index)));
    _mm256_maskstore_epi64(reinterpret_cast<long long*>(arg + xo + 4),
                           _mm256_cmpgt_epi64(_mm256_set1_epi64x(n - 4), lane64),
                           _mm256_cvtepi32_epi64(_mm256_extracti128_si256(index, 1)));
  }
  return _mm256_movemask_ps(unordered) != 0;
}
#endif

}  // namespace ferry::cpu
