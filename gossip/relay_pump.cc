#include "gossip/relay_pump.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gossip/reachability.h"

namespace starling {
namespace {

// Frames of up to this many bytes: the relay forwards whole frames, so
// this bounds what one read holds in memory on every hop.
constexpr size_t kFrameBytes = 64 << 10;

bool WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t w =
        ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

absl::StatusOr<int> DialTcp(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("address ", address, " has no port"));
  }
  const std::string host = HostOf(address);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), address.substr(colon + 1).c_str(), &hints,
                    &found) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", address));
  }
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                  ai->ai_protocol);
    if (fd >= 0 && ::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", address));
  }
  return fd;
}

absl::StatusOr<int> ListenOnLoopback(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return absl::UnavailableError("cannot listen on 127.0.0.1 for a relay");
  }
  *port = ntohs(a.sin_port);
  return fd;
}

std::string LocalDialAddress(const std::string& bound) {
  const size_t colon = bound.rfind(':');
  const std::string host = bound.substr(0, colon);
  const std::string port = bound.substr(colon + 1);
  if (host == "0.0.0.0" || host.empty())
    return absl::StrCat("127.0.0.1:", port);
  if (host == "[::]") return absl::StrCat("[::1]:", port);
  return bound;
}

void Pump(Tunnel* tunnel, RelayStream* stream, std::atomic<int64_t>* bytes) {
  std::thread up([tunnel, stream, bytes] {
    std::vector<char> buf(kFrameBytes);
    peer::v1::RelayFrame f;
    while (true) {
      const ssize_t n = ::read(tunnel->fd, buf.data(), buf.size());
      if (n <= 0) break;
      f.set_data(buf.data(), static_cast<size_t>(n));
      if (!stream->Write(f)) break;
      bytes->fetch_add(n);
    }
    stream->WritesDone();
  });
  peer::v1::RelayFrame in;
  while (stream->Read(&in)) {
    if (!WriteAll(tunnel->fd, in.data())) break;
    bytes->fetch_add(static_cast<int64_t>(in.data().size()));
  }
  ::shutdown(tunnel->fd, SHUT_RDWR);
  tunnel->ctx.TryCancel();
  up.join();
}

void TunnelSet::Start(int fd, std::function<void(Tunnel*)> body) {
  auto tunnel = std::make_shared<Tunnel>();
  tunnel->fd = fd;
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::list<Entry> finished;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      ::close(fd);
      return;
    }
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->done->load()) {
        finished.splice(finished.end(), entries_, it++);
      } else {
        ++it;
      }
    }
    entries_.push_back(Entry{tunnel, done, std::thread([tunnel, done, body] {
                               body(tunnel.get());
                               done->store(true);
                             })});
  }
  // A socket is closed only once its thread is joined, so that StopAll
  // never shuts down a descriptor number the kernel has handed out again.
  for (Entry& e : finished) {
    e.thread.join();
    ::close(e.tunnel->fd);
  }
}

void TunnelSet::StopAll() {
  std::list<Entry> entries;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    entries.swap(entries_);
  }
  for (Entry& e : entries) {
    ::shutdown(e.tunnel->fd, SHUT_RDWR);
    e.tunnel->ctx.TryCancel();
  }
  for (Entry& e : entries) {
    e.thread.join();
    ::close(e.tunnel->fd);
  }
}

}  // namespace starling
