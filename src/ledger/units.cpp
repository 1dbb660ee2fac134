// src/ledger/units.cpp — parse and format bytes, seconds, hertz, bandwidth, counts and shapes (ferry/units.h).
// Not here: any cost arithmetic (cost_model.cpp); nothing in this file knows about devices or tensors.

#include "ferry/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/error.h"

namespace ferry {
namespace {

// ---- text helpers --------------------------------------------------------------------------------

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

bool iends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && iequals(text.substr(text.size() - suffix.size()), suffix);
}

// The input quoted for an error message: control characters escaped so that the message stays on one
// line, and long input cut (at a UTF-8 character boundary) so that it stays readable.
std::string quoted(std::string_view text) {
  constexpr std::size_t kMaxShown = 60;  // bytes of input shown
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const bool continuation = (c & 0xC0) == 0x80;
    if (i >= kMaxShown && !continuation) {
      out += "...";
      break;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);  // printable ASCII, or a byte of a UTF-8 sequence such as "µs"
    }
  }
  out += '"';
  return out;
}

// ---- quantities: a number, then a unit -----------------------------------------------------------

// What a parser reads, for its error messages.
struct QuantityKind {
  std::string_view what;     // "a size in bytes"
  std::string_view example;  // "4MB, 1.5GiB or 4000000"
  std::string_view units;    // the accepted units, in words
};

constexpr QuantityKind kBytes{
    "a size in bytes", "4MB, 1.5GiB or 4000000",
    "B, kB (or KB), MB, GB, TB, PB (1 MB = 10^6 bytes), KiB, MiB, GiB, TiB, PiB (1 MiB = 2^20 bytes), bit, kbit, "
    "Mbit, Gbit; a bare number is bytes"};
constexpr QuantityKind kSeconds{"a time", "5ms, 0.1s or 20us",
                                "s, ms, us (or µs), ns, min, h; a bare number is accepted only for 0"};
constexpr QuantityKind kHertz{"a frequency", "1.5GHz or 3000MHz", "Hz, kHz, MHz, GHz, THz"};
constexpr QuantityKind kBandwidth{
    "a bandwidth", "16GB/s, 900 GB/s or 55.1GiB/s",
    "B/s, kB/s, MB/s, GB/s, TB/s (1 GB = 10^9 bytes), KiB/s, MiB/s, GiB/s, TiB/s, Mbit/s, Gbit/s"};
constexpr QuantityKind kCount{"a count", "25M, 8000 or 1.5K",
                              "no suffix, K (10^3), M (10^6), G or B (10^9), T (10^12)"};

[[noreturn]] void fail(const QuantityKind& kind, std::string_view input, std::string_view why) {
  throw InvalidArgument(fmt::format("Expected {} like {}, got {}: {}. Accepted units: {}", kind.what,
                                    kind.example, quoted(input), why, kind.units));
}

// "1.25e3 MB" split into mantissa "1.25", exponent 3 and unit "MB".
struct ScannedNumber {
  std::string mantissa;      // digits with at most one '.', thousands separators removed
  long exponent = 0;         // power of ten written after e/E (saturated far beyond any double)
  bool is_zero = true;       // every digit is 0
  std::string_view unit;     // the rest of the text, trimmed; may be empty
};

