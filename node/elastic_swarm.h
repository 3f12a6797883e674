// The swarm of an elastic node (--algo=diloco or gossip): the SwarmOptions
// both share, from the run's config, and the steps that start it and join
// the others. Each loop adds its own options (tensors, pushes, identity
// codec) and its progress between the steps. Errors carry the exit code
// (node_session.h): 2 for bad flags, a bad address or a refused handshake.
// Call from the training thread.
#ifndef STARLING_NODE_ELASTIC_SWARM_H_
#define STARLING_NODE_ELASTIC_SWARM_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gossip/swarm.h"
#include "node/node_run.h"
#include "node/node_session.h"

namespace starling {

// Id, listen address, seeds (names mapped through --hosts), identity,
// timeouts, links and credentials. Checks the addresses and the hosts file,
// and arms --test_crash_at. InvalidArgument naming the flag.
absl::StatusOr<SwarmOptions> ElasticSwarmOptions(const NodeRun& run,
                                                 const std::string& algo);
// The same for a model held elsewhere (the Python module's), fingerprinted
// by the caller.
absl::StatusOr<SwarmOptions> ElasticSwarmOptions(
    const NetworkConfig& net, const std::string& algo,
    const peer::v1::ModelFingerprint& model);

// Swarm::Start; a bad option exits with 2.
absl::StatusOr<std::unique_ptr<Swarm>> StartSwarm(const SwarmOptions& options);

// "HOST:PORT" where `swarm` listens, with ", advertised as HOST:PORT" when
// peers are told another address (--advertise): the node's start line.
std::string ListenLine(const Swarm& swarm);

// Joins through the seeds within --connect_timeout. A failure is written as
// an "error" event; a seed's refusal (FailedPrecondition) exits with 2.
absl::Status JoinSwarm(const NodeRun& run, NodeSession& session, Swarm& swarm);

// Waits within --connect_timeout until --min_members have joined.
absl::Status WaitForMembers(const NodeRun& run, Swarm& swarm);

}  // namespace starling

#endif  // STARLING_NODE_ELASTIC_SWARM_H_
