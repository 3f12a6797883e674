#include "node/node_run.h"

#include "node/node_flags.h"

namespace starling {

int Fail(const absl::Status& s, int code) {
  LogEvent(LogLevel::kError, "error",
           absl::StrCat("starling node: error: ", s.message()));
  return code;
}

bool ValidHostPort(absl::string_view a) {
  size_t colon = a.rfind(':');
  int port = 0;
  return colon != absl::string_view::npos && colon > 0 &&
         absl::SimpleAtoi(a.substr(colon + 1), &port) && port >= 0 &&
         port < 65536;
}

absl::StatusOr<StaticMembers> ParseMembers(const std::string& listen,
                                           const std::string& peers) {
  StaticMembers m;
  auto valid = ValidHostPort;
  if (!valid(listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", listen, ": expected host:port"));
  }
  m.members.push_back(listen);
  for (absl::string_view p : absl::StrSplit(peers, ',', absl::SkipEmpty())) {
    if (!valid(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers: '", p, "' is not host:port"));
    }
    m.members.emplace_back(p);
  }
  std::sort(m.members.begin(), m.members.end());
  if (std::adjacent_find(m.members.begin(), m.members.end()) !=
      m.members.end()) {
    return absl::InvalidArgumentError(
        "--peers lists an address twice (or this node's own --listen)");
  }
  if (m.members.size() > 1 && absl::EndsWith(listen, ":0")) {
    return absl::InvalidArgumentError(
        "--listen needs a fixed port when --peers is set (peers must know it)");
  }
  m.rank =
      static_cast<int>(std::find(m.members.begin(), m.members.end(), listen) -
                       m.members.begin());
  return m;
}

// "host" of "host:port" ("[::1]:7070" -> "::1"); empty for ":port".
std::string HostOf(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// Reads a hosts(5)-style file into name -> address.
absl::StatusOr<std::map<std::string, std::string>> ReadHosts(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hosts=", path, ": cannot read it"));
  }
  std::map<std::string, std::string> names;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.empty()) continue;
    if (words.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hosts=", path, ":", n, ": expected ADDRESS NAME..."));
    }
    for (size_t i = 1; i < words.size(); ++i) names[words[i]] = words[0];
  }
  return names;
}

absl::Status StartOps(const std::string& node_id, const std::string& algo,
                      const std::string& device, NodeOps* ops) {
  WatchdogOptions wo;
  wo.multiple = absl::GetFlag(FLAGS_watchdog_multiple);
  const double min_s = absl::GetFlag(FLAGS_watchdog_min_seconds);
  if (!(wo.multiple > 0) || !(min_s >= 0)) {
    return absl::InvalidArgumentError(
        "--watchdog_multiple must be > 0 and --watchdog_min_seconds >= 0");
  }
  wo.min_allowance = absl::Seconds(min_s);
  ops->watchdog = std::make_unique<Watchdog>(wo);
  if (std::string stall = absl::GetFlag(FLAGS_test_stall); !stall.empty()) {
    std::pair<std::string, std::string> parts = absl::StrSplit(stall, ':');
    if (!absl::SimpleAtoi(parts.first, &ops->stall_step) ||
        !absl::SimpleAtod(parts.second, &ops->stall_seconds) ||
        ops->stall_step < 1 || !(ops->stall_seconds > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--test_stall=", stall, ": expected STEP:SECONDS, e.g. 20:5"));
    }
  }
  std::string host = HostOf(absl::GetFlag(FLAGS_listen));
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty()) host = "0.0.0.0";
  const int health_port = absl::GetFlag(FLAGS_health_port);
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  for (auto [name, port] :
       {std::pair<const char*, int>{"health_port", health_port},
        {"metrics_port", metrics_port}}) {
    if (port < -1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, "=", port, ": expected a port, 0 (any) or -1 (off)"));
    }
  }
  if (health_port >= 0) {
    STARLING_ASSIGN_OR_RETURN(
        ops->health,
        HealthServer::Start(host, health_port, ops->watchdog.get()));
    LogEvent(LogLevel::kInfo, "health",
             absl::StrCat("health checks (readiness, liveness) on ",
                          ops->health->address()),
             {{"address", ops->health->address()}});
  }
  if (metrics_port >= 0) {
    BuildInfo info;
    info.version = STARLING_VERSION;
    info.torch = TORCH_VERSION;
    info.device = device;
    info.algo = algo;
    info.node_id = node_id;
    absl::StatusOr<std::unique_ptr<NodeMetrics>> m =
        NodeMetrics::Start(host, metrics_port, info);
    if (!m.ok()) {
      return absl::Status(
          m.status().code(),
          absl::StrCat("--metrics_port: ", m.status().message()));
    }
    ops->metrics = std::move(m).value();
    LogEvent(LogLevel::kInfo, "metrics",
             absl::StrCat("Prometheus metrics on http://",
                          ops->metrics->address(), "/metrics"),
             {{"address", ops->metrics->address()}});
  }
  return absl::OkStatus();
}

// The SwarmOptions both swarm algorithms share, from the flags: id, listen
// address, seeds (through --hosts), identity and failure detection. Checks
// the flags they share and arms --test_crash_at. InvalidArgument naming the
// flag.
absl::StatusOr<SwarmOptions> SharedSwarmOptions(const NodeRun& run,
                                                const std::string& algo) {
  SwarmOptions so;
  so.listen = absl::GetFlag(FLAGS_listen);
  so.node_id = NodeIdFromFlags();
  if (!ValidHostPort(so.listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", so.listen, ": expected host:port"));
  }
  std::map<std::string, std::string> hosts;
  if (std::string path = absl::GetFlag(FLAGS_hosts); !path.empty()) {
    STARLING_ASSIGN_OR_RETURN(hosts, ReadHosts(path));
  }
  for (absl::string_view p :
       absl::StrSplit(absl::GetFlag(FLAGS_peers), ',', absl::SkipEmpty())) {
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
  const double found_after = absl::GetFlag(FLAGS_found_after);
  const int min_members = absl::GetFlag(FLAGS_min_members);
  const double suspect = absl::GetFlag(FLAGS_suspect_timeout);
  if (absl::Status s = ArmCrashPoint(absl::GetFlag(FLAGS_test_crash_at));
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--test_crash_at: ", s.message()));
  }
  so.identity.run_id = absl::GetFlag(FLAGS_run_id);
  so.identity.algo = algo;  // a node of the other algorithm cannot join
  so.identity.model = MakeFingerprint(run.trainer->model().Architecture(),
                                      run.n_params, run.init_hash);
  so.chunk_bytes = run.chunk;
  so.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_round_timeout));
  so.suspect_after = absl::Seconds(suspect);
  so.partition_file = absl::GetFlag(FLAGS_partition_file);
  so.found_after = absl::Seconds(found_after);
  so.links = run.links;
  so.credentials = run.credentials;
  so.stream_idle_timeout = run.stream_idle;
  so.peer_max_streams = run.peer_max_streams;
  return so;
}

// One inner step of an elastic member (DiLoCo or gossip). On a failure
// (e.g. a non-finite loss) it logs an "error" event and says goodbye to
// the swarm, so that nobody waits for this node; the caller then fails.
absl::StatusOr<StepResult> StepOrLeave(Trainer& trainer, EventLog& events,
                                       Swarm& swarm) {
  absl::StatusOr<StepResult> r = trainer.Step();
  if (!r.ok()) {
    events.Write("error", JsonObject().Add("message", r.status().message()));
    swarm.Leave();
  }
  return r;
}

}  // namespace starling
