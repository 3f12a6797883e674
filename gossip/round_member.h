// A node's part in the elastic rounds as a member (the member's side of
// steps 2-5 in gossip/swarm.h): the inbox of round messages coordinators
// send it (PLAN, COMMIT, ABORT, STALE), held for the training thread, and
// the training thread's SyncRound, which sends READY, runs the attempts it
// is planned into over the transport, reports DONE or FAILED and returns
// once a round is committed, stale or left. RoundMemberState decides; this
// sends, runs and waits.
// A running attempt is called off (its mailbox cancelled, so the reduce
// fails at once instead of waiting for peers) by a newer PLAN, by its
// coordinator's ABORT, or by the gossip thread when a member of it or its
// coordinator is gone from the table, or the node is interrupted.
// Thread-safety: Run is called from one thread (the training thread), the
// handlers from the Swarm service's, CallOffIfGone from the gossip thread.
// One mutex guards the inbox and the running attempt. A mailbox is
// cancelled with it released: the one who decides marks the attempt called
// off and counts the cancel in flight, and the training thread waits for
// that count to reach zero before the attempt's mailbox may go away.
#ifndef STARLING_GOSSIP_ROUND_MEMBER_H_
#define STARLING_GOSSIP_ROUND_MEMBER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gossip/grpc_transport.h"
#include "gossip/mailbox.h"
#include "gossip/membership.h"
#include "gossip/round_member_state.h"
#include "gossip/swarm.h"
#include "gossip/swarm_client.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

class RoundMember {
 public:
  struct Options {
    std::string node_id;
    std::string run_id;
    std::string address;     // this node's, for its READY
    MailboxOptions mailbox;  // rank, world and round set per attempt
    // Not OK once this node's emulated link cannot carry a round.
    std::function<absl::Status()> link_error;
  };
  // `membership`, `client`, `transport` and `stopping` must outlive it.
  RoundMember(Options options, const Membership* membership,
              SwarmClient* client, GrpcTransport* transport,
              const std::atomic<bool>* stopping);

  // This node's round token (ControlMessage.token), drawn at construction:
  // its READY, DONE and FAILED carry it, and the round messages it heeds
  // must carry it back.
  uint64_t token() const { return token_; }

  // The Swarm service's handlers: a PLAN, and a COMMIT, ABORT or STALE
  // from a member (the caller checked numbers, sender and token). Only
  // messages of the round this node is in are held for the training
  // thread; those left when it leaves the round are dropped. An accepted
  // PLAN that names this node is announced to the transport
  // (GrpcTransport::ExpectAttempt), so that its members' chunks that come
  // before the attempt is installed are checked and held.
  peer::v1::ControlAck OnPlan(const peer::v1::ControlMessage& plan)
      ABSL_LOCKS_EXCLUDED(mu_);
  peer::v1::ControlAck OnDecision(const peer::v1::ControlMessage& m)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A CONFIRM from a member (a coordinator that got this node's READY):
  // the proof of this node's token for its nonce (RoundTokenProof).
  peer::v1::ControlAck Prove(const peer::v1::ControlMessage& confirm) const;
  // The gossip thread, every tick: calls the running attempt off when this
  // node is `interrupted` or a member of it (or its coordinator) is gone.
  void CallOffIfGone(bool interrupted) ABSL_LOCKS_EXCLUDED(mu_);

  // Swarm::SyncRound.
  absl::StatusOr<Swarm::RoundResult> Run(const Swarm::Lineage& at,
                                         const Swarm::Reduce& reduce,
                                         const std::function<bool()>& stop)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The attempt this node runs (mailbox null: none).
  struct Running {
    int attempt = -1;
    Mailbox* mailbox = nullptr;
    // Its members and coordinator: if one of them stops being alive here
    // (or a member restarted), the attempt is called off locally too.
    std::vector<std::string> members;
    // Their incarnations when planned (empty: the plan did not say).
    std::vector<int64_t> incarnations;
    std::string coordinator;
    bool called_off = false;
  };
  using Ending = std::optional<absl::StatusOr<Swarm::RoundResult>>;

  // Run's steps. Each Ending, when set, is what Run returns.
  void EnterRound(int64_t round) ABSL_LOCKS_EXCLUDED(mu_);
  Ending LeaveRound(Swarm::Outcome outcome, const RoundMemberState& state)
      ABSL_LOCKS_EXCLUDED(mu_);
  void SendReady(const Swarm::Lineage& at, RoundMemberState* state);
  std::optional<peer::v1::ControlMessage> Take() ABSL_LOCKS_EXCLUDED(mu_);
  Ending OnMessage(const peer::v1::ControlMessage& m,
                   const Swarm::Reduce& reduce,
                   const std::function<bool()>& stop, RoundMemberState* state)
      ABSL_LOCKS_EXCLUDED(mu_);
  Ending RunAttempt(const peer::v1::ControlMessage& plan, int rank,
                    const Swarm::Reduce& reduce, RoundMemberState* state)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Installs `plan` as the running attempt, called off at once when its
  // ABORT came before it.
  void BeginAttempt(const peer::v1::ControlMessage& plan)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the running attempt: whether it was called off.
  bool EndAttempt() ABSL_LOCKS_EXCLUDED(mu_);

  // Marks the running attempt called off: its mailbox, for CallOff to
  // cancel once mu_ is released (null when none runs or it was called off
  // already).
  Mailbox* CallOffLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CallOff(Mailbox* mailbox, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The mailbox options of `plan`'s attempt (rank and world are set by
  // the transport).
  MailboxOptions AttemptMailbox(const peer::v1::ControlMessage& plan) const;
  // The reason a round message is refused when the inbox is full.
  std::string InboxFull() const;
  std::string CoordinatorId() const;

  const Options options_;
  const Membership* const membership_;
  SwarmClient* const client_;
  GrpcTransport* const transport_;
  const std::atomic<bool>* const stopping_;
  const uint64_t token_;

  absl::Mutex mu_;
  std::deque<peer::v1::ControlMessage> messages_ ABSL_GUARDED_BY(mu_);
  int64_t round_ ABSL_GUARDED_BY(mu_) = -1;  // the round in Run
  Running running_ ABSL_GUARDED_BY(mu_);
  int cancels_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_ROUND_MEMBER_H_
