// environment.h — ferry's FERRY_* environment variables, read the same way everywhere; not part of the public API.
// A switch is 1/true/yes/on or 0/false/no/off, in any case; unset or empty, it takes its default. Any other value
// is refused with an InvalidArgument naming the variable, never read as one or the other: whoever wrote
// FERRY_CUDNN=off meant off, and a run must not go on the other way without saying so.
#pragma once

#include <optional>
#include <string>

namespace ferry::detail {

// The variable's value; nullopt when it is unset or empty.
std::optional<std::string> environment_text(const char* name);

// The switch's value, or `fallback` when it is unset or empty. Throws InvalidArgument for anything else.
bool environment_switch(const char* name, bool fallback);

}  // namespace ferry::detail
