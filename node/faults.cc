#include "node/faults.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status.h"
#include "core/trainer.h"

namespace starling {
namespace {

// Errors name the flag, its whole value and the entry at fault.
class SpecError {
 public:
  SpecError(absl::string_view flag, absl::string_view value)
      : flag_(flag), value_(value) {}

  absl::Status operator()(absl::string_view entry,
                          absl::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag_, "=", value_, ": in '", entry, "': ", why));
  }

 private:
  std::string flag_;
  std::string value_;
};

// A duration with a unit ("30s", "1.5s", "2m", "500ms"), >= 0 and finite.
absl::StatusOr<absl::Duration> ParseTime(absl::string_view text) {
  absl::Duration d;
  if (text.empty() || !absl::ascii_isalpha(text.back()) ||
      !absl::ParseDuration(text, &d) || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad time '", text, "' (want a duration with a unit: 30s, 1.5s, 2m, ",
        "500ms)"));
  }
  if (d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("time '", text, "' is negative"));
  }
  return d;
}

absl::Status CheckIdSyntax(absl::string_view id) {
  bool ok = !id.empty() && id.size() <= 32;
  for (char c : id) {
    ok = ok && (absl::ascii_isalnum(c) || c == '_' || c == '-');
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad node id '", id, "' (want 1 to 32 of A-Z a-z 0-9 _ -, e.g. n5)"));
  }
  return absl::OkStatus();
}

std::vector<absl::string_view> Entries(absl::string_view value, char sep) {
  std::vector<absl::string_view> out;
  for (absl::string_view e : absl::StrSplit(value, sep)) {
    out.push_back(absl::StripAsciiWhitespace(e));
  }
  return out;
}

struct IdAt {
  std::string entry;  // as given
  std::string id;
  absl::Duration at;
};

// "ID@TIME,ID@TIME...". Checks syntax only.
absl::StatusOr<std::vector<IdAt>> ParseIdTimes(const SpecError& error,
                                               absl::string_view value) {
  std::vector<IdAt> out;
  if (absl::StripAsciiWhitespace(value).empty()) return out;
  for (absl::string_view entry : Entries(value, ',')) {
    if (entry.empty()) return error(entry, "empty entry (stray comma?)");
    std::vector<absl::string_view> parts = absl::StrSplit(entry, '@');
    if (parts.size() != 2) return error(entry, "want ID@TIME, e.g. n2@30s");
    absl::string_view id = absl::StripAsciiWhitespace(parts[0]);
    if (absl::Status s = CheckIdSyntax(id); !s.ok()) {
      return error(entry, s.message());
    }
    absl::StatusOr<absl::Duration> at =
        ParseTime(absl::StripAsciiWhitespace(parts[1]));
    if (!at.ok()) return error(entry, at.status().message());
    out.push_back({std::string(entry), std::string(id), *at});
  }
  return out;
}

std::string KnownIds(const std::vector<std::string>& initial,
                     const std::vector<std::string>& joiners) {
  std::string out = absl::StrJoin(initial, ", ");
  if (!joiners.empty()) {
    absl::StrAppend(&out, "; joiners: ", absl::StrJoin(joiners, ", "));
  }
  return out;
}

}  // namespace

absl::string_view FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kKill:
      return "kill";
    case FaultKind::kLeave:
      return "leave";
    case FaultKind::kRestart:
      return "restart";
    case FaultKind::kJoin:
      return "join";
    case FaultKind::kPartitionStart:
      return "partition_start";
    case FaultKind::kPartitionEnd:
      return "partition_end";
  }
  return "unknown";
}

std::string PartitionLine(const std::vector<std::vector<std::string>>& groups) {
  return absl::StrJoin(groups, "|",
                       [](std::string* out, const std::vector<std::string>& g) {
                         absl::StrAppend(out, absl::StrJoin(g, ","));
                       });
}

namespace {

// The ids a plan may name: the initial nodes and the joiners parsed so far.
class KnownNodes {
 public:
  explicit KnownNodes(const std::vector<std::string>& initial)
      : initial_ids_(initial), initial_(initial.begin(), initial.end()) {}

