#include "gossip/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/chunk_reader.h"
#include "gossip/chunk_writer.h"
#include "gossip/grpc_status.h"
#include "gossip/join_auth.h"
#include "starling/peer/v1/peer.grpc.pb.h"

namespace starling {
namespace {

using peer::v1::HandshakeRequest;
using peer::v1::HandshakeResponse;

// HTTP/2 settings for tensor streams (see GrpcTransport::Start).
constexpr int kMaxFrameBytes = (16 << 20) - 1;  // HTTP/2's largest frame
constexpr int kStreamWindowBytes = 16 << 20;

}  // namespace

void ApplyDialTarget(const DialTarget& to, const PeerCredentials& credentials,
                     grpc::ChannelArguments* args) {
  credentials.Apply(args);
  if (credentials.server_name.empty() && !to.ssl_name.empty()) {
    args->SetSslTargetNameOverride(to.ssl_name);
  }
}

void SetReconnectBackoff(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(
      GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
      static_cast<int>(absl::ToInt64Milliseconds(kMaxReconnectBackoff)));
}

// Server side, on gRPC's callback threads: handshakes, and chunk streams,
// each read by its own reactor (ReadChunks). SendChunks is raw
// (ByteBuffer) so that a chunk's bytes are copied once, straight into the
// message.
class GrpcTransport::Service final
    : public peer::v1::Peer::WithRawCallbackMethod_SendChunks<
          peer::v1::Peer::CallbackService> {
 public:
  Service(const PeerIdentity& identity, const PeerCredentials& credentials,
          StreamDeadlines* deadlines, absl::Duration chunk_stream_deadline)
      : identity_(identity),
        credentials_(credentials),
        deadlines_(deadlines),
        chunk_stream_deadline_(chunk_stream_deadline),
        router_(credentials) {}

  // Installs `mailbox` for incoming streams and answers handshakes as
  // `rank` at `address`. `ids`: the members' node ids by rank, or empty
  // (see InstallRound).
  void SetMailbox(std::shared_ptr<Mailbox> mailbox, int rank,
                  std::string address, bool exact_round,
                  std::vector<std::string> ids) ABSL_LOCKS_EXCLUDED(mu_) {
    router_.Install(std::move(mailbox), exact_round, std::move(ids));
    absl::MutexLock lock(&mu_);
    joined_ = true;
    rank_ = rank;
    address_ = std::move(address);
  }
  // Where this node listens, for the handshake's refusals (before
  // SetMailbox too).
  void SetAddress(std::string address) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    address_ = std::move(address);
  }
  int64_t received() const { return router_.received(); }
  AttemptRouter& router() { return router_; }

  // Why this node refused the peer that listens on `address`, if it did.
  std::string Refusal(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = refused_.find(address);
    return it == refused_.end() ? "" : it->second;
  }

  grpc::ServerUnaryReactor* Handshake(grpc::CallbackServerContext* ctx,
                                      const HandshakeRequest* req,
                                      HandshakeResponse* resp) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (grpc::Status a = credentials_.Admit(ctx, "Handshake"); !a.ok()) {
      reactor->Finish(a);
      return reactor;
    }
    std::string own_address;
    {
      absl::MutexLock lock(&mu_);
      own_address = address_;
    }
    std::string why = HandshakeMismatch(*req, identity_, own_address);
    if (!why.empty()) {
      LogRefusal("peer_refused", PeerHost(ctx->peer()),
                 absl::StrCat("refused peer ", QuoteForLog(req->address()),
                              ": ", why));
      {
        absl::MutexLock lock(&mu_);
        refused_[req->address()] = why;
      }
      reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, why));
      return reactor;
    }
    bool joined;
    std::string address;
    int rank;
    {
      absl::MutexLock lock(&mu_);
      joined = joined_;
      address = address_;
      rank = rank_;
    }
    if (!joined) {
      // Started but not yet told its members and rank: the caller retries.
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "this node has not joined its peers yet"));
      return reactor;
    }
    resp->set_protocol_version(kProtocolVersion);
    resp->set_address(address);
    resp->set_rank(rank);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerReadReactor<grpc::ByteBuffer>* SendChunks(
      grpc::CallbackServerContext* ctx, grpc::ByteBuffer* ack) override {
    IncomingStream stream;
    stream.router = &router_;
    stream.attempt = router_.Current();
    stream.admitted = credentials_.Admit(ctx, "SendChunks");
    if (stream.admitted.ok()) {
      absl::StatusOr<std::unique_ptr<StreamDeadlines::Watched>> w =
          deadlines_->Watch(ctx, "SendChunks", chunk_stream_deadline_);
      if (w.ok()) {
        stream.watch = *std::move(w);
      } else {
        stream.admitted = ToGrpc(w.status());
      }
    }
    if (credentials_.bind_node_ids) {
      stream.names = PeerCredentials::CallerNames(*ctx);
    }
    stream.peer_host = PeerHost(ctx->peer());
    return ReadChunks(std::move(stream), ack);
  }

 private:
  const PeerIdentity identity_;
  const PeerCredentials credentials_;
  StreamDeadlines* const deadlines_;
  const absl::Duration chunk_stream_deadline_;
  AttemptRouter router_;
  absl::Mutex mu_;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  int rank_ ABSL_GUARDED_BY(mu_) = 0;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> refused_ ABSL_GUARDED_BY(mu_);
};

