#include "node/sim_processes.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/status.h"

namespace starling {

absl::StatusOr<std::vector<int>> PickLoopbackPorts(int n) {
  std::vector<int> fds, ports;
  absl::Status status;
  for (int i = 0; i < n && status.ok(); ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      status = absl::UnavailableError("cannot find a free loopback port");
    } else {
      ports.push_back(ntohs(addr.sin_port));
    }
    if (fd >= 0) fds.push_back(fd);
  }
  for (int fd : fds) ::close(fd);
  if (!status.ok()) return status;
  return ports;
}

absl::StatusOr<std::vector<int>> HoldClosedLoopbackPorts(size_t n) {
  std::vector<int> ports;
  while (ports.size() < n) {
    // Kept open until the sim exits (close-on-exec: the nodes do not hold
    // them): bound and never listening, the port refuses every connection.
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (fd >= 0) ::close(fd);
      return absl::UnavailableError("cannot hold a closed loopback port");
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  return ports;
}

std::string NodeLogPath(const std::string& dir, const std::string& id) {
  return absl::StrCat(dir, "/", id, "/node.log");
}

std::vector<std::string> NodeArgs(const NodeLaunch& launch, int i, bool restart,
                                  bool has_checkpoint) {
  const std::string& id = launch.ids[i];
  std::vector<std::string> args = {"starling", "node"};
  args.push_back(absl::StrCat("--listen=", launch.addresses[i]));
  std::vector<std::string> others;
  for (int j = 0; j < launch.initial; ++j) {
    if (j != i && !launch.nat_advertise.count(launch.ids[j])) {
      others.push_back(launch.addresses[j]);
    }
  }
  args.push_back(absl::StrCat("--peers=", absl::StrJoin(others, ",")));
  if (auto n = launch.nat_advertise.find(id); n != launch.nat_advertise.end()) {
    args.push_back(absl::StrCat("--advertise=", n->second));
  }
  const bool late = restart || i >= launch.initial;
  if (launch.elastic) {
    args.push_back(absl::StrCat("--node_id=", id));
    args.push_back(absl::StrCat("--min_members=", late ? 1 : launch.initial));
    args.push_back(absl::StrCat("--partition_file=", launch.partition_file));
  }
  args.push_back(absl::StrCat("--shard=", i, "/", launch.ids.size()));
  args.push_back(absl::StrCat("--out=", launch.dir, "/", id));
  if (auto f = launch.slow.find(id); f != launch.slow.end()) {
    args.push_back(absl::StrCat("--slowdown=", f->second));
  }
  if (auto p = launch.poison.find(id); p != launch.poison.end()) {
    args.push_back(absl::StrCat("--test_poison=", p->second));
  }
  if (!launch.drift.empty()) {
    auto d = launch.drift.find(id);
    args.push_back(absl::StrCat("--drift=", d == launch.drift.end()
                                                ? "never"
                                                : absl::StrCat(d->second)));
  }
  if (launch.links.shaped()) {
    std::map<std::string, std::string> address_of;  // node id -> host:port
    for (size_t k = 0; k < launch.ids.size(); ++k) {
      // Peers know a NATed node by the address it advertises.
      auto n = launch.nat_advertise.find(launch.ids[k]);
      address_of[launch.ids[k]] =
          n != launch.nat_advertise.end() ? n->second : launch.addresses[k];
    }
    auto [bandwidth, latency] = NodeLinkFlags(launch.links, id, address_of);
    args.push_back(absl::StrCat("--link_bandwidth_mbps=", bandwidth));
    args.push_back(absl::StrCat("--link_latency_ms=", latency));
  }
  for (const auto& [name, base] :
       {std::pair<const char*, int>{"metrics_port", launch.metrics_port},
        {"health_port", launch.health_port}}) {
    if (base >= 0) {
      args.push_back(absl::StrCat("--", name, "=", base == 0 ? 0 : base + i));
    }
  }
  for (const std::string& a : launch.common) args.push_back(a);
  if (launch.snapshot_every > 0) {
    // Model snapshots for the consensus distance (the last flag wins).
    args.push_back(absl::StrCat("--snapshot_every=", launch.snapshot_every));
  }
  if (late) {
    args.push_back(
        absl::StrCat("--resume=", has_checkpoint ? "true" : "false"));
  }
  return args;
}

NodeProcessGroup::NodeProcessGroup(NodeLaunch launch)
    : launch_(std::move(launch)),
      pids_(launch_.ids.size(), -1),
      leaving_(launch_.ids.size(), false) {}

int NodeProcessGroup::IndexOf(const std::string& id) const {
  return static_cast<int>(
      std::find(launch_.ids.begin(), launch_.ids.end(), id) -
      launch_.ids.begin());
}

absl::Status NodeProcessGroup::Start(int i, bool restart) {
  const std::string node_dir = absl::StrCat(launch_.dir, "/", launch_.ids[i]);
  STARLING_RETURN_IF_ERROR(MakeDirs(node_dir));
  std::vector<std::string> args = NodeArgs(
      launch_, i, restart, FileExists(CheckpointPathInRunDir(node_dir)));
  const std::string log = NodeLogPath(launch_.dir, launch_.ids[i]);
  if (restart) {
    (void)AppendLine(log, absl::StrCat("--- starling sim: restarting ",
                                       launch_.ids[i], " ---"));
  }
  const pid_t sim_pid = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    ::setpgid(0, 0);  // a terminal's Ctrl-C reaches only the sim
    // A sim killed outright (it cannot stop its nodes) takes its nodes
    // with it; each keeps its last checkpoint. Forks happen on the sim's
    // main thread, whose exit is the sim's.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != sim_pid) _exit(127);
    int fd = ::open(log.c_str(),
                    O_WRONLY | O_CREAT | (restart ? O_APPEND : O_TRUNC), 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  pids_[i] = pid;
  leaving_[i] = false;
  if (std::find(started_.begin(), started_.end(), launch_.ids[i]) ==
      started_.end()) {
    started_.push_back(launch_.ids[i]);
  }
  return absl::OkStatus();
}

int NodeProcessGroup::running_count() const {
  return static_cast<int>(
      std::count_if(pids_.begin(), pids_.end(), [](pid_t p) { return p > 0; }));
}

bool NodeProcessGroup::Kill(int i) {
  if (pids_[i] <= 0) return false;
  ::kill(pids_[i], SIGKILL);
  int status = 0;
  ::waitpid(pids_[i], &status, 0);
  pids_[i] = -1;
  return true;
}

bool NodeProcessGroup::Leave(int i) {
  if (pids_[i] <= 0) return false;
  ::kill(pids_[i], SIGTERM);
  leaving_[i] = true;
  return true;
}

void NodeProcessGroup::SignalAll(int sig) {
  for (pid_t p : pids_) {
    if (p > 0) ::kill(p, sig);
  }
}

std::optional<NodeExit> NodeProcessGroup::Reap() {
  int status = 0;
  const pid_t pid = ::waitpid(-1, &status, WNOHANG);
  if (pid <= 0) return std::nullopt;
  NodeExit exit;
  const auto it = std::find(pids_.begin(), pids_.end(), pid);
  if (it == pids_.end()) return exit;  // not a node (index -1)
  exit.index = static_cast<int>(it - pids_.begin());
  exit.code = ChildExitCode(status);
  exit.left =
      leaving_[exit.index] && (exit.code == 1 || exit.code == 128 + SIGTERM);
  pids_[exit.index] = -1;
  return exit;
}

int ChildExitCode(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status)
                                : 128 + WTERMSIG(wait_status);
}

std::vector<StopStages::Action> StopStages::Step(absl::Time now, int signal,
                                                 int signal_count,
                                                 bool failed) {
  std::vector<Action> actions;
  if (signal != 0 && kill_at_ == absl::InfiniteFuture()) {
    actions.push_back(Action::kStopAfterRound);
    leave_now_at_ = now + absl::Seconds(45);
    kill_at_ = now + absl::Seconds(75);
  }
  if (leave_now_at_ != absl::InfiniteFuture() &&
      (signal_count >= 2 || now > leave_now_at_)) {
    actions.push_back(Action::kLeaveNow);
    leave_now_at_ = absl::InfiniteFuture();
  }
  if (failed && kill_at_ == absl::InfiniteFuture()) {
    kill_at_ = now + absl::Seconds(10);
  }
  if (now > kill_at_) actions.push_back(Action::kKill);
  return actions;
}

std::string FailedNodeMessage(const std::string& id, int code,
                              absl::string_view log_text,
                              const std::string& log_path) {
  std::string last, error;
  for (absl::string_view l :
       absl::StrSplit(log_text, '\n', absl::SkipEmpty())) {
    last = std::string(l);
    if (absl::StrContains(l, "starling node: error:")) error = last;
  }
  if (!error.empty()) last = error;
  // 128 + N: killed by signal N, so its log cannot say why. SIGKILL that
  // nobody here sent is most often the kernel's out-of-memory killer.
  std::string how = absl::StrCat("failed (exit ", code, ")");
  if (code > 128) {
    const int sig = code - 128;
    how = absl::StrCat("was killed by signal ", sig, " (", strsignal(sig),
                       sig == SIGKILL
                           ? "; kill -9 or the kernel's out-of-memory "
                             "killer: see dmesg, or lower --batch or the "
                             "model size"
                           : "",
                       "); its last log line");
  }
  return absl::StrCat("starling sim: node ", id, " ", how, ": ", last,
                      "\n  its log: ", log_path);
}

}  // namespace starling
