// The peer table of an elastic swarm (SWIM-style, without networking): who is
// in the swarm, at which incarnation, alive, suspected, dead or gone. Nodes
// exchange Snapshot()s by gossip and Merge() what they receive; heartbeats
// ride on those exchanges, and Tick() runs the failure detector on the time
// since each member's heartbeat last rose, less any pause of this node's own
// (ForgivePause).
//
// Merge rules, per member id:
//  - a higher incarnation wins outright;
//  - at equal incarnation the worse state wins (ALIVE < SUSPECT < DEAD/LEFT),
//    and a higher heartbeat (or round) of an ALIVE/SUSPECT entry refreshes
//    it; an ALIVE entry never undoes SUSPECT/DEAD/LEFT of the same
//    incarnation, except that a SUSPECT raised by this node's own Tick()
//    clears when the member's heartbeat rises (a gossiped SUSPECT needs the
//    member's new incarnation);
//  - an entry about this node itself that says SUSPECT or DEAD (or LEFT) at
//    the current incarnation, or any entry about it at a higher incarnation
//    (an earlier life), is refuted: the node raises its incarnation above
//    that entry's and stays ALIVE (a node that has left refutes nothing).
//    Gossip never edits this node's address, heartbeat or progress.
//    A stale entry (older incarnation) changes nothing, so an old or forged
//    death notice cannot evict a live node. An entry whose incarnation is
//    more than a day ahead of this node's clock is refused (incarnations
//    are start times in ms), so a forged one cannot take a member's
//    incarnation out of the range it can still refute from.
// DEAD and LEFT entries stay as tombstones so gossip cannot resurrect them; a
// restarted node comes back with a higher incarnation (Options.incarnation
// defaults to the wall clock in milliseconds, which grows across restarts).
// The table is bounded (Options.max_members): a new member evicts the
// tombstone whose state changed longest ago, and is refused when every row
// is live, so that ids gossiped by a misbehaving peer or years of churn
// cannot grow it without end. An evicted tombstone's id and incarnation
// are kept (as many as the table holds), so that stale gossip does not
// bring it back.
//
// Thread-safe: one absl::Mutex guards the table; no callbacks.
#ifndef STARLING_GOSSIP_MEMBERSHIP_H_
#define STARLING_GOSSIP_MEMBERSHIP_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

struct MembershipOptions {
  std::string self_id;
  std::string self_address;
  // 0 means "now in Unix milliseconds".
  int64_t incarnation = 0;
  // An ALIVE member whose heartbeat has not risen for this long becomes
  // SUSPECT; a SUSPECT one that stays silent as long again becomes DEAD.
  absl::Duration suspect_after = absl::Seconds(3);
  // The most rows the table holds, this node's included (at least 1). When
  // it is full, an id not yet known takes the place of the DEAD or LEFT row
  // whose state changed longest ago; a tombstone of an unknown id is then
  // dropped, and a live one is refused (ResourceExhausted) while no row is
  // DEAD or LEFT.
  size_t max_members = 1024;
};

// The highest round an entry, a round message or a swarm state may name.
// Far beyond any real run (a round a second for 34,000 years), and low
// enough that arithmetic on rounds (a round's mailbox sequence is round *
// 2^20 + attempt) cannot overflow, whatever number a peer sends.
constexpr int64_t kMaxRound = int64_t{1} << 40;
// The highest member_rounds (a lineage's weight: the sum of its rounds'
// member counts) a peer may claim: kMaxRound rounds of 2^20 members, with
// room to add a round's members without overflow.
constexpr int64_t kMaxMemberRounds = int64_t{1} << 60;

// OK when `id` can name a member: 1 to 128 bytes of printable ASCII without
// spaces or the separators of --hosts and the sim's specs (',', '|', '@').
// InvalidArgument saying what is wrong otherwise. A node's own --node_id and
// every id a peer gossips must pass it.
absl::Status CheckNodeId(absl::string_view id);

// OK when `lineage` (the hash of a θ_global) is empty or 1 to 128 bytes of
// printable ASCII without spaces; InvalidArgument saying what is wrong
// otherwise. Every lineage a peer sends must pass it.
absl::Status CheckLineage(absl::string_view lineage);

// "alive", "suspect", "dead", "left" or "unknown": for logs and events.
const char* MemberStateName(peer::v1::MemberState s);

// A change Merge() or Tick() made, for the event log.
struct MembershipChange {
  std::string id;
  peer::v1::MemberState from = peer::v1::MEMBER_STATE_UNSPECIFIED;  // new id
  peer::v1::MemberState to = peer::v1::MEMBER_ALIVE;
  int64_t incarnation = 0;
};

