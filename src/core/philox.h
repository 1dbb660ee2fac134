// philox.h — Philox 4x32-10 and the value transforms shared by the cpu and cuda random kernels, so
// that one seed gives the same numbers on every device (DESIGN.md invariant 8).
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace ferry::detail {

struct Philox4 {
  std::uint32_t v[4];
};

FERRY_HOST_DEVICE inline Philox4 philox4x32_10(std::uint64_t counter, std::uint64_t seed) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter), c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = 0, c3 = 0;
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Element `i` of a draw whose first counter is `offset` (a multiple of 4).
// uniform in [0, 1) from the element's own word, 24 bits (exact in float32, never rounds up to 1).
FERRY_HOST_DEVICE inline double philox_uniform(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  const std::uint64_t n = offset + i;
  const Philox4 r = philox4x32_10(n / 4, seed);
  return static_cast<double>(r.v[n % 4] >> 8) * (1.0 / 16777216.0);
}

// Standard normal by Box-Muller over the pair (2j, 2j+1) of the block; even lanes take cos, odd sin.
FERRY_HOST_DEVICE inline double philox_normal(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  const std::uint64_t n = offset + i;
  const Philox4 r = philox4x32_10(n / 4, seed);
  const unsigned pair = static_cast<unsigned>(n % 4) & ~1u;
  const double u1 = (static_cast<double>(r.v[pair]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
  const double u2 = static_cast<double>(r.v[pair + 1]) * (1.0 / 4294967296.0);      // [0, 1)
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 6.283185307179586 * u2;
  return (n % 2 == 0) ? radius * std::cos(angle) : radius * std::sin(angle);
}

// Uniform integer in [0, range), range < 2^32 (multiply-shift; bias below 2^-32 * range).
FERRY_HOST_DEVICE inline std::uint64_t philox_below(std::uint64_t seed, std::uint64_t offset, std::uint64_t i,
                                                    std::uint64_t range) {
  const std::uint64_t n = offset + i;
  const Philox4 r = philox4x32_10(n / 4, seed);
  return (static_cast<std::uint64_t>(r.v[n % 4]) * range) >> 32;
}

}  // namespace ferry::detail
