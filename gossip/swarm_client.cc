#include "gossip/swarm_client.h"

#include <grpcpp/grpcpp.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace starling {

using peer::v1::ControlAck;
using peer::v1::ControlMessage;
using peer::v1::MemberEntry;

namespace {

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

}  // namespace

SwarmClient::SwarmClient(std::string node_id, PeerCredentials credentials,
                         std::string partition_file,
                         const Membership* membership, RpcErrorCounter* errors,
                         Local local,
                         std::function<DialTarget(const std::string&)> route)
    : node_id_(std::move(node_id)),
      credentials_(std::move(credentials)),
      membership_(membership),
      errors_(errors),
      local_(std::move(local)),
      route_(std::move(route)),
      partition_(std::move(partition_file)) {}

std::shared_ptr<peer::v1::Swarm::Stub> SwarmClient::StubFor(
    const std::string& address) {
  const DialTarget to = route_ ? route_(address) : DialTarget{address, ""};
  {
    absl::MutexLock lock(&mu_);
    if (auto it = stubs_.find(to.target); it != stubs_.end()) {
      return it->second;
    }
  }
  // Made (and, when another thread was first, dropped) with the lock
  // released.
  grpc::ChannelArguments args;
  ApplyDialTarget(to, credentials_, &args);
  args.SetMaxReceiveMessageSize(64 << 20);
  SetReconnectBackoff(args);
  const std::shared_ptr<peer::v1::Swarm::Stub> made = peer::v1::Swarm::NewStub(
      grpc::CreateCustomChannel(to.target, credentials_.channel, args));
  absl::MutexLock lock(&mu_);
  return stubs_.try_emplace(to.target, made).first->second;
}

bool SwarmClient::Blocked(const std::string& address) const {
  // Every send asks: without a partition, skip copying the table.
  if (!partition_.active()) return false;
  std::string peer_id;
  for (const MemberEntry& e : membership_->Snapshot()) {
    if (e.address() == address) peer_id = e.id();
  }
  return partition_.Separates(node_id_, peer_id);
}

absl::StatusOr<ControlAck> SwarmClient::SendControl(const std::string& to_id,
                                                    const ControlMessage& m) {
  if (to_id == node_id_) return local_(m);
  absl::StatusOr<MemberEntry> e = membership_->Get(to_id);
  if (!e.ok()) return e.status();
  if (Blocked(e->address())) {
    return absl::UnavailableError(
        absl::StrCat(to_id, " is across a network partition"));
  }
  ControlAck ack;
  grpc::Status s, first;
  // A channel whose last connection attempt failed (the peer was not up
  // yet, or restarted) fails at once until its reconnect backoff ends, up
  // to kMaxReconnectBackoff later, even when the peer is up by then. So the
  // retry waits for the channel to connect, a little longer than that: a
  // member that just came up (and sent its READY) is not left out of the
  // round, and one that is gone costs a second and a half.
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext ctx;
    if (attempt == 0) {
      ctx.set_deadline(Deadline(absl::Seconds(3)));
    } else {
      ctx.set_wait_for_ready(true);
      ctx.set_deadline(Deadline(kMaxReconnectBackoff * 1.5));
    }
    credentials_.Sign(&ctx, "Control");
    CountControlBytes(static_cast<int64_t>(m.ByteSizeLong()));
    s = StubFor(e->address())->Control(&ctx, m, &ack);
    errors_->Record(s.error_code());
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    if (attempt == 0) first = s;
  }
  if (!s.ok()) {
    // A retry that never connected ends at its deadline: the first
    // attempt's error says why (connection refused, say).
    const grpc::Status& why =
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && !first.ok()
            ? first
            : s;
    return absl::UnavailableError(
        absl::StrCat(to_id, " at ", e->address(), ": ", why.error_message()));
  }
  return ack;
}

std::vector<absl::StatusOr<ControlAck>> SwarmClient::SendControls(
    absl::Span<const Outgoing> msgs) {
  std::vector<absl::StatusOr<ControlAck>> acks(msgs.size(),
                                               absl::UnknownError("not sent"));
  std::map<std::string, std::vector<size_t>> by_member;
  for (size_t i = 0; i < msgs.size(); ++i) {
    by_member[msgs[i].first].push_back(i);
  }
  auto send = [&](const std::vector<size_t>& indices) {
    for (size_t i : indices) {
      acks[i] = SendControl(msgs[i].first, msgs[i].second);
    }
  };
  std::vector<std::thread> threads;
  for (const auto& [id, indices] : by_member) {
    if (threads.size() + 1 == by_member.size()) {
      send(indices);  // the last on this thread
    } else {
      threads.emplace_back(send, std::cref(indices));
    }
  }
  for (std::thread& t : threads) t.join();
  return acks;
}

}  // namespace starling
