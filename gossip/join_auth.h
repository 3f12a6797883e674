// Swarm admission by a shared secret (--join_token_file). Every RPC a node
// makes carries, in the `x-starling-auth` metadata header, a fresh timestamp,
// a random nonce and an HMAC-SHA256 of both (and of the method name) keyed by
// the token, so the token itself never travels. A server admits a call only
// when the HMAC matches, the timestamp lies within `window` of its own clock
// and the nonce has not been seen before: a captured request cannot be
// replayed. Refusals are UNAUTHENTICATED, and each peer host is logged at
// most once a minute (with a count of what was not logged).
// The token authenticates callers; it does not protect the bytes of a call
// that follows: use TLS for that (see peer_credentials.h).
// Thread-safe.
#ifndef STARLING_GOSSIP_JOIN_AUTH_H_
#define STARLING_GOSSIP_JOIN_AUTH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gossip/peer_limits.h"

namespace grpc {
class ClientContext;
class ServerContextBase;
class Status;
}  // namespace grpc

namespace starling {

inline constexpr char kAuthHeader[] = "x-starling-auth";

struct JoinAuthOptions {
  // How far a caller's clock may be from ours; also how long nonces are
  // remembered (twice this).
  absl::Duration window = absl::Minutes(2);
  // Most nonces remembered; beyond it the oldest go and calls stamped at or
  // before them are refused as too old (replay protection never lapses).
  int64_t max_nonces = 1 << 20;
  // A refused peer host is logged at most once per this period.
  absl::Duration log_period = absl::Minutes(1);
};

class JoinAuth {
 public:
  // The token is the file's content without trailing whitespace.
  // InvalidArgument naming the file when it cannot be read, is empty or is
  // shorter than 16 bytes.
  static absl::StatusOr<std::shared_ptr<JoinAuth>> FromFile(
      const std::string& path, const JoinAuthOptions& options = {});
  // InvalidArgument when `token` is shorter than 16 bytes.
  static absl::StatusOr<std::shared_ptr<JoinAuth>> FromToken(
      std::string token, const JoinAuthOptions& options = {});

  // The header value for one call of `method` stamped at `now`:
  // "v1.<unix ms>.<nonce hex>.<hmac hex>".
  std::string Stamp(absl::string_view method, absl::Time now) const;
  // Adds a fresh stamp to a client call.
  void Sign(grpc::ClientContext* ctx, absl::string_view method) const;

  // Checks one header value (empty: none was sent) for `method` at `now`
  // and remembers its nonce. Unauthenticated saying why when refused.
  absl::Status Verify(absl::string_view header, absl::string_view method,
                      absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Verify on a server call; logs a refusal (rate-limited per peer host).
  // OK or UNAUTHENTICATED.
  grpc::Status Admit(grpc::ServerContextBase* ctx, absl::string_view method)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether a refusal of `host` at `now` is to be logged; when it is,
  // `*unlogged` is how many refusals of that host were not.
  bool ShouldLog(const std::string& host, absl::Time now, int64_t* unlogged);

  int64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  JoinAuth(std::string token, const JoinAuthOptions& options);
  std::string Mac(absl::string_view method, int64_t unix_ms,
                  absl::string_view nonce) const;

  const std::string token_;
  const JoinAuthOptions options_;
  mutable absl::Mutex mu_;
  // Seen nonces, and the same by stamp time for expiry.
  absl::flat_hash_set<std::string> nonces_ ABSL_GUARDED_BY(mu_);
  std::multimap<int64_t, std::string> by_time_ ABSL_GUARDED_BY(mu_);
  int64_t floor_ms_ ABSL_GUARDED_BY(mu_) = INT64_MIN;
  PerHostLogLimiter log_;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

// The host part of a gRPC peer string ("ipv4:10.0.0.7:4242" -> "10.0.0.7",
// "ipv6:[::1]:4242" -> "::1").
std::string PeerHost(absl::string_view grpc_peer);

}  // namespace starling

#endif  // STARLING_GOSSIP_JOIN_AUTH_H_
