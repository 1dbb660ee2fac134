// determinism.cpp — the process-wide switch of ferry/determinism.h.
#include "ferry/determinism.h"

#include <atomic>
#include <cstdlib>
#include <cctype>
#include <cstring>
#include <string>

#include "ferry/error.h"
#include "internal.h"

namespace ferry {
namespace {
// FERRY_DETERMINISTIC: 1/true/yes/on, or 0/false/no/off (any case); anything else is refused rather than read as
// off, which would leave a user believing a run is reproducible when it is not.
bool from_environment() {
  const char* value = std::getenv("FERRY_DETERMINISTIC");
  if (value == nullptr || *value == '\0') return false;
  std::string v(value);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw InvalidArgument(detail::concat("FERRY_DETERMINISTIC='", value, "' is not a switch: set it to 1 (on) or 0 (off)"));
}
std::atomic<bool>& flag() {  // made on first use: safe from other files' static initialisers
  static std::atomic<bool> deterministic{from_environment()};
  return deterministic;
}
}  // namespace

void use_deterministic_algorithms(bool on) { flag().store(on); }
bool deterministic_algorithms() { return flag().load(); }

}  // namespace ferry
