// An elastic DiLoCo swarm as one node sees it: membership by gossip, the
// round protocol that lets members come and go, and state transfer to
// joiners. The node runtime (node/) drives it from its training thread.
//
// Protocol (one round r):
//  1. Membership. A node joins through any live member (Join: the handshake
//     checks run id, algorithm, codec and model fingerprint, then hands over
//     the peer table). Tables spread by gossip every gossip_interval; each
//     entry carries the member's incarnation, heartbeat, next round and
//     lineage (the hash of its θ_global, and its weight: see Lineage).
//     Silence for suspect_after makes a member SUSPECT, as long again DEAD;
//     a member refutes a rumour by raising its incarnation
//     (gossip/membership.h). A leaving node gossips LEFT to every live
//     member at once. A tick's gossip calls run at once,
//     each bounded by suspect_after / 4 (1 s at most), so a hung peer cannot
//     hold up the heartbeats of the others; a tick late beyond its sleep and
//     calls was a pause of this process (SIGSTOP, a starved CPU), and
//     nobody's silence during it counts against them (ForgivePause).
//  2. The coordinator of a node is the live, non-joining member with the
//     smallest id in its view. After its inner steps a member sends READY
//     (r, lineage) to its coordinator and resends it when the coordinator
//     changes.
//  3. The coordinator waits until every live, non-joining member on the same
//     (r, lineage) is ready, or round_deadline after the first READY, then
//     sends PLAN(r, attempt, members, their incarnations) to the ready ones.
//     A member accepts a PLAN only from the node it considers its
//     coordinator; a PLAN refused by a live member that follows another
//     coordinator is aborted and the next one waits for that member's READY
//     (or the deadline) instead of running the round without it. A
//     coordinator that sees a live member already past r (an earlier
//     coordinator committed r and died before telling all, or this node was
//     stopped while the rest went on) answers its ready members STALE
//     instead of running r among them. The members run the ring all-reduce over
//     exactly that set (mailbox sequence r * 2^20 + attempt) and report DONE.
//     Two coordinators may number an attempt alike (one took over before it
//     heard of the other's plan), so every chunk also carries the digest of
//     its plan (PlanDigest: coordinator, members, incarnations), and a
//     member refuses, without blame, a chunk of a plan it does not run.
//     Round messages whose round or attempt numbers are out of the range
//     the protocol produces (kMaxRound in membership.h) are refused.
//  4. When every member of the attempt is DONE the coordinator sends COMMIT
//     and only then does a member apply the outer step. If a member of the
//     attempt becomes SUSPECT, DEAD or LEFT, shows up at a higher
//     incarnation than planned (it restarted before anyone suspected it:
//     its old life will never report), refuses the plan or reports FAILED
//     first, the coordinator sends ABORT (waiters wake at once) and plans a
//     new attempt over the survivors, who still hold their own Δ. A member
//     calls its running attempt off by itself on the same signs about the
//     other members (the coordinator's ABORT may never come, e.g. when the
//     coordinator is the one that restarted). So θ_global never moves from a
//     sum that only some members saw. A member whose part is DONE and whose
//     coordinator shows up past r for 2 s without a COMMIT or ABORT for it
//     (lost while the member was stopped) sends READY again.
//  5. A READY for a round the coordinator has already committed, or on a
//     worse lineage, gets STALE: that member (and any node that sees a
//     better lineage in gossip before a round) fetches the state of the best
//     lineage from a member on it (FetchState: chunked, zstd, checksummed,
//     resumable from another donor with the same digest) and continues from
//     the next round. Each member encodes and compresses its state after a
//     commit on a thread of its own (ServeState), and refuses at once a
//     request for a round its served state has not reached. A member done
//     with its run stays, serving, while a live member is behind (Behind:
//     at an earlier round, or at the same round on a worse lineage, e.g.
//     the other side of a partition that healed as both finished): once
//     all had left, that one could only run the rounds it missed alone, or
//     end on another model. A member done on a worse lineage fetches the
//     best one's state before it leaves (the node's part). Then it lingers
//     while a DEAD member behind it may come back (MayComeBack: a stopped
//     process, a host asleep), and a member's LEFT entry keeps its final
//     round and lineage, so that one that wakes too late knows the swarm
//     finished without it (Judge, gossip/swarm_end.h) instead of running
//     the rounds alone. Lineages order
//     by round (more progress wins), then by weight (member_rounds: the
//     sum of the member counts of the rounds that made θ_global), then by
//     smallest hash, so after a partition heals every node converges on
//     one θ_global: the half that completed more rounds; at the same
//     round, the one more members trained on (not a member that ran a
//     round alone while the others ran it together); on a tie, the
//     smaller hash.
//  6. Adaptive sync. A member whose drift detector or divergence trigger
//     fires during round r gossips early_sync = r + 1 in its entry
//     (RequestEarlySync); every member polls EarlySyncRequested(r) between
//     inner steps and goes to READY at once, so the whole swarm syncs within
//     a gossip interval or two. Members may thus bring different step
//     counts to a round; the node weights their Δ accordingly.
//
// Push-sum gossip (--algo=gossip) uses the same membership but no rounds:
// Push streams (y, w) to one live member, whose handler checks it and
// deposits it in a bounded inbox (RESOURCE_EXHAUSTED when full) that the
// training thread drains with TakePushes. A push stream that stalls past
// push_timeout is cancelled by the server, so no inbox slot is held forever.
//
// Parts. Swarm is a facade over one object per concern, each in its own
// file: MembershipGossip (join, the start barrier, gossip, goodbye),
// RoundCoordinator (the coordinator's decisions: a state machine with no
// I/O) run by CoordinatorThread, RoundMember (the member's side of a round,
// deciding through RoundMemberState), StateServer and StateFetcher (the two
// ends of state transfer), PushChannel and PushInbox (push-sum gossip), and
// SwarmClient (a channel per peer, the emulated Partition, round messages),
// which the others call their peers through. round_protocol.h holds what
// coordinator and member share.
//
// Threads. Start runs five (and the relay's reaper), and Shutdown joins
// them:
//  - the gossip thread (MembershipGossip): a tick every gossip_interval;
//    its calls to peers run at once as asynchronous calls, and it polls
//    SwarmOptions::interrupted and calls a running attempt off
//    (RoundMember::CallOffIfGone) at the end of each tick;
//  - the coordinator thread (CoordinatorThread): a tick every 50 ms, or at
//    once when a round message or a change of the table wakes it; it sends
//    what the coordinator decided with SwarmClient::SendControls, which
//    starts one thread per member but the last for the duration of the
//    call;
//  - the confirm thread (CoordinatorThread): sends the CONFIRMs that ask a
//    member to prove the round token of a READY (round_tokens.h), so that
//    a member that does not answer delays no tick;
//  - the state thread (StateServer): encodes what ServeState hands over;
//  - the relay thread (RelayAttachment): while this node is unreachable,
//    holds its relay's Attach stream (with a watchdog thread), and starts a
//    thread per relayed connection; RelayRoutes runs an accept thread per
//    relayed member this node dials, and a thread per connection.
// gRPC's threads run the Swarm service's handlers (Join, Gossip, Control,
// FetchState, Push) and the callbacks of asynchronous calls: they only
// touch memory, under short locks, and never block. The Relay service uses
// the synchronous API instead: each of its calls holds a gRPC thread for
// its life, pumping one direction of a spliced connection. The caller's threads
// run the public methods: the training thread's SyncRound, FetchState and
// Push make calls to peers of their own; SyncRound and FetchState must be
// called from one thread. Every other public method is thread-safe.
// on_member_change runs on the gossip thread, a Join or Gossip handler's,
// or JoinSwarm's caller.
//
// Mutexes. Each part's state has its own mutex, and no two of these are
// ever held at once: a part reads the member table before it takes its
// mutex, and calls nothing (a peer, another part, a callback, the cancel of
// a mailbox, the log) while it holds it.
//  - CoordinatorThread::mu_: the round coordinator (round, ready members,
//    the running attempt and its plan), the round tokens and the CONFIRMs
//    to send;
//  - RoundMember::mu_: the round messages held for the training thread, the
//    round it is in and the attempt it runs (with the cancels in flight of
//    that attempt's mailbox, which must end before the mailbox goes away);
//  - StateServer::mu_: the state handed over and the state served;
//  - PushInbox::mu_: the pushes received and the places of those still
//    streaming in;
//  - MembershipGossip::mu_: the seeds found to be this node and the
//    joiners refused;
//  - SwarmClient::mu_: the channels by address; Partition::mu_: the
//    emulated partition's groups.
// The objects these parts use guard themselves, and are taken with none of
// the above held: Membership (the table), Mailbox (an attempt's messages),
// PublicCopies, LinkEmulator, StreamDeadlines, RpcErrorCounter, the logger.
#ifndef STARLING_GOSSIP_SWARM_H_
#define STARLING_GOSSIP_SWARM_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "compression/tensor_policy.h"
#include "gossip/grpc_transport.h"
#include "gossip/membership.h"
#include "gossip/push_sum.h"
#include "gossip/round_protocol.h"
#include "gossip/state_transfer.h"
#include "gossip/swarm_end.h"