  bool initial(const std::string& id) const { return initial_.count(id) > 0; }
  bool known(const std::string& id) const {
    return initial(id) || join_at_.count(id) > 0;
  }
  // When `id` joins; nullptr for an initial node.
  const absl::Duration* join_at(const std::string& id) const {
    auto it = join_at_.find(id);
    return it == join_at_.end() ? nullptr : &it->second;
  }
  void AddJoiner(const std::string& id, absl::Duration at) {
    join_at_[id] = at;
    joiners_.push_back(id);
  }
  const std::vector<std::string>& initial_ids() const { return initial_ids_; }
  // "unknown node ID (nodes: ...)".
  std::string Unknown(const std::string& id) const {
    return absl::StrCat("unknown node ", id,
                        " (nodes: ", KnownIds(initial_ids_, joiners_), ")");
  }

 private:
  const std::vector<std::string>& initial_ids_;
  const std::set<std::string> initial_;
  std::map<std::string, absl::Duration> join_at_;
  std::vector<std::string> joiners_;
};

// --join: new ids, each joining once.
absl::Status ParseJoins(const std::string& value, KnownNodes* nodes,
                        FaultPlan* plan) {
  const SpecError error("join", value);
  STARLING_ASSIGN_OR_RETURN(std::vector<IdAt> joins,
                            ParseIdTimes(error, value));
  for (const IdAt& j : joins) {
    if (nodes->initial(j.id)) {
      return error(j.entry,
                   absl::StrCat("node ", j.id,
                                " already exists (initial "
                                "nodes: ",
                                absl::StrJoin(nodes->initial_ids(), ", "),
                                "); pick a new id, e.g. n",
                                nodes->initial_ids().size()));
    }
    if (nodes->join_at(j.id) != nullptr) {
      return error(j.entry, absl::StrCat(j.id,
                                         " joins twice; use --restart "
                                         "to start it again"));
    }
    nodes->AddJoiner(j.id, j.at);
    plan->joiners.push_back(j.id);
    plan->events.push_back({FaultKind::kJoin, j.id, j.at, {}, {}});
  }
  return absl::OkStatus();
}

// --kill, --restart or --leave: known ids, a joiner only once it joined.
absl::Status ParseNodeEvents(const char* flag, const std::string& value,
                             FaultKind kind, const KnownNodes& nodes,
                             FaultPlan* plan) {
  const SpecError error(flag, value);
  STARLING_ASSIGN_OR_RETURN(std::vector<IdAt> items,
                            ParseIdTimes(error, value));
  for (const IdAt& item : items) {
    if (!nodes.known(item.id)) return error(item.entry, nodes.Unknown(item.id));
    const absl::Duration* joins = nodes.join_at(item.id);
    if (joins != nullptr && item.at < *joins) {
      return error(item.entry, absl::StrCat(item.id, " joins only at ",
                                            absl::FormatDuration(*joins)));
    }
    plan->events.push_back({kind, item.id, item.at, {}, {}});
  }
  return absl::OkStatus();
}

// The groups of one partition entry: known ids, each in one group, at
// least two groups.
absl::Status ParseGroups(const SpecError& error, absl::string_view entry,
                         absl::string_view groups, const KnownNodes& nodes,
                         FaultEvent* ev) {
  std::set<std::string> seen;
  for (absl::string_view group : Entries(groups, '|')) {
    std::vector<std::string> ids;
    for (absl::string_view id : Entries(group, ',')) {
      if (absl::Status s = CheckIdSyntax(id); !s.ok()) {
        return error(entry, group.empty() ? "empty group" : s.message());
      }
      std::string sid(id);
      if (!nodes.known(sid)) return error(entry, nodes.Unknown(sid));
      if (!seen.insert(sid).second) {
        return error(entry, absl::StrCat("node ", sid, " is in two groups"));
      }
      ids.push_back(std::move(sid));
    }
    ev->groups.push_back(std::move(ids));
  }
  if (ev->groups.size() < 2) {
    return error(entry, "want at least two groups separated by '|'");
  }
  return absl::OkStatus();
}

// One --partition entry: GROUP|GROUP@START-END.
absl::StatusOr<FaultEvent> ParsePartition(const SpecError& error,
                                          absl::string_view entry,
                                          const KnownNodes& nodes) {
  if (entry.empty()) return error(entry, "empty entry (stray ';'?)");
  std::vector<absl::string_view> parts = absl::StrSplit(entry, '@');
  if (parts.size() != 2) {
    return error(entry,
                 "want GROUP|GROUP@START-END, e.g. "
                 "n0,n1|n2,n3@20s-40s");
  }
  std::vector<absl::string_view> span =
      absl::StrSplit(absl::StripAsciiWhitespace(parts[1]), '-');
  if (span.size() != 2) {
    return error(entry, "want a time span START-END, e.g. 20s-40s");
  }
  FaultEvent ev;
  ev.kind = FaultKind::kPartitionStart;
  absl::StatusOr<absl::Duration> start =
      ParseTime(absl::StripAsciiWhitespace(span[0]));
  if (!start.ok()) return error(entry, start.status().message());
  absl::StatusOr<absl::Duration> end =
      ParseTime(absl::StripAsciiWhitespace(span[1]));
  if (!end.ok()) return error(entry, end.status().message());
  if (*end <= *start) return error(entry, "the end must be after the start");
  ev.at = *start;
  ev.until = *end;
  STARLING_RETURN_IF_ERROR(ParseGroups(error, entry, parts[0], nodes, &ev));
  return ev;
}

// --partition: entries that do not overlap in time, each a start and an
// end event.
absl::Status ParsePartitions(const std::string& value, const KnownNodes& nodes,
                             FaultPlan* plan) {
  const SpecError error("partition", value);
  std::vector<std::pair<std::string, FaultEvent>> partitions;  // entry, event
  if (!absl::StripAsciiWhitespace(value).empty()) {
    for (absl::string_view entry : Entries(value, ';')) {
      STARLING_ASSIGN_OR_RETURN(FaultEvent ev,
                                ParsePartition(error, entry, nodes));
      partitions.emplace_back(std::string(entry), std::move(ev));
    }
  }
  std::stable_sort(
      partitions.begin(), partitions.end(),
      [](const auto& a, const auto& b) { return a.second.at < b.second.at; });
  for (size_t i = 0; i + 1 < partitions.size(); ++i) {
    if (partitions[i + 1].second.at < partitions[i].second.until) {
      return error(partitions[i + 1].first,
                   absl::StrCat("overlaps in time with '", partitions[i].first,
                                "'; one partition at a time"));
    }
  }
  for (const auto& entry_event : partitions) {
    const FaultEvent& p = entry_event.second;
    plan->events.push_back(p);
    FaultEvent end = p;
    end.kind = FaultKind::kPartitionEnd;
    end.at = p.until;
    plan->events.push_back(std::move(end));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FaultPlan> ParseFaultPlan(
    const FaultFlags& flags, const std::vector<std::string>& initial_ids) {
  FaultPlan plan;
  KnownNodes nodes(initial_ids);
  // Joins first: the other flags may name joiners.
  STARLING_RETURN_IF_ERROR(ParseJoins(flags.join, &nodes, &plan));
  STARLING_RETURN_IF_ERROR(
      ParseNodeEvents("kill", flags.kill, FaultKind::kKill, nodes, &plan));
  STARLING_RETURN_IF_ERROR(ParseNodeEvents("restart", flags.restart,
                                           FaultKind::kRestart, nodes, &plan));
  STARLING_RETURN_IF_ERROR(
      ParseNodeEvents("leave", flags.leave, FaultKind::kLeave, nodes, &plan));
  STARLING_RETURN_IF_ERROR(ParsePartitions(flags.partition, nodes, &plan));
  std::stable_sort(plan.events.begin(), plan.events.end(),
                   [](const FaultEvent& a, const FaultEvent& b) {
                     if (a.at != b.at) return a.at < b.at;
                     return a.kind < b.kind;
                   });
  return plan;
}

absl::StatusOr<std::set<std::string>> ParseNatSpec(
    const std::string& value, const std::vector<std::string>& ids,
    int initial) {
  std::set<std::string> out;
  if (absl::StripAsciiWhitespace(value).empty()) return out;
  const SpecError error("nat", value);
  const std::set<std::string> known(ids.begin(), ids.end());
  for (absl::string_view entry : Entries(value, ',')) {
    absl::string_view id = absl::StripAsciiWhitespace(entry);
    if (id.empty()) return error(entry, "empty entry (stray comma?)");
    if (absl::Status s = CheckIdSyntax(id); !s.ok()) {
      return error(entry, s.message());
    }
    if (!known.count(std::string(id))) {
      return error(entry, absl::StrCat("unknown node ", id, " (nodes: ",
                                       absl::StrJoin(ids, ", "), ")"));
    }
    if (!out.insert(std::string(id)).second) {
      return error(entry, absl::StrCat("node ", id, " is named twice"));
    }
  }
  for (int i = 0; i < initial && i < static_cast<int>(ids.size()); ++i) {
    if (!out.count(ids[i])) return out;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--nat=", value,
      ": every starting node would be behind NAT; at least one must stay "
      "reachable, to admit the others and relay for them"));
}

absl::StatusOr<std::map<std::string, double>> ParseSlowSpec(
    const std::string& value, const std::vector<std::string>& ids) {
  std::map<std::string, double> out;
  if (absl::StripAsciiWhitespace(value).empty()) return out;
  const SpecError error("slow", value);
  const std::set<std::string> known(ids.begin(), ids.end());
  for (absl::string_view entry : Entries(value, ',')) {
    if (entry.empty()) return error(entry, "empty entry (stray comma?)");
    std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    if (parts.size() != 2) return error(entry, "want ID:FACTORx, e.g. n2:4x");
    absl::string_view id = absl::StripAsciiWhitespace(parts[0]);
    if (absl::Status s = CheckIdSyntax(id); !s.ok()) {
      return error(entry, s.message());
    }
    if (!known.count(std::string(id))) {
      return error(entry, absl::StrCat("unknown node ", id, " (nodes: ",
                                       absl::StrJoin(ids, ", "), ")"));
    }
    absl::string_view factor_text = absl::StripAsciiWhitespace(parts[1]);
    absl::ConsumeSuffix(&factor_text, "x");
    double factor = 0;
    if (!absl::SimpleAtod(factor_text, &factor) || !std::isfinite(factor)) {
      return error(entry, absl::StrCat("bad factor '", parts[1],
                                       "' (want a number >= 1, e.g. 4x)"));
    }
    if (factor < 1) {
      return error(entry, absl::StrCat("factor ", factor,
                                       " is below 1 (1x = full speed)"));
    }
    if (factor > kMaxSlowdown) {
      return error(entry, absl::StrCat("factor ", factor, " is over ",
                                       kMaxSlowdown, " (--slowdown's limit)"));
    }
    if (!out.emplace(std::string(id), factor).second) {
      return error(entry, absl::StrCat("node ", id, " is named twice"));
    }
  }
  return out;
}

absl::StatusOr<std::map<std::string, int64_t>> ParseDriftSpec(
    const std::string& value, const std::vector<std::string>& ids) {
  std::map<std::string, int64_t> out;
  if (absl::StripAsciiWhitespace(value).empty()) return out;
  const SpecError error("drift", value);
  const std::set<std::string> known(ids.begin(), ids.end());
  for (absl::string_view entry : Entries(value, ';')) {
    if (entry.empty()) return error(entry, "empty entry (stray ';'?)");
    std::vector<absl::string_view> parts = absl::StrSplit(entry, '@');
    if (parts.size() != 2) {
      return error(entry, "want IDS@STEP, e.g. n0,n1@400");
    }
    int64_t step = -1;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[1]), &step) ||
        step < 0) {
      return error(entry, absl::StrCat("bad step '", parts[1],
                                       "' (want an inner step >= 0)"));
    }
    for (absl::string_view id : Entries(parts[0], ',')) {
      if (absl::Status s = CheckIdSyntax(id); !s.ok()) {
        return error(entry, s.message());
      }
      if (!known.count(std::string(id))) {
        return error(entry, absl::StrCat("unknown node ", id, " (nodes: ",
                                         absl::StrJoin(ids, ", "), ")"));
      }
      if (!out.emplace(std::string(id), step).second) {
        return error(entry, absl::StrCat("node ", id, " is named twice"));
      }
    }
  }
  return out;
}

