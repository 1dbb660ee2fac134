// ferry/units.h — read and write quantities the way the exercise sheet writes them: 4 MB, 16 GB/s, 5 ms, 1.5 GHz, 25M, 1000x1000.
// Not here: any arithmetic on them (ferry/cost_model.h) or what a device measures (ferry/ledger.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// ---- parsing -------------------------------------------------------------------------------------
// Every parser accepts a non-negative decimal number ("4", "0.25", ".5", "1e6", "25,000,000") followed,
// after optional spaces, by a unit. Leading and trailing spaces are ignored. Empty text, a negative
// number, NaN/inf, an unknown unit, trailing garbage or a result too large for a double all throw
// ferry::InvalidArgument with one line that quotes the input and lists the accepted units.
// Prefixes are decimal (k = 1e3, M = 1e6, G = 1e9, T = 1e12, P = 1e15), as on the sheet
// ("1 MB = 10^6 bytes", "1 GB = 10^9 bytes"); Ki, Mi, Gi, Ti, Pi are binary (2^10, 2^20, ...).
// Size prefixes are written as SI and IEC write them (k or K, M, G, T, P; Ki, Mi, Gi, Ti, Pi): "mB" would be
// millibytes and is refused, naming "MB". A lone lowercase "b" is refused as ambiguous (bits or bytes?).

// bytes. "4MB" -> 4e6, "1.5 GiB" -> 1610612736, "4000000" -> 4e6 (a bare number is bytes),
// "8Mbit" -> 1e6 (bits are divided by 8). Units: B, kB, MB, GB, TB, PB, KiB ... PiB, bit, kbit ...
double parse_bytes(std::string_view text);

// seconds. "5ms" -> 0.005, "0.1s" -> 0.1, "20us" -> 2e-5, "1ns" -> 1e-9, "2min" -> 120, "1h" -> 3600.
// Units: s, ms, us (also µs, μs), ns, min, h. A bare number is refused (is "5" seconds or ms?),
// except zero: "0" -> 0.
double parse_seconds(std::string_view text);

// hertz. "1.5GHz" -> 1.5e9, "3000MHz" -> 3e9. Units: Hz, kHz, MHz, GHz, THz. A unit is required.
double parse_hertz(std::string_view text);

// bytes per second. "16GB/s" -> 16e9, "900 GB/s" -> 9e11, "55.1GiB/s", "100MB/s", "400Gbit/s" -> 5e10.
// Units: any byte or bit unit of parse_bytes followed by "/s" (or "/sec"). A unit is required.
double parse_bandwidth(std::string_view text);

// a plain count (parameters, cores, steps). "25M" -> 25e6, "7B" -> 7e9 (B = billion here, not bytes),
// "8000" -> 8000, "1.5K" -> 1500. Suffixes: K, M, G (= B, billion), T; case-insensitive.
double parse_count(std::string_view text);

// a count that must be a whole number that fits in int64: "25M" -> 25000000; "2.5" throws.
std::int64_t parse_whole_count(std::string_view text);

// a tensor shape: "1000x1000", "4,4", "2 x 3 x 4", "(2, 3)", "[2,3]", "2*3", "2×3" -> {2, 3}.
// "()" or "[]" is the shape of a scalar: {}. Dimensions are whole numbers >= 0 that fit in int64.
std::vector<std::int64_t> parse_shape(std::string_view text);

// ---- formatting ----------------------------------------------------------------------------------
// Formatters never throw for any double (they are fuzzed): NaN and infinities print as "nan"/"inf",
// negative values get a leading "-". significant_digits is clamped to [1, 17]. Trailing zeros are
// dropped: 4e6 -> "4 MB", not "4.00 MB". What they print, the parsers above read back.

// 4e6 -> "4 MB", 1234567 -> "1.23 MB", 200e6 -> "200 MB", 512 -> "512 B". Decimal prefixes, chosen so
// that the number is in [1, 1000).
std::string format_bytes(double bytes, int significant_digits = 3);

// 0.00025 -> "0.25 ms", 0.1 -> "0.1 s", 5e-3 -> "5 ms", 26 -> "26 s", 2e-8 -> "20 ns". The largest of
// s, ms, us, ns in which the number is at least 0.1 (the sheet's "0.25 ms", "0.1 s").
std::string format_seconds(double seconds, int significant_digits = 3);

// 16e9 -> "16 GB/s" (the prefixes of format_bytes).
std::string format_bandwidth(double bytes_per_second, int significant_digits = 3);

// 1.5e9 -> "1.5 GHz", 3e9 -> "3 GHz" (Hz, kHz, MHz, GHz, THz).
std::string format_hertz(double hertz, int significant_digits = 3);

// A plain number with the given significant digits and no unit: 31.25 -> "31.25", 250.0 -> "250",
// 0.00025 -> "0.00025", 1e20 -> "1e+20" (exponent form outside [1e-5, 1e15)).
std::string format_number(double value, int significant_digits = 6);

// An integer with thousands separators: 1000000 -> "1,000,000", -1234 -> "-1,234".
std::string format_thousands(std::int64_t value);

// An ordinal with thousands separators: 1 -> "1st", 2 -> "2nd", 112 -> "112th", 1001 -> "1,001st".
std::string format_ordinal(std::int64_t n);

}  // namespace ferry
