#include "gossip/swarm.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/coordinator_thread.h"
#include "gossip/join_auth.h"
#include "gossip/membership_gossip.h"
#include "gossip/push_channel.h"
#include "gossip/reachability.h"
#include "gossip/relay_attachment.h"
#include "gossip/relay_routes.h"
#include "gossip/relay_server.h"
#include "gossip/round_member.h"
#include "gossip/state_fetch.h"
#include "gossip/state_server.h"
#include "gossip/swarm_client.h"
#include "starling/peer/v1/swarm.grpc.pb.h"

namespace starling {
namespace {

using peer::v1::ControlAck;
using peer::v1::ControlMessage;
using peer::v1::GossipRequest;
using peer::v1::GossipResponse;
using peer::v1::JoinRequest;
using peer::v1::JoinResponse;
using peer::v1::MemberEntry;
using peer::v1::PushAck;
using peer::v1::PushChunk;
using peer::v1::StateChunk;
using peer::v1::StateRequest;

// How long JoinSwarm waits for a relay to take an unreachable node.
constexpr absl::Duration kRelayWait = absl::Seconds(10);

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())),
                      std::string(s.message()));
}

// A stream refused before its first message: it finishes at once and frees
// itself when gRPC is done with it.
template <typename Reactor>
class RefusedStream final : public Reactor {
 public:
  explicit RefusedStream(grpc::Status why) { this->Finish(std::move(why)); }
  void OnDone() override { delete this; }
};

}  // namespace

// Server side of the Swarm service: admits each call (credentials, and the
// caller's right to speak as the member it names), then hands it to the part
// it is for. Handlers only touch in-memory state under short locks; nothing
// blocks.
class Swarm::Service final : public peer::v1::Swarm::CallbackService {
 public:
  explicit Service(Swarm* swarm) : swarm_(swarm) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx,
                                 const JoinRequest* req,
                                 JoinResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    grpc::Status a = Admit(ctx, "Join", req->self().id(), "a join");
    reactor->Finish(a.ok() ? ToGrpcStatus(swarm_->gossip_->OnJoin(*req, resp))
                           : a);
    return reactor;
  }
  grpc::ServerUnaryReactor* Gossip(grpc::CallbackServerContext* ctx,
                                   const GossipRequest* req,
                                   GossipResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    grpc::Status a = Admit(ctx, "Gossip", req->from(), "gossip");
    reactor->Finish(a.ok() ? ToGrpcStatus(swarm_->gossip_->OnGossip(*req, resp))
                           : a);
    return reactor;
  }
  grpc::ServerUnaryReactor* Control(grpc::CallbackServerContext* ctx,
                                    const ControlMessage* req,
                                    ControlAck* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (grpc::Status a = Admit(ctx, "Control", req->from(), "a round message");
        !a.ok()) {
      reactor->Finish(a);
      return reactor;
    }
    const std::string& run_id = swarm_->options_.identity.run_id;
    if (req->run_id() != run_id) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat("control message for run '", req->run_id(),
                                    "'; this node is in run '", run_id, "'")));
      return reactor;
    }
    const std::string host = PeerHost(ctx->peer());
    // This node hands its own round messages over in-process: one that
    // comes over the network under its id is someone else's.
    *resp = req->from() == swarm_->id()
                ? swarm_->RefuseControl(
                      host, *req,
                      absl::StrCat(swarm_->id(), " refused a round message ",
                                   "under its own id from another caller"))
                : swarm_->OnControl(*req, host);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerWriteReactor<StateChunk>* FetchState(
      grpc::CallbackServerContext* ctx, const StateRequest* req) override {
    if (grpc::Status r = Ready(); !r.ok()) {
      return new RefusedStream<grpc::ServerWriteReactor<StateChunk>>(r);
    }
    return swarm_->state_->Open(ctx, req);
  }
  grpc::ServerReadReactor<PushChunk>* Push(grpc::CallbackServerContext* ctx,
                                           PushAck* ack) override {
    if (grpc::Status r = Ready(); !r.ok()) {
      return new RefusedStream<grpc::ServerReadReactor<PushChunk>>(r);
    }
    return swarm_->pushes_->Receive(ctx, ack);
  }

 private:
  // The server answers as soon as the transport listens, a moment before
  // the swarm's parts exist (they need the port it bound); a call in that
  // moment is told to try again rather than reaching a part not yet made.
  grpc::Status Ready() const {
    if (swarm_->ready_.load()) return grpc::Status::OK;
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat(swarm_->options_.node_id, " is starting; try again"));
  }

  // The call's credentials, and whether its caller may speak as member
  // `id` (--tls_bind_node_ids).
  grpc::Status Admit(grpc::CallbackServerContext* ctx, absl::string_view method,
                     const std::string& id, absl::string_view what) {
    if (grpc::Status r = Ready(); !r.ok()) return r;
    const PeerCredentials& credentials = swarm_->options_.credentials;
    if (grpc::Status a = credentials.Admit(ctx, method); !a.ok()) return a;
    return credentials.CheckCaller(*ctx, id, what);
  }
  Swarm* swarm_;
};

