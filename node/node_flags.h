// The flags of `starling node` and their parsing (intermediate split).
#ifndef STARLING_NODE_NODE_FLAGS_H_
#define STARLING_NODE_NODE_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compression/tensor_policy.h"
#include "node/node_run.h"
#include "outer_opt/outer_optimizer.h"

ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, peers);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(bool, tls_require_client_cert);
ABSL_DECLARE_FLAG(std::string, tls_server_name);
ABSL_DECLARE_FLAG(bool, tls_bind_node_ids);
ABSL_DECLARE_FLAG(bool, insecure);
ABSL_DECLARE_FLAG(std::string, join_token_file);
ABSL_DECLARE_FLAG(double, peer_rate_limit);
ABSL_DECLARE_FLAG(int, peer_max_streams);
ABSL_DECLARE_FLAG(double, stream_idle_timeout);
ABSL_DECLARE_FLAG(std::string, run_id);
ABSL_DECLARE_FLAG(std::string, algo);
ABSL_DECLARE_FLAG(int, inner_steps);
ABSL_DECLARE_FLAG(std::string, outer);
ABSL_DECLARE_FLAG(double, outer_lr);
ABSL_DECLARE_FLAG(double, outer_momentum);
ABSL_DECLARE_FLAG(int, connect_timeout);
ABSL_DECLARE_FLAG(int, round_timeout);
ABSL_DECLARE_FLAG(int, chunk_bytes);
ABSL_DECLARE_FLAG(std::string, link_bandwidth_mbps);
ABSL_DECLARE_FLAG(std::string, link_latency_ms);
ABSL_DECLARE_FLAG(std::string, compression);
ABSL_DECLARE_FLAG(bool, overlap);
ABSL_DECLARE_FLAG(std::string, error_feedback);
ABSL_DECLARE_FLAG(int, small_tensor_elems);
ABSL_DECLARE_FLAG(std::string, small_tensor_codec);
ABSL_DECLARE_FLAG(std::string, node_id);
ABSL_DECLARE_FLAG(int, min_members);
ABSL_DECLARE_FLAG(double, suspect_timeout);
ABSL_DECLARE_FLAG(double, round_deadline);
ABSL_DECLARE_FLAG(std::string, partition_file);
ABSL_DECLARE_FLAG(std::string, gossip_peers);
ABSL_DECLARE_FLAG(double, gossip_timeout);
ABSL_DECLARE_FLAG(double, gossip_momentum);
ABSL_DECLARE_FLAG(double, gossip_outer_lr);
ABSL_DECLARE_FLAG(int, snapshot_every);
ABSL_DECLARE_FLAG(std::string, test_crash_at);
ABSL_DECLARE_FLAG(std::string, aggregate);
ABSL_DECLARE_FLAG(double, norm_bound);
ABSL_DECLARE_FLAG(std::string, test_poison);
ABSL_DECLARE_FLAG(double, round_seconds);
ABSL_DECLARE_FLAG(std::string, weighting);
ABSL_DECLARE_FLAG(int, min_inner_steps);
ABSL_DECLARE_FLAG(int, max_inner_steps);
ABSL_DECLARE_FLAG(std::string, drift_detector);
ABSL_DECLARE_FLAG(double, divergence_threshold);
ABSL_DECLARE_FLAG(int, health_port);
ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, log_format);
ABSL_DECLARE_FLAG(std::string, hosts);
ABSL_DECLARE_FLAG(double, found_after);
ABSL_DECLARE_FLAG(bool, resume_if_exists);
ABSL_DECLARE_FLAG(double, watchdog_multiple);
ABSL_DECLARE_FLAG(double, watchdog_min_seconds);
ABSL_DECLARE_FLAG(std::string, test_stall);

namespace starling {

// --node_id, or the --listen address when it is not given.
std::string NodeIdFromFlags();
OuterOptions OuterOptionsFromFlags();
PolicyOptions PolicyOptionsFromFlags();
absl::StatusOr<AdaptiveSync> ParseAdaptiveSync(int h);
absl::Status ParseNodeFlags(NodeRun& run);

}  // namespace starling

#endif  // STARLING_NODE_NODE_FLAGS_H_