class GrpcTransport::Peer {
 public:
  Peer(const std::string& address, const DialTarget& to,
       const PeerCredentials& credentials)
      : address(address) {
    grpc::ChannelArguments args;
    ApplyDialTarget(to, credentials, &args);
    args.SetMaxSendMessageSize(64 << 20);
    args.SetMaxReceiveMessageSize(64 << 20);
    SetReconnectBackoff(args);
    args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    channel = grpc::CreateCustomChannel(to.target, credentials.channel, args);
    stub = peer::v1::Peer::NewStub(channel);
    send_chunks = std::make_unique<grpc::internal::RpcMethod>(
        kSendChunksMethod, grpc::internal::RpcMethod::CLIENT_STREAMING,
        channel);
  }
  static constexpr char kSendChunksMethod[] =
      "/starling.peer.v1.Peer/SendChunks";
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<peer::v1::Peer::Stub> stub;
  // SendChunks with serialized chunks (see SendOnce).
  std::unique_ptr<grpc::internal::RpcMethod> send_chunks;
};

GrpcTransport::GrpcTransport(const GrpcTransportOptions& options,
                             const PeerIdentity& identity)
    : options_(options), identity_(identity) {}

GrpcTransport::~GrpcTransport() { Shutdown(); }

absl::StatusOr<std::unique_ptr<GrpcTransport>> GrpcTransport::Start(
    const GrpcTransportOptions& options, const PeerIdentity& identity) {
  auto t = std::unique_ptr<GrpcTransport>(new GrpcTransport(options, identity));
  t->deadlines_ = options.stream_deadlines;
  if (t->deadlines_ == nullptr) {
    t->deadlines_ = std::make_shared<StreamDeadlines>(
        options.stream_idle_timeout, options.peer_max_streams);
  }
  t->service_ = std::make_unique<Service>(identity, options.credentials,
                                          t->deadlines_.get(),
                                          options.chunk_stream_deadline);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, so a second server on a port in use
  // (a stale address, or a port another process took first) would start
  // silently and take half of its connections. Fail to start instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(options.listen, options.credentials.server, &port);
  builder.RegisterService(t->service_.get());
  for (grpc::Service* extra : options.extra_services) {
    builder.RegisterService(extra);
  }
  // Tensor streams: HTTP/2 frames of up to 16 MiB and a fixed 16 MiB
  // receive window per stream, so that a 1 MiB chunk goes out in one frame
  // without waiting for window updates (BDP probing grows the window too
  // slowly for one round's burst). bench allreduce, 64 MiB on loopback:
  // about 1.7x -> 1.2-1.5x Gloo's time. 16 MiB bounds what one stream can
  // make this node buffer.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             kStreamWindowBytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // Bounds on what one peer can hold open: streams per connection, and the
  // life of any call (a connection is closed 15 minutes after it opened,
  // its calls get 5 more to finish; clients reconnect for new calls).
  // Streams have tighter deadlines of their own (StreamDeadlines).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 128);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, 15 * 60 * 1000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                             5 * 60 * 1000);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::max<int64_t>(options.chunk_bytes * 2, 16 << 20)));
  t->server_ = builder.BuildAndStart();
  if (t->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen,
                     " (address in use or not local?)"));
  }
  std::string host = options.listen.substr(0, options.listen.rfind(':'));
  t->address_ = absl::StrCat(host, ":", port);
  t->service_->SetAddress(t->address_);
  return t;
}

