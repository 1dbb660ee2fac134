// determinism.cpp — the process-wide switch of ferry/determinism.h.
#include "ferry/determinism.h"

#include <atomic>

#include "environment.h"

namespace ferry {
namespace {
// FERRY_DETERMINISTIC, a switch (environment.h): a value that is neither on nor off is refused rather than read as
// off, which would leave a user believing a run is reproducible when it is not.
std::atomic<bool>& flag() {  // made on first use: safe from other files' static initialisers
  static std::atomic<bool> deterministic{detail::environment_switch("FERRY_DETERMINISTIC", false)};
  return deterministic;
}
}  // namespace

void use_deterministic_algorithms(bool on) { flag().store(on); }
bool deterministic_algorithms() { return flag().load(); }

}  // namespace ferry
