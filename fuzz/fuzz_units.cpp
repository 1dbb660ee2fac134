// fuzz/fuzz_units.cpp — libFuzzer target: the CLI's unit parsers (16GB/s, 1.5GHz, 25M, 5ms, 1000x1000); only a one-line
// InvalidArgument may escape, values are finite and >= 0, and 17 printed digits read back. Not here: cost arithmetic.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/units.h"
#include "fuzz_common.h"

namespace {

// Runs one parser; returns true and sets `value` when it accepted the text.
template <typename Parse>
bool try_parse(Parse parse, std::string_view text, double& value) {
  try {
    value = static_cast<double>(parse(text));
  } catch (const ferry::InvalidArgument& error) {
    ferry::fuzz::check_error_message(error);
    return false;
  } catch (const ferry::Error& error) {
    ferry::fuzz::finding("a unit parser threw a ferry::Error that is not an InvalidArgument", error.what());
  }
  ferry::fuzz::check(std::isfinite(value) && value >= 0, "a unit parser returned a negative or non-finite value",
                     text);
  return true;
}

// format(value, 17) must parse back to value (both ends are ferry's own): exact for normal numbers up
// to the last digit or two of the decimal scaling.
template <typename Format, typename Parse>
void check_reads_back(Format format, Parse parse, double value) {
  if (value != 0 && value < 1e-290) return;  // subnormal territory: the prefix scaling loses digits
  const std::string text = format(value, 17);
  double back = 0;
  try {
    back = parse(text);
  } catch (const ferry::Error& error) {
    ferry::fuzz::finding("a formatted quantity does not parse back", text + " -> " + error.what());
  }
  ferry::fuzz::check(std::fabs(back - value) <= 1e-14 * value, "a formatted quantity reads back to another value",
                     text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  double value = 0;
  if (try_parse(ferry::parse_bytes, text, value))
    check_reads_back(ferry::format_bytes, ferry::parse_bytes, value);
  if (try_parse(ferry::parse_seconds, text, value))
    check_reads_back(ferry::format_seconds, ferry::parse_seconds, value);
  if (try_parse(ferry::parse_hertz, text, value))
    check_reads_back(ferry::format_hertz, ferry::parse_hertz, value);
  if (try_parse(ferry::parse_bandwidth, text, value))
    check_reads_back(ferry::format_bandwidth, ferry::parse_bandwidth, value);
  try_parse(ferry::parse_count, text, value);
  if (try_parse(ferry::parse_whole_count, text, value))
    ferry::fuzz::check(value == std::floor(value), "parse_whole_count returned a fraction", text);
  try {
    for (const std::int64_t dimension : ferry::parse_shape(text))
      ferry::fuzz::check(dimension >= 0, "parse_shape returned a negative dimension", text);
  } catch (const ferry::InvalidArgument& error) {
    ferry::fuzz::check_error_message(error);
  } catch (const ferry::Error& error) {
    ferry::fuzz::finding("parse_shape threw a ferry::Error that is not an InvalidArgument", error.what());
  }
  return 0;
}
