#include "node/sim_command.h"

#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/node_command.h"
#include "node/report.h"
#include "node/run_output.h"
#include "node/train_command.h"

ABSL_FLAG(int, nodes, 4, "sim: number of node processes");

namespace starling {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

int Fail(const absl::Status& s, int code) {
  WriteStderrLine(absl::StrCat("starling sim: error: ", s.message()));
  return code;
}

// Free loopback ports, held open until all are chosen so they differ.
absl::StatusOr<std::vector<int>> PickPorts(int n) {
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

const Value& Get(const Struct& s, const std::string& key) {
  static const Value* null = new Value();
  auto it = s.fields().find(key);
  return it == s.fields().end() ? *null : it->second;
}

absl::StatusOr<Struct> ReadJsonFile(const std::string& path) {
  STARLING_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Struct s;
  if (!google::protobuf::util::JsonStringToMessage(text, &s).ok()) {
    return absl::DataLossError(absl::StrCat(path, " is not valid JSON"));
  }
  return s;
}

std::string ToJson(const Value& v) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(v, &out, o);
  return out;
}

// Live view of the nodes' progress, from the tail of their events.jsonl.
class Progress {
 public:
  Progress(const std::string& dir, int nodes, int total_steps)
      : dir_(dir),
        offsets_(nodes, 0),
        step_(nodes, 0),
        loss_(nodes, 0),
        sent_(nodes, 0),
        total_steps_(total_steps) {}

  // Reads only what each node appended since the last poll.
  void Poll() {
    for (size_t i = 0; i < offsets_.size(); ++i) {
      absl::StatusOr<std::string> text =
          ReadFileFrom(absl::StrCat(dir_, "/n", i, "/events.jsonl"),
                       static_cast<int64_t>(offsets_[i]));
      if (!text.ok()) continue;
      size_t end = text->rfind('\n');
      if (end == std::string::npos) continue;  // no complete line yet
      for (absl::string_view line :
           absl::StrSplit(absl::string_view(*text).substr(0, end), '\n',
                          absl::SkipEmpty())) {
        Struct ev;
        if (!google::protobuf::util::JsonStringToMessage(std::string(line), &ev)
                 .ok()) {
          continue;
        }
        const std::string kind = Get(ev, "event").string_value();
        if (kind == "round") {
          round_ =
              std::max<int64_t>(round_, Get(ev, "round").number_value() + 1);
          step_[i] = static_cast<int>(Get(ev, "step").number_value());
          loss_[i] = Get(ev, "train_loss").number_value();
          sent_[i] += Get(ev, "bytes").number_value();
        } else if (kind == "eval") {
          val_ = Get(ev, "val_loss").number_value();
        }
      }
      offsets_[i] += end + 1;
    }
  }

  std::string Line(double elapsed) const {
    int min_step = *std::min_element(step_.begin(), step_.end());
    double loss = 0, sent = 0;
    for (size_t i = 0; i < step_.size(); ++i) {
      loss += loss_[i];
      sent += sent_[i];
    }
    loss /= step_.size();
    double eta =
        min_step > 0 ? elapsed * (total_steps_ - min_step) / min_step : NAN;
    return absl::StrFormat(
        "sim | round %d | step %d/%d | loss %s | val %s | sent %s | %s | eta "
        "%s",
        round_, min_step, total_steps_,
        min_step > 0 ? absl::StrFormat("%.4f", loss) : "-",
        std::isnan(val_) ? "-" : absl::StrFormat("%.4f", val_),
        FormatBytes(sent), FormatDuration(elapsed), FormatDuration(eta));
  }