namespace starling {

class CoordinatorThread;
class MembershipGossip;
class PushChannel;
class RelayAttachment;
class RelayRoutes;
class RelayServer;
class RoundMember;
class StateFetcher;
class StateServer;
class SwarmClient;

struct SwarmOptions {
  std::string node_id;  // unique in the swarm
  std::string listen = "127.0.0.1:0";
  // What the others are told to dial (join, membership table, round plans):
  // a port forward or public name when `listen` is not reachable as such.
  // Empty: the address the server bound (`listen` with its port).
  std::string advertise;
  // Reverse connections, when the dial-back at join finds this node
  // UNREACHABLE (relay_attachment.h): "auto" picks a reachable member,
  // "off" stays unreachable, HOST:PORT names the member to relay through.
  // Every node serves as a relay for the others (relay_server.h).
  std::string relay = "auto";
  // Tests: as a relay, cut each relayed connection after it carried this
  // many bytes (RelayServerOptions::cut_after_bytes); 0: never.
  int64_t relay_cut_after_bytes = 0;
  // Tests: as a relay, hold each forwarded frame this long
  // (RelayServerOptions::delay).
  absl::Duration relay_delay = absl::ZeroDuration();
  // Addresses of any live members. A node may list itself (under any name
  // that reaches it, such as its DNS name): see found_after.
  std::vector<std::string> seeds;
  // A node that is itself one of the seeds founds the swarm alone when no
  // other seed admitted it within this time (a StatefulSet whose pods all
  // list the first ordinals).
  absl::Duration found_after = absl::InfiniteDuration();
  PeerIdentity identity;          // identity.world is ignored
  int64_t chunk_bytes = 1 << 20;  // tensor and state chunks
  absl::Duration rpc_timeout = absl::Seconds(60);
  absl::Duration gossip_interval = absl::Milliseconds(200);
  absl::Duration suspect_after = absl::Seconds(3);
  absl::Duration round_deadline = absl::Seconds(60);
  // The most members this node's table holds (MembershipOptions.max_members).
  size_t max_members = 1024;
  // A file whose first line, when present, splits node ids into groups that
  // cannot reach each other ("n0,n1|n2,n3"): an emulated partition.
  std::string partition_file;
  // Tensors and their compressed sizes; rank, world and round are set per
  // attempt.
  MailboxOptions mailbox;
  // Push-sum gossip: the model size pushes must have (0: this node refuses
  // pushes), the codec of lossy pushes (null: raw fp32 only; must outlive
  // the Swarm), how many pushes may wait or be in flight to this node, and
  // how long one incoming push stream may take before it is dropped.
  int64_t push_elements = 0;
  const PolicyCodec* push_codec = nullptr;
  int push_inbox = 8;
  absl::Duration push_timeout = absl::Seconds(30);
  // When set, shapes the tensor messages and pushes this node sends to each
  // peer address (an emulated slow link; control RPCs are not shaped).
  std::shared_ptr<LinkEmulator> links;
  // TLS or plaintext, for the server and every channel to a peer.
  PeerCredentials credentials = InsecurePeerCredentials();
  // A server-side stream (tensor chunks, state transfer) that carries no
  // message for this long is cancelled. Chunk streams may also run at most
  // round_deadline plus a minute, a state transfer 10 minutes (the joiner
  // resumes where it stopped), a push push_timeout.
  absl::Duration stream_idle_timeout = absl::Seconds(60);
  // How many incoming streams one peer host may have open at once, across
  // its connections (--peer_max_streams); 0: no cap.
  int peer_max_streams = 0;
  // Called with no lock held for every change of the peer table: on the
  // gossip thread, a Join or Gossip handler's, or JoinSwarm's caller.
  std::function<void(const MembershipChange&)> on_member_change;
  // Polled on the gossip thread, with no lock held: once it returns true,
  // this node's part of a running attempt is called off at once (its reduce
  // fails instead of waiting for peers), e.g. on a second SIGINT/SIGTERM.
  // SyncRound's `stop` then decides what follows.
  std::function<bool()> interrupted;
};

class Swarm {
 public:
  // Starts the server (Peer and Swarm services) and the gossip and
  // coordinator threads. InvalidArgument for a bad option, Unavailable when
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Swarm>> Start(
      const SwarmOptions& options);
  ~Swarm();

