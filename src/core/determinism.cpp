// determinism.cpp — the process-wide switch of ferry/determinism.h.
#include "ferry/determinism.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace ferry {
namespace {
bool from_environment() {
  const char* value = std::getenv("FERRY_DETERMINISTIC");
  return value != nullptr && std::strcmp(value, "1") == 0;
}
std::atomic<bool>& flag() {  // made on first use: safe from other files' static initialisers
  static std::atomic<bool> deterministic{from_environment()};
  return deterministic;
}
}  // namespace

void use_deterministic_algorithms(bool on) { flag().store(on); }
bool deterministic_algorithms() { return flag().load(); }

}  // namespace ferry
