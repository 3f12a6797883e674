#include "node/swarm_end_report.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gossip/reachability.h"

namespace starling {

std::string EndedApartMessage(const SwarmView& v, const ApartAt& at) {
  const std::string where =
      absl::StrCat("round ", at.round, " (step ", at.step, ")");
  const std::string holders = absl::StrJoin(v.holders, ", ");
  const std::string model = v.furthest.lineage.substr(0, 8);
  const std::string tail =
      "; this node's model is not the swarm's final one (exit 3; "
      "--train_alone trains on alone instead)";
  if (v.standing == SwarmStanding::kSwarmFinished) {
    return absl::StrCat("starling node: ", at.node_id,
                        " ended apart from the swarm: it reached ", where,
                        ", but the swarm went on to round ", v.furthest.round,
                        " without it and has left; ", holders,
                        v.holders.size() == 1 ? " holds" : " hold",
                        " the final model (", model, ")", tail);
  }
  std::vector<std::string> unreachable;
  for (const peer::v1::MemberEntry& e : v.unreachable) {
    unreachable.push_back(e.id());
  }
  return absl::StrCat(
      "starling node: ", at.node_id,
      " ended apart from the swarm: this process was paused for ",
      absl::FormatDuration(absl::Trunc(at.pause, absl::Milliseconds(100))),
      " and none of ", absl::StrJoin(unreachable, ", "),
      " has answered since; the swarm was last seen at round ",
      v.furthest.round, " (model ", model, ", on ", holders,
      ") and may have finished without this node, which stops at ", where,
      tail);
}

JsonObject SwarmFinalFields(const SwarmView& v, bool apart,
                            bool trained_alone) {
  JsonArray holders;
  for (const std::string& h : v.holders) holders.Push(h);
  return JsonObject()
      .Add("swarm_final_round", v.furthest.round)
      .Add("swarm_final_hash", v.furthest.lineage)
      .Add("swarm_final_holders", holders)
      .Add("swarm_standing", SwarmStandingName(v.standing))
      .Add("model_is_swarms", !apart && !trained_alone && v.HoldsFurthest())
      .Add("trained_alone", trained_alone);
}

JsonObject ReachabilityFields(const std::vector<peer::v1::MemberEntry>& table,
                              const std::string& self) {
  JsonObject members;
  peer::v1::Reachability own = peer::v1::REACHABILITY_UNKNOWN;
  for (const peer::v1::MemberEntry& e : table) {
    members.Add(e.id(), ReachabilityName(e.reachability()));
    if (e.id() == self) own = e.reachability();
  }
  return JsonObject()
      .Add("reachability", ReachabilityName(own))
      .Add("members_reachability", members);
}

JsonObject RelayFields(const Swarm& swarm) {
  JsonObject by_member;
  for (const auto& [id, bytes] : swarm.relay_forwarded_by_member()) {
    by_member.Add(id, bytes);
  }
  return JsonObject()
      .Add("relay", swarm.relay())
      .Add("relays_lost", swarm.relays_lost())
      .Add("relayed_bytes", swarm.relayed_bytes())
      .Add("relay_forwarded_bytes", swarm.relay_forwarded_bytes())
      .Add("relay_forwarded_by_member", by_member)
      .Add("bytes_via_relays", swarm.bytes_via_relays());
}

}  // namespace starling