Swarm::Swarm(const SwarmOptions& options) : options_(options) {}

Swarm::~Swarm() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Swarm>> Swarm::Start(
    const SwarmOptions& options) {
  if (absl::Status s = CheckNodeId(options.node_id); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_id: ", s.message(),
                     "; an id is 1 to 128 bytes of printable ASCII without "
                     "spaces, ',', '|' or '@'"));
  }
  auto s = std::unique_ptr<Swarm>(new Swarm(options));
  s->service_ = std::make_unique<Service>(s.get());
  GrpcTransportOptions to;
  to.listen = options.listen;
  to.chunk_bytes = options.chunk_bytes;
  to.rpc_timeout = options.rpc_timeout;
  RelayServerOptions ro;
  ro.run_id = options.identity.run_id;
  ro.credentials = options.credentials;
  ro.cut_after_bytes = options.relay_cut_after_bytes;
  ro.delay = options.relay_delay;
  Swarm* me = s.get();
  ro.is_member = [me](const std::string& id) {
    return me->ready_.load() && me->membership_->Get(id).ok();
  };
  s->relay_server_ = std::make_unique<RelayServer>(std::move(ro));
  s->routes_ = std::make_shared<RelayRoutes>(options.identity.run_id,
                                             options.credentials);
  to.route = [routes = s->routes_](const std::string& address) {
    return routes->Route(address);
  };
  to.extra_services = {s->service_.get(), s->relay_server_.get()};
  to.links = options.links;
  to.credentials = options.credentials;
  s->deadlines_ = std::make_shared<StreamDeadlines>(options.stream_idle_timeout,
                                                    options.peer_max_streams);
  to.stream_deadlines = s->deadlines_;
  to.chunk_stream_deadline = options.round_deadline + absl::Minutes(1);
  to.chunk_stream_deadline_flag = "--round_deadline";
  Swarm* self = s.get();
  to.blocked = [self](const std::string& address) {
    return self->ready_.load() && self->client_->Blocked(address);
  };
  PeerIdentity id = options.identity;
  id.world = 0;
  STARLING_ASSIGN_OR_RETURN(s->transport_, GrpcTransport::Start(to, id));
  MembershipOptions mo;
  mo.self_id = options.node_id;
  s->address_ =
      options.advertise.empty() ? s->transport_->address() : options.advertise;
  mo.self_address = s->address_;
  mo.suspect_after = options.suspect_after;
  mo.max_members = options.max_members;
  STARLING_ASSIGN_OR_RETURN(s->membership_,
                            Membership::Create(mo, absl::Now()));
  s->membership_->SetProgress(0, "", 0, /*joining=*/true);
  s->routes_->SetMembership(s->membership_.get());
  s->MakeParts();
  s->ready_.store(true);
  s->client_->ReadPartitionFile();
  s->gossip_->Start();
  s->coordinator_->Start();
  s->state_->Start();
  s->attachment_->Start();
  return s;
}

