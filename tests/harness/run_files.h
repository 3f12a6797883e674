// Reading what a `starling` run writes into its run directory: summary.json
// (one JSON object) and events.jsonl (one JSON object a line, each with an
// "event" kind). Missing fields and unreadable files fail the calling test
// (EXPECT) and read as empty, so a test goes on to report what else is wrong.
// Stateless, so thread-safe.
#ifndef STARLING_TESTS_HARNESS_RUN_FILES_H_
#define STARLING_TESTS_HARNESS_RUN_FILES_H_

#include <google/protobuf/struct.pb.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace starling::testing {

// Parses a JSON file (e.g. summary.json).
google::protobuf::Struct ReadJson(const std::string& path);

// Parses JSON text (e.g. the object a command printed).
google::protobuf::Struct ParseJson(const std::string& text);

// The field `key` of `s`; a null value when it is missing.
const google::protobuf::Value& Field(const google::protobuf::Struct& s,
                                     const std::string& key);

// The events of an events.jsonl in order: every one, or those whose "event"
// is `kind`. Lines that do not parse (one being written) are skipped; a
// missing file has none.
std::vector<google::protobuf::Struct> ReadEvents(const std::string& path,
                                                 const std::string& kind = "");

// round -> model hash, from the "round" events of an events.jsonl.
std::map<int, std::string> RoundHashes(const std::string& events_path);

// The ids in the "members" list of a round (an event or a summary entry).
std::set<std::string> Members(const google::protobuf::Struct& round);

// final.model_hash of a summary.json.
std::string FinalHash(const std::string& summary_path);

}  // namespace starling::testing

#endif  // STARLING_TESTS_HARNESS_RUN_FILES_H_
