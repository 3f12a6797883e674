// The bounded inbox of push-sum gossip (--algo=gossip): the pushes this
// node received, waiting for its training thread (Take), and places held by
// the pushes still streaming in. A push stream reserves its place when it
// starts, so that a full inbox refuses it before its model streams in, and
// the place is taken by the checked push or given back when the stream
// ends otherwise.
// Thread-safe: one mutex guards the pushes and the places.
#ifndef STARLING_GOSSIP_PUSH_INBOX_H_
#define STARLING_GOSSIP_PUSH_INBOX_H_

#include <cstdint>
#include <set>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gossip/push_sum.h"

namespace starling {

class PushInbox {
 public:
  // Holds `capacity` pushes (at least 1), waiting or streaming in.
  explicit PushInbox(int capacity);

  // Reserves a place for a push that starts streaming in: its ticket, or -1
  // when the inbox is full.
  int64_t Reserve() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the push of `ticket`: deposits `push` in its place when not null,
  // else gives the place back. A ticket ended already is ignored.
  void End(int64_t ticket, ReceivedPush* push) ABSL_LOCKS_EXCLUDED(mu_);
  // The pushes deposited since the last call, in arrival order.
  std::vector<ReceivedPush> Take() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int capacity_;
  absl::Mutex mu_;
  std::vector<ReceivedPush> pushes_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> receiving_ ABSL_GUARDED_BY(mu_);  // tickets
  int64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_PUSH_INBOX_H_
