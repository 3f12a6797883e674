// Whether a member is still in its swarm, judged from its own table: the
// decision a DiLoCo node makes before each round and as its run ends, so
// that a member the swarm finished without (a process stopped, a laptop
// asleep or a VM paused through the last rounds) neither trains on alone as
// though it were still in the swarm nor ends its run reporting a model of
// its own as the swarm's.
//
// What a member knows of the swarm's end: every entry carries the member's
// round, lineage (the hash of its θ_global) and weight, and a member that
// leaves keeps them in its LEFT entry, which gossip spreads as a
// tombstone. A member that finished the run leaves on its final state, so
// the LEFT entries of finished members name the swarm's final round, model
// and holders.
//
// Standings:
//  - kSwarmFinished: a member that LEFT holds a lineage ahead of every live
//    member's (this node's included), and no other member is live. The
//    swarm went on without this node and left: nobody can hand it that
//    state, and rounds it ran alone would make another model.
//  - kCutOff: this process was paused long enough for the others to
//    declare it dead (PausedWith: the members live in its table then),
//    nobody has answered it since, no other member is live and some of
//    those it was with are dead in its table now. They may have finished
//    without it and left, telling nobody it could hear; it cannot know.
//  - kInSwarm: otherwise, including a member whose peers all crashed while
//    it ran on (it holds the best lineage there is, and a crashed member
//    that restarts catches up from it).
// Two members paused together and woken after the swarm has left count as
// live to each other, and go on as a swarm of two.
//
// Pure functions of their inputs (no I/O, no clock); thread-safe.
#ifndef STARLING_GOSSIP_SWARM_END_H_
#define STARLING_GOSSIP_SWARM_END_H_

#include <cstdint>
#include <string>
#include <vector>

#include "starling/peer/v1/swarm.pb.h"

namespace starling {

enum class SwarmStanding { kInSwarm, kSwarmFinished, kCutOff };

// "in_swarm", "swarm_finished" or "cut_off" (for events and summaries).
const char* SwarmStandingName(SwarmStanding s);

// A θ_global as a member's entry gossips it.
struct SwarmPosition {
  int64_t round = 0;
  std::string lineage;  // "": none yet
  int64_t member_rounds = 0;
};

struct SwarmView {
  SwarmStanding standing = SwarmStanding::kInSwarm;
  // This node's own position (its entry in the table).
  SwarmPosition here;
  // The furthest position this node knows the swarm reached (by the order
  // of LineageAhead): its own, or any member's as last gossiped, whether
  // live, dead or departed.
  SwarmPosition furthest;
  // The members known on `furthest`, this node included when it is, by id.
  std::vector<std::string> holders;
  // kCutOff: the members it was with before its pause, as last seen here.
  std::vector<peer::v1::MemberEntry> unreachable;
  // kInSwarm, but not known yet: this node noticed a pause of its own,
  // none of the members it was with has answered since, and some of them
  // are still live in its table (the failure detector has not decided).
  // It must not run a round meanwhile: a round planned now would hold this
  // node alone, and commit a model of its own.
  bool waking = false;

  // Whether this node's own position is `furthest`.
  bool HoldsFurthest() const;
};

// Judges this node's standing from `table` (Membership::Snapshot(): every
// member, this node `self` included, whose own entry is its position).
// `paused_with`: the members that were live in its table when it last
// noticed a pause of its own as long as the failure detector's suspicion
// time, none of whom has answered it since (empty when there was none, or
// once one has).
SwarmView JudgeSwarm(const std::vector<peer::v1::MemberEntry>& table,
                     const std::string& self,
                     const std::vector<std::string>& paused_with);

}  // namespace starling

#endif  // STARLING_GOSSIP_SWARM_END_H_
