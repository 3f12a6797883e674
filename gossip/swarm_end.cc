#include "gossip/swarm_end.h"

#include <algorithm>
#include <optional>

#include "gossip/round_protocol.h"

namespace starling {
namespace {

using peer::v1::MemberEntry;

SwarmPosition PositionOf(const MemberEntry& e) {
  return SwarmPosition{e.round(), e.lineage(), e.member_rounds()};
}

bool Ahead(const SwarmPosition& a, const SwarmPosition& b) {
  return LineageAhead({a.round, a.lineage, a.member_rounds},
                      {b.round, b.lineage, b.member_rounds});
}

bool Same(const SwarmPosition& a, const SwarmPosition& b) {
  return a.round == b.round && a.lineage == b.lineage;
}

// `best` becomes `p` when it is unset or `p` is ahead of it.
void KeepBest(const SwarmPosition& p, std::optional<SwarmPosition>* best) {
  if (!best->has_value() || Ahead(p, **best)) *best = p;
}

}  // namespace

const char* SwarmStandingName(SwarmStanding s) {
  switch (s) {
    case SwarmStanding::kInSwarm:
      return "in_swarm";
    case SwarmStanding::kSwarmFinished:
      return "swarm_finished";
    case SwarmStanding::kCutOff:
      return "cut_off";
  }
  return "in_swarm";
}

bool SwarmView::HoldsFurthest() const { return Same(here, furthest); }

SwarmView JudgeSwarm(const std::vector<MemberEntry>& table,
                     const std::string& self,
                     const std::vector<std::string>& paused_with) {
  SwarmView v;
  for (const MemberEntry& e : table) {
    if (e.id() == self) v.here = PositionOf(e);
  }
  std::optional<SwarmPosition> live_best = v.here, left_best;
  std::optional<SwarmPosition> furthest = v.here;
  bool other_live = false, lost = false, undecided = false;
  for (const MemberEntry& e : table) {
    if (e.id() == self) continue;
    const SwarmPosition p = PositionOf(e);
    KeepBest(p, &furthest);
    if (IsLive(e)) {
      other_live = true;
      KeepBest(p, &live_best);
    } else if (e.state() == peer::v1::MEMBER_LEFT) {
      KeepBest(p, &left_best);
    }
    const bool was_with = std::find(paused_with.begin(), paused_with.end(),
                                    e.id()) != paused_with.end();
    if (was_with) v.unreachable.push_back(e);
    lost = lost || (was_with && e.state() == peer::v1::MEMBER_DEAD);
    undecided = undecided || (was_with && IsLive(e));
  }
  v.furthest = *furthest;
  for (const MemberEntry& e : table) {
    if (Same(PositionOf(e), v.furthest)) v.holders.push_back(e.id());
  }
  if (!other_live && left_best.has_value() && Ahead(*left_best, *live_best)) {
    v.standing = SwarmStanding::kSwarmFinished;
  } else if (!other_live && lost) {
    v.standing = SwarmStanding::kCutOff;
  }
  v.waking = v.standing == SwarmStanding::kInSwarm && undecided;
  if (v.standing != SwarmStanding::kCutOff) v.unreachable.clear();
  return v;
}

}  // namespace starling