void Swarm::MakeParts() {
  const SwarmOptions& o = options_;
  const std::string& run_id = o.identity.run_id;
  client_ = std::make_unique<SwarmClient>(
      o.node_id, o.credentials, o.partition_file, membership_.get(),
      &transport_->rpc_errors(),
      [this](const ControlMessage& m) { return OnControl(m, ""); },
      [routes = routes_](const std::string& address) {
        return routes->Route(address);
      });
  MembershipGossip::Hooks hooks;
  hooks.report = [this](const std::vector<MembershipChange>& changes) {
    ReportChanges(changes);
  };
  hooks.table_changed = [this] { coordinator_->Wake(); };
  hooks.after_tick = [this] {
    member_->CallOffIfGone(options_.interrupted && options_.interrupted());
  };
  gossip_ = std::make_unique<MembershipGossip>(
      MembershipGossip::Options{o.node_id, address(), o.identity, o.seeds,
                                o.found_after, o.gossip_interval,
                                o.suspect_after},
      membership_.get(), client_.get(), std::move(hooks), &stopping_);
  coordinator_ = std::make_unique<CoordinatorThread>(
      RoundCoordinatorOptions{o.node_id, run_id, o.round_deadline,
                              o.rpc_timeout},
      membership_.get(), client_.get(), &stopping_);
  member_ = std::make_unique<RoundMember>(
      RoundMember::Options{o.node_id, run_id, address(), o.mailbox,
                           [this] { return LinkError(); }},
      membership_.get(), client_.get(), transport_.get(), &stopping_);
  state_ = std::make_unique<StateServer>(run_id, o.chunk_bytes, o.credentials,
                                         deadlines_, &stopping_);
  fetcher_ = std::make_unique<StateFetcher>(o.node_id, run_id,
                                            o.identity.model.parameters(),
                                            membership_.get(), client_.get());
  pushes_ = std::make_unique<PushChannel>(
      PushChannel::Options{o.node_id, run_id, o.identity.algo, o.push_elements,
                           o.push_codec, o.push_inbox, o.push_timeout,
                           o.chunk_bytes, o.links},
      membership_.get(), client_.get(), deadlines_);
  attachment_ = std::make_unique<RelayAttachment>(
      RelayAttachmentOptions{o.node_id, run_id, o.relay,
                             LocalDialAddress(transport_->address()),
                             o.credentials},
      membership_.get(), &stopping_);
}

void Swarm::Shutdown() {
  if (stopping_.exchange(true)) return;
  if (coordinator_) coordinator_->Wake();
  if (state_) state_->Wake();
  if (gossip_) gossip_->Join();
  if (coordinator_) coordinator_->Join();
  if (state_) state_->Join();
  // The relay's streams are long-lived: end them before the server waits
  // for its calls.
  if (attachment_) attachment_->Join();
  if (routes_) routes_->Shutdown();
  if (relay_server_) relay_server_->Shutdown();
  if (transport_) transport_->Shutdown();
}

ControlAck Swarm::RefuseControl(const std::string& host,
                                const ControlMessage& m, std::string why) {
  control_refused_.fetch_add(1);
  LogRefusal("control_refused", host,
             absl::StrCat("refused ", ControlMessage::Kind_Name(m.kind()),
                          " round ", m.round(), ": ", why));
  return RefuseRound(std::move(why));
}

ControlAck Swarm::OnControl(const ControlMessage& m, const std::string& host) {
  if (std::string bad = OutOfRange(m); !bad.empty()) {
    return RefuseControl(
        host, m,
        absl::StrCat(options_.node_id, " refused a round message from ",
                     QuoteForLog(m.from()), ": ", bad));
  }
  auto stranger = [&](const std::string& id) {
    return RefuseControl(
        host, m,
        absl::StrCat(options_.node_id, " knows no member ", QuoteForLog(id)));
  };
  auto unknown = [this](const std::string& id) {
    return !membership_->Get(id).ok();
  };
  // The coordinator's messages must carry this node's round token back.
  auto token = [&] {
    return m.token() == member_->token()
               ? std::string()
               : absl::StrCat("a ", ControlMessage::Kind_Name(m.kind()),
                              " from ", QuoteForLog(m.from()),
                              " without this node's round token");
  };
  std::string refused;
  switch (m.kind()) {
    case ControlMessage::READY:
    case ControlMessage::DONE:
    case ControlMessage::FAILED:
      // Only members speak in a round. A READY from an id this node does
      // not know (yet) is resent every two seconds, so refusing it delays
      // a member still unknown here by at most that. The culprit a FAILED
      // names must be a member too: otherwise any caller could bar a
      // member from a round at no cost to itself.
      if (unknown(m.from())) return stranger(m.from());
      if (!m.culprit().empty() && unknown(m.culprit())) {
        return stranger(m.culprit());
      }
      if (m.kind() == ControlMessage::READY) {
        refused = coordinator_->OnReady(m);
      } else if (m.kind() == ControlMessage::DONE) {
        refused = coordinator_->OnDone(m);
      } else {
        refused = coordinator_->OnFailed(m);
      }
      return refused.empty() ? AcceptRound()
                             : RefuseControl(host, m, std::move(refused));
    case ControlMessage::PLAN:
      if (refused = token(); !refused.empty()) {
        return RefuseControl(host, m, std::move(refused));
      }
      return member_->OnPlan(m);
    case ControlMessage::COMMIT:
    case ControlMessage::ABORT:
    case ControlMessage::STALE:
      // Coordinators send these; a member heeds them only from the one it
      // follows (SyncRound), but holds them from any member until then.
      if (unknown(m.from())) return stranger(m.from());
      if (refused = token(); !refused.empty()) {
        return RefuseControl(host, m, std::move(refused));
      }
      return member_->OnDecision(m);
    case ControlMessage::CONFIRM:
      if (unknown(m.from())) return stranger(m.from());
      return member_->Prove(m);
    default:
      return RefuseControl(
          host, m,
          absl::StrCat(
              options_.node_id, " refused a round message of unknown kind ",
              static_cast<int>(m.kind()), " from ", QuoteForLog(m.from())));
  }
}

