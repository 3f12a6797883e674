#include "node/sim_events.h"

#include <google/protobuf/util/json_util.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "core/file_util.h"
#include "core/status.h"

namespace starling {

using google::protobuf::Struct;
using google::protobuf::Value;

const Value& FieldOf(const Struct& s, const std::string& key) {
  static const Value* null = new Value();
  auto it = s.fields().find(key);
  return it == s.fields().end() ? *null : it->second;
}

absl::StatusOr<Struct> ParseJsonObject(absl::string_view text,
                                       absl::string_view what) {
  Struct s;
  if (!google::protobuf::util::JsonStringToMessage(std::string(text), &s)
           .ok()) {
    return absl::DataLossError(absl::StrCat(what, " is not valid JSON"));
  }
  return s;
}

absl::StatusOr<Struct> ReadJsonFile(const std::string& path) {
  STARLING_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseJsonObject(text, path);
}

std::string ToJson(const Value& v) {
  if (v.kind_case() == Value::KIND_NOT_SET) return "null";
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(v, &out, o);
  return out;
}

size_t ForEachEvent(absl::string_view text,
                    const std::function<void(const Struct&)>& fn) {
  size_t end = text.rfind('\n');
  if (end == absl::string_view::npos) return 0;  // no complete line yet
  for (absl::string_view line :
       absl::StrSplit(text.substr(0, end), '\n', absl::SkipEmpty())) {
    Struct ev;
    if (google::protobuf::util::JsonStringToMessage(std::string(line), &ev)
            .ok()) {
      fn(ev);
    }
  }
  return end + 1;
}

std::string MemberId(const Value& v) {
  return v.kind_case() == Value::kStringValue
             ? v.string_value()
             : absl::StrCat("n", static_cast<int64_t>(v.number_value()));
}

double EventUnixSeconds(const Struct& ev) {
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, FieldOf(ev, "time").string_value(),
                       &t, &err)) {
    return NAN;
  }
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

EventTail::EventTail(std::vector<std::string> paths)
    : paths_(std::move(paths)), offsets_(paths_.size(), 0) {}

void EventTail::Poll(const std::function<void(size_t, const Struct&)>& fn) {
  for (size_t i = 0; i < paths_.size(); ++i) {
    absl::StatusOr<std::string> text =
        ReadFileFrom(paths_[i], static_cast<int64_t>(offsets_[i]));
    if (!text.ok()) continue;
    offsets_[i] += ForEachEvent(*text, [&](const Struct& ev) { fn(i, ev); });
  }
}

}  // namespace starling
