#include "tests/harness/run_files.h"

#include <google/protobuf/util/json_util.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "gtest/gtest.h"

namespace starling::testing {

google::protobuf::Struct ReadJson(const std::string& path) {
  google::protobuf::Struct s;
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return s;
  SCOPED_TRACE(path);
  return ParseJson(*text);
}

google::protobuf::Struct ParseJson(const std::string& text) {
  google::protobuf::Struct s;
  auto st = google::protobuf::util::JsonStringToMessage(text, &s);
  EXPECT_TRUE(st.ok()) << st.ToString() << " in\n" << text;
  return s;
}

const google::protobuf::Value& Field(const google::protobuf::Struct& s,
                                     const std::string& key) {
  static const google::protobuf::Value* missing = new google::protobuf::Value;
  auto it = s.fields().find(key);
  EXPECT_NE(it, s.fields().end()) << "missing JSON field " << key;
  return it == s.fields().end() ? *missing : it->second;
}

std::vector<google::protobuf::Struct> ReadEvents(const std::string& path,
                                                 const std::string& kind) {
  std::vector<google::protobuf::Struct> out;
  const std::string text = ReadFile(path).value_or("");
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    google::protobuf::Struct ev;
    if (!google::protobuf::util::JsonStringToMessage(std::string(line), &ev)
             .ok()) {
      continue;
    }
    auto it = ev.fields().find("event");
    if (kind.empty() ||
        (it != ev.fields().end() && it->second.string_value() == kind)) {
      out.push_back(std::move(ev));
    }
  }
  return out;
}

std::map<int, std::string> RoundHashes(const std::string& events_path) {
  std::map<int, std::string> out;
  for (const google::protobuf::Struct& ev : ReadEvents(events_path, "round")) {
    out[static_cast<int>(Field(ev, "round").number_value())] =
        Field(ev, "model_hash").string_value();
  }
  return out;
}

std::set<std::string> Members(const google::protobuf::Struct& round) {
  std::set<std::string> out;
  for (const auto& m : Field(round, "members").list_value().values()) {
    out.insert(m.string_value());
  }
  return out;
}

std::string FinalHash(const std::string& summary_path) {
  const google::protobuf::Struct s = ReadJson(summary_path);
  return Field(Field(s, "final").struct_value(), "model_hash").string_value();
}

}  // namespace starling::testing
