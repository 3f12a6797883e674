#include "gossip/relay_server.h"

#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "gossip/join_auth.h"
#include "gossip/membership.h"
#include "gossip/peer_limits.h"

namespace starling {
namespace {

using peer::v1::RelayEvent;
using peer::v1::RelayFrame;

constexpr char kAttach[] = "/starling.peer.v1.Relay/Attach";
constexpr char kConnect[] = "/starling.peer.v1.Relay/Connect";
constexpr char kAccept[] = "/starling.peer.v1.Relay/Accept";

grpc::Status Refuse(grpc::StatusCode code, grpc::ServerContextBase* ctx,
                    std::string why) {
  LogRefusal("relay_refused", PeerHost(ctx->peer()), why);
  return grpc::Status(code, std::move(why));
}

}  // namespace

// A Connect call and the Accept call that answers it. The streams and
// contexts belong to the two handlers, which stay in Pump until `running`
// is 0, so each side may use the other's while it pumps.
struct RelayServer::Pipe {
  std::string target;
  grpc::ServerContext* connect_ctx = nullptr;
  Stream* connect = nullptr;
  grpc::ServerContext* accept_ctx = nullptr;
  Stream* accept = nullptr;
  std::atomic<int64_t> bytes{0};  // forwarded both ways
  bool accepted = false;          // guarded by RelayServer::mu_
  int running = 0;  // directions pumping; guarded by RelayServer::mu_
};

RelayServer::RelayServer(RelayServerOptions options)
    : options_(std::move(options)) {
  reaper_ = std::thread([this] { Reap(); });
}

RelayServer::~RelayServer() {
  Shutdown();
  reaper_.join();
}

void RelayServer::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  // Under the lock: a handler unregisters its context (~CallScope) before it
  // returns, so every context in calls_ is alive while the lock is held.
  // TryCancel only marks the call; it runs none of this class's code.
  for (grpc::ServerContext* ctx : calls_) ctx->TryCancel();
  changed_.SignalAll();
}

void RelayServer::Reap() {
  absl::MutexLock lock(&mu_);
  while (!shutting_down_) {
    changed_.WaitWithTimeout(&mu_, absl::Milliseconds(250));
    const absl::Time now = absl::Now();
    for (auto it = first_due_.begin(); it != first_due_.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      it->first->TryCancel();  // alive: see Shutdown
      it = first_due_.erase(it);
    }
  }
}

grpc::Status RelayServer::CheckRun(grpc::ServerContextBase* ctx,
                                   const std::string& run_id) {
  if (run_id != options_.run_id) {
    return Refuse(
        grpc::StatusCode::FAILED_PRECONDITION, ctx,
        absl::StrCat("relay call for run ", QuoteForLog(run_id),
                     "; this relay serves run ", QuoteForLog(options_.run_id)));
  }
  return grpc::Status::OK;
}

grpc::Status RelayServer::Open(grpc::ServerContext* ctx, Stream* stream,
                               absl::string_view method, RelayFrame* first) {
  if (grpc::Status s = options_.credentials.Admit(ctx, method); !s.ok()) {
    return s;
  }
  {
    absl::MutexLock lock(&mu_);
    first_due_[ctx] = absl::Now() + options_.first_frame_timeout;
  }
  const bool read = stream->Read(first);
  {
    absl::MutexLock lock(&mu_);
    first_due_.erase(ctx);
  }
  if (!read) {
    return Refuse(grpc::StatusCode::CANCELLED, ctx,
                  "relay stream ended or timed out before its first frame");
  }
  return CheckRun(ctx, first->run_id());
}

void RelayServer::ForwardFirst(const RelayFrame& first, Stream* to) {
  if (first.data().empty()) return;
  RelayFrame out;
  out.set_data(first.data());
  forwarded_.fetch_add(static_cast<int64_t>(first.data().size()));
  to->Write(out);
}

