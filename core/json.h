// A small streaming JSON writer for events.jsonl and summary.json.
// Keys keep insertion order. Non-finite numbers are written as null.
// Not thread-safe: build one value per thread.
#ifndef STARLING_CORE_JSON_H_
#define STARLING_CORE_JSON_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace starling {

class JsonArray;

// A JSON object under construction: {"k": v, ...}.
class JsonObject {
 public:
  JsonObject& Add(absl::string_view key, double value);
  JsonObject& Add(absl::string_view key, int value);
  JsonObject& Add(absl::string_view key, int64_t value);
  JsonObject& Add(absl::string_view key, uint64_t value);
  JsonObject& Add(absl::string_view key, bool value);
  JsonObject& Add(absl::string_view key, absl::string_view value);
  JsonObject& Add(absl::string_view key, const char* value);
  JsonObject& Add(absl::string_view key, const std::string& value);
  JsonObject& Add(absl::string_view key, const JsonObject& value);
  JsonObject& Add(absl::string_view key, const JsonArray& value);
  JsonObject& AddNull(absl::string_view key);
  // `json` must already be valid JSON text (e.g. a protobuf JSON dump).
  JsonObject& AddRaw(absl::string_view key, absl::string_view json);
  // Appends every field of `other` (keys are not deduplicated).
  JsonObject& Merge(const JsonObject& other);

  std::string Dump() const { return "{" + body_ + "}"; }

 private:
  void Key(absl::string_view key);
  std::string body_;
};

// A JSON array under construction: [v, ...].
class JsonArray {
 public:
  JsonArray& Push(double value);
  JsonArray& Push(int64_t value);
  JsonArray& Push(absl::string_view value);
  JsonArray& Push(const JsonObject& value);
  JsonArray& PushRaw(absl::string_view json);
  bool empty() const { return body_.empty(); }

  std::string Dump() const { return "[" + body_ + "]"; }

 private:
  void Sep();
  std::string body_;
};

// JSON string literal for `s`, quotes included.
std::string JsonQuote(absl::string_view s);
// JSON number for `v`: shortest round-trip form; null when not finite.
std::string JsonNumber(double v);

}  // namespace starling

#endif  // STARLING_CORE_JSON_H_
