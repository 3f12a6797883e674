#include "gossip/relay_routes.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/reachability.h"

namespace starling {
namespace {

constexpr char kConnect[] = "/starling.peer.v1.Relay/Connect";

}  // namespace

absl::StatusOr<std::unique_ptr<RelayTunnel>> RelayTunnel::Start(
    std::string relay_address, std::string target, std::string run_id,
    const PeerCredentials& credentials, std::atomic<int64_t>* bytes) {
  auto t = std::unique_ptr<RelayTunnel>(new RelayTunnel());
  int port = 0;
  STARLING_ASSIGN_OR_RETURN(t->listen_fd_, ListenOnLoopback(&port));
  t->local_address_ = absl::StrCat("127.0.0.1:", port);
  t->relay_address_ = std::move(relay_address);
  t->target_ = std::move(target);
  t->run_id_ = std::move(run_id);
  t->credentials_ = credentials;
  t->bytes_ = bytes;
  grpc::ChannelArguments args;
  credentials.Apply(&args);
  SetReconnectBackoff(args);
  t->stub_ = peer::v1::Relay::NewStub(
      grpc::CreateCustomChannel(t->relay_address_, credentials.channel, args));
  RelayTunnel* self = t.get();
  t->acceptor_ = std::thread([self] { self->AcceptLoop(); });
  return t;
}

RelayTunnel::~RelayTunnel() {
  stopping_.store(true);
  if (acceptor_.joinable()) acceptor_.join();
  tunnels_.StopAll();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void RelayTunnel::AcceptLoop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    tunnels_.Start(fd, [this](Tunnel* t) { Carry(t); });
  }
}

void RelayTunnel::Carry(Tunnel* tunnel) {
  credentials_.Sign(&tunnel->ctx, kConnect);
  std::unique_ptr<RelayStream> stream = stub_->Connect(&tunnel->ctx);
  peer::v1::RelayFrame first;
  first.set_run_id(run_id_);
  first.set_target(target_);
  if (stream->Write(first)) Pump(tunnel, stream.get(), bytes_);
  ::shutdown(tunnel->fd, SHUT_RDWR);
  tunnel->ctx.TryCancel();
  const grpc::Status s = stream->Finish();
  if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
    STARLING_LOG(INFO) << "relay " << relay_address_ << " to " << target_
                       << ": " << s.error_message();
  }
}

RelayRoutes::RelayRoutes(std::string run_id, PeerCredentials credentials)
    : run_id_(std::move(run_id)), credentials_(std::move(credentials)) {}

DialTarget RelayRoutes::Route(const std::string& address) {
  DialTarget direct{address, ""};
  const Membership* membership = membership_.load();
  if (membership == nullptr) return direct;
  const absl::StatusOr<std::pair<std::string, std::string>> relayed =
      membership->RelayedAt(address);
  if (!relayed.ok()) return direct;
  const auto& [id, relay] = *relayed;
  // With TLS the member's certificate covers its advertised host (or
  // --tls_server_name, which Apply sets and which then wins).
  DialTarget via{"", credentials_.tls ? HostOf(address) : ""};
  const std::string key = absl::StrCat(id, "@", relay);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = tunnels_.find(key); it != tunnels_.end()) {
      via.target = it->second->local_address();
      return via;
    }
    if (stopped_) return direct;
  }
  absl::StatusOr<std::unique_ptr<RelayTunnel>> made =
      RelayTunnel::Start(relay, id, run_id_, credentials_, &bytes_);
  if (!made.ok()) {
    STARLING_LOG(WARNING) << "no tunnel to " << id << " through relay " << relay
                          << ": " << made.status().message();
    return direct;
  }
  std::unique_ptr<RelayTunnel> spare;  // another thread's won: stopped here
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<RelayTunnel>& slot = tunnels_[key];
    if (slot == nullptr && !stopped_) {
      slot = std::move(*made);
    } else {
      spare = std::move(*made);
    }
    if (slot == nullptr) return direct;
    via.target = slot->local_address();
  }
  return via;
}

void RelayRoutes::Shutdown() {
  std::map<std::string, std::unique_ptr<RelayTunnel>> tunnels;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    tunnels.swap(tunnels_);
  }
  tunnels.clear();
}

}  // namespace starling
