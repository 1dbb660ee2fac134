// strided.h — walk N strided operands of one shape in lockstep, dims coalesced, split over OpenMP
// threads in chunks. The kernel body sees runs along the innermost dim: (count, offsets, strides).
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "ferry/backend.h"

namespace ferry::cpu {

// Elements per chunk worth a thread where OpenMP's threads spin between loops; times host_parallel_work_scale()
// where they sleep (parallel_cost.h).
inline constexpr std::int64_t kParallelGrain = 32768;

template <int N>
struct StridedShape {
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};
  std::array<std::array<std::int64_t, kMaxDims>, N> strides{};  // elements, per operand
};

// Drop size-1 dims, then merge neighbours that every operand walks contiguously.
template <int N>
StridedShape<N> coalesce(const KernelTensor& shape_of, const std::array<const KernelTensor*, N>& operands) {
  StridedShape<N> s;
  for (int d = 0; d < shape_of.ndim; ++d) {
    if (shape_of.shape[d] == 1) continue;
    s.shape[s.ndim] = shape_of.shape[d];
    for (int k = 0; k < N; ++k) s.strides[k][s.ndim] = operands[k]->strides[d];
    ++s.ndim;
  }
  if (s.ndim == 0) {  // a scalar: one element
    s.ndim = 1;
    s.shape[0] = 1;
    for (int k = 0; k < N; ++k) s.strides[k][0] = 1;
    return s;
  }
  int out = 0;
  for (int d = 1; d < s.ndim; ++d) {
    bool mergeable = true;
    for (int k = 0; k < N; ++k) mergeable = mergeable && s.strides[k][out] == s.strides[k][d] * s.shape[d];
    if (mergeable) {
      s.shape[out] *= s.shape[d];
      for (int k = 0; k < N; ++k) s.strides[k][out] = s.strides[k][d];
    } else {
      ++out;
      s.shape[out] = s.shape[d];
      for (int k = 0; k < N; ++k) s.strides[k][out] = s.strides[k][d];
    }
  }
  s.ndim = out + 1;
  return s;
}

// body(count, offsets, inner_strides): process `count` elements starting at element offsets
// `offsets[k]` of operand k, stepping by inner_strides[k].
template <int N, typename Body>
void strided_for(const StridedShape<N>& s, Body&& body) {
  std::int64_t total = 1;
  for (int d = 0; d < s.ndim; ++d) total *= s.shape[d];
  if (total == 0) return;
  const int last = s.ndim - 1;
  std::array<std::int64_t, N> inner;
  for (int k = 0; k < N; ++k) inner[k] = s.strides[k][last];

  auto run_range = [&](std::int64_t begin, std::int64_t end) {
    std::array<std::int64_t, kMaxDims> index{};
    std::int64_t rest = begin;
    for (int d = last; d >= 0; --d) {
      index[d] = rest % s.shape[d];
      rest /= s.shape[d];
    }
    std::int64_t position = begin;
    while (position < end) {
      std::array<std::int64_t, N> offsets{};
      for (int d = 0; d <= last; ++d)
        for (int k = 0; k < N; ++k) offsets[k] += index[d] * s.strides[k][d];
      const std::int64_t count = std::min(end - position, s.shape[last] - index[last]);
      body(count, offsets, inner);
      position += count;
      index[last] += count;
      for (int d = last; d > 0 && index[d] == s.shape[d]; --d) {
        index[d] = 0;
        ++index[d - 1];
      }
    }
  };

  const std::int64_t grain = kParallelGrain * host_parallel_work_scale();
  if (total < 2 * grain || omp_in_parallel()) {
    run_range(0, total);
    return;
  }
  const int threads = omp_get_max_threads();
  const std::int64_t chunks = std::min<std::int64_t>(threads * 4, total / grain);
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) run_range(total * c / chunks, total * (c + 1) / chunks);
}

// Parallel loop over [0, n) when the work (n * cost elements) is large enough.
template <typename Body>
void parallel_for(std::int64_t n, std::int64_t cost_per_item, Body&& body) {
  if (n * cost_per_item < 2 * kParallelGrain * host_parallel_work_scale() || n < 2 || omp_in_parallel()) {
    for (std::int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace ferry::cpu
