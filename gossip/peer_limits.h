// Per-peer limits on incoming calls: a token bucket of calls per second for
// each peer host (--peer_rate_limit), refused with RESOURCE_EXHAUSTED, and a
// log limiter that lets one line per host through per period, so that a
// flood of bad calls never floods the log. Keyed by host, not host:port: a
// peer cannot dodge its limit by opening new connections.
// Thread-safe.
#ifndef STARLING_GOSSIP_PEER_LIMITS_H_
#define STARLING_GOSSIP_PEER_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace starling {

// One log line per host per `period`, counting the rest.
class PerHostLogLimiter {
 public:
  explicit PerHostLogLimiter(absl::Duration period) : period_(period) {}
  // Whether an event about `host` at `now` is to be logged; when it is,
  // `*unlogged` is how many events of that host since the last logged one
  // were not.
  bool ShouldLog(const std::string& host, absl::Time now, int64_t* unlogged);

 private:
  struct State {
    absl::Time last = absl::InfinitePast();
    int64_t unlogged = 0;
  };
  const absl::Duration period_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, State> hosts_ ABSL_GUARDED_BY(mu_);
};

class PeerRateLimiter {
 public:
  // `per_second` calls per host on average, bursts of up to `burst`.
  PeerRateLimiter(double per_second, double burst);
  // Takes one call's token for `host` at `now`; ResourceExhausted naming the
  // host and the limit when there is none.
  absl::Status Take(const std::string& host, absl::Time now);
  int64_t refused() const;

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

}  // namespace starling

#endif  // STARLING_GOSSIP_PEER_LIMITS_H_
