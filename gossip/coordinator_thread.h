// The thread that runs a node's round coordinator (round_coordinator.h):
// it feeds the state machine the round messages the Swarm service hands it
// and, every 50 ms or at once when woken (a message came in, the member
// table changed), a tick with the live table and the time; then it sends
// what the machine decided, with no lock held: ABORT, COMMIT and STALE to
// each member at once (those up to the first COMMIT to another member
// before the rest, so that a crash right after it, "commit_partial", leaves
// the rest uncommitted), then the PLANs, whose refusals go back to the
// machine.
// Thread-safety: the public methods are thread-safe. One mutex guards the
// machine; the membership table is read before it is taken, and the
// machine's log lines are written after it is released.
#ifndef STARLING_GOSSIP_COORDINATOR_THREAD_H_
#define STARLING_GOSSIP_COORDINATOR_THREAD_H_

#include <atomic>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gossip/membership.h"
#include "gossip/round_coordinator.h"
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

  // The coordinator's messages (the caller checked their numbers and
  // senders, see RoundCoordinator). OnReady: "" when taken, else why it is
  // refused.
  std::string OnReady(const peer::v1::ControlMessage& ready)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnDone(const peer::v1::ControlMessage& done) ABSL_LOCKS_EXCLUDED(mu_);
  void OnFailed(const peer::v1::ControlMessage& failed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ticks now (the member table changed, or the node is stopping).
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends what a tick decided and hands refused plans back to the machine.
  void Send(const RoundCoordinator::Decisions& d) ABSL_LOCKS_EXCLUDED(mu_);

  const Membership* const membership_;
  SwarmClient* const client_;
  const std::atomic<bool>* const stopping_;
  std::thread thread_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // signalled under mu_ by every event
  RoundCoordinator machine_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_COORDINATOR_THREAD_H_