absl::Status GrpcTransport::Connect(const std::vector<std::string>& members,
                                    int rank, const MailboxOptions& mailbox,
                                    absl::Time deadline) {
  MailboxOptions o = mailbox;
  o.rank = rank;
  o.world = static_cast<int>(members.size());
  mailbox_ = std::make_shared<Mailbox>(o);
  service_->SetMailbox(mailbox_, rank, address_, /*exact_round=*/false, {});
  SetPeers(members, rank);
  const HandshakeRequest req = MakeHandshakeRequest(identity_, members[rank]);
  for (int r = 0; r < static_cast<int>(members.size()); ++r) {
    if (r == rank) continue;
    STARLING_RETURN_IF_ERROR(HandshakeWith(r, req, deadline));
  }
  return absl::OkStatus();
}

absl::Status GrpcTransport::HandshakeWith(int r, const HandshakeRequest& req,
                                          absl::Time deadline) {
  const std::string& address = members_[r];
  absl::Duration backoff = absl::Milliseconds(100);
  grpc::Status last;
  int attempts = 0;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(5))));
    options_.credentials.Sign(&ctx, "Handshake");
    HandshakeResponse resp;
    last = peers_[r]->stub->Handshake(&ctx, req, &resp);
    rpc_errors_.Record(last.error_code());
    ++attempts;
    if (last.ok()) {
      if (resp.rank() != r) {
        return absl::FailedPreconditionError(absl::StrCat(
            "peer ", address, " thinks it is rank ", resp.rank(),
            ", this node expects ", r, " (give every node the same members)"));
      }
      return absl::OkStatus();
    }
    if (last.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      return absl::FailedPreconditionError(absl::StrCat(
          "peer ", address, " refused this node: ", last.error_message()));
    }
    if (last.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return absl::UnauthenticatedError(
          absl::StrCat("peer ", address, " refused this node's credentials: ",
                       last.error_message(), " (check --join_token_file)"));
    }
    // The peer may have tried us first, been refused and left.
    if (std::string why = service_->Refusal(address); !why.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("this node refused peer ", address, ": ", why));
    }
    if (absl::Now() + backoff >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach peer ", address, " after ", attempts,
                       " attempts (last error: ", last.error_message(), ")"));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

void GrpcTransport::SetPeers(const std::vector<std::string>& members,
                             int rank) {
  members_ = members;
  rank_ = rank;
  peers_.clear();
  for (int r = 0; r < static_cast<int>(members.size()); ++r) {
    if (r == rank) {
      peers_.push_back(nullptr);
      continue;
    }
    // By where it is dialed: a member that moved to another relay gets a
    // channel to the new one.
    const DialTarget to = options_.route ? options_.route(members[r])
                                         : DialTarget{members[r], ""};
    std::unique_ptr<Peer>& p = stubs_[absl::StrCat(members[r], " ", to.target)];
    if (!p) p = std::make_unique<Peer>(members[r], to, options_.credentials);
    peers_.push_back(p.get());
  }
}

void GrpcTransport::InstallRound(const std::vector<std::string>& members,
                                 int rank, const MailboxOptions& mailbox,
                                 const std::vector<std::string>& ids) {
  MailboxOptions o = mailbox;
  o.rank = rank;
  o.world = static_cast<int>(members.size());
  elastic_ = true;
  mailbox_ = std::make_shared<Mailbox>(o);
  service_->SetMailbox(mailbox_, rank, address_, /*exact_round=*/true, ids);
  SetPeers(members, rank);
}

void GrpcTransport::ExpectAttempt(const std::vector<std::string>& members,
                                  int rank, const MailboxOptions& mailbox,
                                  std::vector<std::string> ids) {
  PlannedAttempt planned{mailbox, std::move(ids)};
  planned.options.rank = rank;
  planned.options.world = static_cast<int>(members.size());
  service_->router().Expect(std::move(planned));
}

absl::Status GrpcTransport::Send(int to, const Message& m,
                                 absl::Time deadline) {
  return SendPayload(to, m, m.payload, nullptr, deadline);
}

