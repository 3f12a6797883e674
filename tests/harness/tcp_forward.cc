#include "tests/harness/tcp_forward.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace starling::testing {
namespace {

// A connected socket to "a.b.c.d:port", or -1.
int Dial(const std::string& target) {
  const size_t colon = target.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(target.substr(colon + 1), &port)) {
    return -1;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, target.substr(0, colon).c_str(), &a.sin_addr) != 1) {
    return -1;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

TcpForward::TcpForward() {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (listen_fd_ >= 0 &&
      ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::listen(listen_fd_, 64) == 0 &&
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port_ = ntohs(a.sin_port);
  }
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpForward::~TcpForward() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::thread> pumps;
  {
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    pumps = std::move(pumps_);
  }
  for (std::thread& t : pumps) t.join();
  absl::MutexLock lock(&mu_);
  for (int fd : fds_) ::close(fd);
}

std::string TcpForward::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

void TcpForward::SetTarget(const std::string& target) {
  absl::MutexLock lock(&mu_);
  target_ = target;
}

void TcpForward::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    const int in = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (in < 0) continue;
    std::string target;
    {
      absl::MutexLock lock(&mu_);
      target = target_;
    }
    const int out = target.empty() ? -1 : Dial(target);
    if (out < 0) {
      ::close(in);
      continue;
    }
    connections_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    fds_.push_back(in);
    fds_.push_back(out);
    pumps_.emplace_back([this, in, out] { Pump(in, out); });
    pumps_.emplace_back([this, in, out] { Pump(out, in); });
  }
}

void TcpForward::Pump(int from, int to) {
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(from, buf, sizeof(buf));
    if (n <= 0) break;
    ssize_t done = 0;
    while (done < n) {
      const ssize_t w = ::send(to, buf + done, n - done, MSG_NOSIGNAL);
      if (w <= 0) break;
      done += w;
    }
    if (done < n) break;
    bytes_.fetch_add(n);
  }
  // Half-closes the other way too, so its pump ends.
  ::shutdown(to, SHUT_WR);
  ::shutdown(from, SHUT_RD);
}

}  // namespace starling::testing
