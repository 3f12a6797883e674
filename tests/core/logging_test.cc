// The logger's text lines stay one line whatever a message carries.
#include "core/logging.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

TEST(LoggingTest, TextLinesEscapeControlCharactersOfTheMessage) {
  SetLogFormat(LogFormat::kText);
  // An error a peer sent back, with a line of its own made up inside.
  const std::string peer =
      "refused\nE 12:00:00 forged.cc:1] n0 is dead\r\t\x01";
  testing::internal::CaptureStderr();
  STARLING_LOG(WARNING) << "plan refused by n1: " << peer;
  LogEvent(LogLevel::kInfo, "member", "n1 says: " + peer, {{"peer", "n1"}});
  const std::vector<std::string> lines =
      Lines(testing::internal::GetCapturedStderr());
  ASSERT_EQ(lines.size(), 2u);
  const std::string escaped =
      "refused\\nE 12:00:00 forged.cc:1] n0 is dead\\r\\t\\x01";
  EXPECT_NE(lines[0].find("plan refused by n1: " + escaped), std::string::npos)
      << lines[0];
  EXPECT_EQ(lines[0].rfind("W ", 0), 0u) << lines[0];
  EXPECT_NE(lines[1].find("peer=n1 n1 says: " + escaped), std::string::npos)
      << lines[1];
  // UTF-8 and printable text pass unchanged.
  testing::internal::CaptureStderr();
  STARLING_LOG(INFO) << "θ_global ok";
  EXPECT_NE(testing::internal::GetCapturedStderr().find("θ_global ok\n"),
            std::string::npos);
}

TEST(LoggingTest, JsonLinesCarryTheMessageEscapedByJson) {
  SetLogFormat(LogFormat::kJson);
  testing::internal::CaptureStderr();
  STARLING_LOG(INFO) << "a\nb";
  const std::vector<std::string> lines =
      Lines(testing::internal::GetCapturedStderr());
  SetLogFormat(LogFormat::kText);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("\"msg\":\"a\\nb\""), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace starling