bool SimLinks::shaped() const {
  if (defaults.shaped()) return true;
  for (const auto& [from, to] : links) {
    for (const auto& [id, p] : to) {
      if (p.shaped()) return true;
    }
  }
  return false;
}

absl::StatusOr<SimLinks> ParseSimLinks(const std::string& bandwidth_mbps,
                                       const std::string& latency_ms,
                                       const std::vector<std::string>& ids) {
  SimLinks out;
  const std::set<std::string> known(ids.begin(), ids.end());
  struct Flag {
    const char* name;
    const std::string& value;
    double LinkParams::*field;
    bool smaller_wins;  // when both ends of a link have a node value
    double max;
  };
  const Flag flags[] = {
      {"link_bandwidth_mbps", bandwidth_mbps, &LinkParams::bandwidth_mbps, true,
       std::numeric_limits<double>::max()},
      {"link_latency_ms", latency_ms, &LinkParams::latency_ms, false,
       kMaxLinkLatencyMs}};
  bool any = false;
  for (const Flag& f : flags) {
    STARLING_ASSIGN_OR_RETURN(LinkValueSpec spec,
                              ParseLinkValueSpec(f.name, f.value, f.max));
    any = any || spec.default_value || !spec.entries.empty();
    const double fallback = spec.default_value.value_or(0);
    out.defaults.*f.field = fallback;
    const SpecError error(f.name, f.value);
    std::map<std::string, double> node;
    std::map<std::pair<std::string, std::string>, double> pair;
    for (const LinkValueSpec::Entry& e : spec.entries) {
      if (known.count(e.key)) {
        if (!node.emplace(e.key, e.value).second) {
          return error(e.token,
                       absl::StrCat("node ", e.key, " is named twice"));
        }
        continue;
      }
      // ID-ID: split at the '-' that leaves two known ids.
      std::vector<std::pair<std::string, std::string>> splits;
      for (size_t dash = e.key.find('-'); dash != std::string::npos;
           dash = e.key.find('-', dash + 1)) {
        std::string a(absl::StripAsciiWhitespace(e.key.substr(0, dash)));
        std::string b(absl::StripAsciiWhitespace(e.key.substr(dash + 1)));
        if (known.count(a) && known.count(b)) splits.emplace_back(a, b);
      }
      if (splits.size() != 1) {
        return error(e.token,
                     absl::StrCat(splits.empty() ? "unknown node or pair '"
                                                 : "ambiguous pair '",
                                  e.key, "' (want ID or ID-ID; nodes: ",
                                  absl::StrJoin(ids, ", "), ")"));
      }
      auto [a, b] = splits[0];
      if (a == b) {
        return error(e.token,
                     absl::StrCat("a link needs two nodes, not ", a, "-", b));
      }
      if (b < a) std::swap(a, b);
      if (!pair.emplace(std::make_pair(a, b), e.value).second) {
        return error(e.token,
                     absl::StrCat("the pair ", a, "-", b, " is named twice"));
      }
    }
    for (const std::string& from : ids) {
      for (const std::string& to : ids) {
        if (from == to) continue;
        double v = fallback;
        auto p = pair.find(from < to ? std::make_pair(from, to)
                                     : std::make_pair(to, from));
        auto a = node.find(from);
        auto b = node.find(to);
        if (p != pair.end()) {
          v = p->second;
        } else if (a != node.end() && b != node.end()) {
          if (!f.smaller_wins) {
            v = std::max(a->second, b->second);
          } else if (a->second <= 0 || b->second <= 0) {
            v = std::max(a->second, b->second);  // 0: unlimited
          } else {
            v = std::min(a->second, b->second);
          }
        } else if (a != node.end()) {
          v = a->second;
        } else if (b != node.end()) {
          v = b->second;
        }
        out.links[from][to].*f.field = v;
      }
    }
  }
  if (!any) out.links.clear();
  return out;
}

