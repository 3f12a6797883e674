// Transport security for peer traffic: TLS (optionally mutual) from PEM
// files, or plaintext only when the user asked for it (--insecure). The
// same credentials serve the node's gRPC server (the Peer and Swarm
// services) and every channel it opens to other members.
// With a join token (--join_token_file) every call is also signed and
// checked (see join_auth.h); a per-host rate limit (--peer_rate_limit)
// bounds the calls each peer host may make (see peer_limits.h).
// Thread-safe: PeerCredentials is immutable once loaded.
#ifndef STARLING_GOSSIP_PEER_CREDENTIALS_H_
#define STARLING_GOSSIP_PEER_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gossip/join_auth.h"

namespace starling {

struct PeerSecurityOptions {
  std::string tls_cert;  // PEM certificate (chain) of this node
  std::string tls_key;   // PEM private key of tls_cert
  std::string tls_ca;    // PEM CA certificate(s) that peers' certificates
                         // must chain to
  bool tls_require_client_cert = false;  // mutual TLS
  // Name checked against every peer's certificate instead of the host part
  // of its address (one certificate for the whole swarm). Empty: the host.
  std::string tls_server_name;
  // Members are who their certificates say: each member's certificate names
  // its node id (as its CN or a DNS subjectAltName), and a call that speaks
  // for a member (a join, gossip, round control, a push, ring tensor
  // chunks) is refused unless the caller's certificate names that member.
  // Needs mutual TLS.
  bool tls_bind_node_ids = false;
  // The host of this node's --listen address, which peers dial and check
  // its certificate against: with TLS, tls_cert must cover it (an IP
  // address as an IP subjectAltName, a name as a DNS subjectAltName or CN),
  // or cover tls_server_name when that is set, since peers then check that
  // instead. Empty or a wildcard (0.0.0.0, ::): not checked, as the name
  // peers dial is not known here.
  std::string listen_host;
  // This node's id, which its own tls_cert must name when ids are bound;
  // empty: not checked (a parent that checks its children's flags).
  std::string node_id;
  bool insecure = false;  // plaintext
  // The swarm secret every call must prove it knows; empty: no admission
  // check.
  std::string join_token_file;
  // Incoming calls per second per peer host (bursts of twice as many);
  // 0: no limit.
  double peer_rate_limit = 0;

  // Whether any --tls_* option is set.
  bool asks_for_tls() const;
};

struct PeerCredentials {
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> channel;
  std::string server_name;  // SSL target name override, or empty
  bool tls = false;
  bool mutual = false;
  bool bind_node_ids = false;  // see PeerSecurityOptions::tls_bind_node_ids
  // Null: calls are not signed and every caller is admitted.
  std::shared_ptr<JoinAuth> join_auth;
  // Null: no per-peer rate limit on incoming calls.
  std::shared_ptr<PeerRateLimiter> rate_limit;
  // Sets the target name override (when there is one) on a channel's args.
  void Apply(grpc::ChannelArguments* args) const;
  // Signs a client call of `method` with the join token, when there is one.
  void Sign(grpc::ClientContext* ctx, absl::string_view method) const;
  // OK; RESOURCE_EXHAUSTED when the caller's host is over the rate limit;
  // UNAUTHENTICATED when there is a join token and the call does not prove
  // it. Refusals are logged at most once a minute per peer host.
  grpc::Status Admit(grpc::ServerContextBase* ctx,
                     absl::string_view method) const;
  // OK unless ids are bound and the caller's certificate does not name
  // member `id`: then PERMISSION_DENIED naming `what` (e.g. "gossip"), the
  // id and the names the certificate carries.
  grpc::Status CheckCaller(const grpc::ServerContextBase& ctx,
                           absl::string_view id, absl::string_view what) const;
  // The names ids bind to in the caller's certificate: its CN and DNS
  // subjectAltNames (none without TLS).
  static std::vector<std::string> CallerNames(
      const grpc::ServerContextBase& ctx);
  // CheckCaller for a caller whose certificate carries `names`.
  grpc::Status CheckNames(const std::vector<std::string>& names,
                          absl::string_view id, absl::string_view what) const;
};

// Plaintext credentials, for in-process tools and tests (the node's own
// flags go through LoadPeerCredentials, which wants --insecure for this).
PeerCredentials InsecurePeerCredentials();

// Reads and checks the PEM files: each parses, the key matches the
// certificate, the certificate chains to the CA and covers listen_host (or
// tls_server_name). InvalidArgument naming the flag and the file when not;
// also when neither TLS nor --insecure was asked for, or both were. Loads
// the join token when a file is named.
absl::StatusOr<PeerCredentials> LoadPeerCredentials(
    const PeerSecurityOptions& options);

// Every check LoadPeerCredentials makes (the flags, the PEM files, the join
// token file), with no gRPC credentials built: for a parent process that
// checks its children's flags before it starts them.
absl::Status CheckPeerSecurity(const PeerSecurityOptions& options);

}  // namespace starling

#endif  // STARLING_GOSSIP_PEER_CREDENTIALS_H_