RelayServer::CallScope::CallScope(RelayServer* server, grpc::ServerContext* ctx)
    : server_(server), ctx_(ctx) {
  absl::MutexLock lock(&server_->mu_);
  open_ = !server_->shutting_down_;
  if (open_) server_->calls_.insert(ctx_);
}

RelayServer::CallScope::~CallScope() {
  absl::MutexLock lock(&server_->mu_);
  server_->calls_.erase(ctx_);
  server_->first_due_.erase(ctx_);
}

grpc::Status RelayServer::Attach(grpc::ServerContext* ctx,
                                 const peer::v1::AttachRequest* request,
                                 grpc::ServerWriter<RelayEvent>* events) {
  CallScope call(this, ctx);
  if (!call.open()) return {grpc::StatusCode::UNAVAILABLE, "shutting down"};
  if (grpc::Status s = options_.credentials.Admit(ctx, kAttach); !s.ok()) {
    return s;
  }
  if (grpc::Status s = CheckRun(ctx, request->run_id()); !s.ok()) return s;
  const std::string& id = request->node_id();
  if (absl::Status s = CheckNodeId(id); !s.ok()) {
    return Refuse(grpc::StatusCode::INVALID_ARGUMENT, ctx,
                  absl::StrCat("attach: ", s.message()));
  }
  if (grpc::Status s = options_.credentials.CheckCaller(*ctx, id, "attach");
      !s.ok()) {
    return s;
  }
  if (!options_.is_member || !options_.is_member(id)) {
    return Refuse(grpc::StatusCode::FAILED_PRECONDITION, ctx,
                  absl::StrCat("attach: ", QuoteForLog(id),
                               " is not a member of this relay's swarm"));
  }
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    generation = ++generation_;
    attachments_[id] = Attachment{generation, {}};  // a newer life wins
  }
  LogEvent(LogLevel::kInfo, "relay_attached", absl::StrCat("relaying for ", id),
           {{"peer", id}});
  std::vector<uint64_t> conns = {0};  // a first keepalive says "attached"
  while (true) {
    for (uint64_t c : conns) {
      RelayEvent e;
      e.set_conn(c);
      if (!events->Write(e)) conns.clear();
    }
    absl::MutexLock lock(&mu_);
    auto it = attachments_.find(id);
    auto moved = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutting_down_ || it == attachments_.end() ||
             it->second.generation != generation || !it->second.pending.empty();
    };
    if (conns.empty() || ctx->IsCancelled()) break;
    mu_.AwaitWithTimeout(absl::Condition(&moved), options_.keepalive);
    it = attachments_.find(id);
    if (shutting_down_ || it == attachments_.end() ||
        it->second.generation != generation) {
      break;
    }
    conns.swap(it->second.pending);
    it->second.pending.clear();
    if (conns.empty()) conns.push_back(0);
  }
  absl::MutexLock lock(&mu_);
  auto it = attachments_.find(id);
  if (it != attachments_.end() && it->second.generation == generation) {
    attachments_.erase(it);
  }
  return grpc::Status::OK;
}

grpc::Status RelayServer::Connect(grpc::ServerContext* ctx, Stream* stream) {
  CallScope call(this, ctx);
  if (!call.open()) return {grpc::StatusCode::UNAVAILABLE, "shutting down"};
  RelayFrame first;
  if (grpc::Status s = Open(ctx, stream, kConnect, &first); !s.ok()) return s;
  auto pipe = std::make_shared<Pipe>();
  pipe->target = first.target();
  pipe->connect_ctx = ctx;
  pipe->connect = stream;
  bool attached = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = attachments_.find(pipe->target);
    attached = it != attachments_.end();
    if (attached) {
      absl::BitGen gen;
      uint64_t conn = 0;
      while (conn == 0 || pipes_.count(conn) > 0) {
        conn = absl::Uniform<uint64_t>(gen);
      }
      it->second.pending.push_back(conn);
      pipes_[conn] = pipe;
      changed_.SignalAll();
      auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return pipe->accepted || shutting_down_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&answered), options_.accept_timeout);
      if (!pipe->accepted) pipes_.erase(conn);
    }
  }
  if (!attached) {
    return Refuse(grpc::StatusCode::UNAVAILABLE, ctx,
                  absl::StrCat(QuoteForLog(pipe->target),
                               " is not attached to this relay"));
  }
  if (pipe->accept == nullptr) {  // set with accepted, before the wake
    return {grpc::StatusCode::UNAVAILABLE,
            absl::StrCat(pipe->target, " did not accept the connection")};
  }
  ForwardFirst(first, pipe->accept);
  Pump(pipe, /*connect_side=*/true);
  return grpc::Status::OK;
}

