// Per-peer limits on incoming calls: a token bucket of calls per second for
// each peer host (--peer_rate_limit), refused with RESOURCE_EXHAUSTED, and a
// log limiter that lets one line per host through per period, so that a
// flood of bad calls never floods the log. Keyed by host, not host:port: a
// peer cannot dodge its limit by opening new connections. And deadlines for
// server-side streams (StreamDeadlines), so that a slow-loris peer cannot
// hold a stream, and the buffers behind it, open, with a cap on how many
// streams each peer host may have open at once, across all its connections.
// Thread-safe.
#ifndef STARLING_GOSSIP_PEER_LIMITS_H_
#define STARLING_GOSSIP_PEER_LIMITS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class CallbackServerContext;
}  // namespace grpc

namespace starling {

// One log line per host per `period`, counting the rest. It remembers at
// most kMaxHosts hosts (forgetting those whose period is over first); past
// that, new ones share one line per period.
class PerHostLogLimiter {
 public:
  static constexpr size_t kMaxHosts = 4096;
  explicit PerHostLogLimiter(absl::Duration period) : period_(period) {}
  // Whether an event about `host` at `now` is to be logged; when it is,
  // `*unlogged` is how many events of that host since the last logged one
  // were not.
  bool ShouldLog(const std::string& host, absl::Time now, int64_t* unlogged)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Logs warning `event` with `message` about `host` when ShouldLog says
  // so, adding how many such events of that host went unlogged.
  void Warn(const std::string& host, absl::Time now, absl::string_view event,
            std::string message) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct State {
    absl::Time last = absl::InfinitePast();
    int64_t unlogged = 0;
  };
  const absl::Duration period_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, State> hosts_ ABSL_GUARDED_BY(mu_);
};

// Logs warning `event` with `message` about `peer` (a peer host; "" for a
// refusal with no caller, e.g. a held message refused later) at most once a
// minute per event and peer, adding how many such lines went unlogged:
// how every refusal of a peer's call or message is logged, so that a flood
// of bad calls never floods the log. Thread-safe.
void LogRefusal(absl::string_view event, const std::string& peer,
                std::string message);

class PeerRateLimiter {
 public:
  // `per_second` calls per host on average, bursts of up to `burst`.
  PeerRateLimiter(double per_second, double burst);
  // Takes one call's token for `host` at `now`; ResourceExhausted naming the
  // host and the limit when there is none.
  absl::Status Take(const std::string& host, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  int64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time last;
  };
  const double per_second_;
  const double burst_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

// Cancels (ServerContext::TryCancel) a watched server-side stream that goes
// `idle` without a message in either direction, or that runs past its own
// total deadline. One thread checks every watched stream each `tick`; a
// cancellation is logged at most once a minute per peer host. With
// `max_per_host` > 0, a peer host may have at most that many watched
// streams at once (whatever its connections): Watch refuses the next.
class StreamDeadlines {
 public:
  class Watched;

  explicit StreamDeadlines(absl::Duration idle, int max_per_host = 0,
                           absl::Duration tick = absl::Seconds(1));
  // Stops the checking thread. Every Watched must be gone by then (shut the
  // server down first).
  ~StreamDeadlines();
  StreamDeadlines(const StreamDeadlines&) = delete;
  StreamDeadlines& operator=(const StreamDeadlines&) = delete;

  // Watches the stream of `ctx` (named `what` in the log, e.g. "SendChunks")
  // until the returned handle is destroyed, which the stream's reactor does
  // in OnDone (the destructor waits for a cancellation in flight, so `ctx`
  // outlives every use). `total` is the stream's own deadline.
  // ResourceExhausted, naming the host and the cap (logged at most once a
  // minute per host), when the peer's host already has max_per_host.
  absl::StatusOr<std::unique_ptr<Watched>> Watch(
      grpc::CallbackServerContext* ctx, std::string what, absl::Duration total)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Duration idle() const { return idle_; }
  // Streams cancelled so far.
  int64_t cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  // Streams refused for their host's cap so far.
  int64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry;
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Forget(Entry* e) ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration idle_;
  const int max_per_host_;
  const absl::Duration tick_;
  PerHostLogLimiter log_{absl::Minutes(1)};
  PerHostLogLimiter refusal_log_{absl::Minutes(1)};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Entry*, std::shared_ptr<Entry>> entries_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_host_ ABSL_GUARDED_BY(mu_);
  int64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// One watched stream. Progress() on every message read or written.
class StreamDeadlines::Watched {
 public:
  ~Watched();
  void Progress();

 private:
  friend class StreamDeadlines;
  Watched(StreamDeadlines* owner, std::shared_ptr<Entry> entry)
      : owner_(owner), entry_(std::move(entry)) {}
  StreamDeadlines* owner_;
  std::shared_ptr<Entry> entry_;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_PEER_LIMITS_H_