void Swarm::ReportChanges(const std::vector<MembershipChange>& changes) {
  for (const MembershipChange& c : changes) {
    // A copy per sender ever heard from would grow with churn.
    if (c.to == peer::v1::MEMBER_DEAD || c.to == peer::v1::MEMBER_LEFT) {
      pushes_->Forget(c.id);
    }
  }
  if (!options_.on_member_change) return;
  for (const MembershipChange& c : changes) options_.on_member_change(c);
}

absl::Status Swarm::JoinSwarm(absl::Time deadline) {
  STARLING_RETURN_IF_ERROR(gossip_->JoinSwarm(deadline));
  // Nobody can dial this node until it has a relay: ready without one, it
  // would cost the first round's attempts.
  absl::StatusOr<MemberEntry> self = membership_->Get(options_.node_id);
  if (options_.relay == "off" || !self.ok() ||
      self->reachability() != peer::v1::REACHABILITY_UNREACHABLE) {
    return absl::OkStatus();
  }
  const absl::Time until = std::min(deadline, absl::Now() + kRelayWait);
  while (attachment_->relay().empty() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (attachment_->relay().empty()) {
    LogEvent(
        LogLevel::kWarning, "relay_none",
        absl::StrCat("no relay took this node within ",
                     absl::FormatDuration(kRelayWait),
                     "; going on unreachable (--relay=", options_.relay, ")"));
  }
  return absl::OkStatus();
}

absl::Status Swarm::WaitForMembers(int n, absl::Time deadline) {
  return gossip_->WaitForMembers(n, deadline);
}

void Swarm::Leave() { gossip_->Leave(); }

void Swarm::SetProgress(const Lineage& at, bool joining) {
  membership_->SetProgress(at.round, at.lineage, at.member_rounds, joining);
}

void Swarm::RequestEarlySync(int64_t round) {
  membership_->RequestEarlySync(round);
}

bool Swarm::EarlySyncRequested(int64_t round) const {
  for (const MemberEntry& e : membership_->Live()) {
    if (e.state() == peer::v1::MEMBER_ALIVE && e.early_sync() == round + 1) {
      return true;
    }
  }
  return false;
}

void Swarm::ServeState(SwarmState state) { state_->Serve(std::move(state)); }

int64_t Swarm::ServedRound() const { return state_->ServedRound(); }

absl::StatusOr<SwarmState> Swarm::FetchState(
    const std::vector<std::string>& donors, const Lineage* at_least,
    absl::Time deadline, FetchStats* stats) {
  return fetcher_->Fetch(donors, at_least, deadline, stats);
}

absl::StatusOr<Swarm::RoundResult> Swarm::SyncRound(
    const Lineage& at, const Reduce& reduce,
    const std::function<bool()>& stop) {
  return member_->Run(at, reduce, stop);
}

bool Swarm::Ahead(const Lineage& a, const Lineage& b) {
  return LineageAhead({a.round, a.lineage, a.member_rounds},
                      {b.round, b.lineage, b.member_rounds});
}

Swarm::Lineage Swarm::Of(const MemberEntry& e) {
  return Lineage{e.round(), e.lineage(), e.member_rounds(), {}};
}

Swarm::Lineage Swarm::Best() const {
  Lineage best;
  best.round = -1;
  std::vector<MemberEntry> live = membership_->Live();
  for (const MemberEntry& e : live) {
    if (e.joining() || e.state() != peer::v1::MEMBER_ALIVE) continue;
    Lineage at = Of(e);
    if (best.round < 0 || Ahead(at, best)) best = std::move(at);
  }
  // Every live member may donate, in id order: gossip can lag a round
  // behind, so FetchState checks what it gets against the best instead.
  for (const MemberEntry& e : live) {
    if (!e.joining() && e.state() == peer::v1::MEMBER_ALIVE &&
        e.id() != options_.node_id) {
      best.donors.push_back(e.id());
    }
  }
  if (best.round < 0) best.round = 0;
  return best;
}

std::vector<MemberEntry> Swarm::Behind(const Lineage& self) const {
  std::vector<MemberEntry> behind;
  for (MemberEntry& e : membership_->Live()) {
    if (e.id() != options_.node_id && Ahead(self, Of(e))) {
      behind.push_back(std::move(e));
    }
  }
  return behind;
}

SwarmView Swarm::Judge() const {
  return JudgeSwarm(membership_->Snapshot(), options_.node_id,
                    gossip_->PausedWith());
}

absl::Duration Swarm::LastPause() const { return gossip_->LastPause(); }

std::vector<MemberEntry> Swarm::MayComeBack(const Lineage& self,
                                            absl::Duration timeout) const {
  std::vector<MemberEntry> back;
  for (MemberEntry& e : membership_->Snapshot()) {
    if (e.id() == options_.node_id || e.state() != peer::v1::MEMBER_DEAD ||
        !Ahead(self, Of(e))) {
      continue;
    }
    if (client_->Blocked(e.address()) ||
        ProbeAddress(e.address(), timeout) != Reachability::kRefused) {
      back.push_back(std::move(e));
    }
  }
  return back;
}

std::vector<MemberEntry> Swarm::Members() const {
  return membership_->Snapshot();
}

std::vector<std::string> Swarm::AlivePeers() const {
  std::vector<std::string> ids;
  for (const MemberEntry& e : membership_->Live()) {
    if (e.id() != options_.node_id && e.state() == peer::v1::MEMBER_ALIVE) {
      ids.push_back(e.id());
    }
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::Status Swarm::Push(const std::string& peer_id, const PushShare& share,
                         absl::Duration timeout, int64_t* sequence) {
  return pushes_->Push(peer_id, share, timeout, sequence);
}

std::vector<ReceivedPush> Swarm::TakePushes() { return pushes_->Take(); }

int64_t Swarm::pushes_refused() const { return pushes_->refused(); }

absl::Status Swarm::LinkError() const {
  return options_.links ? options_.links->Error() : absl::OkStatus();
}

int64_t Swarm::bytes_sent() const {
  return transport_->bytes_sent() + client_->control_bytes() +
         pushes_->bytes_sent();
}

int64_t Swarm::bytes_received() const {
  return transport_->bytes_received() + pushes_->bytes_received();
}

std::map<std::string, int64_t> Swarm::refusals() const {
  const std::shared_ptr<PeerRateLimiter>& limit =
      options_.credentials.rate_limit;
  return {{"rate_limit", limit != nullptr ? limit->refused() : 0},
          {"stream_limit", deadlines_->refused()},
          {"stream_cancelled", deadlines_->cancelled()},
          {"early_refused", transport_->early_refused()},
          {"control_refused", control_refused_.load()}};
}

int64_t Swarm::early_bytes() const { return transport_->early_bytes(); }

std::string Swarm::relay() const { return attachment_->relay(); }
int64_t Swarm::relayed_bytes() const { return attachment_->relayed_bytes(); }
int64_t Swarm::relays_lost() const { return attachment_->relays_lost(); }
int64_t Swarm::relay_forwarded_bytes() const {
  return relay_server_->forwarded_bytes();
}
std::map<std::string, int64_t> Swarm::relay_forwarded_by_member() const {
  return relay_server_->forwarded_by_member();
}
int64_t Swarm::bytes_via_relays() const { return routes_->relayed_bytes(); }

}  // namespace starling