absl::Status GrpcTransport::SendPayload(
    int to, const Message& m, absl::string_view payload,
    const std::shared_ptr<const void>& owner, absl::Time deadline) {
  if (to < 0 || to >= world() || to == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("no peer rank ", to));
  }
  absl::Duration backoff = absl::Milliseconds(5);
  while (true) {
    absl::Status s = SendOnce(to, m, payload, owner, deadline);
    // Elastic rounds: the peer has not reached this attempt yet (or is
    // restarting); retry until the deadline or until the attempt is off.
    if (s.ok() || !elastic_ || !absl::IsUnavailable(s) ||
        mailbox_->cancelled() || absl::Now() + backoff >= deadline) {
      return s;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

absl::Status GrpcTransport::SendOnce(int to, const Message& m,
                                     absl::string_view payload,
                                     const std::shared_ptr<const void>& owner,
                                     absl::Time deadline) {
  const Peer& peer = *peers_[to];
  if (options_.blocked && options_.blocked(peer.address)) {
    return absl::UnavailableError(
        absl::StrCat("peer ", peer.address, " is across a network partition"));
  }
  ChunkStream stream;
  stream.channel = peer.channel.get();
  stream.method = peer.send_chunks.get();
  stream.credentials = &options_.credentials;
  stream.chunk_bytes = std::max<int64_t>(1, options_.chunk_bytes);
  stream.deadline = deadline;
  stream.link = options_.links ? options_.links->For(peer.address) : nullptr;
  stream.attempt = mailbox_;
  stream.crash_after_first = m.phase == RingPhase::kReduceScatter;
  stream.bytes_sent = &sent_;
  const int64_t payload_bytes = static_cast<int64_t>(payload.size());
  if (stream.link != nullptr) {
    STARLING_ASSIGN_OR_RETURN(
        stream.chunk_bytes,
        ChunkBytesFor(*stream.link, peer.address, payload_bytes));
  }
  const uint64_t plan = mailbox_ != nullptr ? mailbox_->options().plan : 0;
  const ChunkStreamStatus s = WriteChunks(
      stream, ChunkHeaderFor(m, identity_.run_id, plan, payload_bytes), payload,
      owner);
  absl::Status failed = s.link;
  if (failed.ok() && !s.call.ok()) {
    rpc_errors_.Record(s.call.error_code());
    failed = FromGrpc(s.call);
  }
  if (failed.ok()) return failed;
  return absl::Status(failed.code(), absl::StrCat("peer ", peer.address, ": ",
                                                  failed.message()));
}

absl::StatusOr<int64_t> GrpcTransport::ChunkBytesFor(const LinkShaper& link,
                                                     const std::string& address,
                                                     int64_t payload_bytes) {
  StreamLimits limits;
  limits.idle = deadlines_->idle();
  limits.stream = options_.chunk_stream_deadline;
  limits.stream_flag =
      absl::StrCat(options_.chunk_stream_deadline_flag, " plus a minute");
  limits.sender = options_.rpc_timeout;
  limits.sender_flag = "--round_timeout";
  absl::StatusOr<int64_t> chunk = options_.links->ChunkBytes(
      link, address, payload_bytes, options_.chunk_bytes, limits);
  if (!chunk.ok()) return chunk;
  // A slow but workable link: say once per link why rounds take long.
  const absl::Duration need = link.MessageTime(payload_bytes);
  bool first;
  {
    absl::MutexLock lock(&slow_mu_);
    first =
        need > absl::Seconds(5) && slow_links_logged_.insert(address).second;
  }
  if (first) {
    STARLING_LOG(INFO) << "link emulator: a " << FormatKib(payload_bytes)
                       << " tensor message to " << address << " takes "
                       << absl::Trunc(need, absl::Milliseconds(100)) << " at "
                       << FormatLinkRate(link);
  }
  return chunk;
}

void RpcErrorCounter::Record(int code) {
  if (code == 0) return;
  std::string name =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  absl::MutexLock lock(&mu_);
  ++counts_[name];
}

std::map<std::string, int64_t> RpcErrorCounter::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return counts_;
}

int64_t GrpcTransport::bytes_received() const { return service_->received(); }

int64_t GrpcTransport::early_refused() const {
  return service_->router().early_refused();
}

int64_t GrpcTransport::early_bytes() const {
  return service_->router().early_bytes();
}

void GrpcTransport::Shutdown() {
  if (server_) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    server_.reset();
  }
}

}  // namespace starling
