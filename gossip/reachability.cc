#include "gossip/reachability.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

namespace starling {
namespace {

// One connection attempt to `ai`: kListening, kRefused or kNoAnswer.
Reachability Connect(const addrinfo& ai, absl::Duration timeout) {
  const int fd =
      ::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               ai.ai_protocol);
  if (fd < 0) return Reachability::kNoAnswer;
  int err = 0;
  if (::connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ms = static_cast<int>(
          std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout)));
      if (::poll(&p, 1, ms) == 1) {
        socklen_t len = sizeof(err);
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      } else {
        err = ETIMEDOUT;
      }
    }
  }
  ::close(fd);
  if (err == 0) return Reachability::kListening;
  return err == ECONNREFUSED ? Reachability::kRefused : Reachability::kNoAnswer;
}

}  // namespace

std::string HostOf(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

Reachability ProbeAddress(const std::string& address, absl::Duration timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return Reachability::kNoAnswer;
  const std::string host = HostOf(address);
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) {
    return Reachability::kNoAnswer;
  }
  Reachability r = Reachability::kRefused;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const Reachability one = Connect(*ai, timeout);
    if (one == Reachability::kListening) {
      r = one;
      break;
    }
    if (one == Reachability::kNoAnswer) r = one;
  }
  ::freeaddrinfo(found);
  return r;
}

peer::v1::Reachability DialBackVerdict(Reachability probe) {
  return probe == Reachability::kListening ? peer::v1::REACHABILITY_REACHABLE
                                           : peer::v1::REACHABILITY_UNREACHABLE;
}

const char* ReachabilityName(peer::v1::Reachability r) {
  switch (r) {
    case peer::v1::REACHABILITY_REACHABLE:
      return "reachable";
    case peer::v1::REACHABILITY_UNREACHABLE:
      return "unreachable";
    default:
      return "unknown";
  }
}

ReachabilityCounts CountReachability(
    const std::vector<peer::v1::MemberEntry>& table) {
  ReachabilityCounts c;
  for (const peer::v1::MemberEntry& e : table) {
    if (e.state() != peer::v1::MEMBER_ALIVE &&
        e.state() != peer::v1::MEMBER_SUSPECT) {
      continue;
    }
    switch (e.reachability()) {
      case peer::v1::REACHABILITY_REACHABLE:
        ++c.reachable;
        break;
      case peer::v1::REACHABILITY_UNREACHABLE:
        ++c.unreachable;
        break;
      default:
        ++c.unknown;
    }
  }
  return c;
}

}  // namespace starling
