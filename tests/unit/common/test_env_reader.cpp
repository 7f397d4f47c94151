// The environment reader every layer's settings use: truth values and
// whole numbers read alike everywhere, refused with the variable named.

#include <symmpool/env_reader.hpp>
#include <symmpool/error.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace symmpool::test {

constexpr const char* kName = "SYMMPOOL_TEST_ENV_READER";

class EnvReader : public ::testing::Test {
 protected:
  void TearDown() override { ::unsetenv(kName); }
  static void set(const char* v) { ::setenv(kName, v, 1); }
};

TEST_F(EnvReader, TruthValuesInAnyCase) {
  ::unsetenv(kName);
  EXPECT_EQ(env::value(kName), "");
  EXPECT_FALSE(env::is_true(kName));
  EXPECT_FALSE(env::is_false(kName)) << "unset is neither";
  for (const char* yes : {"1", "true", "YES", "On"}) {
    set(yes);
    EXPECT_TRUE(env::is_true(kName)) << yes;
    EXPECT_FALSE(env::is_false(kName)) << yes;
  }
  for (const char* no : {"0", "False", "no", "OFF"}) {
    set(no);
    EXPECT_TRUE(env::is_false(kName)) << no;
    EXPECT_FALSE(env::is_true(kName)) << no;
  }
  set("maybe");
  EXPECT_FALSE(env::is_true(kName));
  EXPECT_FALSE(env::is_false(kName));
}

TEST_F(EnvReader, WholeNumbersInRangeOrARefusalNamingTheVariable) {
  EXPECT_EQ(env::whole_number("", kName, 7, 0, 10), 7) << "empty: the fallback";
  EXPECT_EQ(env::whole_number("10", kName, 7, 0, 10), 10);
  EXPECT_EQ(env::whole_number("-3", kName, 7, -5, 10), -3);
  for (const char* bad : {"11", "-1", "4 MiB", "lots", "3.5", " 4", "99999999999999999999"}) {
    try {
      env::whole_number(bad, kName, 7, 0, 10);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const logic_error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string(kName) + " must be a whole number from 0 to 10, got '" + bad + "'");
    }
  }
}

}  // namespace symmpool::test