 private:
  std::string dir_;
  std::vector<size_t> offsets_;
  std::vector<int> step_;
  std::vector<double> loss_;
  std::vector<double> sent_;
  int total_steps_;
  int64_t round_ = 0;
  double val_ = NAN;
};

std::atomic<int> g_sim_signal{0};
void OnSimSignal(int sig) { g_sim_signal.store(sig); }

// Merges the nodes' summaries into the sim's summary.json and report.html.
absl::Status MergeOutputs(const std::string& dir, int n,
                          const TrainConfig& config, const JsonObject& sim_cfg,
                          double wall) {
  std::vector<Struct> sums;
  for (int i = 0; i < n; ++i) {
    STARLING_ASSIGN_OR_RETURN(
        Struct s, ReadJsonFile(absl::StrCat(dir, "/n", i, "/summary.json")));
    sums.push_back(std::move(s));
  }
  JsonArray nodes;
  double total_bytes = 0, equivalent = 0, compute = 0, node_wall = 0;
  double before = 0, after = 0;
  std::string compression;
  ReportData report;
  for (int i = 0; i < n; ++i) {
    const Struct& node =
        Get(sums[i], "nodes").list_value().values(0).struct_value();
    nodes.PushRaw(ToJson(Get(sums[i], "nodes").list_value().values(0)));
    total_bytes += Get(node, "bytes_sent").number_value();
    before += Get(node, "bytes_before_compression").number_value();
    after += Get(node, "bytes_after_compression").number_value();
    compression = Get(node, "compression").string_value();
    compute += Get(node, "compute_seconds").number_value();
    node_wall += Get(node, "wall_seconds").number_value();
    equivalent +=
        Get(Get(sums[i], "final").struct_value(), "allreduce_equivalent_bytes")
            .number_value();
    double w = Get(node, "wall_seconds").number_value();
    report.nodes.push_back(
        {Get(node, "id").string_value(), Get(node, "bytes_sent").number_value(),
         Get(node, "bytes_received").number_value(),
         w > 0 ? Get(node, "compute_seconds").number_value() / w : 0});
  }
  // Rounds: every node logged the same rounds; they must agree on the hash.
  const auto& r0 = Get(sums[0], "rounds").list_value();
  JsonArray rounds;
  bool all_agree = true;
  double cumulative = 0;
  for (int k = 0; k < r0.values_size(); ++k) {
    const Struct& a = r0.values(k).struct_value();
    const std::string hash = Get(a, "model_hash").string_value();
    bool agree = true;
    double loss = 0, bytes = 0, seconds = 0;
    JsonArray hashes;
    for (int i = 0; i < n; ++i) {
      const auto& ri = Get(sums[i], "rounds").list_value();
      if (k >= ri.values_size()) {
        agree = false;
        hashes.Push(absl::string_view(""));
        continue;
      }
      const Struct& b = ri.values(k).struct_value();
      agree = agree && Get(b, "model_hash").string_value() == hash;
      hashes.Push(Get(b, "model_hash").string_value());
      loss += Get(b, "train_loss").number_value() / n;
      bytes += Get(b, "bytes").number_value();
      seconds = std::max(seconds, Get(b, "seconds").number_value());
    }
    all_agree = all_agree && agree;
    cumulative += bytes;
    JsonObject o;
    o.Add("round", static_cast<int64_t>(Get(a, "round").number_value()))
        .AddRaw("members", ToJson(Get(a, "members")))
        .Add("model_hash", hash)
        .Add("hashes_agree", agree)
        .Add("node_hashes", hashes)
        .Add("train_loss", loss)
        .AddRaw("val_loss", ToJson(Get(a, "val_loss")))
        .Add("bytes", bytes)
        .Add("seconds", seconds);
    rounds.Push(o);
    report.rounds.push_back(
        {static_cast<int64_t>(Get(a, "round").number_value()), cumulative, loss,
         0.0, agree, Get(a, "members").list_value().values_size()});
  }
  // Wall time at each round end, from n0's events.
  absl::StatusOr<std::string> ev0 =
      ReadFile(absl::StrCat(dir, "/n0/events.jsonl"));
  if (ev0.ok()) {
    size_t k = 0;
    for (absl::string_view line :
         absl::StrSplit(*ev0, '\n', absl::SkipEmpty())) {
      Struct ev;
      if (!google::protobuf::util::JsonStringToMessage(std::string(line), &ev)
               .ok()) {
        continue;
      }
      const std::string kind = Get(ev, "event").string_value();
      double t = Get(ev, "wall_seconds").number_value();
      if (kind == "round" && k < report.rounds.size()) {
        report.rounds[k++].wall_seconds = t;
      } else if (kind == "eval") {
        report.val_vs_time.push_back({t, Get(ev, "val_loss").number_value()});
      }
    }
  }
  const Struct& f0 = Get(sums[0], "final").struct_value();
  std::string final_hash = Get(f0, "model_hash").string_value();
  for (int i = 1; i < n; ++i) {
    all_agree =
        all_agree && Get(Get(sums[i], "final").struct_value(), "model_hash")
                             .string_value() == final_hash;
  }
  JsonObject fin;
  fin.AddRaw("val_loss", ToJson(Get(f0, "val_loss")));
  if (f0.fields().count("val_accuracy")) {
    fin.AddRaw("val_accuracy", ToJson(Get(f0, "val_accuracy")));
  }
  fin.Add("total_bytes", total_bytes)
      .Add("allreduce_equivalent_bytes", equivalent);
  if (!compression.empty()) {
    fin.Add("compression", compression)
        .Add("bytes_before_compression", before)
        .Add("bytes_after_compression", after);
  }
  if (total_bytes > 0) {
    fin.Add("comm_reduction", equivalent / total_bytes);
  } else {
    fin.AddNull("comm_reduction");
  }
  fin.Add("utilization", node_wall > 0 ? compute / node_wall : 0.0)
      .Add("model_hash", final_hash)
      .Add("all_hashes_agree", all_agree)
      .Add("rounds", static_cast<int64_t>(r0.values_size()))
      .Add("wall_seconds", wall);
  JsonObject summary;
  summary.Add("command", "sim")
      .AddRaw("config", ConfigJson(config))
      .Add("sim", sim_cfg)
      .AddRaw("model", ToJson(Get(sums[0], "model")))
      .Add("nodes", nodes)
      .Add("rounds", rounds)
      .Add("final", fin);
  STARLING_RETURN_IF_ERROR(
      WriteFileAtomic(dir + "/summary.json", summary.Dump() + "\n"));

  report.title =
      absl::StrCat("Starling sim: ", n, " nodes, ", absl::GetFlag(FLAGS_algo));
  auto num = [](const Value& v, const char* fmt) {
    return v.kind_case() == Value::kNumberValue
               ? absl::StrFormat(fmt, v.number_value())
               : std::string("-");
  };
  report.facts = {
      {"run directory", dir},
      {"model", Get(Get(sums[0], "model").struct_value(), "architecture")
                    .string_value()},
      {"algorithm", absl::GetFlag(FLAGS_algo)},
      {"final validation loss", num(Get(f0, "val_loss"), "%.4f")},
      {"rounds", absl::StrCat(r0.values_size())},
      {"pseudo-gradient compression",
       compression.empty()
           ? std::string("-")
           : absl::StrFormat("%s: %s before, %s after (%.1fx)", compression,
                             FormatBytes(before), FormatBytes(after),
                             after > 0 ? before / after : 0.0)},
      {"bytes sent (all nodes)", FormatBytes(total_bytes)},
      {"per-step all-reduce would send", FormatBytes(equivalent)},
      {"communication reduction",
       total_bytes > 0 ? absl::StrFormat("%.1fx", equivalent / total_bytes)
                       : "-"},
      {"utilization (compute / wall)",
       absl::StrFormat("%.1f%%",
                       node_wall > 0 ? 100 * compute / node_wall : 0)},
      {"model hashes agree every round", all_agree ? "yes" : "NO"},
      {"wall time", FormatDuration(wall)},
  };
  absl::Status rs = WriteReport(dir, report);
  if (!rs.ok()) STARLING_LOG(WARNING) << "report: " << rs.message();
  return absl::OkStatus();
}

}  // namespace

