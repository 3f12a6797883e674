#include "core/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace starling {

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += "\"";
  return out;
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  // %.17g round-trips; try shorter forms first for readability.
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

void JsonObject::Key(absl::string_view key) {
  if (!body_.empty()) body_ += ",";
  absl::StrAppend(&body_, JsonQuote(key), ":");
}

JsonObject& JsonObject::Add(absl::string_view key, double value) {
  Key(key);
  body_ += JsonNumber(value);
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, int value) {
  return Add(key, static_cast<int64_t>(value));
}
JsonObject& JsonObject::Add(absl::string_view key, int64_t value) {
  Key(key);
  absl::StrAppend(&body_, value);
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, uint64_t value) {
  Key(key);
  absl::StrAppend(&body_, value);
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, bool value) {
  Key(key);
  body_ += value ? "true" : "false";
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, absl::string_view value) {
  Key(key);
  body_ += JsonQuote(value);
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, const char* value) {
  return Add(key, absl::string_view(value));
}
JsonObject& JsonObject::Add(absl::string_view key, const std::string& value) {
  return Add(key, absl::string_view(value));
}
JsonObject& JsonObject::Add(absl::string_view key, const JsonObject& value) {
  return AddRaw(key, value.Dump());
}
JsonObject& JsonObject::Add(absl::string_view key, const JsonArray& value) {
  return AddRaw(key, value.Dump());
}
JsonObject& JsonObject::AddNull(absl::string_view key) {
  return AddRaw(key, "null");
}
JsonObject& JsonObject::AddRaw(absl::string_view key, absl::string_view json) {
  Key(key);
  absl::StrAppend(&body_, json);
  return *this;
}

JsonObject& JsonObject::Merge(const JsonObject& other) {
  if (other.body_.empty()) return *this;
  if (!body_.empty()) body_ += ",";
  body_ += other.body_;
  return *this;
}

void JsonArray::Sep() {
  if (!body_.empty()) body_ += ",";
}
JsonArray& JsonArray::Push(double value) {
  Sep();
  body_ += JsonNumber(value);
  return *this;
}
JsonArray& JsonArray::Push(int64_t value) {
  Sep();
  absl::StrAppend(&body_, value);
  return *this;
}
JsonArray& JsonArray::Push(absl::string_view value) {
  Sep();
  body_ += JsonQuote(value);
  return *this;
}
JsonArray& JsonArray::Push(const JsonObject& value) {
  return PushRaw(value.Dump());
}
JsonArray& JsonArray::PushRaw(absl::string_view json) {
  Sep();
  absl::StrAppend(&body_, json);
  return *this;
}

}  // namespace starling
