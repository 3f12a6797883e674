// NodeMetrics: the Prometheus endpoint of `starling node` (GET /metrics). The
// node reports what it does (inner steps, rounds, traffic, peers,
// checkpoints); this class turns those reports into starling_* metrics in a
// prometheus-cpp registry and serves them over HTTP from one thread it owns.
// Thread-safety: every method is thread-safe and never blocks on the network.
// (prometheus-cpp's own Exposer is not used: Debian's civetweb starts threads
// with a 100 KiB stack, below LibTorch's static TLS, so it cannot start here.)
#ifndef STARLING_NODE_METRICS_H_
#define STARLING_NODE_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace starling {

// Labels of starling_build_info (value 1, the Prometheus "info" convention).
struct BuildInfo {
  std::string version;  // Starling version
  std::string torch;    // LibTorch version
  std::string device;   // e.g. "cpu", "cuda:0"
  std::string algo;     // e.g. "diloco"
  std::string node_id;  // exported as label `node`
};

// Values of Round()'s `result`.
inline constexpr char kRoundCommitted[] = "committed";
inline constexpr char kRoundStale[] = "stale";
inline constexpr char kRoundAborted[] = "aborted";
inline constexpr char kRoundStopped[] = "stopped";

class NodeMetrics {
 public:
  // Serves GET /metrics on host:port; port 0 picks any free port (see
  // address()). `host` is a numeric IPv4 or IPv6 address ("127.0.0.1",
  // "0.0.0.0", "::1"). Errors: InvalidArgument for a host that is not a
  // numeric address or a port outside [0, 65535]; Unavailable, naming the
  // address, when it cannot bind.
  static absl::StatusOr<std::unique_ptr<NodeMetrics>> Start(
      const std::string& host, int port, const BuildInfo& info);

  ~NodeMetrics();
  NodeMetrics(const NodeMetrics&) = delete;
  NodeMetrics& operator=(const NodeMetrics&) = delete;

  // "host:bound_port" ("[v6]:port" for IPv6), with the port actually bound.
  std::string address() const;

  // One inner optimizer step: starling_inner_steps_total += 1,
  // starling_tokens_total += tokens, starling_step_duration_seconds observes
  // `seconds`, starling_train_loss = loss. Negative tokens/seconds are ignored.
  void InnerStep(double seconds, int64_t tokens, double loss);

  // One outer round ended with `result` (kRoundCommitted, kRoundStale,
  // kRoundAborted or kRoundStopped): starling_rounds_total{result} += 1. Only
  // committed rounds observe starling_round_duration_seconds (`round_seconds`,
  // the whole round) and starling_sync_duration_seconds (`sync_seconds`, the
  // pseudo-gradient exchange), so the histograms describe successful rounds;
  // the other results' durations are ignored.
  void Round(const std::string& result, double round_seconds,
             double sync_seconds);

  // Gauges starling_outer_learning_rate, starling_inner_learning_rate,
  // starling_pseudo_gradient_norm.
  void SetOuterLr(double lr);
  void SetInnerLr(double lr);
  void SetPseudoGradientNorm(double norm);
  // Gossip: starling_consensus_distance = ‖y − y_s‖² of the last absorbed
  // push (an estimate of how far this node is from the others).
  void SetConsensusDistance(double distance);
  // The latest evaluation: starling_val_loss = loss and, for a classifier
  // (`accuracy` >= 0), starling_val_accuracy = accuracy (a fraction). Both
  // are NaN until this node first evaluates (and the accuracy stays NaN for
  // a language model).
  void SetValidation(double loss, double accuracy);

  // The node's running totals since it started, in bytes: gossip bytes
  // sent/received and pseudo-gradient bytes before/after compression. Each
  // counter (starling_sent_bytes_total, starling_received_bytes_total,
  // starling_pseudo_gradient_bytes_total{stage="before_compression"|
  // "after_compression"}) follows the largest total seen: it grows by the
  // difference, and a total lower than an earlier one is ignored.
  void SetTraffic(int64_t sent, int64_t received, int64_t before_compression,
                  int64_t after_compression) ABSL_LOCKS_EXCLUDED(mu_);