const Subcommand& SimSubcommand() {
  static const Subcommand* sub = [] {
    std::vector<std::string> flags = {"nodes"};
    for (const std::string& f : NodeFlagNames()) {
      if (f != "listen" && f != "peers") flags.push_back(f);
    }
    for (const std::string& f : TrainFlagNames()) {
      if (f != "shard") flags.push_back(f);
    }
    return new Subcommand{
        "sim",
        "run N nodes as local processes (the default: 4-node DiLoCo on KJV)",
        "Starts --nodes `starling node` processes on 127.0.0.1, node K with "
        "--shard=K/N, waits for them with one live progress line, and writes "
        "--out/summary.json, --out/report.html and --out/nK/ (events.jsonl, "
        "summary.json, node.log, checkpoint.ckpt). Ctrl-C stops every node; "
        "if a node fails the others are stopped and its log is named. The "
        "training and node flags are passed to every node; --threads "
        "defaults to 1 per node.\n\n"
        "Default: 4 nodes, DiLoCo with H=50 (16 rounds), the small gpt on "
        "KJV, 800 inner steps per node.\n"
        "  starling sim\n"
        "  starling sim --algo=ddp --out=runs/ddp\n"
        "  starling sim --inner_steps=10 --steps=800 --seed=1",
        flags};
  }();
  return *sub;
}