  const std::string& id() const { return options_.node_id; }
  // Where the others reach this node (SwarmOptions.advertise).
  const std::string& address() const { return address_; }
  // Where its server listens (`listen` with the port it bound).
  const std::string& listen_address() const { return transport_->address(); }

  // Joins through the seeds, trying each until one admits this node. OK at
  // once without seeds, or after found_after when this node is a seed.
  // FailedPrecondition with the seed's reason when it refuses (run id, model,
  // ...); Unavailable when none answered in time.
  absl::Status JoinSwarm(absl::Time deadline);

  // Waits until at least `n` members (this one included) are ready: not
  // joining (a node counts for the others only once its JoinSwarm returned
  // and it said so with SetProgress) and live, or LEFT after being ready (a
  // fast member may train and leave before a slow one sees it ready).
  // On success it first tells every live member at once that this node is
  // ready: a node that joined last may pass at once, train and die before
  // its first gossip, and the others must not then wait for it in vain.
  // DeadlineExceeded saying who is known.
  absl::Status WaitForMembers(int n, absl::Time deadline);

  // Where a member is: the next round it runs, on which θ_global.
  struct Lineage {
    int64_t round = 0;
    std::string lineage;  // the hash of its θ_global ("": none yet)
    // The lineage's weight: over the rounds that made its θ_global, the
    // sum of each round's member count (MemberEntry.member_rounds).
    int64_t member_rounds = 0;
    std::vector<std::string> donors;  // Best(): every other live member
  };
  // True when `a` is ahead of `b`: at a later round; or, at the same round
  // on another θ_global (a partition's other side, a member that ran a
  // round apart), heavier (more member_rounds: more members trained on
  // it); or, as heavy, of the smaller hash.
  static bool Ahead(const Lineage& a, const Lineage& b);
  // The lineage a member's entry gossips.
  static Lineage Of(const peer::v1::MemberEntry& e);
  // The best lineage among live, non-joining members, this node included.
  Lineage Best() const;

