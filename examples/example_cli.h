// example_cli.h — what the example programs share on their command lines: numbers read from options (or
// InvalidArgument naming the option), and a main() that turns exceptions into one line on stderr and an exit
// status, as the `ferry` command line does: 2 for bad input (a wrong option, a device this machine lacks), 1 for
// anything else.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>

#include "ferry/error.h"

namespace example {

// A whole number >= least, e.g. whole("--steps", "300", 1).
inline std::int64_t whole(std::string_view option, const std::string& text, std::int64_t least) {
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < least) {
    throw ferry::InvalidArgument(std::string(option) + " wants a whole number >= " + std::to_string(least) +
                                 ", not '" + text + "'");
  }
  return value;
}

// A number > 0, e.g. positive_number("--lr", "3e-3").
inline double positive_number(std::string_view option, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(value > 0)) {
    throw ferry::InvalidArgument(std::string(option) + " wants a number > 0, not '" + text + "'");
  }
  return value;
}

// main()'s body: returns run()'s status, or prints "<program>: <what went wrong>" and returns 2 or 1.
template <typename Run>
int guarded_main(const char* program, Run&& run) {
  const auto say = [program](const std::exception& e, int status) {
    std::cerr << program << ": " << e.what() << "\n";
    return status;
  };
  try {
    return run();
  } catch (const ferry::InvalidArgument& e) {
    return say(e, 2);
  } catch (const ferry::DeviceUnavailable& e) {
    return say(e, 2);
  } catch (const std::exception& e) {
    return say(e, 1);
  }
}

}  // namespace example