  // Gauges starling_peers_known, starling_peers_connected.
  void SetPeers(int known, int connected);
  // Gauges starling_reachable (this node's dial-back verdict at its join:
  // 1 reachable, 0 unreachable, -1 not checked) and
  // starling_members_reachability{reachability="reachable"|"unreachable"|
  // "unknown"} (live members, this node included, by verdict).
  void SetReachability(int self, int reachable, int unreachable, int unknown);

  // Running totals of failed RPCs by gRPC status code name ("UNAVAILABLE",
  // "DEADLINE_EXCEEDED", ...): starling_rpc_errors_total{code}, with the same
  // largest-total-seen rule as SetTraffic(). Codes absent from the map keep
  // their value. Every code's series exists from the start, at 0, so that
  // rate() and alerts see the first error.
  void SetRpcErrors(const std::map<std::string, int64_t>& totals_by_code)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Running totals of incoming calls and streams this node refused or cut
  // off to protect itself, by reason ("rate_limit": --peer_rate_limit,
  // "stream_limit": --peer_max_streams, "stream_cancelled": a stream past
  // its idle time or deadline): starling_peer_refusals_total{reason}, with
  // the same rule as SetRpcErrors(). These three reasons exist from the
  // start, at 0.
  void SetRefusals(const std::map<std::string, int64_t>& totals_by_reason)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Payload bytes of early tensor messages held now (Swarm::early_bytes):
  // starling_early_message_bytes.
  void SetEarlyBytes(int64_t bytes);
  // Reverse connections (gossip/relay_server.h): bytes this node forwarded
  // as a relay, by relayed member, as running totals
  // (starling_relay_forwarded_bytes_total{member}, the rule of
  // SetRpcErrors()), and whether this node is attached to a relay now
  // (starling_relay_attached: 1 or 0).
  void SetRelay(const std::map<std::string, int64_t>& forwarded_by_member,
                bool attached) ABSL_LOCKS_EXCLUDED(mu_);

  // A checkpoint written at `when` that took `seconds`:
  // starling_checkpoint_duration_seconds observes it and
  // starling_last_checkpoint_timestamp_seconds = when (Unix seconds).
  void Checkpoint(double seconds, absl::Time when);

 private:
  struct Metrics;    // the metric handles, owned by registry_
  class HttpServer;  // serves registry_

  // Registers every starling_* metric in `registry`. Throws what
  // prometheus-cpp throws (on an invalid name); Start() catches it.
  static std::unique_ptr<Metrics> RegisterAll(const BuildInfo& info,
                                              prometheus::Registry& registry);
  // Its parts: the build, inner steps, rounds and learning rates; the
  // traffic, peers, refusals and checkpoints.
  static void RegisterTraining(const BuildInfo& info,
                               prometheus::Registry& registry, Metrics& m);
  static void RegisterNetwork(prometheus::Registry& registry, Metrics& m);

  NodeMetrics(std::string host, std::shared_ptr<prometheus::Registry> registry,
              std::unique_ptr<Metrics> metrics,
              std::unique_ptr<HttpServer> server);

  // Adds total - *seen to `counter` when positive and remembers the total.
  static void Advance(prometheus::Counter& counter, int64_t total,
                      int64_t* seen);
  // Advance() for each labelled total of `family` (label `label`).
  static void AdvanceEach(prometheus::Family<prometheus::Counter>& family,
                          const std::string& label,
                          const std::map<std::string, int64_t>& totals,
                          std::map<std::string, int64_t>* seen);

  const std::string host_;  // as given, bracketed if IPv6
  // Declaration order matters: the server (whose thread reads the registry)
  // is destroyed first, then the metric handles, then the registry.
  const std::shared_ptr<prometheus::Registry> registry_;
  const std::unique_ptr<Metrics> metrics_;
  const std::unique_ptr<HttpServer> server_;

  // Largest totals seen by SetTraffic(), SetRpcErrors() and SetRefusals().
  absl::Mutex mu_;
  int64_t sent_seen_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t received_seen_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t before_compression_seen_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t after_compression_seen_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> rpc_errors_seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> refusals_seen_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> relay_forwarded_seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_NODE_METRICS_H_
