#include "gossip/peer_limits.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace starling {

bool PerHostLogLimiter::ShouldLog(const std::string& host, absl::Time now,
                                  int64_t* unlogged) {
  absl::MutexLock lock(&mu_);
  State& s = hosts_[host];
  if (now - s.last < period_) {
    ++s.unlogged;
    return false;
  }
  *unlogged = s.unlogged;
  s.unlogged = 0;
  s.last = now;
  return true;
}

PeerRateLimiter::PeerRateLimiter(double per_second, double burst)
    : per_second_(per_second), burst_(std::max(1.0, burst)) {}

absl::Status PeerRateLimiter::Take(const std::string& host, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto [it, fresh] = buckets_.try_emplace(host);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = burst_;
  } else if (now > b.last) {
    b.tokens = std::min(
        burst_, b.tokens + absl::ToDoubleSeconds(now - b.last) * per_second_);
  }
  b.last = std::max(b.last, now);
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return absl::OkStatus();
  }
  ++refused_;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "rate limit: %s made more than %g calls per second (bursts of %g; "
      "--peer_rate_limit)",
      host, per_second_, burst_));
}

int64_t PeerRateLimiter::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

}  // namespace starling
