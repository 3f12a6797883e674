// Reading what a `starling node` writes, as `starling sim` needs it: the
// lines of events.jsonl and summary.json as protobuf Structs, a field of one
// (null when missing), a value back as JSON text, and a member id. The sim's
// progress line follows the events as they grow; its merge reads them once
// at the end. Pure functions, except ReadJsonFile and EventTail::Poll, which
// read files; thread-compatible.
#ifndef STARLING_NODE_SIM_EVENTS_H_
#define STARLING_NODE_SIM_EVENTS_H_

#include <google/protobuf/struct.pb.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace starling {

// The field `key` of `s`, or a null (unset) Value when it is missing.
const google::protobuf::Value& FieldOf(const google::protobuf::Struct& s,
                                       const std::string& key);

// The JSON object in `text`; DataLoss naming `what` when it is not one.
absl::StatusOr<google::protobuf::Struct> ParseJsonObject(
    absl::string_view text, absl::string_view what);
// The JSON object in the file `path`: NotFound, or DataLoss naming it.
absl::StatusOr<google::protobuf::Struct> ReadJsonFile(const std::string& path);

// JSON text of `v` with proto field names; "null" when it is unset.
std::string ToJson(const google::protobuf::Value& v);

// Calls `fn` with each complete, parseable line of JSON-lines `text` (a
// last line without its newline is not complete yet; unparseable lines are
// skipped). Returns the length of the complete lines: what a follower of a
// growing file has consumed.
size_t ForEachEvent(
    absl::string_view text,
    const std::function<void(const google::protobuf::Struct&)>& fn);

// A member id from a round's "members" list: a string id, or an int rank
// ("nK") from nodes that predate elastic membership.
std::string MemberId(const google::protobuf::Value& v);

// An event's "time" (RFC 3339) in seconds since the Unix epoch; NaN when it
// has none or it does not parse.
double EventUnixSeconds(const google::protobuf::Struct& ev);

// Follows the events.jsonl files of a set of nodes: each Poll reads only
// what each file gained since the last one, complete lines only.
class EventTail {
 public:
  explicit EventTail(std::vector<std::string> paths);

  // Calls `fn(i, event)` for each new complete event of file i, in order.
  // A file that is missing (its node has not started) is skipped.
  void Poll(
      const std::function<void(size_t, const google::protobuf::Struct&)>& fn);

 private:
  std::vector<std::string> paths_;
  std::vector<size_t> offsets_;  // consumed bytes of each file
};

}  // namespace starling

#endif  // STARLING_NODE_SIM_EVENTS_H_