ScannedNumber scan_number(std::string_view input, const QuantityKind& kind) {
  const std::string_view text = trim(input);
  if (text.empty()) fail(kind, input, "it is empty");
  if (text.front() == '-') fail(kind, input, "it is negative");

  ScannedNumber number;
  std::size_t i = 0;
  const std::size_t n = text.size();
  auto take_digits = [&] {
    const std::size_t start = i;
    while (i < n && is_digit(text[i])) {
      if (text[i] != '0') number.is_zero = false;
      number.mantissa += text[i++];
    }
    return i - start;
  };

  // Integer part, optionally grouped by thousands: "25,000,000". A comma that does not start a group of
  // exactly three digits is not part of the number (so "4,4" is the number 4 followed by ",4").
  const std::size_t leading_digits = take_digits();
  if (leading_digits >= 1 && leading_digits <= 3) {
    while (i + 3 < n && text[i] == ',' && is_digit(text[i + 1]) && is_digit(text[i + 2]) &&
           is_digit(text[i + 3]) && (i + 4 == n || !is_digit(text[i + 4]))) {
      ++i;  // the comma
      take_digits();
    }
  }
  std::size_t fraction_digits = 0;
  if (i < n && text[i] == '.') {
    number.mantissa += text[i++];
    fraction_digits = take_digits();
  }
  if (leading_digits == 0 && fraction_digits == 0) {
    fail(kind, input, "it does not start with a number");
  }
  // Exponent, only when digits follow: in "1EB" the E is not an exponent.
  if (i + 1 < n && (text[i] == 'e' || text[i] == 'E')) {
    std::size_t j = i + 1;
    bool negative = false;
    if (text[j] == '+' || text[j] == '-') {
      negative = text[j] == '-';
      ++j;
    }
    if (j < n && is_digit(text[j])) {
      constexpr long kSaturated = 1'000'000;  // far outside a double's range, and no overflow
      long exponent = 0;
      while (j < n && is_digit(text[j])) {
        exponent = std::min(kSaturated, exponent * 10 + (text[j] - '0'));
        ++j;
      }
      number.exponent = negative ? -exponent : exponent;
      i = j;
    }
  }
  number.unit = trim(text.substr(i));
  return number;
}

// A unit as a decimal power and a further factor: "MB" = 10^6 x 1, "MiB" = 10^0 x 1048576, "min" = 10^0 x 60.
// The power of ten is folded into the decimal text before conversion, so "0.25ms" reads as exactly
// the double nearest 0.00025, the same as the C++ literal 0.00025.
struct UnitScale {
  int exponent10 = 0;
  double factor = 1.0;
};

double to_double(const ScannedNumber& number, UnitScale scale, const QuantityKind& kind,
                 std::string_view input) {
  if (number.is_zero) return 0.0;
  const long exponent = number.exponent + scale.exponent10;
  const std::string decimal = number.mantissa + "e" + std::to_string(exponent);
  double value = 0.0;
  const auto [end, error] = std::from_chars(decimal.data(), decimal.data() + decimal.size(), value);
  if (error != std::errc{} || end != decimal.data() + decimal.size() || !std::isfinite(value)) {
    fail(kind, input, "the number is out of range");
  }
  value *= scale.factor;
  if (!std::isfinite(value)) fail(kind, input, "the number is out of range");
  return value;
}

// "k", "M", "Gi" ... as a scale; false when `stem` is no prefix. Case-insensitive.
bool prefix_scale(std::string_view stem, UnitScale& scale) {
  static constexpr std::string_view kLetters = "kmgtp";  // 10^3 ... 10^15, 2^10 ... 2^50
  if (stem.empty()) {
    scale = {};
    return true;
  }
  if (stem.size() > 2) return false;
  const auto position = kLetters.find(lower(stem[0]));
  if (position == std::string_view::npos) return false;
  const int power = static_cast<int>(position) + 1;
  if (stem.size() == 1) {
    scale = {3 * power, 1.0};
    return true;
  }
  if (lower(stem[1]) != 'i') return false;
  scale = {0, std::ldexp(1.0, 10 * power)};
  return true;
}

// A byte or bit prefix as SI and IEC write it: "k" for 10^3 (a capital K is common and accepted too), "M",
// "G", "T", "P"; "Ki", "Mi", "Gi", "Ti", "Pi". `stem` is a prefix that prefix_scale() accepted.
std::string written_prefix(std::string_view stem) {
  if (stem.empty()) return "";
  const char letter = lower(stem[0]);
  if (stem.size() == 2) return std::string(1, static_cast<char>(letter - 'a' + 'A')) + "i";
  return letter == 'k' ? "k" : std::string(1, static_cast<char>(letter - 'a' + 'A'));
}

