// fuzz/fuzz_common.h — what every ferry fuzz target shares: how a broken promise becomes a finding.
// Not here: the inputs. A target catches only ferry::Error; anything else escaping is a finding too.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ferry/error.h"

namespace ferry::fuzz {

// Reports a broken property and aborts, so that libFuzzer saves the input as a crash artifact.
[[noreturn]] inline void finding(std::string_view what, std::string_view detail = {}) {
  std::fprintf(stderr, "\nFERRY FUZZ FINDING: %.*s\n  %.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

// ferry's promise for every error: one clear line (the CLI prints it as is after "ferry: error: ").
inline void check_error_message(const ferry::Error& error) {
  const std::string_view message = error.what();
  if (message.empty()) finding("an error with an empty message");
  if (message.find('\n') != std::string_view::npos || message.find('\r') != std::string_view::npos)
    finding("an error message that is not one line", message);
}

inline void check(bool condition, std::string_view what, std::string_view detail = {}) {
  if (!condition) finding(what, detail);
}

}  // namespace ferry::fuzz