int RunSimCommand() {
  const int n = absl::GetFlag(FLAGS_nodes);
  if (n < 1 || n > 64) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("--nodes=", n, ": must be in [1, 64]")),
                2);
  }
  TrainConfig config = ConfigFromFlags();
  if (absl::Status s = ResolveTrainConfig(&config); !s.ok()) return Fail(s, 2);
  if (config.out().empty()) {
    config.set_out(absl::StrCat(
        "runs/sim-",
        absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone())));
  }
  const std::string dir = config.out();
  if (!config.resume() &&
      (FileExists(dir + "/n0") || FileExists(dir + "/summary.json"))) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("--out=", dir,
                                 " already holds a sim run; pass --resume "
                                 "to continue it, or choose another --out")),
                2);
  }
  if (absl::Status s = MakeDirs(dir); !s.ok()) return Fail(s, 2);
  absl::StatusOr<std::vector<int>> ports = PickPorts(n);
  if (!ports.ok()) return Fail(ports.status(), 1);
  std::vector<std::string> addrs;
  for (int p : *ports) addrs.push_back(absl::StrCat("127.0.0.1:", p));
  // Ranks follow the sorted member list; sorting here makes node K rank K.
  std::sort(addrs.begin(), addrs.end());
  std::string run_id = absl::GetFlag(FLAGS_run_id);
  if (run_id == "starling") {
    run_id = absl::StrCat("sim-", absl::ToUnixMillis(absl::Now()));
  }
  // Flags every child gets: the current value of each training/node flag.
  std::vector<std::string> common;
  for (const std::string& name : SimSubcommand().flags) {
    if (name == "nodes" || name == "out" || name == "run_id" ||
        name == "threads") {
      continue;
    }
    absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    if (f != nullptr)
      common.push_back(absl::StrCat("--", name, "=", f->CurrentValue()));
  }
  common.push_back(absl::StrCat("--run_id=", run_id));
  common.push_back(absl::StrCat("--threads=", std::max(1, config.threads())));

  struct sigaction sa = {};
  sa.sa_handler = OnSimSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  WriteStderrLine(absl::StrFormat(
      "starling sim: %d nodes (%s), %s on %s, %d steps per node, run %s -> %s",
      n, absl::GetFlag(FLAGS_algo), config.model(), config.data(),
      config.steps(), run_id, dir));
  const auto start = absl::Now();
  std::vector<pid_t> pids(n, -1);
  for (int i = 0; i < n; ++i) {
    const std::string node_dir = absl::StrCat(dir, "/n", i);
    if (absl::Status s = MakeDirs(node_dir); !s.ok()) return Fail(s, 1);
    std::vector<std::string> args = {"starling", "node"};
    args.push_back(absl::StrCat("--listen=", addrs[i]));
    std::vector<std::string> others;
    for (int j = 0; j < n; ++j) {
      if (j != i) others.push_back(addrs[j]);
    }
    args.push_back(absl::StrCat("--peers=", absl::StrJoin(others, ",")));
    args.push_back(absl::StrCat("--shard=", i, "/", n));
    args.push_back(absl::StrCat("--out=", node_dir));
    for (const std::string& a : common) args.push_back(a);
    const std::string log = node_dir + "/node.log";
    pid_t pid = ::fork();
    if (pid < 0) return Fail(absl::InternalError("fork failed"), 1);
    if (pid == 0) {
      ::setpgid(0, 0);  // a terminal's Ctrl-C reaches only the sim
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
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
    pids[i] = pid;
  }

  Progress progress(dir, n, config.steps());
  const bool tty = ::isatty(STDERR_FILENO);
  auto last_print = absl::InfinitePast();
  std::string last_line;
  int running = n;
  int failed = -1, failed_code = 0;
  // When to SIGKILL whatever is still running: nodes finish their round
  // after SIGTERM; a node blocked on a dead peer never would.
  absl::Time kill_at = absl::InfiniteFuture();
  auto stop_all = [&](int sig) {
    for (pid_t p : pids) {
      if (p > 0) ::kill(p, sig);
    }
  };
  while (running > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      int idx = static_cast<int>(std::find(pids.begin(), pids.end(), pid) -
                                 pids.begin());
      if (idx < n) {
        pids[idx] = -1;
        --running;
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && failed < 0 && g_sim_signal.load() == 0) {
          failed = idx;
          failed_code =
              WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          stop_all(SIGTERM);
        }
      }
      continue;
    }
    if (g_sim_signal.load() != 0 && kill_at == absl::InfiniteFuture()) {
      WriteStderrLine("\nstarling sim: stopping all nodes");
      stop_all(SIGTERM);
      kill_at = absl::Now() + absl::Seconds(60);
    }
    if (failed >= 0 && kill_at == absl::InfiniteFuture()) {
      kill_at = absl::Now() + absl::Seconds(10);  // their round cannot finish
    }
    if (absl::Now() > kill_at) stop_all(SIGKILL);
    progress.Poll();
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
    std::string line = progress.Line(elapsed);
    if (tty) {
      std::fprintf(stderr, "\r%-110s", line.c_str());
      std::fflush(stderr);
    } else if (line != last_line &&
               absl::Now() - last_print > absl::Seconds(5)) {
      WriteStderrLine(line);
      last_print = absl::Now();
      last_line = line;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  if (tty) std::fprintf(stderr, "\n");
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  if (g_sim_signal.load() != 0) {
    WriteStderrLine(
        absl::StrCat("starling sim: interrupted; node logs and "
                     "checkpoints are in ",
                     dir, "/n*/"));
    return 1;
  }
  if (failed >= 0) {
    const std::string log = absl::StrCat(dir, "/n", failed, "/node.log");
    std::string last;
    if (absl::StatusOr<std::string> text = ReadFile(log); text.ok()) {
      for (absl::string_view l :
           absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
        last = std::string(l);
      }
    }
    WriteStderrLine(absl::StrCat("starling sim: node n", failed,
                                 " failed (exit ", failed_code, "): ", last,
                                 "\n  its log: ", log));
    return 1;
  }
  JsonObject sim_cfg;
  sim_cfg.Add("nodes", static_cast<int64_t>(n))
      .Add("algo", absl::GetFlag(FLAGS_algo))
      .Add("inner_steps",
           static_cast<int64_t>(absl::GetFlag(FLAGS_inner_steps)))
      .Add("outer", absl::GetFlag(FLAGS_outer))
      .Add("outer_lr", absl::GetFlag(FLAGS_outer_lr))
      .Add("outer_momentum", absl::GetFlag(FLAGS_outer_momentum))
      .Add("run_id", run_id);
  if (absl::Status s = MergeOutputs(dir, n, config, sim_cfg, wall); !s.ok()) {
    return Fail(s, 1);
  }
  absl::StatusOr<Struct> summary = ReadJsonFile(dir + "/summary.json");
  if (summary.ok()) {
    const Struct& fin = Get(*summary, "final").struct_value();
    WriteStderrLine(absl::StrFormat(
        "done: val_loss %s | sent %s (per-step all-reduce: %s, %.1fx less) | "
        "hashes agree: %s | %s\n  report: %s/report.html",
        ToJson(Get(fin, "val_loss")),
        FormatBytes(Get(fin, "total_bytes").number_value()),
        FormatBytes(Get(fin, "allreduce_equivalent_bytes").number_value()),
        Get(fin, "comm_reduction").number_value(),
        Get(fin, "all_hashes_agree").bool_value() ? "yes" : "NO",
        FormatDuration(wall), dir));
  }
  return 0;
}

}  // namespace starling
