// repr.h — numbers in module reprs as Python prints them (not part of the public API).
#pragma once

#include <cmath>
#include <string>

#include "ferry/error.h"

namespace ferry::nn {

// A float as Python's repr: a whole number keeps ".0" ("0.0", "1.0"), others as printed (0.1 -> "0.1").
inline std::string python_float(double value) {
  if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 1e16) {
    return ferry::detail::concat(static_cast<long long>(value), ".0");
  }
  return ferry::detail::concat(value);
}

}  // namespace ferry::nn