  // What this node gossips about its progress.
  void SetProgress(const Lineage& at, bool joining);
  // Adaptive sync: asks every member, by gossip, to end `round` now (this
  // node's drift detector or divergence trigger fired), and whether any
  // live member (this one included) asked so for `round`.
  void RequestEarlySync(int64_t round);
  bool EarlySyncRequested(int64_t round) const;
  // The state this node serves to joiners (its last committed round). It
  // is encoded, compressed and hashed on a thread of the swarm's, so the
  // caller (the training loop) pays only for the copy it hands over; until
  // that is done joiners get the previous state (or UNAVAILABLE before the
  // first). A state still waiting to be encoded is replaced by a newer one.
  void ServeState(SwarmState state);
  // The round of the state served now, or -1 before the first.
  int64_t ServedRound() const;

  struct FetchStats {
    std::string donor;
    int64_t bytes = 0;  // compressed bytes received
    double seconds = 0;
    int retries = 0;  // chunks or donors that failed and were retried
  };
  // Fetches the state from `donors` (ids), resuming with the next donor when
  // one fails mid-transfer, and skipping a donor whose state is behind
  // `at_least` (when not null). Unavailable when every donor failed before
  // `deadline`. Adds to `*stats` (when not null) what this call received,
  // took and retried, whether it succeeds or not, so that a caller that
  // calls again after a failure reports the whole transfer.
  absl::StatusOr<SwarmState> FetchState(const std::vector<std::string>& donors,
                                        const Lineage* at_least,
                                        absl::Time deadline, FetchStats* stats);