grpc::Status RelayServer::Accept(grpc::ServerContext* ctx, Stream* stream) {
  CallScope call(this, ctx);
  if (!call.open()) return {grpc::StatusCode::UNAVAILABLE, "shutting down"};
  RelayFrame first;
  if (grpc::Status s = Open(ctx, stream, kAccept, &first); !s.ok()) return s;
  std::shared_ptr<Pipe> pipe;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = pipes_.find(first.conn()); it != pipes_.end()) {
      pipe = it->second;
    }
  }
  if (pipe == nullptr) {
    return Refuse(grpc::StatusCode::NOT_FOUND, ctx,
                  absl::StrCat("accept: no connection ", first.conn(),
                               " waits at this relay"));
  }
  if (grpc::Status s =
          options_.credentials.CheckCaller(*ctx, pipe->target, "accept");
      !s.ok()) {
    return s;
  }
  {
    absl::MutexLock lock(&mu_);
    // The Connect may have given up meanwhile (its pipe is then gone).
    if (pipes_.erase(first.conn()) == 0) {
      return {grpc::StatusCode::NOT_FOUND, "the connection was given up"};
    }
    pipe->accept_ctx = ctx;
    pipe->accept = stream;
    pipe->accepted = true;
    pipe->running = 2;
  }
  ForwardFirst(first, pipe->connect);
  Pump(pipe, /*connect_side=*/false);
  return grpc::Status::OK;
}

void RelayServer::Pump(const std::shared_ptr<Pipe>& pipe, bool connect_side) {
  Stream* from = connect_side ? pipe->connect : pipe->accept;
  Stream* to = connect_side ? pipe->accept : pipe->connect;
  RelayFrame in;
  while (from->Read(&in)) {
    if (in.data().empty()) continue;
    if (options_.delay > absl::ZeroDuration()) absl::SleepFor(options_.delay);
    RelayFrame out;
    const int64_t n = static_cast<int64_t>(in.data().size());
    *out.mutable_data() = std::move(*in.mutable_data());
    if (!to->Write(out)) break;
    forwarded_.fetch_add(n);
    {
      absl::MutexLock lock(&mu_);
      forwarded_by_[pipe->target] += n;
    }
    if (options_.cut_after_bytes > 0 &&
        pipe->bytes.fetch_add(n) + n >= options_.cut_after_bytes) {
      LogEvent(LogLevel::kWarning, "relay_cut",
               absl::StrCat("cut a connection to ", pipe->target, " after ",
                            pipe->bytes.load(), " bytes (--test_relay_fault)"),
               {{"peer", pipe->target}});
      break;
    }
  }
  // One end stopped: end both calls, so that the other direction's Read
  // returns too. The other handler is still in Pump (running > 0), so its
  // context is alive.
  pipe->connect_ctx->TryCancel();
  pipe->accept_ctx->TryCancel();
  absl::MutexLock lock(&mu_);
  --pipe->running;
  auto both_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pipe->running == 0;
  };
  mu_.Await(absl::Condition(&both_done));
}

std::map<std::string, int64_t> RelayServer::forwarded_by_member() const {
  absl::MutexLock lock(&mu_);
  return forwarded_by_;
}

std::set<std::string> RelayServer::attached() const {
  absl::MutexLock lock(&mu_);
  std::set<std::string> ids;
  for (const auto& [id, a] : attachments_) ids.insert(id);
  return ids;
}

}  // namespace starling
