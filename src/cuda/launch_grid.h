// launch_grid.h — how many blocks and threads a launch gets: grid-stride loops over n elements, and kernels that
// give each row one block. Host code; the current device's multiprocessor count sizes both.
#pragma once

#include <algorithm>
#include <cstdint>

#include "device_state.h"

namespace ferry::cuda {

// Blocks for a grid-stride loop over n elements at `threads` a block: one element a thread, but no more than
// `blocks_per_multiprocessor` blocks on each multiprocessor (the loop covers the rest); at least one.
inline unsigned grid_stride_blocks(std::int64_t n, int threads, int blocks_per_multiprocessor = 16) {
  const std::int64_t wanted = (n + threads - 1) / threads;
  const std::int64_t most = std::int64_t{current_multiprocessors()} * blocks_per_multiprocessor;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(wanted, most)));
}

// One block a row, for `rows` rows of n elements (rows, n > 0): threads n rounded up to a warp, at most
// max_threads (a multiple of 32); blocks one a row, at most 32 a multiprocessor (the kernels loop over the rest).
struct RowGrid {
  unsigned blocks;
  unsigned threads;
};
inline RowGrid row_grid(std::int64_t rows, std::int64_t n, std::int64_t max_threads) {
  return {static_cast<unsigned>(std::min<std::int64_t>(rows, std::int64_t{current_multiprocessors()} * 32)),
          static_cast<unsigned>(std::min<std::int64_t>(max_threads, (n + 31) / 32 * 32))};
}

}  // namespace ferry::cuda
