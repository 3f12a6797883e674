// A real-network test: three `starling node` processes, each in its own
// network namespace, joined by veth pairs to a bridge in a hub namespace,
// with every node's egress shaped by `tc` (netem delay and rate, or tbf rate
// only on kernels without sch_netem). The same DiLoCo run at a low and at an
// 8x higher rate: round sync times must track the emulated bandwidth.
// Needs root and iproute2 (ip, tc); skips with a message otherwise. Every
// namespace it makes is removed when the test ends, passed or failed, and
// leftovers of killed runs are removed at the start.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::Process;
using ::starling::testing::ReadJson;
using ::starling::testing::TempDir;
using ::starling::testing::TinyTextFlags;

constexpr int kNodes = 3;
constexpr int kPort = 7000;  // the same in every namespace
// Namespaces are named kPrefix + PID + "-" + role, so a run can tell its
// own from a dead run's leftovers.
constexpr char kPrefix[] = "stnetem-";
constexpr double kSlowMbit = 2;
constexpr double kFastMbit = 16;
constexpr double kDelayMs = 5;  // each way, netem only

struct CmdResult {
  int code = -1;
  std::string out;  // stdout and stderr
};

// Runs `cmd` through the shell.
CmdResult Sh(const std::string& cmd) {
  CmdResult r;
  FILE* p = ::popen(absl::StrCat(cmd, " 2>&1 </dev/null").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The path of executable `name` on $PATH or in the sbin directories (a
// non-root PATH often lacks them); empty when there is none.
std::string FindTool(const std::string& name) {
  const char* env = std::getenv("PATH");
  std::vector<std::string> dirs =
      absl::StrSplit(env ? env : "", ':', absl::SkipEmpty());
  for (const char* d : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    dirs.push_back(d);
  }
  for (const std::string& d : dirs) {
    std::string path = absl::StrCat(d, "/", name);
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

enum class Qdisc { kNetem, kTbf };

// Network namespaces for one test: a hub with a bridge and one namespace per
// node, linked by a veth pair (eth0 in the node, vK in the hub). The
// destructor kills what still runs in them and deletes them (which deletes
// their interfaces), so nothing is left even when an assertion ends the
// test early. Not thread-safe.
class NetLab {
 public:
  NetLab(std::string ip, std::string tc)
      : ip_(std::move(ip)),
        tc_(std::move(tc)),
        prefix_(absl::StrCat(kPrefix, ::getpid(), "-")),
        netns_was_mounted_(IsMountPoint(kNetnsDir)) {
    RemoveLeftovers();
  }
  ~NetLab() {
    for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
      KillAndDelete(*it);
    }
    // `ip netns add` bind-mounts /run/netns onto itself the first time;
    // undo that when this run made it and no namespace is left in it, so
    // that the test leaves no mount behind (one in a chroot keeps the
    // chroot from being removed).
    if (!netns_was_mounted_ &&
        absl::StripAsciiWhitespace(Sh(absl::StrCat(ip_, " netns list")).out)
            .empty()) {
      for (int i = 0; i < 4 && IsMountPoint(kNetnsDir); ++i) {
        Sh(absl::StrCat("umount ", kNetnsDir));
      }
    }
  }
  NetLab(const NetLab&) = delete;
  NetLab& operator=(const NetLab&) = delete;

  // Which qdisc can shape a veth here: netem, else tbf; tried on a
  // throwaway veth pair in a namespace of its own. An error names what is
  // missing when neither works.
  absl::StatusOr<Qdisc> Probe() {
    const std::string ns = absl::StrCat(prefix_, "probe");
    STARLING_RETURN_IF_ERROR(AddNamespace(ns));
    absl::Status s = Run(
        absl::StrCat(ip_, " -n ", ns, " link add p0 type veth peer name p1"));
    if (!s.ok()) {
      Delete(ns);
      return s;
    }
    CmdResult netem = Sh(absl::StrCat(
        tc_, " -n ", ns, " qdisc add dev p0 root netem delay 10ms rate 8mbit"));
    CmdResult tbf = Sh(absl::StrCat(
        tc_, " -n ", ns, " qdisc add dev p1 root tbf rate 8mbit burst 16kb",
        " latency 200ms"));
    Delete(ns);
    if (netem.code == 0) return Qdisc::kNetem;
    if (tbf.code == 0) {
      netem_error_ = std::string(absl::StripAsciiWhitespace(netem.out));
      return Qdisc::kTbf;
    }
    return absl::UnavailableError(
        absl::StrCat("neither tc qdisc works on a veth: netem: ",
                     absl::StripAsciiWhitespace(netem.out),
                     "; tbf: ", absl::StripAsciiWhitespace(tbf.out)));
  }
  // tc's message when netem was missing and tbf was used.
  const std::string& netem_error() const { return netem_error_; }

  // The hub, its bridge and `nodes` node namespaces; node K has
  // 10.77.0.(K+1)/24 on its eth0.
  absl::Status Create(int nodes) {
    const std::string hub = absl::StrCat(prefix_, "hub");
    STARLING_RETURN_IF_ERROR(AddNamespace(hub));
    STARLING_RETURN_IF_ERROR(
        Run(absl::StrCat(ip_, " -n ", hub, " link add br0 type bridge")));
    STARLING_RETURN_IF_ERROR(
        Run(absl::StrCat(ip_, " -n ", hub, " link set br0 up")));
    for (int k = 0; k < nodes; ++k) {
      const std::string ns = Node(k);
      STARLING_RETURN_IF_ERROR(AddNamespace(ns));
      STARLING_RETURN_IF_ERROR(
          Run(absl::StrCat(ip_, " -n ", hub, " link add v", k,
                           " type veth peer name eth0 netns ", ns)));
      STARLING_RETURN_IF_ERROR(Run(
          absl::StrCat(ip_, " -n ", hub, " link set v", k, " master br0 up")));
      STARLING_RETURN_IF_ERROR(Run(absl::StrCat(ip_, " -n ", ns, " addr add ",
                                                Address(k), "/24 dev eth0")));
      STARLING_RETURN_IF_ERROR(
          Run(absl::StrCat(ip_, " -n ", ns, " link set eth0 up")));
      STARLING_RETURN_IF_ERROR(
          Run(absl::StrCat(ip_, " -n ", ns, " link set lo up")));
    }
    return absl::OkStatus();
  }

  // Shapes every node's egress (its eth0) to `mbit` Mbit/s, plus kDelayMs
  // of delay with netem. Replaces the previous shaping.
  absl::Status Shape(int nodes, Qdisc qdisc, double mbit) {
    for (int k = 0; k < nodes; ++k) {
      std::string spec;
      if (qdisc == Qdisc::kNetem) {
        // A queue of about 250 ms keeps gossip from waiting seconds behind
        // bulk data (bufferbloat), as tbf's latency bound does.
        const int limit =
            std::max(20, static_cast<int>(mbit * 1e6 / 8 * 0.25 / 1500));
        spec = absl::StrFormat("netem delay %gms rate %gmbit limit %d",
                               kDelayMs, mbit, limit);
      } else {
        spec =
            absl::StrFormat("tbf rate %gmbit burst 16kb latency 250ms", mbit);
      }
      STARLING_RETURN_IF_ERROR(Run(absl::StrCat(
          tc_, " -n ", Node(k), " qdisc replace dev eth0 root ", spec)));
    }
    return absl::OkStatus();
  }

  // Starts `starling ARGS` in node K's namespace, stdout and stderr to
  // `log` (`ip netns exec` and `env` exec, so the process is starling's).
  Process Spawn(int k, const std::string& args, const std::string& log) {
    Process::Options options;
    options.wrapper = absl::StrCat(
        ip_, " netns exec ", Node(k),
        " env -u http_proxy -u https_proxy -u grpc_proxy -u HTTP_PROXY"
        " -u HTTPS_PROXY");
    options.stdout_to_log = true;
    return Process::Start(args, log, options);
  }

  std::string Node(int k) const { return absl::StrCat(prefix_, "n", k); }
  static std::string Address(int k) { return absl::StrCat("10.77.0.", k + 1); }

  // Namespaces whose names start with kPrefix, from `ip netns list`.
  static std::vector<std::string> Namespaces(const std::string& ip) {
    std::vector<std::string> out;
    for (absl::string_view line :
         absl::StrSplit(Sh(absl::StrCat(ip, " netns list")).out, '\n',
                        absl::SkipEmpty())) {
      std::string name(line.substr(0, line.find(' ')));  // "NAME (id: 3)"
      if (absl::StartsWith(name, kPrefix)) out.push_back(name);
    }
    return out;
  }

 private:
  static constexpr char kNetnsDir[] = "/run/netns";
  // Whether `path` is a mount point (a line of /proc/self/mountinfo has it
  // as its fifth field).
  static bool IsMountPoint(const std::string& path) {
    const std::string info = ReadFile("/proc/self/mountinfo").value_or("");
    for (absl::string_view line : absl::StrSplit(info, '\n')) {
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
      if (f.size() > 4 && f[4] == path) return true;
    }
    return false;
  }
  absl::Status Run(const std::string& cmd) {
    CmdResult r = Sh(cmd);
    if (r.code == 0) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(
        cmd, " (exit ", r.code, "): ", absl::StripAsciiWhitespace(r.out)));
  }
  absl::Status AddNamespace(const std::string& ns) {
    STARLING_RETURN_IF_ERROR(Run(absl::StrCat(ip_, " netns add ", ns)));
    namespaces_.push_back(ns);
    return absl::OkStatus();
  }
  void Delete(const std::string& ns) {
    KillAndDelete(ns);
    namespaces_.erase(std::remove(namespaces_.begin(), namespaces_.end(), ns),
                      namespaces_.end());
  }
  // A namespace lives on while a process is in it: kill those first.
  void KillAndDelete(const std::string& ns) {
    for (absl::string_view p :
         absl::StrSplit(Sh(absl::StrCat(ip_, " netns pids ", ns)).out, '\n',
                        absl::SkipEmpty())) {
      int pid = 0;
      if (absl::SimpleAtoi(p, &pid) && pid > 0) ::kill(pid, SIGKILL);
    }
    Sh(absl::StrCat(ip_, " netns del ", ns));
  }
  // Namespaces of earlier runs whose test process is gone (killed before
  // its destructor ran). Those of a live run, in parallel, are kept.
  void RemoveLeftovers() {
    for (const std::string& ns : Namespaces(ip_)) {
      absl::string_view rest =
          absl::string_view(ns).substr(sizeof(kPrefix) - 1);
      int pid = 0;
      if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &pid)) continue;
      if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
      std::cout << "[ netem    ] removing leftover namespace " << ns
                << std::endl;
      KillAndDelete(ns);
    }
  }

  const std::string ip_, tc_, prefix_;
  const bool netns_was_mounted_;         // before this lab
  std::vector<std::string> namespaces_;  // made by this lab, in order
  std::string netem_error_;
};

// One node's rounds from its summary.json.
struct NodeRounds {
  std::string final_hash;
  std::map<int, double> sync_seconds;  // round -> seconds
  std::map<int, double> bytes;         // round -> bytes sent
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// What a swarm run measured: per round, the smallest sync time over the
// nodes (that of the last node to be ready, which waits for nobody: the
// transfer itself) and the most bytes a node sent.
struct Measured {
  double sync_median = 0;      // seconds, median over rounds
  double expected_median = 0;  // bytes / rate, median over rounds
  int rounds = 0;
};

// Runs the swarm once at `mbit` and checks that every node finished and
// all agree on the final model.
void RunSwarm(NetLab& lab, Qdisc qdisc, double mbit, const std::string& name,
              Measured* out) {
  absl::Status shaped = lab.Shape(kNodes, qdisc, mbit);
  ASSERT_TRUE(shaped.ok()) << shaped;
  const std::string dir = absl::StrCat(TempDir(), "/", name);
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string run_id = absl::StrCat("netem-", name, "-", ::getpid(), "-",
                                          absl::ToUnixMillis(absl::Now()));
  static const std::string* model = new std::string(TinyTextFlags(60000));
  std::vector<Process> procs;
  for (int k = 0; k < kNodes; ++k) {
    std::vector<std::string> peers;
    for (int j = 0; j < kNodes; ++j) {
      if (j != k) peers.push_back(absl::StrCat(NetLab::Address(j), ":", kPort));
    }
    procs.push_back(lab.Spawn(
        k,
        absl::StrCat("node ", *model,
                     " --steps=35 --inner_steps=5 --eval_every=0 --threads=1"
                     " --shard_mode=contiguous --connect_timeout=30 --insecure",
                     " --run_id=", run_id, " --node_id=n", k,
                     " --listen=", NetLab::Address(k), ":", kPort, " --peers=",
                     absl::StrJoin(peers, ","), " --min_members=", kNodes,
                     " --shard=", k, "/", kNodes, " --out=", dir, "/n", k),
        absl::StrCat(dir, "/n", k, ".log")));
    ASSERT_TRUE(procs.back().started());
  }
  std::vector<NodeRounds> nodes(kNodes);
  for (int k = 0; k < kNodes; ++k) {
    const std::string log = absl::StrCat(dir, "/n", k, ".log");
    ASSERT_EQ(procs[k].Wait(absl::Minutes(4)), 0)
        << "n" << k << " at " << mbit << " Mbit/s, its log " << log << ":\n"
        << ReadFile(log).value_or("");
    auto summary = ReadJson(absl::StrCat(dir, "/n", k, "/summary.json"));
    nodes[k].final_hash =
        Field(Field(summary, "final").struct_value(), "model_hash")
            .string_value();
    for (const auto& v : Field(summary, "rounds").list_value().values()) {
      const auto& round = v.struct_value();
      const int r = static_cast<int>(Field(round, "round").number_value());
      nodes[k].sync_seconds[r] = Field(round, "sync_seconds").number_value();
      nodes[k].bytes[r] = Field(round, "bytes").number_value();
    }
  }
  for (int k = 1; k < kNodes; ++k) {
    EXPECT_EQ(nodes[k].final_hash, nodes[0].final_hash) << "n" << k;
    EXPECT_EQ(nodes[k].sync_seconds.size(), nodes[0].sync_seconds.size())
        << "n" << k << " and n0 ran different rounds; their logs:\n"
        << ReadFile(absl::StrCat(dir, "/n", k, ".log")).value_or("") << "\n"
        << ReadFile(absl::StrCat(dir, "/n0.log")).value_or("");
  }
  ASSERT_FALSE(nodes[0].final_hash.empty());
  std::vector<double> sync, expected;
  std::vector<std::string> rows;
  for (const auto& [r, s0] : nodes[0].sync_seconds) {
    double s = s0, bytes = 0;
    for (const NodeRounds& n : nodes) {
      auto it = n.sync_seconds.find(r);
      if (it != n.sync_seconds.end()) s = std::min(s, it->second);
      auto b = n.bytes.find(r);
      if (b != n.bytes.end()) bytes = std::max(bytes, b->second);
    }
    sync.push_back(s);
    expected.push_back(bytes * 8 / (mbit * 1e6));
    rows.push_back(absl::StrFormat("%.3f", s));
  }
  out->rounds = static_cast<int>(sync.size());
  out->sync_median = Median(sync);
  out->expected_median = Median(expected);
  std::cout << absl::StrFormat(
                   "[ netem    ] %g Mbit/s: %d rounds, sync seconds "
                   "(fastest node) %s; median %.3f s, bytes/rate %.3f s",
                   mbit, out->rounds, absl::StrJoin(rows, " "),
                   out->sync_median, out->expected_median)
            << std::endl;
}

TEST(NetemTest, RoundTimesTrackTheEmulatedBandwidth) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to make network namespaces and shape them "
                    "with tc (running as uid "
                 << ::geteuid() << ")";
  }
  const std::string ip = FindTool("ip"), tc = FindTool("tc");
  if (ip.empty() || tc.empty()) {
    GTEST_SKIP() << "needs iproute2: " << (ip.empty() ? "ip " : "")
                 << (tc.empty() ? "tc " : "")
                 << "not found (apt-get install iproute2)";
  }
  NetLab lab(ip, tc);
  absl::StatusOr<Qdisc> qdisc = lab.Probe();
  if (!qdisc.ok()) {
    GTEST_SKIP() << "cannot shape a veth here: " << qdisc.status().message();
  }
  if (*qdisc == Qdisc::kTbf) {
    std::cout << "[ netem    ] the kernel has no sch_netem ("
              << lab.netem_error()
              << "): shaping the rate with tbf, without delay" << std::endl;
  }
  RecordProperty("qdisc", *qdisc == Qdisc::kNetem ? "netem" : "tbf");
  absl::Status created = lab.Create(kNodes);
  ASSERT_TRUE(created.ok()) << created;

  Measured slow, fast;
  ASSERT_NO_FATAL_FAILURE(RunSwarm(lab, *qdisc, kSlowMbit, "slow", &slow));
  ASSERT_NO_FATAL_FAILURE(RunSwarm(lab, *qdisc, kFastMbit, "fast", &fast));
  RecordProperty("slow_sync_median_ms",
                 static_cast<int>(slow.sync_median * 1000));
  RecordProperty("fast_sync_median_ms",
                 static_cast<int>(fast.sync_median * 1000));
  ASSERT_GE(slow.rounds, 5);
  ASSERT_EQ(fast.rounds, slow.rounds);
  // The exchange cannot beat the link: a round's sync takes at least about
  // bytes/rate (0.7x: the qdisc's burst and timer slack).
  EXPECT_GT(slow.expected_median, 0);
  EXPECT_GE(slow.sync_median, 0.7 * slow.expected_median);
  EXPECT_GE(fast.sync_median, 0.7 * fast.expected_median);
  // 8x the rate: the sync is clearly faster (not 8x: fixed protocol costs).
  EXPECT_GT(slow.sync_median, 2 * fast.sync_median);
}

}  // namespace
}  // namespace starling
