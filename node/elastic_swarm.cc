#include "node/elastic_swarm.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status.h"
#include "gossip/crash_point.h"
#include "node/peer_address.h"

namespace starling {

absl::StatusOr<SwarmOptions> ElasticSwarmOptions(const NodeRun& run,
                                                 const std::string& algo) {
  return ElasticSwarmOptions(
      run.config.net, algo,
      MakeFingerprint(run.trainer.model().Architecture(), run.n_params,
                      run.init_hash, TensorSignature(run.trainer.model())));
}

absl::StatusOr<SwarmOptions> ElasticSwarmOptions(
    const NetworkConfig& net, const std::string& algo,
    const peer::v1::ModelFingerprint& model) {
  SwarmOptions so;
  so.listen = net.listen;
  so.advertise = net.advertise;
  so.relay = net.relay;
  so.relay_cut_after_bytes = net.test_relay_cut_after;
  so.relay_delay = net.test_relay_delay;
  so.node_id = net.node_id;
  if (!ValidHostPort(so.listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", so.listen, ": expected host:port"));
  }
  std::map<std::string, std::string> hosts;
  if (!net.hosts_file.empty()) {
    STARLING_ASSIGN_OR_RETURN(hosts, ReadHosts(net.hosts_file));
  }
  for (absl::string_view p :
       absl::StrSplit(net.peers, ',', absl::SkipEmpty())) {
    if (!ValidHostPort(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers: '", p, "' is not host:port"));
    }
    std::string seed(p);
    if (auto it = hosts.find(HostOf(seed)); it != hosts.end()) {
      seed = absl::StrCat(it->second, seed.substr(seed.rfind(':')));
    }
    so.seeds.push_back(seed);
  }
  if (absl::Status s = ArmCrashPoint(net.test_crash_at); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--test_crash_at: ", s.message()));
  }
  so.identity.run_id = net.run_id;
  so.identity.algo = algo;  // a node of the other algorithm cannot join
  so.identity.model = model;
  so.chunk_bytes = net.chunk_bytes;
  so.rpc_timeout = net.round_timeout;
  so.suspect_after = net.suspect_timeout;
  so.partition_file = net.partition_file;
  so.found_after = net.found_after;
  so.links = net.links;
  so.credentials = net.credentials;
  so.stream_idle_timeout = net.stream_idle_timeout;
  so.peer_max_streams = net.peer_max_streams;
  return so;
}

absl::StatusOr<std::unique_ptr<Swarm>> StartSwarm(const SwarmOptions& options) {
  absl::StatusOr<std::unique_ptr<Swarm>> started = Swarm::Start(options);
  if (!started.ok()) {
    return WithExitCode(started.status(),
                        absl::IsInvalidArgument(started.status()) ? 2 : 1);
  }
  return started;
}

std::string ListenLine(const Swarm& swarm) {
  if (swarm.address() == swarm.listen_address()) return swarm.address();
  return absl::StrCat(swarm.listen_address(), ", advertised as ",
                      swarm.address());
}

absl::Status JoinSwarm(const NodeRun& run, NodeSession& session, Swarm& swarm) {
  absl::Status s =
      swarm.JoinSwarm(absl::Now() + run.config.net.connect_timeout);
  if (!s.ok()) {
    session.events().Write("error", JsonObject().Add("message", s.message()));
    return WithExitCode(s, absl::IsFailedPrecondition(s) ? 2 : 1);
  }
  return s;
}

absl::Status WaitForMembers(const NodeRun& run, Swarm& swarm) {
  return swarm.WaitForMembers(run.config.net.min_members,
                              absl::Now() + run.config.net.connect_timeout);
}

}  // namespace starling