class Membership {
 public:
  // InvalidArgument when self_id or self_address is empty, incarnation is
  // negative or max_members is 0.
  static absl::StatusOr<std::unique_ptr<Membership>> Create(
      const MembershipOptions& options, absl::Time now);

  const std::string& self_id() const { return options_.self_id; }

  // Raises this node's heartbeat (call once per gossip tick).
  void Beat() ABSL_LOCKS_EXCLUDED(mu_);

  // Sets what this node gossips about its progress; a change raises the
  // heartbeat, so that the others take the new row over copies of the old.
  void SetProgress(int64_t round, const std::string& lineage,
                   int64_t member_rounds, bool joining)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records what the dial-back at this node's join found (see
  // MemberEntry.reachability); a change raises the heartbeat.
  void SetReachability(peer::v1::Reachability r) ABSL_LOCKS_EXCLUDED(mu_);
  // Records the address of the relay this node is attached to ("" for
  // none: MemberEntry.relay); a change raises the heartbeat.
  void SetRelay(const std::string& relay) ABSL_LOCKS_EXCLUDED(mu_);
  // Asks the members (by gossip) to end `round` early: see
  // MemberEntry.early_sync.
  void RequestEarlySync(int64_t round) ABSL_LOCKS_EXCLUDED(mu_);

  // Marks this node LEFT (graceful goodbye) with a fresher heartbeat, so
  // that the entry carries its last progress too; Snapshot() then has it.
  void Leave() ABSL_LOCKS_EXCLUDED(mu_);

  // Merges entries received by gossip (or in a join answer) at local time
  // `now`. Entries with a bad id (CheckNodeId), an empty, overlong or
  // unprintable address or lineage, an unspecified state or negative
  // counters are skipped (InvalidArgument naming the first, after merging
  // the rest), and so are new live members of a full table
  // (ResourceExhausted: see max_members).
  // Appends what changed to `changes` when it is not null.
  absl::Status Merge(const std::vector<peer::v1::MemberEntry>& entries,
                     absl::Time now,
                     std::vector<MembershipChange>* changes = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Failure detection at local time `now` (see suspect_after).
  void Tick(absl::Time now, std::vector<MembershipChange>* changes = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // This node itself could not run for `paused` up to local time `now` (its
  // process was stopped, or starved of CPU): it heard nobody then, through
  // no fault of theirs. Every other member's silence timer moves on by that
  // much (never past `now`), so that a node waking from a pause does not
  // suspect the whole swarm at its next Tick() and go on alone.
  void ForgivePause(absl::Duration paused, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The whole table, this node included (sorted by id).
  std::vector<peer::v1::MemberEntry> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  // The member other than this node at `address` that is behind NAT and
  // names a relay (MemberEntry.relay): its id and relay, or NotFound. The
  // dialing path asks on every new channel, so this copies no table.
  absl::StatusOr<std::pair<std::string, std::string>> RelayedAt(
      const std::string& address) const ABSL_LOCKS_EXCLUDED(mu_);

  // Members that are ALIVE or SUSPECT (not yet declared dead), this node
  // included while it has not left, sorted by id.
  std::vector<peer::v1::MemberEntry> Live() const ABSL_LOCKS_EXCLUDED(mu_);

  // The entry for `id`, or NotFound.
  absl::StatusOr<peer::v1::MemberEntry> Get(const std::string& id) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Row {
    peer::v1::MemberEntry entry;
    absl::Time last_rise;  // local time its heartbeat (or state) last moved
    // SUSPECT by this node's own Tick() (not by gossip): a rising heartbeat
    // clears it at the same incarnation.
    bool suspected_locally = false;
  };
  explicit Membership(const MembershipOptions& options);

  // The row for `id`, or nullptr.
  Row* FindLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Row* FindLocked(const std::string& id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Row& SelfLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges one valid entry; ResourceExhausted when it is a new live member
  // and the table is full of live ones.
  absl::Status MergeOneLocked(const peer::v1::MemberEntry& e, absl::Time now,
                              std::vector<MembershipChange>* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // MergeOneLocked for an id not in the table (`e` valid): a stale entry
  // of an evicted tombstone is dropped; a full table evicts its oldest
  // tombstone, or refuses a live newcomer when it has none.
  absl::Status AddLocked(const peer::v1::MemberEntry& e, absl::Time now,
                         std::vector<MembershipChange>* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MembershipOptions options_;
  mutable absl::Mutex mu_;
  std::vector<Row> rows_ ABSL_GUARDED_BY(mu_);  // sorted by id; self included
  // Tombstones evicted from a full table, oldest first, at most
  // max_members: id and incarnation. An entry about one of them at that
  // incarnation or older is stale gossip and is dropped; were it taken, a
  // member known dead would come back as live until declared dead again.
  std::deque<std::pair<std::string, int64_t>> evicted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_MEMBERSHIP_H_
