// random.cpp — the process-wide generator: a seed and a counter offset, shared by every device.
#include "ferry/random.h"

#include <mutex>

#include "internal.h"

namespace ferry {
namespace {
std::mutex g_mutex;
GeneratorState g_state{0x5EEDull, 0};
}  // namespace

void manual_seed(std::uint64_t seed) {
  std::lock_guard lock(g_mutex);
  g_state = {seed, 0};
}
GeneratorState generator_state() {
  std::lock_guard lock(g_mutex);
  return g_state;
}
void set_generator_state(const GeneratorState& state) {
  std::lock_guard lock(g_mutex);
  g_state = state;
}
std::uint64_t reserve_random_counters(std::uint64_t count) {
  // A replay would draw the same numbers again: the counter offset is baked into the captured work.
  detail::check_not_capturing("Drawing random numbers");
  std::lock_guard lock(g_mutex);
  const std::uint64_t first = g_state.offset;
  g_state.offset += (count + 3) / 4 * 4;  // every draw starts on a fresh Philox block
  return first;
}

}  // namespace ferry
