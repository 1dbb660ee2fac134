// tests/test_units.cpp — the unit parsers and formatters of ferry/units.h: the sheet's notation, edge cases, bad input,
// and a small deterministic fuzz. Not here: the cost arithmetic (test_cost_model.cpp).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ferry/error.h"
#include "ferry/units.h"

namespace {

using Shape = std::vector<std::int64_t>;

// The message of the ferry::InvalidArgument that `f` throws; fails the test when it throws nothing
// or something else. Every message must be one line.
template <typename F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const ferry::InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "expected ferry::InvalidArgument";
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- bytes ---------------------------------------------------------------------------------------

TEST(Units, BytesDecimalAsTheSheetWritesThem) {
  EXPECT_EQ(ferry::parse_bytes("4MB"), 4e6);
  EXPECT_EQ(ferry::parse_bytes("4 MB"), 4e6);
  EXPECT_EQ(ferry::parse_bytes("1KB"), 1e3);
  EXPECT_EQ(ferry::parse_bytes("1kB"), 1e3);
  EXPECT_EQ(ferry::parse_bytes("1GB"), 1e9);
  EXPECT_EQ(ferry::parse_bytes("200 MB"), 200e6);
  EXPECT_EQ(ferry::parse_bytes("2TB"), 2e12);
  EXPECT_EQ(ferry::parse_bytes("1PB"), 1e15);
  EXPECT_EQ(ferry::parse_bytes("4000000"), 4e6);  // a bare number is bytes
  EXPECT_EQ(ferry::parse_bytes("512B"), 512);
  EXPECT_EQ(ferry::parse_bytes("512 bytes"), 512);
  EXPECT_EQ(ferry::parse_bytes("1 byte"), 1);
  EXPECT_EQ(ferry::parse_bytes("0"), 0);
  EXPECT_EQ(ferry::parse_bytes("0MB"), 0);
  EXPECT_EQ(ferry::parse_bytes("  4MB\t"), 4e6);
  EXPECT_EQ(ferry::parse_bytes("4 Mbytes"), 4e6);
}

TEST(Units, BytePrefixesAreWrittenAsSiWritesThem) {
  // k or K for 10^3; M, G, T, P capital; binary Ki ... Pi.
  EXPECT_EQ(ferry::parse_bytes("1kB"), 1e3);
  EXPECT_EQ(ferry::parse_bytes("1KB"), 1e3);
  EXPECT_EQ(ferry::parse_bytes("1kbit"), 125);
  EXPECT_EQ(ferry::parse_bytes("1Kbit"), 125);
  EXPECT_EQ(ferry::parse_bytes("1KiB"), 1024);
  EXPECT_EQ(ferry::parse_bytes("1Kibit"), 128);
  // m is milli (millibytes are no size), p pico; g and t are no prefix: refused, naming the unit meant.
  const std::string milli = invalid_argument_message([] { ferry::parse_bytes("4mB"); });
  EXPECT_TRUE(contains(milli, "\"mB\"")) << milli;
  EXPECT_TRUE(contains(milli, "milli")) << milli;
  EXPECT_TRUE(contains(milli, "write MB for 10^6 bytes")) << milli;
  EXPECT_TRUE(contains(invalid_argument_message([] { ferry::parse_bytes("4gB"); }), "write GB for 10^9 bytes"));
  EXPECT_TRUE(contains(invalid_argument_message([] { ferry::parse_bytes("4mbit"); }), "write Mbit for 10^6 bits"));
  EXPECT_TRUE(contains(invalid_argument_message([] { ferry::parse_bytes("4pB"); }), "write PB"));
  EXPECT_TRUE(contains(invalid_argument_message([] { ferry::parse_bytes("4miB"); }), "write MiB for 2^20 bytes"));
  EXPECT_TRUE(contains(invalid_argument_message([] { ferry::parse_bytes("4 mbytes"); }), "write MB"));
  EXPECT_TRUE(contains(invalid_argument_message([] { ferry::parse_bandwidth("16gB/s"); }), "write GB"));
}

TEST(Units, BytesBinary) {
  EXPECT_EQ(ferry::parse_bytes("1KiB"), 1024);
  EXPECT_EQ(ferry::parse_bytes("1MiB"), 1048576);
  EXPECT_EQ(ferry::parse_bytes("1.5GiB"), 1.5 * 1073741824.0);
  EXPECT_EQ(ferry::parse_bytes("1TiB"), 1099511627776.0);
}

TEST(Units, BytesDecimalNumbersAreExact) {
  // The power of ten is folded in before conversion: the same double as the C++ literal.
  EXPECT_EQ(ferry::parse_bytes("1.1MB"), 1.1e6);
  EXPECT_EQ(ferry::parse_bytes("0.3kB"), 0.3e3);
  EXPECT_EQ(ferry::parse_bytes("1e6"), 1e6);
  EXPECT_EQ(ferry::parse_bytes("2.5e3 MB"), 2.5e9);
  EXPECT_EQ(ferry::parse_bytes(".5MB"), 5e5);
  EXPECT_EQ(ferry::parse_bytes("5.MB"), 5e6);
  EXPECT_EQ(ferry::parse_bytes("25,000,000"), 25e6);  // thousands separators
}

TEST(Units, BytesBits) {
  EXPECT_EQ(ferry::parse_bytes("8bit"), 1);
  EXPECT_EQ(ferry::parse_bytes("8Mbit"), 1e6);
  EXPECT_EQ(ferry::parse_bytes("1 bits"), 0.125);
}

TEST(Units, BytesRejectsBadInput) {
  for (const char* bad : {"", "   ", "-4MB", "4XB", "MB", "4 M B", "4MBx", "nan", "NaN MB", "inf", "infinity",
                          "1e400", "1e400 MB", "1e308 PB", "0x10", "4,4", "1,5MB", "1,0000", "four MB", "4 GB/s",
                          "+4MB", "4MB 5MB", "--4", "4..5MB", "4e", "1EB"}) {
    SCOPED_TRACE(bad);
    invalid_argument_message([&] { ferry::parse_bytes(bad); });
  }
}

TEST(Units, BytesErrorQuotesInputAndListsUnits) {
  const std::string message = invalid_argument_message([] { ferry::parse_bytes("4XB"); });
  EXPECT_TRUE(contains(message, "\"4XB\"")) << message;
  EXPECT_TRUE(contains(message, "MB")) << message;
  EXPECT_TRUE(contains(message, "GiB")) << message;
  EXPECT_TRUE(contains(invalid_argument_message([] { ferry::parse_bytes("-3MB"); }), "negative"));
}

TEST(Units, LowercaseBIsAmbiguous) {
  const std::string message = invalid_argument_message([] { ferry::parse_bytes("100Mb"); });
  EXPECT_TRUE(contains(message, "ambiguous")) << message;
  EXPECT_TRUE(contains(message, "MB")) << message;
  EXPECT_TRUE(contains(message, "Mbit")) << message;
  invalid_argument_message([] { ferry::parse_bandwidth("100Gb/s"); });
  invalid_argument_message([] { ferry::parse_bytes("4b"); });
  // The suggestion writes the prefix as SI does, whatever case was typed: never "mB" (millibytes) or "gB".
  for (const auto& [typed, meant] : {std::pair{"4mb", "write MB for bytes or Mbit for bits"},
                                     std::pair{"4gb", "write GB for bytes or Gbit for bits"},
                                     std::pair{"4kb", "write kB for bytes or kbit for bits"},
                                     std::pair{"4Kb", "write kB for bytes or kbit for bits"},
                                     std::pair{"4Kib", "write KiB for bytes or Kibit for bits"},
                                     std::pair{"4kib", "write KiB for bytes or Kibit for bits"}}) {
    SCOPED_TRACE(typed);
    const std::string suggestion = invalid_argument_message([&] { ferry::parse_bytes(typed); });
    EXPECT_TRUE(contains(suggestion, meant)) << suggestion;
  }
  const std::string rate = invalid_argument_message([] { ferry::parse_bandwidth("16gb/s"); });
  EXPECT_TRUE(contains(rate, "write GB for bytes or Gbit for bits")) << rate;
}

// ---- seconds -------------------------------------------------------------------------------------

TEST(Units, Seconds) {
  EXPECT_EQ(ferry::parse_seconds("5ms"), 0.005);
  EXPECT_EQ(ferry::parse_seconds("20 ms"), 0.020);
  EXPECT_EQ(ferry::parse_seconds("0.1s"), 0.1);
  EXPECT_EQ(ferry::parse_seconds("0.7 s"), 0.7);
  EXPECT_EQ(ferry::parse_seconds("0.25ms"), 0.00025);
  EXPECT_EQ(ferry::parse_seconds("20us"), 20e-6);
  EXPECT_EQ(ferry::parse_seconds("20\u00b5s"), 20e-6);  // micro sign
  EXPECT_EQ(ferry::parse_seconds("20\u03bcs"), 20e-6);  // Greek mu
  EXPECT_EQ(ferry::parse_seconds("1ns"), 1e-9);
  EXPECT_EQ(ferry::parse_seconds("2min"), 120);
  EXPECT_EQ(ferry::parse_seconds("1h"), 3600);
  EXPECT_EQ(ferry::parse_seconds("3 seconds"), 3);
  EXPECT_EQ(ferry::parse_seconds("5MS"), 0.005);  // case-insensitive
  EXPECT_EQ(ferry::parse_seconds("0"), 0);        // zero needs no unit (Exercise 3.2's T_transfer = 0)
  EXPECT_EQ(ferry::parse_seconds("0.0"), 0);
}

TEST(Units, SecondsRejectsBadInput) {
  for (const char* bad : {"5", "0.1", "", "-5ms", "5 parsecs", "5ms5", "ms", "5 m s", "nan s", "1e999s"}) {
    SCOPED_TRACE(bad);
    invalid_argument_message([&] { ferry::parse_seconds(bad); });
  }
  const std::string message = invalid_argument_message([] { ferry::parse_seconds("5"); });
  EXPECT_TRUE(contains(message, "unit")) << message;
  EXPECT_TRUE(contains(message, "ms")) << message;
}

// ---- hertz ---------------------------------------------------------------------------------------

TEST(Units, Hertz) {
  EXPECT_EQ(ferry::parse_hertz("1.5GHz"), 1.5e9);
  EXPECT_EQ(ferry::parse_hertz("3 GHz"), 3e9);
  EXPECT_EQ(ferry::parse_hertz("3000MHz"), 3e9);
  EXPECT_EQ(ferry::parse_hertz("100kHz"), 1e5);
  EXPECT_EQ(ferry::parse_hertz("60Hz"), 60);
  EXPECT_EQ(ferry::parse_hertz("1THz"), 1e12);
  EXPECT_EQ(ferry::parse_hertz("1.5ghz"), 1.5e9);
}

TEST(Units, HertzRejectsBadInput) {
  for (const char* bad : {"1.5", "1.5G", "1.5 GB", "-1GHz", "", "GHz", "1.5GHzz"}) {
    SCOPED_TRACE(bad);
    invalid_argument_message([&] { ferry::parse_hertz(bad); });
  }
}

// ---- bandwidth -----------------------------------------------------------------------------------

TEST(Units, Bandwidth) {
  EXPECT_EQ(ferry::parse_bandwidth("16GB/s"), 16e9);
  EXPECT_EQ(ferry::parse_bandwidth("900 GB/s"), 900e9);
  EXPECT_EQ(ferry::parse_bandwidth("100MB/s"), 100e6);
  EXPECT_EQ(ferry::parse_bandwidth("55.1GiB/s"), 55.1 * 1073741824.0);
  EXPECT_EQ(ferry::parse_bandwidth("4.8TB/s"), 4.8e12);
  EXPECT_EQ(ferry::parse_bandwidth("400Gbit/s"), 50e9);
  EXPECT_EQ(ferry::parse_bandwidth("16 GB/sec"), 16e9);
  EXPECT_EQ(ferry::parse_bandwidth("1B/s"), 1);
}

TEST(Units, BandwidthRejectsBadInput) {
  for (const char* bad : {"16", "16GB", "16/s", "16 GB / s", "16GB/h", "-16GB/s", "", "16XB/s", "GB/s"}) {
    SCOPED_TRACE(bad);
    invalid_argument_message([&] { ferry::parse_bandwidth(bad); });
  }
  const std::string message = invalid_argument_message([] { ferry::parse_bandwidth("16GB"); });
  EXPECT_TRUE(contains(message, "16GB/s")) << message;  // suggests the fix
}

// ---- counts --------------------------------------------------------------------------------------

TEST(Units, Counts) {
  EXPECT_EQ(ferry::parse_count("25M"), 25e6);
  EXPECT_EQ(ferry::parse_count("25m"), 25e6);
  EXPECT_EQ(ferry::parse_count("8000"), 8000);
  EXPECT_EQ(ferry::parse_count("1.5K"), 1500);
  EXPECT_EQ(ferry::parse_count("7B"), 7e9);  // billion
  EXPECT_EQ(ferry::parse_count("2G"), 2e9);
  EXPECT_EQ(ferry::parse_count("1T"), 1e12);
  EXPECT_EQ(ferry::parse_count("25,000,000"), 25e6);
  EXPECT_EQ(ferry::parse_count("250"), 250);
  EXPECT_EQ(ferry::parse_count("31.25"), 31.25);
}

TEST(Units, CountsRejectBadInput) {
  for (const char* bad : {"", "-4", "25MB", "25 million", "x", "4,4", "nan", "1e999"}) {
    SCOPED_TRACE(bad);
    invalid_argument_message([&] { ferry::parse_count(bad); });
  }
}

TEST(Units, WholeCounts) {
  EXPECT_EQ(ferry::parse_whole_count("25M"), 25'000'000);
  EXPECT_EQ(ferry::parse_whole_count("4"), 4);
  EXPECT_EQ(ferry::parse_whole_count("0"), 0);
  EXPECT_EQ(ferry::parse_whole_count("1.5K"), 1500);
  EXPECT_EQ(ferry::parse_whole_count("9223372036854775807"), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(ferry::parse_whole_count("9007199254740993"), 9007199254740993LL);  // exact above 2^53
  invalid_argument_message([] { ferry::parse_whole_count("2.5"); });
  invalid_argument_message([] { ferry::parse_whole_count("9223372036854775808"); });
  invalid_argument_message([] { ferry::parse_whole_count("1e19"); });
  invalid_argument_message([] { ferry::parse_whole_count("-1"); });
}

// ---- shapes --------------------------------------------------------------------------------------

TEST(Units, Shapes) {
  EXPECT_EQ(ferry::parse_shape("1000x1000"), (Shape{1000, 1000}));
  EXPECT_EQ(ferry::parse_shape("4,4"), (Shape{4, 4}));
  EXPECT_EQ(ferry::parse_shape("2 x 3 x 4"), (Shape{2, 3, 4}));
  EXPECT_EQ(ferry::parse_shape("(2, 3)"), (Shape{2, 3}));
  EXPECT_EQ(ferry::parse_shape("[2,3]"), (Shape{2, 3}));
  EXPECT_EQ(ferry::parse_shape("2*3"), (Shape{2, 3}));
  EXPECT_EQ(ferry::parse_shape("2X3"), (Shape{2, 3}));
  EXPECT_EQ(ferry::parse_shape("2\u00d73"), (Shape{2, 3}));
  EXPECT_EQ(ferry::parse_shape("10"), (Shape{10}));
  EXPECT_EQ(ferry::parse_shape("0x5"), (Shape{0, 5}));
  EXPECT_EQ(ferry::parse_shape("()"), Shape{});
  EXPECT_EQ(ferry::parse_shape("[ ]"), Shape{});
  EXPECT_EQ(ferry::parse_shape("9223372036854775807"), (Shape{std::numeric_limits<std::int64_t>::max()}));
}

TEST(Units, ShapesRejectBadInput) {
  for (const char* bad : {"", "x", "4x", "x4", "4xx4", "4x-3", "-3x4", "4.5x2", "4x4)", "(4x4", "[4x4)", "4 4",
                          "1e3x4", "9223372036854775808", "4;4", "(", "4x4x"}) {
    SCOPED_TRACE(bad);
    invalid_argument_message([&] { ferry::parse_shape(bad); });
  }
  const std::string message = invalid_argument_message([] { ferry::parse_shape("-3x4"); });
  EXPECT_TRUE(contains(message, "\"-3x4\"")) << message;
  EXPECT_TRUE(contains(message, "negative")) << message;
}

// ---- formatting ----------------------------------------------------------------------------------

TEST(Units, FormatBytes) {
  EXPECT_EQ(ferry::format_bytes(4e6), "4 MB");
  EXPECT_EQ(ferry::format_bytes(200e6), "200 MB");
  EXPECT_EQ(ferry::format_bytes(150e6), "150 MB");
  EXPECT_EQ(ferry::format_bytes(1234567), "1.23 MB");
  EXPECT_EQ(ferry::format_bytes(512), "512 B");
  EXPECT_EQ(ferry::format_bytes(0), "0 B");
  EXPECT_EQ(ferry::format_bytes(1000), "1 kB");
  EXPECT_EQ(ferry::format_bytes(999999), "1 MB");  // rounds up into the next prefix, not "1000 kB"
  EXPECT_EQ(ferry::format_bytes(999499), "999 kB");
  EXPECT_EQ(ferry::format_bytes(16e9), "16 GB");
  EXPECT_EQ(ferry::format_bytes(0.5), "0.5 B");
  EXPECT_EQ(ferry::format_bytes(-4e6), "-4 MB");
  EXPECT_EQ(ferry::format_bytes(1234567, 5), "1.2346 MB");
  EXPECT_EQ(ferry::format_bytes(5e18), "5000 PB");
}

TEST(Units, FormatSeconds) {
  EXPECT_EQ(ferry::format_seconds(0.00025), "0.25 ms");
  EXPECT_EQ(ferry::format_seconds(0.1), "0.1 s");
  EXPECT_EQ(ferry::format_seconds(0.7), "0.7 s");
  EXPECT_EQ(ferry::format_seconds(5e-3), "5 ms");
  EXPECT_EQ(ferry::format_seconds(0.025), "25 ms");
  EXPECT_EQ(ferry::format_seconds(26), "26 s");
  EXPECT_EQ(ferry::format_seconds(25.01, 6), "25.01 s");
  EXPECT_EQ(ferry::format_seconds(2e-8), "20 ns");
  EXPECT_EQ(ferry::format_seconds(5e-5), "50 us");
  EXPECT_EQ(ferry::format_seconds(0), "0 s");
  EXPECT_EQ(ferry::format_seconds(3600), "3600 s");
}

TEST(Units, FormatBandwidthHertzNumbers) {
  EXPECT_EQ(ferry::format_bandwidth(16e9), "16 GB/s");
  EXPECT_EQ(ferry::format_bandwidth(900e9), "900 GB/s");
  EXPECT_EQ(ferry::format_bandwidth(4.8e12), "4.8 TB/s");
  EXPECT_EQ(ferry::format_hertz(1.5e9), "1.5 GHz");
  EXPECT_EQ(ferry::format_hertz(3e9), "3 GHz");
  EXPECT_EQ(ferry::format_number(31.25), "31.25");
  EXPECT_EQ(ferry::format_number(250.0), "250");
  EXPECT_EQ(ferry::format_number(0.00025), "0.00025");
  EXPECT_EQ(ferry::format_number(0.125), "0.125");
  EXPECT_EQ(ferry::format_number(1e20), "1e+20");
  EXPECT_EQ(ferry::format_number(1e-7), "1e-07");
  EXPECT_EQ(ferry::format_number(-2.5), "-2.5");
  EXPECT_EQ(ferry::format_number(25.009999999999998), "25.01");
  EXPECT_EQ(ferry::format_thousands(1'000'000), "1,000,000");
  EXPECT_EQ(ferry::format_thousands(999), "999");
  EXPECT_EQ(ferry::format_thousands(0), "0");
  EXPECT_EQ(ferry::format_thousands(-1234), "-1,234");
  EXPECT_EQ(ferry::format_thousands(std::numeric_limits<std::int64_t>::min()), "-9,223,372,036,854,775,808");
}

TEST(Units, FormatOrdinal) {
  EXPECT_EQ(ferry::format_ordinal(1), "1st");
  EXPECT_EQ(ferry::format_ordinal(2), "2nd");
  EXPECT_EQ(ferry::format_ordinal(3), "3rd");
  EXPECT_EQ(ferry::format_ordinal(4), "4th");
  EXPECT_EQ(ferry::format_ordinal(11), "11th");
  EXPECT_EQ(ferry::format_ordinal(12), "12th");
  EXPECT_EQ(ferry::format_ordinal(13), "13th");
  EXPECT_EQ(ferry::format_ordinal(21), "21st");
  EXPECT_EQ(ferry::format_ordinal(100), "100th");
  EXPECT_EQ(ferry::format_ordinal(112), "112th");
  EXPECT_EQ(ferry::format_ordinal(1001), "1,001st");
}

TEST(Units, FormatNonFiniteAndExtremeValues) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(ferry::format_bytes(kNaN), "nan B");
  EXPECT_EQ(ferry::format_bytes(kInf), "inf B");
  EXPECT_EQ(ferry::format_seconds(-kInf), "-inf s");
  EXPECT_EQ(ferry::format_number(kNaN), "nan");
  EXPECT_EQ(ferry::format_number(-0.0), "0");
  EXPECT_EQ(ferry::format_bytes(std::numeric_limits<double>::max()), "1.8e+293 PB");
  EXPECT_EQ(ferry::format_seconds(std::numeric_limits<double>::denorm_min()), "4.94e-315 ns");
  EXPECT_EQ(ferry::format_number(1.0, 0), "1");     // digits clamped to 1
  EXPECT_EQ(ferry::format_number(1.0, 1000), "1");  // and to 17
}

TEST(Units, FormattedQuantitiesParseBack) {
  for (double bytes : {0.0, 1.0, 512.0, 4e6, 1234567.0, 200e6, 16e9, 9.99e14, 3e17}) {
    SCOPED_TRACE(bytes);
    EXPECT_NEAR(ferry::parse_bytes(ferry::format_bytes(bytes)), bytes, bytes * 5e-3);
    EXPECT_NEAR(ferry::parse_bandwidth(ferry::format_bandwidth(bytes + 1)), bytes + 1, (bytes + 1) * 5e-3);
  }
  for (double seconds : {0.0, 1e-9, 2.5e-4, 5e-3, 0.1, 26.0, 1e5}) {
    SCOPED_TRACE(seconds);
    EXPECT_NEAR(ferry::parse_seconds(ferry::format_seconds(seconds)), seconds, seconds * 5e-3);
  }
  EXPECT_EQ(ferry::parse_hertz(ferry::format_hertz(1.5e9)), 1.5e9);
}

// ---- a small deterministic fuzz ------------------------------------------------------------------

// Parsers return a finite value >= 0 or throw ferry::InvalidArgument with a one-line message, for
// any bytes at all; formatters never throw and never print a newline, for any double at all.
TEST(Units, FuzzParsersOnlyThrowInvalidArgument) {
  std::mt19937_64 random(20261130);
  const std::string alphabet = "0123456789.,eE+-xX*()[] \tkKmMgGtTpPiIbBsSuUnNhHzZ/\u00b5\u00d7\n\x01\xff";
  for (int trial = 0; trial < 20000; ++trial) {
    std::string text;
    const std::size_t length = random() % 14;
    for (std::size_t i = 0; i < length; ++i) text += alphabet[random() % alphabet.size()];
    auto check_value = [&](auto parse) {
      try {
        const double value = parse(text);
        EXPECT_TRUE(std::isfinite(value) && value >= 0) << '"' << text << "\" -> " << value;
      } catch (const ferry::InvalidArgument& error) {
        EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << error.what();
      }
    };
    check_value([](const std::string& t) { return ferry::parse_bytes(t); });
    check_value([](const std::string& t) { return ferry::parse_seconds(t); });
    check_value([](const std::string& t) { return ferry::parse_hertz(t); });
    check_value([](const std::string& t) { return ferry::parse_bandwidth(t); });
    check_value([](const std::string& t) { return ferry::parse_count(t); });
    check_value([](const std::string& t) { return static_cast<double>(ferry::parse_whole_count(t)); });
    try {
      for (std::int64_t dimension : ferry::parse_shape(text)) EXPECT_GE(dimension, 0) << text;
    } catch (const ferry::InvalidArgument&) {
    }
  }
}

TEST(Units, FuzzFormattersAcceptEveryDouble) {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 20000; ++trial) {
    const std::uint64_t bits = random();
    double value = 0;
    std::memcpy(&value, &bits, sizeof value);  // every bit pattern: NaNs, infinities, subnormals
    const int digits = static_cast<int>(random() % 40) - 10;
    for (const std::string& text : {ferry::format_bytes(value, digits), ferry::format_seconds(value, digits),
                                    ferry::format_bandwidth(value, digits), ferry::format_hertz(value, digits),
                                    ferry::format_number(value, digits)}) {
      EXPECT_FALSE(text.empty());
      EXPECT_EQ(text.find('\n'), std::string::npos) << text;
    }
    // Finite non-negative quantities read back (to the digits printed).
    if (std::isfinite(value) && value >= 0) {
      const double back = ferry::parse_bytes(ferry::format_bytes(value, 17));
      EXPECT_NEAR(back, value, value * 1e-15) << ferry::format_bytes(value, 17);
    }
  }
}

}  // namespace
