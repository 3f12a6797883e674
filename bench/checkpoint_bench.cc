// Checkpoint write and resume of one gpt trainer, against `cp` of the same
// file, back to back on the same disk; and the memory a checkpoint adds on
// top of the trainer (the process's VmHWM over its VmRSS, the peak reset
// before each write through /proc/self/clear_refs).
//
//   build/bench/checkpoint_bench --layers=6 --width=512 --heads=8 \
//       --dir=/tmp/ckpt --repeats=3 [--extra_copies=1]
//
// The trainer takes one inner step first, so that the optimizer holds its
// state. --extra_copies adds that many more fp32 copies of the weights as
// caller sections, the way a DiLoCo node adds its outer momentum ("outer"),
// passed as strings. Prints one JSON object; figures per repeat and their
// medians. It asserts nothing.
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/flat_params.h"
#include "core/trainer.h"

namespace starling {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A /proc/self/status field in bytes ("VmRSS", "VmHWM"); -1 if absent.
int64_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    int64_t kib = 0;
    if (absl::ConsumePrefix(&v, field + ":") &&
        absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(v), "kB"),
                         &kib)) {
      return kib * 1024;
    }
  }
  return -1;
}

// Makes VmHWM start again from the current VmRSS (Linux >= 4.0).
void ResetPeak() { std::ofstream("/proc/self/clear_refs") << "5"; }

// Seconds `argv` took to run; -1 when it failed.
double Run(const std::vector<std::string>& argv) {
  const double start = Now();
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    return -1;
  }
  return Now() - start;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"layers", "6"},  {"width", "512"},      {"heads", "8"},
      {"dir", "/tmp"},  {"repeats", "3"},      {"extra_copies", "1"},
      {"threads", "1"}, {"optimizer", "adamw"}};
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (!absl::ConsumePrefix(&a, "--") || a.find('=') == a.npos) {
      std::fprintf(stderr, "usage: checkpoint_bench [--key=value ...]\n");
      return 2;
    }
    flags[std::string(a.substr(0, a.find('=')))] =
        std::string(a.substr(a.find('=') + 1));
  }
  auto num = [&](const std::string& key) {
    int v = 0;
    (void)absl::SimpleAtoi(flags[key], &v);
    return v;
  };
  TrainConfig c = DefaultTrainConfig();
  c.set_layers(num("layers"));
  c.set_width(num("width"));
  c.set_heads(num("heads"));
  c.set_threads(num("threads"));
  c.set_optimizer(flags["optimizer"]);
  if (absl::Status s = ResolveTrainConfig(&c); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  torch::set_num_threads(std::max(1, num("threads")));
  auto created = Trainer::Create(c);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  Trainer& trainer = **created;
  if (auto step = trainer.Step(); !step.ok()) {
    std::fprintf(stderr, "%s\n", step.status().ToString().c_str());
    return 1;
  }
  const int64_t params = NumElements(trainer.Parameters());
  const std::string path = absl::StrCat(flags["dir"], "/bench.ckpt");
  const std::string copy = absl::StrCat(flags["dir"], "/bench.copy");
  std::vector<double> write, cp, cp_sync, resume, write_peak, resume_peak;
  int64_t file_bytes = 0;
  for (int r = 0; r < num("repeats"); ++r) {
    // What a node passes: its own state as strings, built before the call.
    std::map<std::string, std::string> extra;
    for (int k = 0; k < num("extra_copies"); ++k) {
      extra[k == 0 ? "outer" : absl::StrCat("extra", k)] =
          std::string(static_cast<size_t>(params) * 4, static_cast<char>(k));
    }
    ResetPeak();
    int64_t rss = StatusBytes("VmRSS");
    double t = Now();
    if (absl::Status s = trainer.SaveCheckpoint(path, std::move(extra));
        !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    write.push_back(Now() - t);
    write_peak.push_back(static_cast<double>(StatusBytes("VmHWM") - rss));
    struct stat st;
    file_bytes = ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
    ::unlink(copy.c_str());
    cp.push_back(Run({"cp", path, copy}));
    ::unlink(copy.c_str());
    cp_sync.push_back(
        Run({"sh", "-c", "cp \"$0\" \"$1\" && sync \"$1\"", path, copy}));
    ::unlink(copy.c_str());
    ResetPeak();
    rss = StatusBytes("VmRSS");
    t = Now();
    if (absl::Status s = trainer.RestoreCheckpoint(path); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    resume.push_back(Now() - t);
    resume_peak.push_back(static_cast<double>(StatusBytes("VmHWM") - rss));
  }
  ::unlink(path.c_str());
  auto list = [](const std::vector<double>& v) {
    return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
  };
  auto entry = [&](const char* name, const std::vector<double>& v) {
    return absl::StrCat("  \"", name, "\": ", list(v), ",\n  \"", name,
                        "_median\": ", Median(v));
  };
  std::printf(
      "{\n  \"parameters\": %lld,\n  \"file_bytes\": %lld,\n%s,\n%s,\n%s,\n"
      "%s,\n%s,\n%s\n}\n",
      static_cast<long long>(params), static_cast<long long>(file_bytes),
      entry("write_seconds", write).c_str(), entry("cp_seconds", cp).c_str(),
      entry("cp_sync_seconds", cp_sync).c_str(),
      entry("resume_seconds", resume).c_str(),
      entry("write_peak_bytes", write_peak).c_str(),
      entry("resume_peak_bytes", resume_peak).c_str());
  return 0;
}

}  // namespace
}  // namespace starling

int main(int argc, char** argv) { return starling::Main(argc, argv); }
