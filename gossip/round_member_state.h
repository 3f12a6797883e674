// What a member decides during one round of the elastic protocol (the
// member's side of steps 2-5 in gossip/swarm.h), from the round messages it
// takes and the time, with no I/O and no clock: which plans to run, when
// the round is committed or stale, when to send READY again. The round
// member (round_member.h) sends, runs and waits; this decides.
//  - A PLAN runs when its attempt is after every one seen; the member then
//    runs its part and reports DONE (or FAILED).
//  - COMMIT, ABORT and STALE count only from the coordinator that planned
//    the attempt done here or was last sent READY: another node's view of
//    the round (one this node once took for the coordinator, say) is not
//    the swarm's decision. COMMIT of the attempt done here commits the
//    round; ABORT of it waits for a new plan; STALE leaves the round.
//  - READY goes again when the coordinator changed (it died, or a partition
//    healed); every 2 s while waiting for a plan, in case it was lost; and
//    when the coordinator of the attempt done here has been past the round
//    for 2 s without a COMMIT or ABORT for it (lost while this node was
//    stopped, say): it then hears STALE.
// Not thread-safe: one SyncRound owns it.
#ifndef STARLING_GOSSIP_ROUND_MEMBER_STATE_H_
#define STARLING_GOSSIP_ROUND_MEMBER_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gossip/round_protocol.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

// Why this node calls off its part of a running attempt by itself (the
// coordinator's ABORT may never come, e.g. across a partition or from a
// coordinator that restarted), or "": `interrupted` (the node is
// stopping), or a member of the attempt or its coordinator gone from
// `live` since the plan (GoneSincePlan; `incarnations`: the members'
// incarnations in the plan, empty when it did not say).
std::string CallOffReason(const std::vector<std::string>& members,
                          const std::vector<int64_t>& incarnations,
                          const std::string& coordinator, const LiveTable& live,
                          bool interrupted);

class RoundMemberState {
 public:
  RoundMemberState(int64_t round, std::string self_id);

  int64_t round() const { return round_; }
  // The highest attempt seen (READY's last_attempt).
  int last_attempt() const { return last_attempt_; }
  // READY went to `coordinator` at `now`.
  void ReadySent(const std::string& coordinator, absl::Time now);
  const std::string& sent_to() const { return sent_to_; }

  // Whether `plan` (of this round) is of an attempt after every one seen.
  bool IsNew(const peer::v1::ControlMessage& plan) const {
    return plan.attempt() > last_attempt_;
  }
  // Takes new `plan`: this node's rank in it, or -1 when it is not a
  // member (the plan is then only counted as seen).
  int Start(const peer::v1::ControlMessage& plan);
  // This node's part of `plan` is done (it reports DONE).
  void Done(const peer::v1::ControlMessage& plan);

  enum class Verdict { kWait, kCommitted, kStale };
  // A COMMIT, ABORT or STALE of this round; `log` gets a line about a STALE
  // ignored.
  Verdict OnDecision(const peer::v1::ControlMessage& m,
                     std::vector<LogLine>* log);

  // With no message at `now`: whether to send READY again. `coordinator`:
  // whom this node takes for the coordinator now; `done_coordinator`: the
  // table's entry of the coordinator of the attempt done here (null when
  // it has none). `log` gets a line when it asks again after a decision
  // that never came.
  bool ShouldSendReady(const std::string& coordinator,
                       const peer::v1::MemberEntry* done_coordinator,
                       absl::Time now, std::vector<LogLine>* log);

  // The attempt done here and not yet committed (-1: none), its members by
  // rank and its coordinator.
  int done_attempt() const { return done_attempt_; }
  const std::vector<std::string>& done_members() const { return done_members_; }
  const std::string& done_coordinator() const { return done_coordinator_; }

 private:
  const int64_t round_;
  const std::string self_id_;
  int last_attempt_ = 0;
  int done_attempt_ = -1;
  std::vector<std::string> done_members_;
  std::string done_coordinator_;
  std::string sent_to_;
  absl::Time sent_at_ = absl::InfinitePast();
  // Since when the coordinator of the attempt done here is past this round.
  absl::Time coordinator_past_ = absl::InfiniteFuture();
};

}  // namespace starling

#endif  // STARLING_GOSSIP_ROUND_MEMBER_STATE_H_
