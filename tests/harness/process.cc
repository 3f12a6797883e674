#include "tests/harness/process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"

namespace starling::testing {
namespace {

// The exit code of a waitpid status: 128 + the signal for a signal.
int ExitCode(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Whether `sig` is pending for `pid`, process-wide (ShdPnd) or for its main
// thread (SigPnd), from /proc/PID/status.
bool Pending(pid_t pid, int sig) {
  const std::string status =
      ReadFile(absl::StrCat("/proc/", pid, "/status")).value_or("");
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::StartsWith(line, "ShdPnd:") &&
        !absl::StartsWith(line, "SigPnd:")) {
      continue;
    }
    const std::string mask(line.substr(line.find(':') + 1));
    const uint64_t bits = std::strtoull(mask.c_str(), nullptr, 16);
    if (bits & (uint64_t{1} << (sig - 1))) return true;
  }
  return false;
}

}  // namespace

const char* StarlingBinary() { return STARLING_BINARY; }

RunResult RunStarling(const std::string& args) {
  return RunCommand(absl::StrCat(StarlingBinary(), " ", args));
}

RunResult RunCommand(const std::string& command) {
  const std::string dir = TempDir();
  const std::string cmd =
      absl::StrCat(command, " >", dir, "/out 2>", dir, "/err </dev/null");
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(dir + "/out").value_or("");
  r.err = ReadFile(dir + "/err").value_or("");
  return r;
}

google::protobuf::Struct RunToSummary(const std::string& args,
                                      const std::string& out) {
  const RunResult r = RunStarling(absl::StrCat(args, " --out=", out));
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  return ReadJson(out + "/summary.json");
}

RunResult ExpectRefused(const std::string& args, const std::string& mention) {
  RunResult r = RunStarling(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(mention), std::string::npos)
      << args << ": no " << mention << " in\n"
      << r.err;
  return r;
}

void ExpectSimRefused(const std::string& args, const std::string& out,
                      const std::string& mention) {
  const RunResult r =
      ExpectRefused(absl::StrCat("sim ", args, " --out=", out), mention);
  EXPECT_EQ(r.err.find("failed (exit 2)"), std::string::npos) << r.err;
  EXPECT_FALSE(FileExists(out)) << args;
}

Process Process::Start(const std::string& args, const std::string& log_path,
                       const Options& options) {
  Process p;
  p.log_path_ = log_path;
  const std::string redirect =
      options.stdout_to_log ? absl::StrCat(" >", log_path, " 2>&1 </dev/null")
                            : absl::StrCat(" 2>", log_path);
  const std::string cmd =
      absl::StrCat("exec ", options.wrapper, options.wrapper.empty() ? "" : " ",
                   StarlingBinary(), " ", args, redirect);
  p.pid_ = ::fork();
  if (p.pid_ == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    _exit(127);
  }
  EXPECT_GT(p.pid_, 0) << "cannot fork for " << cmd;
  return p;
}

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = std::exchange(other.pid_, -1);
    log_path_ = std::move(other.log_path_);
    ended_ = other.ended_;
    exit_code_ = other.exit_code_;
  }
  return *this;
}

Process::~Process() { Kill(); }

void Process::Kill() {
  if (started() && !ended_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    ended_ = true;
    exit_code_ = -1;
  }
}

std::string Process::LogText() const {
  return ReadFile(log_path_).value_or("");
}

bool Process::Poll(int options) {
  if (ended_ || !started()) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG | options) != pid_) return false;
  if (WIFSTOPPED(status)) return false;
  ended_ = true;
  exit_code_ = ExitCode(status);
  return true;
}

int Process::Wait(absl::Duration timeout) {
  if (!started()) return -1;
  if (!WaitFor([this] { return Poll(0); }, timeout)) Kill();
  return exit_code_;
}

bool Process::WaitStopped(absl::Duration timeout) {
  bool stopped = false;
  WaitFor(
      [&] {
        if (ended_ || !started()) return true;
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG | WUNTRACED) != pid_) {
          return false;
        }
        if (WIFSTOPPED(status)) {
          stopped = true;
        } else {
          ended_ = true;
          exit_code_ = ExitCode(status);
        }
        return true;
      },
      timeout);
  return stopped;
}

bool Process::Running() { return !Poll(0); }

void Process::Signal(int sig) {
  if (started() && !ended_) ::kill(pid_, sig);
}

bool Process::Deliver(int sig, absl::Duration timeout) {
  Signal(sig);
  return WaitFor([&] { return !Running() || !Pending(pid_, sig); }, timeout,
                 absl::Milliseconds(5));
}

int Process::Interrupt(absl::Duration timeout) {
  Signal(SIGINT);
  return Wait(timeout);
}

std::string ListenAddress(const std::string& log_path, absl::Duration timeout) {
  const std::string needle = "listening on ";
  if (!WaitForText(log_path, needle, timeout)) return "";
  const std::string text = ReadFile(log_path).value_or("");
  const size_t begin = text.find(needle) + needle.size();
  const size_t end = text.find_first_not_of(
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.:-[]",
      begin);
  return text.substr(begin, end == std::string::npos ? end : end - begin);
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string TinyTextFlags(size_t bytes) {
  const std::string path = absl::StrCat(TempDir(), "/corpus.txt");
  EXPECT_TRUE(WriteFileAtomic(path, SampleText(bytes)).ok());
  return absl::StrCat(
      "--data=text:", path,
      " --model=gpt --layers=1 --width=32 --heads=2 --context=32 --batch=8 "
      "--lr=3e-3 --warmup=5");
}

}  // namespace starling::testing