// Whether a prefix that prefix_scale() accepted is written as a size prefix: "m" is milli, "p" pico, "g" and
// "t" nothing, so "mB" (millibytes) or "gbit" is refused rather than read as "MB" or "Gbit".
bool prefix_letter_is_valid(std::string_view stem) {
  return stem.empty() || stem[0] == 'k' || (stem[0] >= 'A' && stem[0] <= 'Z');
}

// "MB", 10^6 bytes: what a byte or bit prefix stands for, for error messages.
std::string prefix_meaning(std::string_view stem, bool bits) {
  const std::string_view letters = "kmgtp";
  const auto power = static_cast<int>(letters.find(lower(stem[0]))) + 1;
  return stem.size() == 2 ? fmt::format("2^{} {}", 10 * power, bits ? "bits" : "bytes")
                          : fmt::format("10^{} {}", 3 * power, bits ? "bits" : "bytes");
}

// The scale of a byte or bit unit ("MB", "KiB", "Gbit", "bytes"); false when unknown.
// A lone lowercase "b" ("Mb", "kb") throws: it means bits to some and bytes to others. A prefix in the
// wrong case ("mB", "gbit") throws too, naming the unit meant.
bool byte_unit_scale(std::string_view unit, UnitScale& scale, const QuantityKind& kind,
                     std::string_view input) {
  std::string_view stem;
  double base = 1.0;  // bytes per base unit
  if (iends_with(unit, "bytes")) {
    stem = unit.substr(0, unit.size() - 5);
  } else if (iends_with(unit, "byte")) {
    stem = unit.substr(0, unit.size() - 4);
  } else if (iends_with(unit, "bits")) {
    stem = unit.substr(0, unit.size() - 4);
    base = 1.0 / 8.0;
  } else if (iends_with(unit, "bit")) {
    stem = unit.substr(0, unit.size() - 3);
    base = 1.0 / 8.0;
  } else if (!unit.empty() && unit.back() == 'B') {
    stem = unit.substr(0, unit.size() - 1);
  } else if (!unit.empty() && unit.back() == 'b') {
    UnitScale ignored;
    const std::string_view ambiguous_stem = unit.substr(0, unit.size() - 1);
    if (prefix_scale(ambiguous_stem, ignored)) {
      const std::string prefix = written_prefix(ambiguous_stem);
      fail(kind, input,
           fmt::format("{} is ambiguous (bits or bytes?); write {}B for bytes or {}bit for bits", quoted(unit),
                       prefix, prefix));
    }
    return false;
  } else {
    return false;
  }
  if (!prefix_scale(stem, scale)) return false;
  if (!prefix_letter_is_valid(stem)) {
    const bool bits = base < 1.0;
    const std::string meant = written_prefix(stem) + (bits ? "bit" : "B");
    const char* note = stem[0] == 'm' ? " (m is milli)" : stem[0] == 'p' ? " (p is pico)" : "";
    fail(kind, input, fmt::format("{} is not a size unit{}; write {} for {}", quoted(unit), note, meant,
                                  prefix_meaning(stem, bits)));
  }
  scale.factor *= base;
  return true;
}

struct NamedScale {
  std::string_view name;
  UnitScale scale;
};

bool lookup(std::span<const NamedScale> table, std::string_view unit, UnitScale& scale) {
  for (const NamedScale& entry : table) {
    if (iequals(entry.name, unit)) {
      scale = entry.scale;
      return true;
    }
  }
  return false;
}

constexpr NamedScale kTimeUnits[] = {
    {"s", {0, 1.0}},       {"sec", {0, 1.0}},      {"secs", {0, 1.0}},     {"second", {0, 1.0}},
    {"seconds", {0, 1.0}}, {"ms", {-3, 1.0}},      {"msec", {-3, 1.0}},    {"us", {-6, 1.0}},
    {"usec", {-6, 1.0}},   {"\u00b5s", {-6, 1.0}}, {"\u03bcs", {-6, 1.0}}, {"ns", {-9, 1.0}},
    {"nsec", {-9, 1.0}},   {"min", {0, 60.0}},     {"mins", {0, 60.0}},    {"minute", {0, 60.0}},
    {"minutes", {0, 60.0}}, {"h", {0, 3600.0}},    {"hr", {0, 3600.0}},    {"hour", {0, 3600.0}},
    {"hours", {0, 3600.0}},
};
constexpr NamedScale kHertzUnits[] = {
    {"Hz", {0, 1.0}}, {"kHz", {3, 1.0}}, {"MHz", {6, 1.0}}, {"GHz", {9, 1.0}}, {"THz", {12, 1.0}},
};
constexpr NamedScale kCountSuffixes[] = {
    {"", {0, 1.0}}, {"K", {3, 1.0}}, {"M", {6, 1.0}}, {"G", {9, 1.0}}, {"B", {9, 1.0}}, {"T", {12, 1.0}},
};

