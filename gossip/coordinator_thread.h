// The thread that runs a node's round coordinator (round_coordinator.h):
// it feeds the state machine the round messages the Swarm service hands it
// and, every 50 ms or at once when woken (a message came in, the member
// table changed), a tick with the live table and the time; then it sends
// what the machine decided, with no lock held: ABORT, COMMIT and STALE to
// each member at once (those up to the first COMMIT to another member
// before the rest, so that a crash right after it, "commit_partial", leaves
// the rest uncommitted), then the PLANs, whose refusals go back to the
// machine. In front of the machine, RoundTokens (round_tokens.h) lets
// through only READYs that carry their member's proved round token and
// DONEs and FAILEDs that carry it; the CONFIRMs that ask a member to prove
// a new one go out from a second thread, so that a member that does not
// answer holds up no tick. The thread stamps each outgoing message with
// its recipient's token, and each attempt's PLANs with a fresh plan
// secret.
// Thread-safety: the public methods are thread-safe. One mutex guards the
// machine; the membership table is read before it is taken, and the
// machine's log lines are written after it is released.
#ifndef STARLING_GOSSIP_COORDINATOR_THREAD_H_
#define STARLING_GOSSIP_COORDINATOR_THREAD_H_

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gossip/membership.h"
#include "gossip/round_coordinator.h"
#include "gossip/round_tokens.h"
#include "gossip/swarm_client.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

class CoordinatorThread {
 public:
  // `membership` and `client` must outlive the thread; it runs until
  // `stopping` turns true (then Wake it, and Join).
  CoordinatorThread(RoundCoordinatorOptions options,
                    const Membership* membership, SwarmClient* client,
                    const std::atomic<bool>* stopping);
  ~CoordinatorThread() { Join(); }

  void Start();
  void Join();

  // The coordinator's messages (the caller checked their numbers and that
  // their senders are members, see RoundCoordinator). OnReady: "" when
  // taken or held for its member's proof, else why it is refused. OnDone
  // and OnFailed: "" when taken, else why it is refused (it does not carry
  // its sender's round token).
  std::string OnReady(const peer::v1::ControlMessage& ready)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string OnDone(const peer::v1::ControlMessage& done)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string OnFailed(const peer::v1::ControlMessage& failed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ticks now (the member table changed, or the node is stopping).
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Stamps `d`'s messages with their recipients' round tokens and its
  // plans with a fresh plan secret.
  void Stamp(RoundCoordinator::Decisions* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends what a tick decided and hands refused plans back to the machine.
  void Send(const RoundCoordinator::Decisions& d) ABSL_LOCKS_EXCLUDED(mu_);
  // The confirm thread: sends the CONFIRMs the tokens asked for (so that a
  // member that does not answer never holds up the coordinator's ticks)
  // and hands the answers to the tokens, and the READYs they prove to the
  // machine.
  void ConfirmLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Confirm(const std::vector<Outgoing>& asks) ABSL_LOCKS_EXCLUDED(mu_);
  // The table's incarnation of member `id` (-1: not in it).
  int64_t IncarnationOf(const std::string& id) const;

  const Membership* const membership_;
  SwarmClient* const client_;
  const std::atomic<bool>* const stopping_;
  std::thread thread_;
  std::thread confirm_thread_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled under mu_ by every event
  bool tick_now_ ABSL_GUARDED_BY(mu_) = false;  // a READY was just taken
  RoundCoordinator machine_ ABSL_GUARDED_BY(mu_);
  RoundTokens tokens_ ABSL_GUARDED_BY(mu_);
  // CONFIRMs the tokens asked for, for the thread to send.
  std::vector<Outgoing> asks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_COORDINATOR_THREAD_H_