std::pair<std::string, std::string> NodeLinkFlags(
    const SimLinks& links, const std::string& from,
    const std::map<std::string, std::string>& addresses) {
  LinkEmulatorOptions o;
  o.defaults = links.defaults;
  if (auto it = links.links.find(from); it != links.links.end()) {
    for (const auto& [to, p] : it->second) {
      if (auto a = addresses.find(to); a != addresses.end()) {
        o.links[a->second] = p;
      }
    }
  }
  return FormatLinkFlags(o);
}

absl::StatusOr<std::vector<PoisonWindow>> ParsePoisonPlan(
    const std::string& value) {
  std::vector<PoisonWindow> out;
  if (absl::StripAsciiWhitespace(value).empty()) return out;
  const SpecError error("test_poison", value);
  for (absl::string_view entry : Entries(value, '+')) {
    std::vector<absl::string_view> parts = absl::StrSplit(entry, '@');
    std::vector<absl::string_view> range =
        parts.size() == 2 ? absl::StrSplit(parts[1], '-')
                          : std::vector<absl::string_view>{};
    PoisonWindow w;
    if (parts.size() != 2 || range.size() != 2 ||
        !absl::SimpleAtoi(range[0], &w.first) ||
        !absl::SimpleAtoi(range[1], &w.last) || w.first < 0 ||
        w.last < w.first) {
      return error(entry,
                   "want MODE@FIRST-LAST with rounds 0 <= FIRST <= "
                   "LAST, e.g. nan@2-4");
    }
    absl::string_view mode = absl::StripAsciiWhitespace(parts[0]);
    if (mode == "nan") {
      w.mode = PoisonMode::kNaN;
    } else if (mode == "noise") {
      w.mode = PoisonMode::kNoise;
    } else if (absl::ConsumePrefix(&mode, "x") &&
               absl::SimpleAtod(mode, &w.scale) && std::isfinite(w.scale)) {
      w.mode = PoisonMode::kScale;
    } else {
      return error(entry, "MODE must be nan, noise or xFACTOR (e.g. x1000)");
    }
    for (const PoisonWindow& o : out) {
      if (w.first <= o.last && o.first <= w.last) {
        return error(entry, "overlaps an earlier window");
      }
    }
    out.push_back(w);
  }
  return out;
}