std::string unknown_unit(std::string_view unit) { return fmt::format("unknown unit {}", quoted(unit)); }

// ---- formatting helpers --------------------------------------------------------------------------

int clamp_digits(int significant_digits) { return std::clamp(significant_digits, 1, 17); }

// `value` (finite, > 0) rounded to `digits` significant digits, and the decimal exponent of the result.
struct Rounded {
  double value;
  int exponent;
};

Rounded round_significant(double value, int digits) {
  const std::string scientific = fmt::format("{:.{}e}", value, digits - 1);  // "1.23e+06"
  Rounded rounded{value, 0};
  std::from_chars(scientific.data(), scientific.data() + scientific.size(), rounded.value);
  std::size_t exponent_start = scientific.find('e') + 1;
  if (scientific[exponent_start] == '+') ++exponent_start;
  std::from_chars(scientific.data() + exponent_start, scientific.data() + scientific.size(),
                  rounded.exponent);
  return rounded;
}

void strip_trailing_zeros(std::string& text) {
  if (text.find('.') == std::string::npos) return;
  while (!text.empty() && text.back() == '0') text.pop_back();
  if (!text.empty() && text.back() == '.') text.pop_back();
}

struct Prefix {
  int exponent10;          // the prefix is 10^exponent10
  std::string_view name;   // "M"
};

constexpr Prefix kDecimalPrefixes[] = {{15, "P"}, {12, "T"}, {9, "G"}, {6, "M"}, {3, "k"}, {0, ""}};
constexpr Prefix kHertzPrefixes[] = {{12, "T"}, {9, "G"}, {6, "M"}, {3, "k"}, {0, ""}};
constexpr Prefix kTimePrefixes[] = {{0, ""}, {-3, "m"}, {-6, "u"}, {-9, "n"}};

// `value` in `unit` with the largest prefix (prefixes listed largest first) in which the rounded
// number's decimal exponent is at least `min_exponent`: 0 puts bytes in [1, 1000), -1 puts seconds
// at 0.1 or more.
std::string format_with_prefix(double value, int digits, std::span<const Prefix> prefixes,
                               std::string_view unit, int min_exponent) {
  digits = clamp_digits(digits);
  if (!std::isfinite(value) || value == 0.0) return fmt::format("{} {}", format_number(value, digits), unit);
  if (value < 0) {
    std::string negative = "-";  // appended, not "-" + ...: GCC 12 -O3 gives a false -Wrestrict warning
    negative += format_with_prefix(-value, digits, prefixes, unit, min_exponent);
    return negative;
  }
  // Choose by the exponent of the unscaled value: dividing first could underflow (1e-309 / 1e15 = 0).
  const int exponent = round_significant(value, digits).exponent;
  for (std::size_t i = 0; i < prefixes.size(); ++i) {
    const int exponent10 = prefixes[i].exponent10;
    if (i + 1 == prefixes.size() || exponent - exponent10 >= min_exponent) {
      // Multiply or divide by an exact power of ten.
      const double scaled = exponent10 >= 0 ? value / std::pow(10.0, exponent10) : value * std::pow(10.0, -exponent10);
      return fmt::format("{} {}{}", format_number(scaled, digits), prefixes[i].name, unit);
    }
  }
  return "";  // not reached: the last prefix always matches
}

}  // namespace

// ---- parsing -------------------------------------------------------------------------------------

