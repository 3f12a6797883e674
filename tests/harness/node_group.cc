#include "tests/harness/node_group.h"

#include <unistd.h>

#include <iostream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"

namespace starling::testing {

NodeGroup::NodeGroup(const std::string& name, std::string common)
    : failed_before_(::testing::Test::HasFailure()),
      dir_(absl::StrCat(TempDir(), "/", name)),
      common_(std::move(common)) {
  EXPECT_TRUE(MakeDirs(dir_).ok()) << dir_;
}

NodeGroup::~NodeGroup() {
  std::vector<std::string> ids;
  for (const auto& [id, unused] : nodes_) ids.push_back(id);
  nodes_.clear();  // kills and reaps those still running
  if (!::testing::Test::HasFailure() || failed_before_) return;
  std::cerr << "Logs of every node of " << dir_ << ":\n";
  for (const std::string& id : ids) {
    std::cerr << "---- " << id << " (" << Log(id) << ")\n"
              << LogText(id) << "---- end of " << id << "\n";
  }
}

void NodeGroup::Start(const std::string& id, const std::string& flags,
                      const std::string& via) {
  const std::string peers =
      via.empty() ? "" : absl::StrCat(" --peers=", Address(via));
  addresses_[id].clear();
  ::unlink(Log(id).c_str());  // no stale "listening on" from a past life
  nodes_[id] = Process::Start(
      absl::StrCat("node ", common_, " --node_id=", id, " --listen=127.0.0.1:0",
                   peers, " --out=", Out(id), " ", flags),
      Log(id));
}

RunResult NodeGroup::Run(const std::string& id, const std::string& flags,
                         const std::string& via) {
  Start(id, flags, via);
  RunResult r;
  r.exit_code = Wait(id, absl::Minutes(10));
  r.err = LogText(id);
  return r;
}

std::string NodeGroup::Address(const std::string& id) {
  std::string& address = addresses_[id];
  if (address.empty()) {
    address = ListenAddress(Log(id), absl::Seconds(60));
    if (address.empty()) {
      ADD_FAILURE() << id << " did not log its address:\n" << LogText(id);
    }
  }
  return address;
}

int NodeGroup::Wait(const std::string& id, absl::Duration timeout) {
  return nodes_[id].Wait(timeout);
}

bool NodeGroup::WaitStopped(const std::string& id, absl::Duration timeout) {
  return nodes_[id].WaitStopped(timeout);
}

void NodeGroup::Signal(const std::string& id, int sig) {
  nodes_[id].Signal(sig);
}

bool NodeGroup::Deliver(const std::string& id, int sig) {
  return nodes_[id].Deliver(sig);
}

bool NodeGroup::Running(const std::string& id) { return nodes_[id].Running(); }

bool NodeGroup::WaitForEvent(const std::string& id, const std::string& needle,
                             absl::Duration timeout) const {
  return WaitForText(EventsPath(id), needle, timeout);
}

std::string NodeGroup::Out(const std::string& id) const {
  return absl::StrCat(dir_, "/", id);
}

std::string NodeGroup::Log(const std::string& id) const {
  return absl::StrCat(dir_, "/", id, ".log");
}

std::string NodeGroup::LogText(const std::string& id) const {
  return ReadFile(Log(id)).value_or("");
}

std::string NodeGroup::EventsPath(const std::string& id) const {
  return absl::StrCat(Out(id), "/events.jsonl");
}

std::vector<google::protobuf::Struct> NodeGroup::Events(
    const std::string& id, const std::string& kind) const {
  return ReadEvents(EventsPath(id), kind);
}

std::map<int, std::string> NodeGroup::RoundHashes(const std::string& id) const {
  return testing::RoundHashes(EventsPath(id));
}

std::string NodeGroup::FinalHash(const std::string& id) const {
  return testing::FinalHash(absl::StrCat(Out(id), "/summary.json"));
}

int64_t NodeGroup::Parameters(const std::string& id) const {
  const std::string log = LogText(id);
  const size_t at = log.find(" parameters");
  const size_t begin = at == std::string::npos || at == 0
                           ? std::string::npos
                           : log.rfind(' ', at - 1) + 1;
  int64_t n = 0;
  if (begin == std::string::npos ||
      !absl::SimpleAtoi(log.substr(begin, at - begin), &n)) {
    ADD_FAILURE() << id << " logged no \"N parameters\":\n" << log;
  }
  return n;
}

}  // namespace starling::testing
