// Membership by gossip (step 1 in gossip/swarm.h): joining through the
// seeds, the start barrier (WaitForMembers), the Join and Gossip handlers,
// the gossip thread's ticks (heartbeat, failure detection, a pause
// forgiven and remembered until a peer answers, two random live members
// called, now and then a suspected one or a seed), and the goodbye.
// The table itself is Membership's; this moves it between nodes.
// Thread-safety: thread-safe. One mutex guards what this node learned
// about its seeds, its refusals and its last pause; calls and hooks run
// with it released.
#ifndef STARLING_GOSSIP_MEMBERSHIP_GOSSIP_H_
#define STARLING_GOSSIP_MEMBERSHIP_GOSSIP_H_

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gossip/grpc_transport.h"
#include "gossip/membership.h"
#include "gossip/reachability.h"
#include "gossip/swarm_client.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

// The addresses one gossip tick calls, from this node's `table`: two random
// ALIVE members; half the ticks (every tick while none is ALIVE) one member
// it takes for SUSPECT or DEAD (three while none is ALIVE), which is how
// both sides of a healed partition learn to refute; and about one tick in
// ten (three in ten while none is ALIVE) a seed that is no ALIVE member's
// address (a DNS name) and not this node (`is_self_seed`), so that swarms
// founded apart meet and merge.
std::vector<std::string> GossipTargets(
    const std::vector<peer::v1::MemberEntry>& table, const std::string& self,
    const std::vector<std::string>& seeds,
    const std::function<bool(const std::string&)>& is_self_seed,
    std::mt19937_64& rng);

// How long the dial-back at a join waits for the joiner's address to
// accept a connection (within the joiner's 5 s join call).
inline constexpr absl::Duration kDialBackTimeout = absl::Seconds(1);

// How often a node that waits for its peers (joining, or for
// --min_members) says what it waits for.
inline constexpr absl::Duration kWaitReportEvery = absl::Seconds(5);

// The line a joining node logs every kWaitReportEvery: whom it tries, for
// how long and how often, the last error, and when it gives up.
std::string JoinWaitLine(const std::vector<std::string>& seeds,
                         absl::Duration waited, int attempts,
                         const std::string& last_error, absl::Duration left);

// The line a node waiting for `n` members (--min_members) logs every
// kWaitReportEvery: who is ready, who is known but not (joining, suspect,
// dead), and when it gives up.
std::string MembersWaitLine(const std::vector<peer::v1::MemberEntry>& table,
                            const std::string& self, int n,
                            absl::Duration waited, absl::Duration left);

class MembershipGossip {
 public:
  struct Options {
    std::string node_id;
    std::string address;  // this node's
    PeerIdentity identity;
    std::vector<std::string> seeds;
    absl::Duration found_after = absl::InfiniteDuration();
    absl::Duration gossip_interval = absl::Milliseconds(200);
    absl::Duration suspect_after = absl::Seconds(3);
    // The dial-back at a join: probes a joiner's address (null:
    // ProbeAddress, at most kDialBackTimeout).
    std::function<Reachability(const std::string& address)> probe;
  };
  // Called with no lock held.
  struct Hooks {
    // Every change of the table (a handler's, a join's or a tick's).
    std::function<void(const std::vector<MembershipChange>&)> report;
    // Gossip changed the table (a tick's or a Gossip handler's).
    std::function<void()> table_changed;
    // The end of every tick.
    std::function<void()> after_tick;
  };
  // `membership` and `client` must outlive it; the gossip thread runs until
  // `stopping` turns true (then Join it).
  MembershipGossip(Options options, Membership* membership, SwarmClient* client,
                   Hooks hooks, const std::atomic<bool>* stopping);
  ~MembershipGossip() { Join(); }

  void Start();
  void Join();

  // Swarm::JoinSwarm, WaitForMembers and Leave.
  absl::Status JoinSwarm(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WaitForMembers(int n, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Leave() ABSL_LOCKS_EXCLUDED(mu_);

  // The members that were live in this node's table when it last noticed a
  // pause of its own (the process stopped or starved) at least as long as
  // suspect_after, after which they may have declared it dead and gone on
  // without it; empty again once one of its gossip calls succeeds (see
  // gossip/swarm_end.h). And how long that pause was.
  std::vector<std::string> PausedWith() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration LastPause() const ABSL_LOCKS_EXCLUDED(mu_);

  // The Join and Gossip handlers.
  absl::Status OnJoin(const peer::v1::JoinRequest& req,
                      peer::v1::JoinResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status OnGossip(const peer::v1::GossipRequest& req,
                        peer::v1::GossipResponse* resp);

 private:
  // What JoinSwarm met so far; JoinSwarm's reporter thread reads it.
  struct Tries {
    absl::Mutex mu;
    std::string last_error ABSL_GUARDED_BY(mu) = "no answer yet";
    int attempts ABSL_GUARDED_BY(mu) = 0;
  };
  // One Join call to `seed`: what JoinSwarm returns, or nullopt for the
  // next seed.
  std::optional<absl::Status> TryJoin(const std::string& seed,
                                      absl::Time deadline,
                                      peer::v1::JoinRequest* req, Tries* tries)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records the dial-back verdict a join answer from `seed` carries in this
  // node's own row, and says what it means when peers cannot dial it.
  void RecordDialBack(const std::string& seed, peer::v1::Reachability verdict)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The request JoinSwarm sends (its `self` is set per call).
  peer::v1::JoinRequest Hello() const;
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Gossips this node's table to every live member at once (a goodbye, or
  // the news that it is ready) and merges their answers.
  void GossipToEveryone() ABSL_LOCKS_EXCLUDED(mu_);
  // Gossips this node's table to every address at once (skipping its own
  // and those across a partition), each call waiting at most `timeout`, and
  // merges the answers (recording into `changes` when not null).
  void GossipTo(const std::vector<std::string>& addresses,
                absl::Duration timeout, std::vector<MembershipChange>* changes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A pause of this process was forgiven (Loop): notes who it was with.
  void NotePause(absl::Duration paused) ABSL_LOCKS_EXCLUDED(mu_);
  // A gossip call was answered: the pause, if any, is behind it.
  void BackInTouch() ABSL_LOCKS_EXCLUDED(mu_);
  bool IsSelfSeed(const std::string& seed) const ABSL_LOCKS_EXCLUDED(mu_);
  bool HasSelfSeed() const ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  Membership* const membership_;
  SwarmClient* const client_;
  const Hooks hooks_;
  const std::atomic<bool>* const stopping_;
  std::thread thread_;
  std::atomic<bool> joined_{false};             // part of a swarm (OnJoin)
  std::atomic<bool> warned_table_full_{false};  // logged once (OnGossip)

  mutable absl::Mutex mu_;
  // Why this node refused joiners that are its seeds, by address.
  std::map<std::string, std::string> refused_ ABSL_GUARDED_BY(mu_);
  // Seeds that turned out to be this node.
  std::set<std::string> self_seeds_ ABSL_GUARDED_BY(mu_);
  // See PausedWith and LastPause.
  std::vector<std::string> paused_with_ ABSL_GUARDED_BY(mu_);
  absl::Duration last_pause_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

}  // namespace starling

#endif  // STARLING_GOSSIP_MEMBERSHIP_GOSSIP_H_