double parse_bytes(std::string_view text) {
  const ScannedNumber number = scan_number(text, kBytes);
  UnitScale scale;
  if (number.unit.empty()) return to_double(number, {}, kBytes, text);
  if (!byte_unit_scale(number.unit, scale, kBytes, text)) fail(kBytes, text, unknown_unit(number.unit));
  return to_double(number, scale, kBytes, text);
}

double parse_seconds(std::string_view text) {
  const ScannedNumber number = scan_number(text, kSeconds);
  if (number.unit.empty()) {
    if (number.is_zero) return 0.0;
    const std::string_view number_text = trim(text);
    fail(kSeconds, text, fmt::format("a unit is required ({}s or {}ms?)", number_text, number_text));
  }
  UnitScale scale;
  if (!lookup(kTimeUnits, number.unit, scale)) fail(kSeconds, text, unknown_unit(number.unit));
  return to_double(number, scale, kSeconds, text);
}

double parse_hertz(std::string_view text) {
  const ScannedNumber number = scan_number(text, kHertz);
  if (number.unit.empty()) fail(kHertz, text, "a unit is required");
  UnitScale scale;
  if (!lookup(kHertzUnits, number.unit, scale)) fail(kHertz, text, unknown_unit(number.unit));
  return to_double(number, scale, kHertz, text);
}

double parse_bandwidth(std::string_view text) {
  const ScannedNumber number = scan_number(text, kBandwidth);
  if (number.unit.empty()) fail(kBandwidth, text, "a unit is required");
  std::string_view per_unit = number.unit;
  if (iends_with(per_unit, "/sec")) {
    per_unit.remove_suffix(4);
  } else if (iends_with(per_unit, "/s")) {
    per_unit.remove_suffix(2);
  } else {
    UnitScale ignored;
    if (byte_unit_scale(per_unit, ignored, kBandwidth, text)) {
      fail(kBandwidth, text, fmt::format("{} is a size, not a rate; write {}/s", quoted(per_unit), per_unit));
    }
    fail(kBandwidth, text, unknown_unit(number.unit));
  }
  UnitScale scale;
  if (per_unit.empty() || !byte_unit_scale(per_unit, scale, kBandwidth, text)) {
    fail(kBandwidth, text, unknown_unit(number.unit));
  }
  return to_double(number, scale, kBandwidth, text);
}

double parse_count(std::string_view text) {
  const ScannedNumber number = scan_number(text, kCount);
  UnitScale scale;
  if (!lookup(kCountSuffixes, number.unit, scale)) fail(kCount, text, unknown_unit(number.unit));
  return to_double(number, scale, kCount, text);
}

std::int64_t parse_whole_count(std::string_view text) {
  // Plain digits are read as an integer, exactly: a double does not hold every integer above 2^53.
  const std::string_view digits = trim(text);
  if (!digits.empty() && std::all_of(digits.begin(), digits.end(), is_digit)) {
    std::int64_t exact = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), exact);
    if (error != std::errc{} || end != digits.data() + digits.size()) {
      fail(kCount, text, "it does not fit in a 64-bit integer");
    }
    return exact;
  }
  const double value = parse_count(text);
  if (value != std::floor(value)) fail(kCount, text, "a whole number is required");
  constexpr double kTwoTo63 = 9223372036854775808.0;
  if (value >= kTwoTo63) fail(kCount, text, "it does not fit in a 64-bit integer");
  return static_cast<std::int64_t>(value);
}

namespace {
[[noreturn]] void fail_shape(std::string_view input, std::string_view why) {
  throw InvalidArgument(fmt::format(
      "Expected a shape like 1000x1000, 4,4 or (2, 3, 4) (whole dimensions >= 0 separated by x or "
      "commas; () for a scalar), got {}: {}",
      quoted(input), why));
}
}  // namespace

