// ferry/random.h — the generator behind rand/randn/randint: counter-based, so any device agrees.
// Each draw of n values takes counters [offset, offset + n) of the stream named by the seed.
#pragma once

#include <cstdint>

namespace ferry {

struct GeneratorState {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;  // counters used so far
};

void manual_seed(std::uint64_t seed);  // resets offset to 0
GeneratorState generator_state();
void set_generator_state(const GeneratorState& state);
// Reserve `count` counters; returns the first. Thread-safe.
std::uint64_t reserve_random_counters(std::uint64_t count);

// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): four 32-bit words
// from (counter, key). Host and device code share this definition.
struct Philox4x32 {
  static constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  static constexpr std::uint32_t kKey0 = 0x9E3779B9u, kKey1 = 0xBB67AE85u;
};

}  // namespace ferry