  enum class Outcome { kCommitted, kStale, kStopped };
  struct RoundResult {
    Outcome outcome = Outcome::kStale;
    std::vector<std::string> members;  // of the committed attempt
    int attempt = 0;
  };
  // Runs `reduce` over the round's transport for one attempt: it must
  // restore its input before each call (an attempt may be re-run).
  // `members` are the attempt's node ids by rank.
  using Reduce = std::function<absl::Status(
      Transport& t, int64_t sequence, const std::vector<std::string>& members)>;
  // Steps 2-5 of the protocol for round `at.round` of `at`. kStopped when
  // `stop()` turns true while this node waits for a plan or, its part done,
  // for the coordinator's COMMIT (it abandons the round; see
  // SwarmOptions::interrupted for leaving an attempt's reduce). Errors only
  // for local failures, among them FailedPrecondition when this node's
  // emulated link cannot carry the round's messages within the run's
  // limits (LinkError): every attempt would fail alike.
  absl::StatusOr<RoundResult> SyncRound(const Lineage& at, const Reduce& reduce,
                                        const std::function<bool()>& stop);

  // Push-sum gossip. Streams `share` to member `peer_id` in chunks of
  // chunk_bytes, all within `timeout` (through the emulated link, when
  // options.links shapes it). Unavailable when the peer is not alive here,
  // unreachable or too slow (the emulated link included); ResourceExhausted
  // when its inbox is full; InvalidArgument / FailedPrecondition when it
  // refused the push (FailedPrecondition also when it lacks the public copy a
  // relative share names: push in full next). In every case the caller may
  // restore its share and try another peer, except after an emulated link
  // too slow for the push at all (LinkError). On success `*sequence` (when
  // not null) is the push's sequence number, the one a later share's base
  // names.
  absl::Status Push(const std::string& peer_id, const PushShare& share,
                    absl::Duration timeout, int64_t* sequence = nullptr);
  // Not OK once a round's message or a push found this node's emulated link
  // too slow for the run's limits (LinkEmulator::Error): FailedPrecondition
  // naming the link, the message and the limit. Every later try would fail
  // alike, so the node should stop.
  absl::Status LinkError() const;
  // The pushes received since the last call, in arrival order.
  std::vector<ReceivedPush> TakePushes();
  // Ids of the other members that are alive in this node's view, sorted.
  std::vector<std::string> AlivePeers() const;
  // Pushes refused by this node's handler (invalid payloads, full inbox).
  int64_t pushes_refused() const;

  // The other members, alive or suspected, joining or not, that this node's
  // table shows behind `self`: at an earlier round, or at the same round
  // on a worse lineage (see Ahead), by id. At the end of a run a
  // node stays (serving its state) while some are: one that missed the
  // last rounds, or ran them apart, can catch up only from a member that
  // has not left.
  std::vector<peer::v1::MemberEntry> Behind(const Lineage& self) const;

  // Whether this node is still in the swarm, and the furthest state it
  // knows the swarm reached (gossip/swarm_end.h), from its table and the
  // pause it last noticed.
  SwarmView Judge() const;
  // How long this process's last noticed pause was (zero: none).
  absl::Duration LastPause() const;
  // The other members this node's table shows DEAD (not LEFT) and behind
  // `self` (see Behind) that may still come back: their address still
  // listens or does not answer (ProbeAddress: a stopped process, a host
  // asleep), or an emulated partition cuts them off. A member whose
  // address refuses connections has exited; a restart would come back as
  // a new incarnation. Probes each such address, at most `timeout` each,
  // on the calling thread.
  std::vector<peer::v1::MemberEntry> MayComeBack(const Lineage& self,
                                                 absl::Duration timeout) const;