std::vector<std::int64_t> parse_shape(std::string_view input) {
  std::string_view text = trim(input);
  if (text.empty()) fail_shape(input, "it is empty");
  if (text.front() == '(' || text.front() == '[') {
    const char close = text.front() == '(' ? ')' : ']';
    if (text.size() < 2 || text.back() != close) fail_shape(input, fmt::format("the '{}' is not closed", text.front()));
    text = trim(text.substr(1, text.size() - 2));
    if (text.empty()) return {};  // a scalar
  }

  std::vector<std::int64_t> shape;
  std::size_t i = 0;
  const std::size_t n = text.size();
  auto skip_spaces = [&] {
    while (i < n && is_space(text[i])) ++i;
  };
  while (true) {
    skip_spaces();
    const std::size_t start = i;
    if (i < n && text[i] == '-') {
      ++i;
      while (i < n && is_digit(text[i])) ++i;
      fail_shape(input, fmt::format("dimension {} is negative", text.substr(start, i - start)));
    }
    while (i < n && is_digit(text[i])) ++i;
    if (i == start) {
      fail_shape(input, i < n ? fmt::format("expected a dimension at {}", quoted(text.substr(i, 1)))
                       : std::string("it ends where a dimension was expected"));
    }
    std::int64_t dimension = 0;
    const auto [end, error] = std::from_chars(text.data() + start, text.data() + i, dimension);
    if (error != std::errc{} || end != text.data() + i) {
      fail_shape(input, fmt::format("dimension {} does not fit in a 64-bit integer", text.substr(start, i - start)));
    }
    shape.push_back(dimension);
    skip_spaces();
    if (i == n) break;
    const char c = text[i];
    if (c == 'x' || c == 'X' || c == '*' || c == ',') {
      i += 1;
    } else if (text.substr(i, 2) == "\u00d7") {  // ×
      i += 2;
    } else {
      fail_shape(input, fmt::format("unexpected {} after a dimension", quoted(text.substr(i, 1))));
    }
  }
  return shape;
}

// ---- formatting ----------------------------------------------------------------------------------

std::string format_number(double value, int significant_digits) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0.0) return "0";
  const int digits = clamp_digits(significant_digits);
  std::string sign = value < 0 ? "-" : "";
  const double magnitude = std::fabs(value);
  const Rounded rounded = round_significant(magnitude, digits);
  std::string text;
  if (rounded.exponent >= -5 && rounded.exponent < 15) {
    const int decimals = std::max(0, digits - 1 - rounded.exponent);
    text = fmt::format("{:.{}f}", rounded.value, decimals);
    strip_trailing_zeros(text);
  } else {
    const std::string scientific = fmt::format("{:.{}e}", magnitude, digits - 1);
    const auto e = scientific.find('e');
    std::string mantissa = scientific.substr(0, e);
    strip_trailing_zeros(mantissa);
    text = mantissa + scientific.substr(e);
  }
  sign += text;
  return sign;
}

std::string format_bytes(double bytes, int significant_digits) {
  return format_with_prefix(bytes, significant_digits, kDecimalPrefixes, "B", 0);
}

std::string format_seconds(double seconds, int significant_digits) {
  return format_with_prefix(seconds, significant_digits, kTimePrefixes, "s", -1);
}

std::string format_bandwidth(double bytes_per_second, int significant_digits) {
  return format_with_prefix(bytes_per_second, significant_digits, kDecimalPrefixes, "B/s", 0);
}

std::string format_hertz(double hertz, int significant_digits) {
  return format_with_prefix(hertz, significant_digits, kHertzPrefixes, "Hz", 0);
}

std::string format_thousands(std::int64_t value) {
  // The magnitude as unsigned, so that INT64_MIN has one too.
  const std::uint64_t magnitude =
      value < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(value) : static_cast<std::uint64_t>(value);
  const std::string digits = std::to_string(magnitude);
  std::string out = value < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string format_ordinal(std::int64_t n) {
  const std::int64_t last_two = n % 100;
  const char* suffix = "th";
  if (last_two < 11 || last_two > 13) {
    if (n % 10 == 1) suffix = "st";
    if (n % 10 == 2) suffix = "nd";
    if (n % 10 == 3) suffix = "rd";
  }
  return format_thousands(n) + suffix;
}

}  // namespace ferry
