// environment.cpp — reading ferry's environment variables (environment.h).
#include "environment.h"

#include <cctype>
#include <cstdlib>

#include "ferry/error.h"

namespace ferry::detail {

std::optional<std::string> environment_text(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  return std::string(text);
}

bool environment_switch(const char* name, bool fallback) {
  const std::optional<std::string> value = environment_text(name);
  if (!value) return fallback;
  std::string v = *value;
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  throw InvalidArgument(concat(name, "='", *value, "' is not a switch: set it to 1 (on) or 0 (off), or leave it unset (",
                               fallback ? "on" : "off", ")"));
}

}  // namespace ferry::detail
