// Helpers for tests that run the `starling` binary as a real process.
#ifndef STARLING_TESTS_CORE_RUN_UTIL_H_
#define STARLING_TESTS_CORE_RUN_UTIL_H_

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace starling::testing {

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `starling ARGS` through the shell and captures its output.
inline RunResult RunStarling(const std::string& args) {
  std::string dir = TempDir();
  std::string cmd = absl::StrCat(STARLING_BINARY, " ", args, " >", dir,
                                 "/out 2>", dir, "/err </dev/null");
  int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(dir + "/out").value_or("");
  r.err = ReadFile(dir + "/err").value_or("");
  return r;
}

// Starts `starling ARGS` in the background, stderr to `err_path`.
inline pid_t SpawnStarling(const std::string& args,
                           const std::string& err_path) {
  pid_t pid = fork();
  if (pid == 0) {
    std::string cmd =
        absl::StrCat("exec ", STARLING_BINARY, " ", args, " 2>", err_path);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    _exit(127);
  }
  return pid;
}

// Waits until `path` contains `needle`, or `timeout` passes.
inline bool WaitForText(const std::string& path, const std::string& needle,
                        absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> text = ReadFile(path);
    if (text.ok() && text->find(needle) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(25));
  }
  return false;
}

// Sends SIGINT to `pid` and returns its exit code (-1 if a signal ended it).
inline int InterruptAndWait(pid_t pid) {
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The address a node serves peers on, from the "listening on HOST:PORT" line
// it logs to `log_path` once its server is up (text or JSON logs); empty when
// that line did not appear within `timeout`. Start nodes with
// --listen=127.0.0.1:0 and read their address here instead of picking a port
// with FreePort(): the kernel then gives every node its own port.
inline std::string ListenAddress(const std::string& log_path,
                                 absl::Duration timeout) {
  const std::string needle = "listening on ";
  if (!WaitForText(log_path, needle, timeout)) return "";
  const std::string text = ReadFile(log_path).value_or("");
  const size_t begin = text.find(needle) + needle.size();
  const size_t end = text.find_first_not_of(
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.:-[]",
      begin);
  return text.substr(begin, end == std::string::npos ? end : end - begin);
}

// A free loopback TCP port (bound once and released). Racy: another process
// (a concurrent test) may take it before the caller binds it, so prefer
// listening on port 0 and ListenAddress(). Only for addresses that must be
// known before the node starts (e.g. a node listed among its own seeds).
inline int FreePort() {
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

// Waits for `pid` until `deadline`; SIGKILLs it after. Exit code, 128+signal
// for a signal, or -1 when it had to be killed.
inline int WaitUntil(pid_t pid, absl::Time deadline) {
  while (absl::Now() < deadline) {
    int status = 0;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

// Parses a JSON file (e.g. summary.json) into a Struct.
inline google::protobuf::Struct ReadJson(const std::string& path) {
  google::protobuf::Struct s;
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return s;
  auto st = google::protobuf::util::JsonStringToMessage(*text, &s);
  EXPECT_TRUE(st.ok()) << path << ": " << st.ToString();
  return s;
}

inline const google::protobuf::Value& Field(const google::protobuf::Struct& s,
                                            const std::string& key) {
  static const google::protobuf::Value* missing = new google::protobuf::Value;
  auto it = s.fields().find(key);
  EXPECT_NE(it, s.fields().end()) << "missing JSON field " << key;
  return it == s.fields().end() ? *missing : it->second;
}

// Flags for a tiny gpt on a generated corpus of `bytes` bytes (written once
// per process): fast enough for integration tests of real processes.
inline std::string TinyTextFlags(size_t bytes) {
  std::string path = absl::StrCat(TempDir(), "/corpus.txt");
  EXPECT_TRUE(WriteFileAtomic(path, SampleText(bytes)).ok());
  return absl::StrCat(
      "--data=text:", path,
      " --model=gpt --layers=1 --width=32 --heads=2 --context=32 --batch=8 "
      "--lr=3e-3 --warmup=5");
}

}  // namespace starling::testing

#endif  // STARLING_TESTS_CORE_RUN_UTIL_H_
