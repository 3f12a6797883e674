// Fault injection for `starling sim`: parses the --kill, --restart, --join,
// --leave and --partition specs into a FaultPlan, a time-ordered list of
// events that the sim carries out while its nodes run, and the per-node
// heterogeneity specs (--slow, --drift, --link_bandwidth_mbps,
// --link_latency_ms), and the poisoned-peer plans (--poison,
// --test_poison). Pure functions over plain values:
// thread-compatible, no I/O.
#ifndef STARLING_NODE_FAULTS_H_
#define STARLING_NODE_FAULTS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gossip/link_shaper.h"

namespace starling {

enum class FaultKind {
  // Declaration order is the order of events due at the same time: a
  // partition heals first, then nodes go, then nodes come.
  kPartitionEnd,    // the partition file is emptied
  kKill,            // SIGKILL
  kLeave,           // SIGTERM: graceful leave
  kRestart,         // start a stopped node again, same id, port and dir
  kJoin,            // start a new node
  kPartitionStart,  // the groups cannot reach each other until `until`
};

// "kill", "leave", "restart", "join", "partition_start", "partition_end".
absl::string_view FaultKindName(FaultKind kind);

struct FaultEvent {
  FaultKind kind = FaultKind::kKill;
  std::string node;   // node id; empty for partition events
  absl::Duration at;  // after the sim started
  // Partition events: the groups (node ids) and when the partition heals.
  std::vector<std::vector<std::string>> groups;
  absl::Duration until;
};

// The partition file's line for `groups`: "n0,n1|n2,n3".
std::string PartitionLine(const std::vector<std::vector<std::string>>& groups);

// The sim's fault flags, as given ("" = none). Syntax:
//   kill, restart, join, leave: ID@TIME[,ID@TIME...]
//   partition: IDS|IDS[|IDS...]@START-END[;...], IDS = ID[,ID...]
// TIME is a duration with a unit: 30s, 1.5s, 2m, 500ms.
struct FaultFlags {
  std::string kill;
  std::string restart;
  std::string join;
  std::string leave;
  std::string partition;
};

struct FaultPlan {
  std::vector<FaultEvent> events;    // sorted by `at`, then by kind
  std::vector<std::string> joiners;  // --join ids, in the order given
  bool empty() const { return events.empty(); }
};

// Parses and checks `flags` against the ids of the nodes started at time 0.
// InvalidArgument naming the flag and the bad part for: malformed syntax, a
// time without a unit or negative, an id that is not [A-Za-z0-9_-]{1,32},
// an unknown id (kill/restart/leave/partition may name initial nodes and
// joiners), a join id that already exists or joins twice, a kill/leave/
// restart of a joiner before it joins, a node in two groups of one
// partition, fewer than two groups, an end not after the start, and
// partitions that overlap in time.
absl::StatusOr<FaultPlan> ParseFaultPlan(
    const FaultFlags& flags, const std::vector<std::string>& initial_ids);

// The sim's --slow=ID:FACTORx[,ID:FACTORx...] ("" = none), e.g. n2:4x: node
// ID runs with --slowdown=FACTOR (the trailing x is optional). Returns the
// factor per node id. InvalidArgument naming --slow for malformed syntax, a
// bad or unknown id (`ids` lists the sim's nodes, joiners included), a node
// named twice, and a factor < 1 or not finite.
absl::StatusOr<std::map<std::string, double>> ParseSlowSpec(
    const std::string& value, const std::vector<std::string>& ids);

// The sim's --nat=ID[,ID...] ("" = none), e.g. n2,n3: those nodes run
// behind emulated NAT. Returns the ids. InvalidArgument naming --nat for a
// bad or unknown id (`ids`: the sim's nodes, joiners included), a node
// named twice, and a list that leaves none of the first `initial` nodes
// reachable (a NATed node needs a reachable one to join and relay through).
absl::StatusOr<std::set<std::string>> ParseNatSpec(
    const std::string& value, const std::vector<std::string>& ids, int initial);

// The sim's --drift=IDS@STEP[;IDS@STEP...] ("" = none), IDS = ID[,ID...],
// e.g. n0,n1@400: those nodes run with --drift=STEP, and every other node
// with --drift=never (so that all nodes share one distribution until the
// drift). Returns the step per drifting node id. InvalidArgument naming
// --drift for malformed syntax, a bad or unknown id, a node named twice, and
// a step that is not an integer >= 0.
absl::StatusOr<std::map<std::string, int64_t>> ParseDriftSpec(
    const std::string& value, const std::vector<std::string>& ids);

// The sim's link emulation: the link from every node to every other one.
struct SimLinks {
  LinkParams defaults;  // the flags' DEFAULT entries
  // links[from][to] for every ordered pair of distinct ids; empty when
  // neither flag is set.
  std::map<std::string, std::map<std::string, LinkParams>> links;
  bool shaped() const;
};

// The sim's --link_bandwidth_mbps and --link_latency_ms, each
// DEFAULT[,ID=VALUE...][,ID-ID=VALUE...] ("" = none), e.g.
// 100,n3=10,n0-n1=1000. DEFAULT applies to every link; ID=VALUE to every
// link from or to that node (when both ends have one, the smaller bandwidth
// and the larger latency win); ID-ID=VALUE to both directions between the
// two nodes, over the others. 0 means unlimited / no latency. `ids` lists
// the sim's nodes, joiners included; an ID-ID key splits at the '-' that
// leaves two known ids. InvalidArgument naming the flag and the bad entry
// for a bad number (negative, not finite), an unknown id or pair, a pair of
// one node with itself, a node or pair named twice, and a second DEFAULT.
absl::StatusOr<SimLinks> ParseSimLinks(const std::string& bandwidth_mbps,
                                       const std::string& latency_ms,
                                       const std::vector<std::string>& ids);

// The node flags for `from`'s links in `links`: --link_bandwidth_mbps and
// --link_latency_ms values naming each peer by its address (`addresses`:
// id -> host:port), for ParseLinkFlags.
std::pair<std::string, std::string> NodeLinkFlags(
    const SimLinks& links, const std::string& from,
    const std::map<std::string, std::string>& addresses);

// A poisoned peer, for testing robust aggregation: in rounds first..last
// (inclusive) the node replaces its pseudo-gradient with NaN (kNaN), scales
// it (kScale), or sends Gaussian noise of its RMS (kNoise).
enum class PoisonMode { kNaN, kScale, kNoise };
struct PoisonWindow {
  PoisonMode mode = PoisonMode::kNaN;
  double scale = 1;  // kScale
  int64_t first = 0, last = 0;
};

// The node's --test_poison=MODE@FIRST-LAST[+MODE@FIRST-LAST...] ("" =
// none), MODE = nan | noise | xFACTOR (e.g. x1000), rounds >= 0. E.g.
// nan@2-4+x1000@5-7+noise@8-10. InvalidArgument naming --test_poison and
// the bad part; also for windows that overlap.
absl::StatusOr<std::vector<PoisonWindow>> ParsePoisonPlan(
    const std::string& value);

// The sim's --poison=ID:PLAN[,ID:PLAN...] ("" = none): node ID runs with
// --test_poison=PLAN. InvalidArgument naming --poison for a bad or unknown
// id, a node named twice or a bad PLAN.
absl::StatusOr<std::map<std::string, std::string>> ParsePoisonSpec(
    const std::string& value, const std::vector<std::string>& ids);

// The window of `plan` that covers `round`, or null.
const PoisonWindow* PoisonFor(const std::vector<PoisonWindow>& plan,
                              int64_t round);
// Applies `w` to `values` (noise seeded by `seed`). "nan", "x1000", "noise".
std::string ApplyPoison(const PoisonWindow& w, uint64_t seed, float* values,
                        int64_t n);

}  // namespace starling

#endif  // STARLING_NODE_FAULTS_H_
