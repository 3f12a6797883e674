#include "gossip/reachability.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

// A socket listening on 127.0.0.1 (port chosen by the kernel), closed on
// destruction; -1 port when it could not be made.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
  }
  ~Listener() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = -1;
};

TEST(ReachabilityTest, DialBackVerdictsAndTheirNames) {
  EXPECT_EQ(DialBackVerdict(Reachability::kListening),
            peer::v1::REACHABILITY_REACHABLE);
  EXPECT_EQ(DialBackVerdict(Reachability::kRefused),
            peer::v1::REACHABILITY_UNREACHABLE);
  EXPECT_EQ(DialBackVerdict(Reachability::kNoAnswer),
            peer::v1::REACHABILITY_UNREACHABLE);
  EXPECT_STREQ(ReachabilityName(peer::v1::REACHABILITY_REACHABLE), "reachable");
  EXPECT_STREQ(ReachabilityName(peer::v1::REACHABILITY_UNREACHABLE),
               "unreachable");
  EXPECT_STREQ(ReachabilityName(peer::v1::REACHABILITY_UNKNOWN), "unknown");
}

TEST(ReachabilityTest, CountsOnlyLiveMembersByVerdict) {
  std::vector<peer::v1::MemberEntry> table(5);
  const peer::v1::MemberState states[] = {
      peer::v1::MEMBER_ALIVE, peer::v1::MEMBER_SUSPECT, peer::v1::MEMBER_ALIVE,
      peer::v1::MEMBER_DEAD, peer::v1::MEMBER_LEFT};
  const peer::v1::Reachability verdicts[] = {
      peer::v1::REACHABILITY_REACHABLE, peer::v1::REACHABILITY_UNREACHABLE,
      peer::v1::REACHABILITY_UNKNOWN, peer::v1::REACHABILITY_REACHABLE,
      peer::v1::REACHABILITY_UNREACHABLE};
  for (int i = 0; i < 5; ++i) {
    table[i].set_state(states[i]);
    table[i].set_reachability(verdicts[i]);
  }
  const ReachabilityCounts c = CountReachability(table);
  EXPECT_EQ(c.reachable, 1);
  EXPECT_EQ(c.unreachable, 1);
  EXPECT_EQ(c.unknown, 1);
}

TEST(ReachabilityTest, AListeningSocketAcceptsEvenIfNobodyAccepts) {
  // The way a stopped process's socket does: its kernel completes the
  // handshake into the backlog.
  Listener l;
  ASSERT_GT(l.port(), 0);
  EXPECT_EQ(
      ProbeAddress(absl::StrCat("127.0.0.1:", l.port()), absl::Seconds(5)),
      Reachability::kListening);
  // By name too, where this machine resolves "localhost" (a minimal chroot
  // may have no /etc/hosts).
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo("localhost", nullptr, &hints, &found) == 0) {
    freeaddrinfo(found);
    EXPECT_EQ(
        ProbeAddress(absl::StrCat("localhost:", l.port()), absl::Seconds(5)),
        Reachability::kListening);
  }
}

TEST(ReachabilityTest, AClosedPortIsRefused) {
  // The way an exited process's port is.
  Listener l;
  ASSERT_GT(l.port(), 0);
  const int port = l.port();
  l.Close();
  EXPECT_EQ(ProbeAddress(absl::StrCat("127.0.0.1:", port), absl::Seconds(5)),
            Reachability::kRefused);
}

TEST(ReachabilityTest, AStoppedProcessStillListens) {
  Listener l;
  ASSERT_GT(l.port(), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  l.Close();  // the child holds the listening socket now
  ASSERT_EQ(::kill(child, SIGSTOP), 0);
  EXPECT_EQ(
      ProbeAddress(absl::StrCat("127.0.0.1:", l.port()), absl::Seconds(5)),
      Reachability::kListening);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(
      ProbeAddress(absl::StrCat("127.0.0.1:", l.port()), absl::Seconds(5)),
      Reachability::kRefused);
}

TEST(ReachabilityTest, AnAddressThatIsNoneDoesNotAnswer) {
  EXPECT_EQ(ProbeAddress("no-port", absl::Seconds(1)), Reachability::kNoAnswer);
}

}  // namespace
}  // namespace starling