absl::StatusOr<std::map<std::string, std::string>> ParsePoisonSpec(
    const std::string& value, const std::vector<std::string>& ids) {
  std::map<std::string, std::string> out;
  if (absl::StripAsciiWhitespace(value).empty()) return out;
  const SpecError error("poison", value);
  const std::set<std::string> known(ids.begin(), ids.end());
  for (absl::string_view entry : Entries(value, ',')) {
    const size_t colon = entry.find(':');
    if (colon == absl::string_view::npos) {
      return error(entry, "want ID:PLAN, e.g. n4:nan@2-4+x1000@5-7");
    }
    const std::string id(absl::StripAsciiWhitespace(entry.substr(0, colon)));
    if (absl::Status s = CheckIdSyntax(id); !s.ok()) {
      return error(entry, s.message());
    }
    if (!known.count(id)) {
      return error(entry, absl::StrCat("unknown node ", id, " (nodes: ",
                                       absl::StrJoin(ids, ", "), ")"));
    }
    const std::string plan(entry.substr(colon + 1));
    if (auto p = ParsePoisonPlan(plan); !p.ok()) {
      return error(entry, p.status().message());
    }
    if (!out.emplace(id, plan).second) {
      return error(entry, absl::StrCat("node ", id, " is named twice"));
    }
  }
  return out;
}