  // Says goodbye: marks this node LEFT and tells every live member. Its
  // LEFT entry keeps its round, lineage and weight: those of a finished
  // member are the swarm's final state (gossip/swarm_end.h).
  void Leave();
  // Stops the threads and the server. Idempotent.
  void Shutdown();

  std::vector<peer::v1::MemberEntry> Members() const;
  int64_t bytes_sent() const;
  int64_t bytes_received() const;
  // Failed client RPCs (gossip, control, join, state, tensors) by code.
  std::map<std::string, int64_t> rpc_errors() const {
    return transport_->rpc_errors().Snapshot();
  }
  // Incoming calls and streams refused or cut off so far, by reason:
  // "rate_limit" (--peer_rate_limit), "stream_limit" (--peer_max_streams),
  // "stream_cancelled" (idle or past its deadline), "early_refused" (tensor
  // messages of an attempt not installed yet, refused for their plan,
  // sender, size or the bound per sender), "control_refused" (round
  // messages out of range, from a stranger, under this node's own id or
  // without the round token they must carry).
  std::map<std::string, int64_t> refusals() const;
  // Payload bytes of early tensor messages held now.
  int64_t early_bytes() const;
  // Reverse connections (relay.proto). The relay this node is attached to
  // now ("" when none); bytes carried through it to and from this node;
  // relays it lost; bytes this node forwarded as a relay for others, in
  // all and by relayed member; and bytes it sent and received through
  // other members' relays.
  std::string relay() const;
  int64_t relayed_bytes() const;
  int64_t relays_lost() const;
  int64_t relay_forwarded_bytes() const;
  std::map<std::string, int64_t> relay_forwarded_by_member() const;
  int64_t bytes_via_relays() const;

  class Service;  // public for the .cc's reactors

 private:
  explicit Swarm(const SwarmOptions& options);
  // Makes the parts once the transport and the table exist.
  void MakeParts();

  // The Control handler (and this node's own round messages, `host` ""):
  // the coordinator's messages (READY, DONE, FAILED) go to the coordinator
  // thread, the member's (PLAN, COMMIT, ABORT, STALE, CONFIRM) to the round
  // member, once their numbers, senders and round tokens are checked.
  peer::v1::ControlAck OnControl(const peer::v1::ControlMessage& m,
                                 const std::string& host);
  // Refuses `m` from `host` saying `why`: counted, and logged at most once
  // a minute per host (LogRefusal).
  peer::v1::ControlAck RefuseControl(const std::string& host,
                                     const peer::v1::ControlMessage& m,
                                     std::string why);
  // Membership changes: a dead or departed sender's push copy is dropped,
  // and options_.on_member_change hears each.
  void ReportChanges(const std::vector<MembershipChange>& changes);

  const SwarmOptions options_;
  std::atomic<bool> ready_{false};     // the parts below exist (Service waits)
  std::atomic<bool> stopping_{false};  // every part's loops end on it
  std::atomic<int64_t> control_refused_{0};     // see refusals()
  std::shared_ptr<StreamDeadlines> deadlines_;  // outlives the server
  std::unique_ptr<Service> service_;
  std::unique_ptr<RelayServer> relay_server_;  // outlives the server
  std::shared_ptr<RelayRoutes> routes_;
  std::unique_ptr<GrpcTransport> transport_;
  std::string address_;  // advertised: options_.advertise or the bound one
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<SwarmClient> client_;
  std::unique_ptr<MembershipGossip> gossip_;
  std::unique_ptr<CoordinatorThread> coordinator_;
  std::unique_ptr<RoundMember> member_;
  std::unique_ptr<StateServer> state_;
  std::unique_ptr<StateFetcher> fetcher_;
  std::unique_ptr<PushChannel> pushes_;
  std::unique_ptr<RelayAttachment> attachment_;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_SWARM_H_
