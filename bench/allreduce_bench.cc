// Ring all-reduce throughput across local processes over real gRPC on
// loopback. The parent forks --nodes workers; each all-reduces a
// --megabytes fp32 buffer --iterations times; rank 0 prints one JSON object.
//   build/bench/allreduce_bench [--nodes=4] [--megabytes=64] [--iterations=3]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/json.h"
#include "gossip/grpc_transport.h"
#include "gossip/ring_allreduce.h"

namespace starling {
namespace {

struct Args {
  int nodes = 4;
  int megabytes = 64;
  int iterations = 3;
  int rank = -1;  // >= 0 in workers
  std::string members;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(
        absl::string_view(argv[i]).substr(2), absl::MaxSplits('=', 1));
    if (kv.first == "nodes") (void)absl::SimpleAtoi(kv.second, &a.nodes);
    if (kv.first == "megabytes")
      (void)absl::SimpleAtoi(kv.second, &a.megabytes);
    if (kv.first == "iterations")
      (void)absl::SimpleAtoi(kv.second, &a.iterations);
    if (kv.first == "rank") (void)absl::SimpleAtoi(kv.second, &a.rank);
    if (kv.first == "members") a.members = kv.second;
  }
  return a;
}

int Worker(const Args& a) {
  std::vector<std::string> members = absl::StrSplit(a.members, ',');
  const int64_t elems = int64_t{a.megabytes} * (1 << 20) / 4;
  PeerIdentity id;
  id.run_id = "bench";
  id.algo = "diloco";
  id.world = static_cast<int>(members.size());
  id.model = MakeFingerprint("bench", elems, "0");
  GrpcTransportOptions o;
  o.listen = members[a.rank];
  auto t = GrpcTransport::Start(o, id);
  if (!t.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", a.rank,
                 t.status().ToString().c_str());
    return 1;
  }
  MailboxOptions mo;
  mo.run_id = "bench";
  mo.tensors = {{"pseudo_grad", elems}};
  absl::Status s =
      (*t)->Connect(members, a.rank, mo, absl::Now() + absl::Seconds(60));
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", a.rank, s.ToString().c_str());
    return 1;
  }
  std::vector<float> data(elems, 1.0f + a.rank);
  std::vector<double> seconds;
  for (int it = 0; it < a.iterations + 1; ++it) {  // +1 warm-up
    (*t)->mailbox().AdvanceRound(it);
    RingOptions ro;
    ro.round = it;
    auto start = absl::Now();
    s = RingAllReduceSum(**t, absl::MakeSpan(data), ro);
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", a.rank, s.ToString().c_str());
      return 1;
    }
    if (it > 0) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (a.rank == 0) {
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    const double bytes = static_cast<double>(elems) * 4;
    const int n = static_cast<int>(members.size());
    JsonArray all;
    for (double x : seconds) all.Push(x);
    JsonObject out;
    out.Add("benchmark", "ring_allreduce_grpc_loopback")
        .Add("nodes", static_cast<int64_t>(n))
        .Add("payload_bytes", static_cast<int64_t>(bytes))
        .Add("iterations", static_cast<int64_t>(seconds.size()))
        .Add("seconds_median", median)
        .Add("seconds", all)
        // algbw: payload / time; busbw: bytes each node moves / time.
        .Add("algbw_MBps", bytes / median / 1e6)
        .Add("busbw_MBps", bytes * 2.0 * (n - 1) / n / median / 1e6)
        .Add("bytes_sent_rank0", (*t)->bytes_sent());
    std::printf("%s\n", out.Dump().c_str());
  }
  absl::SleepFor(absl::Milliseconds(500));  // let peers finish their last reads
  return 0;
}

}  // namespace
}  // namespace starling

int main(int argc, char** argv) {
  starling::Args a = starling::Parse(argc, argv);
  if (a.rank >= 0) return starling::Worker(a);
  std::vector<std::string> members;
  for (int i = 0; i < a.nodes; ++i) {
    members.push_back(absl::StrCat("127.0.0.1:", 47700 + i));
  }
  std::sort(members.begin(), members.end());
  std::vector<pid_t> pids;
  for (int r = 0; r < a.nodes; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      std::vector<std::string> args = {
          argv[0], absl::StrCat("--rank=", r),
          absl::StrCat("--members=", absl::StrJoin(members, ",")),
          absl::StrCat("--megabytes=", a.megabytes),
          absl::StrCat("--iterations=", a.iterations)};
      std::vector<char*> cargs;
      for (auto& s : args) cargs.push_back(s.data());
      cargs.push_back(nullptr);
      execv("/proc/self/exe", cargs.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}