const PoisonWindow* PoisonFor(const std::vector<PoisonWindow>& plan,
                              int64_t round) {
  for (const PoisonWindow& w : plan) {
    if (round >= w.first && round <= w.last) return &w;
  }
  return nullptr;
}

std::string ApplyPoison(const PoisonWindow& w, uint64_t seed, float* values,
                        int64_t n) {
  switch (w.mode) {
    case PoisonMode::kNaN:
      for (int64_t i = 0; i < n; ++i) {
        values[i] = std::numeric_limits<float>::quiet_NaN();
      }
      return "nan";
    case PoisonMode::kScale:
      for (int64_t i = 0; i < n; ++i) {
        values[i] = static_cast<float>(values[i] * w.scale);
      }
      return absl::StrCat("x", w.scale);
    case PoisonMode::kNoise: {
      double sum2 = 0;
      for (int64_t i = 0; i < n; ++i) sum2 += double{values[i]} * values[i];
      const double rms = n > 0 ? std::sqrt(sum2 / static_cast<double>(n)) : 0;
      std::mt19937_64 rng(seed);
      std::normal_distribution<float> gauss(0.0f, static_cast<float>(rms));
      for (int64_t i = 0; i < n; ++i) values[i] = gauss(rng);
      return "noise";
    }
  }
  return "";
}

}  // namespace starling
