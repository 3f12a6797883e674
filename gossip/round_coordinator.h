// The round coordinator of the elastic protocol (steps 2-5 in
// gossip/swarm.h) as a state machine with no I/O and no clock, like
// Membership: events go in (a member's READY, DONE or FAILED, a refused
// plan, a tick of time with the live member table), and decisions come out
// (round messages to send, plans that need each member's acceptance, log
// lines). The coordinator thread (coordinator_thread.h) feeds it and sends
// what it decides with no lock held.
//
// One round at a time: the newest round (or the better lineage of it) a
// READY names. The coordinator
//  - waits for every ALIVE member at or before that round to be READY on it,
//    or round_deadline after the first READY, then plans attempt n + 1 over
//    the ready members (PLAN: members, their addresses and incarnations);
//    the attempt is above any a READY says its sender saw (last_attempt);
//  - commits an attempt when every member of it is DONE (COMMIT to them,
//    STALE to ready members left out of it);
//  - aborts it (ABORT to its members) when a member of it is no longer
//    ALIVE, comes back at a higher incarnation, reports FAILED, refuses the
//    plan, or the attempt runs past attempt_timeout; it then replans at once
//    over the rest, or, when the refusal came from a member that follows
//    another coordinator, waits for that one's READY or the deadline. From
//    the second abort of a round on, the next plan waits 100 ms, doubling up
//    to 5 s;
//  - answers STALE to a READY for a round it committed, or on a lineage
//    behind its own; to the members ready for a round a live member is
//    already past (committed without them); and, when a READY moves it to a
//    newer round or a better lineage, to those ready on the old one;
//  - refuses a READY for a round more than one ahead of its own that no
//    other member has reached, and goes back from a round that neither it
//    nor two other members have reached for kUnvouchedGrace;
//  - bans from the rest of a round both ends of a FAILED that names a
//    culprit (invalid data: one of the two is faulty, or lying).
//
// Not thread-safe: its owner serializes every call (a mutex).
#ifndef STARLING_GOSSIP_ROUND_COORDINATOR_H_
#define STARLING_GOSSIP_ROUND_COORDINATOR_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gossip/round_protocol.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

// How long a coordinator stays at a round no member vouches for.
constexpr absl::Duration kUnvouchedGrace = absl::Seconds(5);

struct RoundCoordinatorOptions {
  std::string self_id;
  std::string run_id;
  // How long after the first READY of a round the coordinator waits for the
  // other members before it plans over the ready ones.
  absl::Duration round_deadline = absl::Seconds(60);
  // An attempt still running this long after its plan is aborted
  // (--round_timeout).
  absl::Duration attempt_timeout = absl::Seconds(60);
};

class RoundCoordinator {
 public:
  explicit RoundCoordinator(RoundCoordinatorOptions options);

  // The events. Each message's numbers are in range (OutOfRange) and its
  // sender (and culprit) is a member: the caller checked. `live` is the
  // table's live members sorted by id (Membership::Live()).
  // A READY at `now`: "" when taken (or dropped: its sender sits the round
  // out), else why it is refused (see AloneAhead). Replies it calls for
  // go out with the next Tick's messages, first.
  std::string OnReady(const peer::v1::ControlMessage& ready,
                      const std::vector<peer::v1::MemberEntry>& live,
                      absl::Time now);
  void OnDone(const peer::v1::ControlMessage& done);
  // A FAILED; the log line when it bans its two ends.
  std::vector<LogLine> OnFailed(const peer::v1::ControlMessage& failed);
  // Member `to` refused `plan` or could not be reached; `follows` is the
  // coordinator it follows when it said so ("" otherwise).
  void OnPlanRefused(const peer::v1::ControlMessage& plan,
                     const std::string& to, const std::string& follows);

  struct Decisions {
    // An attempt is committed: the crash point "commit" comes before any
    // of the messages.
    bool commit = false;
    // Round messages (ABORT, COMMIT, STALE) in the order they go out.
    std::vector<Outgoing> messages;
    // PLANs, after the messages: each member's refusal goes back to
    // OnPlanRefused.
    std::vector<Outgoing> plans;
    std::vector<LogLine> log;
  };
  // Time passes (or the table changed): what the coordinator does at `now`.
  Decisions Tick(const std::vector<peer::v1::MemberEntry>& live,
                 absl::Time now);

  // The round it collects (-1 before the first READY), the last it
  // committed, the attempt last numbered, whether that attempt runs and its
  // members.
  int64_t round() const { return round_; }
  int64_t committed() const { return committed_; }
  int attempt() const { return attempt_; }
  bool running() const { return running_; }
  const std::vector<std::string>& plan() const { return plan_; }

 private:
  // OnReady for a round that moves the coordinator, or from a banned or
  // new member of its round.
  void MoveTo(const peer::v1::ControlMessage& ready, absl::Time now);
  void TakeReady(const peer::v1::ControlMessage& ready, absl::Time now);
  // Why `ready` is too far ahead of this coordinator's round for it to
  // move there (no other member is there), or "".
  std::string AloneAhead(const peer::v1::ControlMessage& ready,
                         const std::vector<peer::v1::MemberEntry>& live) const;
  // Whether this node, or two other members of `live`, are at round_ or
  // past it.
  bool Vouched(const LiveTable& live) const;

  // The steps of Tick, in order.
  void CheckAttempt(const LiveTable& live, absl::Time now, Decisions* d);
  void Abort(absl::Time now, Decisions* d);
  void Commit(Decisions* d);
  void ForgetUnvouched(const LiveTable& live, bool coordinating, absl::Time now,
                       Decisions* d);
  void CatchUpAhead(const LiveTable& live, bool coordinating, Decisions* d);
  void MaybePlan(const LiveTable& live, absl::Time now, Decisions* d);

  // A message of this coordinator's for its round and attempt.
  peer::v1::ControlMessage Message(peer::v1::ControlMessage::Kind kind) const;
  // Leaves round_ and every READY for it out of the rest of this round.
  void Ban(const std::string& id);

  const RoundCoordinatorOptions options_;
  int64_t round_ = -1;
  std::string lineage_;
  int64_t member_rounds_ = 0;  // of lineage_
  int64_t committed_ = -1;
  std::set<std::string> ready_;
  absl::Time first_ready_;
  int attempt_ = 0;
  // Every attempt number of this round is taken (logged once).
  bool out_of_attempts_ = false;
  // Since when no member vouches for round_ (see ForgetUnvouched).
  absl::Time unvouched_since_ = absl::InfiniteFuture();
  bool running_ = false;
  absl::Time plan_started_;
  bool replan_now_ = false;
  // The attempt being aborted was refused by a live member that follows
  // another coordinator: the next plan waits for it (see OnPlanRefused).
  bool hold_after_abort_ = false;
  std::vector<std::string> plan_;
  std::vector<std::string> plan_addresses_;
  std::vector<int64_t> plan_incarnations_;
  std::set<std::string> done_;
  std::set<std::string> excluded_;  // this round
  // Left out of the rest of this round: members that sent invalid data and
  // the members that reported it (one of the two is faulty, or lying).
  std::set<std::string> banned_;
  bool abort_ = false;
  std::string abort_reason_;
  // Attempts of this round aborted so far, and when the next may be
  // planned: the second retry waits 100 ms, doubling up to 5 s, so that an
  // attempt that fails at once every time (a link too slow for the round's
  // deadline, say) does not spin the swarm.
  int aborted_ = 0;
  absl::Time next_plan_at_ = absl::InfinitePast();
  // Replies the events called for, sent first by the next Tick.
  std::vector<Outgoing> replies_;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_ROUND_COORDINATOR_H_
