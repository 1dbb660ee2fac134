// Tests for src/core/environment.h: every FERRY_* switch reads on and off the same way, and refuses anything else
// with the variable and its value in the message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../src/core/environment.h"
#include "ferry/error.h"

namespace {

constexpr const char* kName = "FERRY_TEST_ENVIRONMENT_SWITCH";

// Sets kName for one scope (unset when `value` is null), and unsets it after.
struct Setting {
  explicit Setting(const char* value) {
    if (value) setenv(kName, value, 1);
    else unsetenv(kName);
  }
  ~Setting() { unsetenv(kName); }
};

TEST(Environment, SwitchReadsOnAndOffInAnyCase) {
  for (const char* on : {"1", "true", "TRUE", "yes", "On"}) {
    Setting s(on);
    EXPECT_TRUE(ferry::detail::environment_switch(kName, false)) << on;
  }
  for (const char* off : {"0", "false", "No", "OFF"}) {
    Setting s(off);
    EXPECT_FALSE(ferry::detail::environment_switch(kName, true)) << off;
  }
}

TEST(Environment, UnsetOrEmptyTakesTheDefault) {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    Setting s(value);
    EXPECT_TRUE(ferry::detail::environment_switch(kName, true));
    EXPECT_FALSE(ferry::detail::environment_switch(kName, false));
    EXPECT_FALSE(ferry::detail::environment_text(kName).has_value());
  }
  Setting s("16");
  EXPECT_EQ(ferry::detail::environment_text(kName), std::optional<std::string>("16"));
}

TEST(Environment, AnythingElseIsRefusedWithTheNameAndTheValue) {
  for (const char* value : {"maybe", "2", "o", " 1", "enabled"}) {
    Setting s(value);
    try {
      ferry::detail::environment_switch(kName, true);
      ADD_FAILURE() << "'" << value << "' was read as a switch";
    } catch (const ferry::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(kName) + "='" + value + "' is not a switch"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("leave it unset (on)"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
