#include "core/json.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace starling {
namespace {

TEST(JsonTest, ObjectsKeepOrderAndEscapeStrings) {
  JsonObject o;
  o.Add("b", int64_t{1}).Add("a", "x\"y\n").Add("ok", true);
  EXPECT_EQ(o.Dump(), R"({"b":1,"a":"x\"y\n","ok":true})");
}

TEST(JsonTest, NonFiniteNumbersBecomeNull) {
  JsonObject o;
  o.Add("nan", std::nan(""))
      .Add("inf", std::numeric_limits<double>::infinity());
  EXPECT_EQ(o.Dump(), R"({"nan":null,"inf":null})");
}

TEST(JsonTest, NumbersRoundTrip) {
  for (double v : {0.1, 2.0529227, 1e-9, 123456789.125, -3.5}) {
    EXPECT_EQ(std::strtod(JsonNumber(v).c_str(), nullptr), v);
  }
  EXPECT_EQ(JsonNumber(0.5), "0.5");
}

TEST(JsonTest, NestedArrays) {
  JsonArray a;
  a.Push(int64_t{1}).Push(JsonObject().Add("k", "v")).Push("s");
  JsonObject o;
  o.Add("a", a).Add("empty", JsonArray()).AddNull("n");
  EXPECT_EQ(o.Dump(), R"({"a":[1,{"k":"v"},"s"],"empty":[],"n":null})");
}

TEST(JsonTest, ControlCharactersAreEscaped) {
  EXPECT_EQ(JsonQuote(std::string("a\x01", 2)), "\"a\\u0001\"");
}

}  // namespace
}  // namespace starling
