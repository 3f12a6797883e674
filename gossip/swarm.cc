#include "gossip/swarm.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/blocking_counter.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/crash_point.h"
#include "gossip/ring_allreduce.h"
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

static_assert(kMaxRound <=
                  std::numeric_limits<int64_t>::max() / kAttemptsPerRound - 1,
              "round * kAttemptsPerRound + attempt must fit an int64");
// How long a coordinator stays at a round no member vouches for.
constexpr absl::Duration kUnvouchedGrace = absl::Seconds(5);
// Round messages (COMMIT, ABORT, STALE, PLAN) a member holds for its
// training thread, which takes them when it is in a round.
constexpr size_t kMaxInboxMessages = 4096;

// Why a round message's numbers (or its lineage) are out of the range the
// protocol produces, or "" when they are in it. A peer's number out of
// range would overflow the arithmetic on rounds and attempts (see
// kAttemptsPerRound).
std::string OutOfRange(const ControlMessage& m) {
  if (m.round() < 0 || m.round() > kMaxRound) {
    return absl::StrCat("round ", m.round(), " is out of range [0, ", kMaxRound,
                        "]");
  }
  if (m.attempt() < 0 || m.attempt() >= kAttemptsPerRound) {
    return absl::StrCat("attempt ", m.attempt(), " is out of range [0, ",
                        kAttemptsPerRound - 1, "]");
  }
  if (m.last_attempt() < 0 || m.last_attempt() > kMaxClaimedAttempt) {
    return absl::StrCat("last_attempt ", m.last_attempt(),
                        " is out of range [0, ", kMaxClaimedAttempt, "]");
  }
  // The coordinator puts a READY's lineage into every plan of the round.
  if (absl::Status s = CheckLineage(m.lineage()); !s.ok()) {
    return std::string(s.message());
  }
  if (m.member_rounds() < 0 || m.member_rounds() > kMaxMemberRounds) {
    return absl::StrCat("member_rounds ", m.member_rounds(),
                        " is out of range [0, ", kMaxMemberRounds, "]");
  }
  return "";
}

// The digest of a PLAN: its coordinator, round, attempt, members and their
// incarnations, as every member of it computes alike (MailboxOptions.plan).
uint64_t PlanDigest(const ControlMessage& plan) {
  std::string text =
      absl::StrCat(plan.from(), "\n", plan.round(), "\n", plan.attempt());
  for (int i = 0; i < plan.members_size(); ++i) {
    absl::StrAppend(&text, "\n", plan.members(i), "@",
                    i < plan.incarnations_size() ? plan.incarnations(i) : -1);
  }
  return HashBytes(text.data(), text.size());
}

std::vector<MemberEntry> ToVector(
    const google::protobuf::RepeatedPtrField<MemberEntry>& r) {
  return std::vector<MemberEntry>(r.begin(), r.end());
}

bool IsLive(const MemberEntry& e) {
  return e.state() == peer::v1::MEMBER_ALIVE ||
         e.state() == peer::v1::MEMBER_SUSPECT;
}

// Why member `id` of an attempt can no longer take part in it, as this
// node's table shows it (`now`: its entry, nullptr when absent; `planned`:
// its incarnation in the PLAN, -1 when unknown); "" while it can. A higher
// incarnation is a restart faster than the failure detector (or a refuted
// suspicion): the old life will never report, the new one is not planned.
std::string GoneSincePlan(const std::string& id, const MemberEntry* now,
                          int64_t planned) {
  if (now == nullptr || now->state() != peer::v1::MEMBER_ALIVE) {
    return absl::StrCat(id, " is no longer alive");
  }
  if (planned >= 0 && now->incarnation() > planned) {
    return absl::StrCat(id, " came back at a new incarnation (it restarted)");
  }
  return "";
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code())),
                      std::string(s.message()));
}

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

}  // namespace

struct Swarm::Stub {
  Stub(const std::string& address, const PeerCredentials& credentials) {
    grpc::ChannelArguments args;
    credentials.Apply(&args);
    args.SetMaxReceiveMessageSize(64 << 20);
    SetReconnectBackoff(args);
    stub = peer::v1::Swarm::NewStub(
        grpc::CreateCustomChannel(address, credentials.channel, args));
  }
  std::unique_ptr<peer::v1::Swarm::Stub> stub;
};

// Server side of the Swarm service. Handlers only touch in-memory state
// under short locks; nothing blocks.
class Swarm::Service final : public peer::v1::Swarm::CallbackService {
 public:
  explicit Service(Swarm* swarm) : swarm_(swarm) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx,
                                 const JoinRequest* req,
                                 JoinResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (grpc::Status a = Admit(ctx, "Join"); !a.ok()) {
      reactor->Finish(a);
      return reactor;
    }
    if (grpc::Status a = Caller(ctx, req->self().id(), "a join"); !a.ok()) {
      reactor->Finish(a);
      return reactor;
    }
    reactor->Finish(ToGrpcStatus(swarm_->OnJoin(*req, resp)));
    return reactor;
  }
  grpc::ServerUnaryReactor* Gossip(grpc::CallbackServerContext* ctx,
                                   const GossipRequest* req,
                                   GossipResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (grpc::Status a = Admit(ctx, "Gossip"); !a.ok()) {
      reactor->Finish(a);
      return reactor;
    }
    if (grpc::Status a = Caller(ctx, req->from(), "gossip"); !a.ok()) {
      reactor->Finish(a);
      return reactor;
    }
    reactor->Finish(ToGrpcStatus(swarm_->OnGossip(*req, resp)));
    return reactor;
  }
  grpc::ServerUnaryReactor* Control(grpc::CallbackServerContext* ctx,
                                    const ControlMessage* req,
                                    ControlAck* resp) override {
    auto* reactor = ctx->DefaultReactor();
    if (grpc::Status a = Admit(ctx, "Control"); !a.ok()) {
      reactor->Finish(a);
      return reactor;
    }
    if (grpc::Status a = Caller(ctx, req->from(), "a round message"); !a.ok()) {
      reactor->Finish(a);
      return reactor;
    }
    if (req->run_id() != swarm_->options_.identity.run_id) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat("control message for run '", req->run_id(),
                                    "'; this node is in run '",
                                    swarm_->options_.identity.run_id, "'")));
      return reactor;
    }
    *resp = swarm_->OnControl(*req);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerWriteReactor<StateChunk>* FetchState(
      grpc::CallbackServerContext* ctx, const StateRequest* req) override;
  grpc::ServerReadReactor<PushChunk>* Push(grpc::CallbackServerContext* ctx,
                                           PushAck* ack) override;

 private:
  class StateWriter;
  class PushReader;
  grpc::Status Admit(grpc::CallbackServerContext* ctx,
                     absl::string_view method) {
    return swarm_->options_.credentials.Admit(ctx, method);
  }
  // Whether the caller may speak as member `id` (--tls_bind_node_ids).
  grpc::Status Caller(grpc::CallbackServerContext* ctx, const std::string& id,
                      absl::string_view what) {
    return swarm_->options_.credentials.CheckCaller(*ctx, id, what);
  }
  Swarm* swarm_;
};

// Streams the served blob from the requested offset (or from 0 when the
// requester's digest is not the one served any more).
class Swarm::Service::StateWriter
    : public grpc::ServerWriteReactor<StateChunk> {
 public:
  StateWriter(std::shared_ptr<const StateBlob> blob, int64_t offset,
              int64_t chunk_bytes,
              std::unique_ptr<StreamDeadlines::Watched> watch)
      : blob_(std::move(blob)),
        offset_(offset),
        chunk_bytes_(std::max<int64_t>(1024, chunk_bytes)),
        watch_(std::move(watch)) {
    half_ = static_cast<int64_t>(blob_->bytes().size()) / 2;
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    watch_->Progress();
    offset_ += len_;
    if (offset_ >= half_ && !crashed_checked_) {
      crashed_checked_ = true;
      CrashPoint("donate");  // test hook: die in the middle of a transfer
    }
    Next();
  }
  void OnDone() override {
    watch_.reset();  // waits out a cancellation in flight
    delete this;
  }

 private:
  void Next() {
    const int64_t size = static_cast<int64_t>(blob_->bytes().size());
    if (offset_ >= size) {
      Finish(grpc::Status::OK);
      return;
    }
    len_ = std::min(chunk_bytes_, size - offset_);
    chunk_.set_round(blob_->round());
    chunk_.set_lineage(blob_->lineage());
    chunk_.set_digest(blob_->digest());
    chunk_.set_total_bytes(size);
    chunk_.set_offset(offset_);
    chunk_.set_data(blob_->bytes().data() + offset_, static_cast<size_t>(len_));
    chunk_.set_checksum(ChunkChecksum(chunk_.data()));
    if (TakeFault("corrupt_state")) {
      // Test hook: a bit flips on the wire; the checksum must catch it.
      std::string* d = chunk_.mutable_data();
      (*d)[d->size() / 2] ^= 0x20;
    }
    StartWrite(&chunk_);
  }

  std::shared_ptr<const StateBlob> blob_;
  int64_t offset_;
  const int64_t chunk_bytes_;
  int64_t len_ = 0;
  int64_t half_ = 0;
  std::unique_ptr<StreamDeadlines::Watched> watch_;
  bool crashed_checked_ = false;
  StateChunk chunk_;
};

grpc::ServerWriteReactor<StateChunk>* Swarm::Service::FetchState(
    grpc::CallbackServerContext* ctx, const StateRequest* req) {
  std::shared_ptr<const StateBlob> blob;
  {
    absl::MutexLock lock(&swarm_->state_mu_);
    blob = swarm_->served_;
  }
  auto fail = [](grpc::StatusCode code, std::string why) {
    class Refuse : public grpc::ServerWriteReactor<StateChunk> {
     public:
      Refuse(grpc::StatusCode code, std::string why) {
        Finish(grpc::Status(code, why));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse(code, std::move(why));
  };
  if (grpc::Status a = Admit(ctx, "FetchState"); !a.ok()) {
    return fail(a.error_code(), a.error_message());
  }
  if (req->run_id() != swarm_->options_.identity.run_id) {
    return fail(grpc::StatusCode::FAILED_PRECONDITION,
                absl::StrCat("state request for run '", req->run_id(),
                             "'; this node is in run '",
                             swarm_->options_.identity.run_id, "'"));
  }
  if (blob == nullptr) {
    return fail(grpc::StatusCode::UNAVAILABLE,
                "this node has no committed state to serve yet");
  }
  if (Swarm::Ahead({req->round(), req->lineage(), req->member_rounds()},
                   {blob->round(), blob->lineage(), blob->member_rounds()})) {
    // The joiner would throw this state away: its next one is still being
    // encoded (or this node is behind), or it is of the same round on a
    // lineage that lost (a partition's other side).
    return fail(grpc::StatusCode::FAILED_PRECONDITION,
                req->round() > blob->round()
                    ? absl::StrCat("this node serves round ", blob->round(),
                                   ", not yet round ", req->round())
                    : absl::StrCat("this node serves round ", blob->round(),
                                   " of lineage ", blob->lineage(), ", not ",
                                   req->lineage()));
  }
  int64_t offset = 0;
  if (req->digest() == blob->digest() && req->offset() > 0 &&
      req->offset() < static_cast<int64_t>(blob->bytes().size())) {
    offset = req->offset();
  }
  absl::StatusOr<std::unique_ptr<StreamDeadlines::Watched>> watch =
      swarm_->deadlines_->Watch(ctx, "FetchState", absl::Minutes(10));
  if (!watch.ok()) {
    return fail(grpc::StatusCode::RESOURCE_EXHAUSTED,
                std::string(watch.status().message()));
  }
  // The joiner resumes from where a cancelled transfer stopped.
  return new StateWriter(std::move(blob), offset, swarm_->options_.chunk_bytes,
                         *std::move(watch));
}

// One incoming push stream's place in the inbox (its identity in
// receiving_).
struct Swarm::PushSlot {};

// Receives one push: checks every chunk as it arrives (PushAssembler), then
// deposits the whole push in the inbox. Never blocks: the inbox place was
// reserved when the stream started.
class Swarm::Service::PushReader : public grpc::ServerReadReactor<PushChunk> {
 public:
  PushReader(Swarm* swarm, grpc::CallbackServerContext* ctx, PushAck* ack)
      : swarm_(swarm),
        ctx_(ctx),
        ack_(ack),
        slot_(std::make_shared<PushSlot>()),
        assembler_(swarm->options_.identity.run_id,
                   swarm->options_.push_elements, swarm->options_.push_codec,
                   swarm->options_.push_codec
                       ? swarm->options_.push_codec->MaxEncodedBytes(
                             swarm->options_.push_elements)
                       : 0) {
    if (grpc::Status a = swarm->options_.credentials.Admit(ctx, "Push");
        !a.ok()) {
      End(a);
      return;
    }
    if (swarm_->options_.push_elements <= 0) {
      End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat(swarm_->options_.node_id,
                                    " does not take pushes (algorithm ",
                                    swarm_->options_.identity.algo, ")")));
      return;
    }
    if (!swarm_->ReservePush(slot_)) {
      End(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat(swarm_->options_.node_id, "'s push inbox is full")));
      return;
    }
    reserved_ = true;
    // A push that stalls is cancelled, so no inbox place is held forever.
    absl::StatusOr<std::unique_ptr<StreamDeadlines::Watched>> watch =
        swarm_->deadlines_->Watch(ctx, "Push", swarm_->options_.push_timeout);
    if (!watch.ok()) {
      End(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       std::string(watch.status().message())));
      return;
    }
    watch_ = *std::move(watch);
    StartRead(&chunk_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      // The sender is done (or the stream was cancelled).
      absl::StatusOr<ReceivedPush> push = assembler_.Finish();
      if (!push.ok()) {
        End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         std::string(push.status().message())));
        return;
      }
      // Only another member's model is averaged in (and kept as a copy:
      // one per made-up sender would grow without bound).
      if (push->from == swarm_->options_.node_id ||
          !swarm_->membership_->Get(push->from).ok()) {
        End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                         absl::StrCat(swarm_->options_.node_id,
                                      " takes pushes only from "
                                      "other members it knows, not from ",
                                      QuoteForLog(push->from))));
        return;
      }
      if (absl::Status s = swarm_->push_copies_.Resolve(*push); !s.ok()) {
        End(grpc::Status(absl::IsFailedPrecondition(s)
                             ? grpc::StatusCode::FAILED_PRECONDITION
                             : grpc::StatusCode::INVALID_ARGUMENT,
                         std::string(s.message())));
        return;
      }
      ack_->set_inbox(1);
      swarm_->EndPush(slot_, &*push);
      reserved_ = false;
      Finish(grpc::Status::OK);
      return;
    }
    watch_->Progress();
    swarm_->push_received_ += static_cast<int64_t>(chunk_.ByteSizeLong());
    // The first chunk names the sender (the assembler holds the rest to
    // it): an impostor is refused before its model streams in.
    if (first_chunk_) {
      first_chunk_ = false;
      if (grpc::Status a = swarm_->options_.credentials.CheckCaller(
              *ctx_, chunk_.from(), "a push");
          !a.ok()) {
        End(a);
        return;
      }
    }
    if (absl::Status s = assembler_.Add(chunk_); !s.ok()) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       std::string(s.message())));
      return;
    }
    StartRead(&chunk_);
  }
  void OnDone() override {
    watch_.reset();  // waits out a cancellation in flight
    if (reserved_) swarm_->EndPush(slot_, nullptr);
    delete this;
  }

 private:
  // Ends the stream with an error; a refused push is counted and logged.
  void End(grpc::Status status) {
    swarm_->pushes_refused_.fetch_add(1);
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      STARLING_LOG(WARNING) << "refused a push: " << status.error_message();
    }
    if (reserved_) swarm_->EndPush(slot_, nullptr);
    reserved_ = false;
    Finish(status);
  }

  Swarm* swarm_;
  grpc::CallbackServerContext* ctx_;  // valid until OnDone
  PushAck* ack_;
  std::shared_ptr<PushSlot> slot_;
  std::unique_ptr<StreamDeadlines::Watched> watch_;
  PushAssembler assembler_;
  PushChunk chunk_;
  bool first_chunk_ = true;
  bool reserved_ = false;
};

grpc::ServerReadReactor<PushChunk>* Swarm::Service::Push(
    grpc::CallbackServerContext* ctx, PushAck* ack) {
  return new PushReader(swarm_, ctx, ack);
}

// The coordinator's state for the round it is collecting (see swarm.h).
struct Swarm::Coordinator {
  absl::Mutex mu;
  absl::CondVar cv;
  int64_t round ABSL_GUARDED_BY(mu) = -1;
  std::string lineage ABSL_GUARDED_BY(mu);
  int64_t member_rounds ABSL_GUARDED_BY(mu) = 0;  // of `lineage`
  int64_t committed ABSL_GUARDED_BY(mu) = -1;
  std::map<std::string, std::string> ready ABSL_GUARDED_BY(mu);  // id->addr
  absl::Time first_ready ABSL_GUARDED_BY(mu);
  int attempt ABSL_GUARDED_BY(mu) = 0;
  // Every attempt number of this round is taken (logged once).
  bool out_of_attempts ABSL_GUARDED_BY(mu) = false;
  // Since when no member vouches for `round` (see CoordinatorLoop).
  absl::Time unvouched_since ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  bool running ABSL_GUARDED_BY(mu) = false;
  absl::Time plan_started ABSL_GUARDED_BY(mu);
  bool replan_now ABSL_GUARDED_BY(mu) = false;
  // The attempt being aborted was refused by a live member that follows
  // another coordinator: the next plan waits for it (see CoordinatorLoop).
  bool hold_after_abort ABSL_GUARDED_BY(mu) = false;
  std::vector<std::string> plan ABSL_GUARDED_BY(mu);
  std::vector<std::string> plan_addresses ABSL_GUARDED_BY(mu);
  std::vector<int64_t> plan_incarnations ABSL_GUARDED_BY(mu);
  std::set<std::string> done ABSL_GUARDED_BY(mu);
  std::set<std::string> excluded ABSL_GUARDED_BY(mu);  // this round
  // Left out of the rest of this round: members that sent invalid data and
  // the members that reported it (one of the two is faulty, or lying).
  std::set<std::string> banned ABSL_GUARDED_BY(mu);
  bool abort ABSL_GUARDED_BY(mu) = false;
  std::string abort_reason ABSL_GUARDED_BY(mu);
  // Attempts of this round aborted so far, and when the next may be
  // planned: the second retry waits 100 ms, doubling up to 5 s, so that an
  // attempt that fails at once every time (a link too slow for the round's
  // deadline, say) does not spin the swarm.
  int aborted ABSL_GUARDED_BY(mu) = 0;
  absl::Time next_plan_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  // Messages to send once the lock is released: (to id, message).
  std::vector<std::pair<std::string, ControlMessage>> outbox
      ABSL_GUARDED_BY(mu);
};

// Control messages for this node as a member, and the attempt it runs.
struct Swarm::Inbox {
  absl::Mutex mu;
  std::deque<ControlMessage> messages ABSL_GUARDED_BY(mu);
  int64_t round ABSL_GUARDED_BY(mu) = -1;  // the round in SyncRound
  int running_attempt ABSL_GUARDED_BY(mu) = -1;
  Mailbox* running_mailbox ABSL_GUARDED_BY(mu) = nullptr;
  // The running attempt's members and coordinator: if one of them stops
  // being alive here (or a member restarted), the attempt is called off
  // locally too (an ABORT may never arrive, e.g. across a partition or from
  // a coordinator that restarted).
  std::vector<std::string> running_members ABSL_GUARDED_BY(mu);
  // Their incarnations when planned (empty: the plan did not say).
  std::vector<int64_t> running_incarnations ABSL_GUARDED_BY(mu);
  std::string running_coordinator ABSL_GUARDED_BY(mu);
};

Swarm::Swarm(const SwarmOptions& options)
    : options_(options),
      coord_(std::make_unique<Coordinator>()),
      inbox_(std::make_unique<Inbox>()) {}

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
  to.extra_services = {s->service_.get()};
  to.links = options.links;
  to.credentials = options.credentials;
  s->deadlines_ = std::make_shared<StreamDeadlines>(options.stream_idle_timeout,
                                                    options.peer_max_streams);
  to.stream_deadlines = s->deadlines_;
  to.chunk_stream_deadline = options.round_deadline + absl::Minutes(1);
  to.chunk_stream_deadline_flag = "--round_deadline";
  Swarm* self = s.get();
  to.blocked = [self](const std::string& address) {
    return self->Blocked(address);
  };
  PeerIdentity id = options.identity;
  id.world = 0;
  STARLING_ASSIGN_OR_RETURN(s->transport_, GrpcTransport::Start(to, id));
  MembershipOptions mo;
  mo.self_id = options.node_id;
  mo.self_address = s->transport_->address();
  mo.suspect_after = options.suspect_after;
  mo.max_members = options.max_members;
  STARLING_ASSIGN_OR_RETURN(s->membership_,
                            Membership::Create(mo, absl::Now()));
  s->membership_->SetProgress(0, "", 0, /*joining=*/true);
  s->ReadPartitionFile();
  s->gossip_thread_ = std::thread([self] { self->GossipLoop(); });
  s->coord_thread_ = std::thread([self] { self->CoordinatorLoop(); });
  s->state_thread_ = std::thread([self] { self->StateLoop(); });
  return s;
}

void Swarm::Shutdown() {
  if (stopping_.exchange(true)) return;
  {
    absl::MutexLock lock(&coord_->mu);
    coord_->cv.SignalAll();
  }
  {
    absl::MutexLock lock(&to_serve_mu_);  // StateLoop's wait sees stopping_
  }
  if (gossip_thread_.joinable()) gossip_thread_.join();
  if (coord_thread_.joinable()) coord_thread_.join();
  if (state_thread_.joinable()) state_thread_.join();
  if (transport_) transport_->Shutdown();
}

std::shared_ptr<Swarm::Stub> Swarm::StubFor(const std::string& address) {
  absl::MutexLock lock(&state_mu_);
  std::shared_ptr<Stub>& s = stubs_[address];
  if (!s) s = std::make_shared<Stub>(address, options_.credentials);
  return s;
}

void Swarm::ReadPartitionFile() {
  if (options_.partition_file.empty()) return;
  absl::StatusOr<std::string> text = ReadFile(options_.partition_file);
  std::string line = text.ok() ? std::string(absl::StripAsciiWhitespace(
                                     text->substr(0, text->find('\n'))))
                               : "";
  absl::MutexLock lock(&state_mu_);
  if (line == partition_text_) return;
  partition_text_ = line;
  groups_.clear();
  int g = 0;
  for (absl::string_view group : absl::StrSplit(line, '|', absl::SkipEmpty())) {
    for (absl::string_view id : absl::StrSplit(group, ',', absl::SkipEmpty())) {
      groups_[std::string(absl::StripAsciiWhitespace(id))] = g;
    }
    ++g;
  }
  STARLING_LOG(INFO) << (line.empty() ? "network partition healed"
                                      : "network partition: " + line);
}

bool Swarm::Blocked(const std::string& address) const {
  {
    // Every send asks: without a partition, skip copying the table.
    absl::MutexLock lock(&state_mu_);
    if (groups_.empty()) return false;
  }
  std::string peer_id;
  for (const MemberEntry& e : membership_->Snapshot()) {
    if (e.address() == address) peer_id = e.id();
  }
  absl::MutexLock lock(&state_mu_);
  if (groups_.empty()) return false;
  auto mine = groups_.find(options_.node_id);
  auto theirs = groups_.find(peer_id);
  return mine != groups_.end() && theirs != groups_.end() &&
         mine->second != theirs->second;
}

bool Swarm::IsSelfSeed(const std::string& seed) const {
  if (seed == address()) return true;
  absl::MutexLock lock(&state_mu_);
  return self_seeds_.count(seed) > 0;
}

bool Swarm::HasSelfSeed() const {
  for (const std::string& seed : options_.seeds) {
    if (IsSelfSeed(seed)) return true;
  }
  return false;
}

std::string Swarm::CoordinatorId() const {
  for (const MemberEntry& e : membership_->Live()) {
    if (e.state() == peer::v1::MEMBER_ALIVE && !e.joining()) return e.id();
  }
  return options_.node_id;
}

absl::Status Swarm::JoinSwarm(absl::Time deadline) {
  if (options_.seeds.empty()) {
    joined_ = true;  // the first member
    return absl::OkStatus();
  }
  JoinRequest req;
  peer::v1::HandshakeRequest* hello = req.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_run_id(options_.identity.run_id);
  hello->set_algo(options_.identity.algo);
  hello->set_world(0);
  hello->set_compression(options_.identity.compression);
  hello->set_aggregate(options_.identity.aggregate);
  *hello->mutable_model() = options_.identity.model;
  hello->set_address(address());
  absl::Duration backoff = absl::Milliseconds(100);
  std::string last_error = "no answer";
  int attempts = 0;
  const absl::Time start = absl::Now();
  while (!stopping_.load()) {
    for (const std::string& seed : options_.seeds) {
      if (IsSelfSeed(seed)) continue;
      std::vector<MemberEntry> self = membership_->Snapshot();
      for (const MemberEntry& e : self) {
        if (e.id() == options_.node_id) *req.mutable_self() = e;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(
          std::min(deadline, absl::Now() + absl::Seconds(5))));
      options_.credentials.Sign(&ctx, "Join");
      JoinResponse resp;
      grpc::Status s = StubFor(seed)->stub->Join(&ctx, req, &resp);
      ++attempts;
      if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
        // The seed is this node under another name (its DNS name).
        STARLING_LOG(INFO) << "seed " << seed << " is this node";
        absl::MutexLock lock(&state_mu_);
        self_seeds_.insert(seed);
        continue;
      }
      transport_->rpc_errors().Record(s.error_code());
      if (s.ok()) {
        std::vector<MembershipChange> changes;
        (void)membership_->Merge(ToVector(resp.members()), absl::Now(),
                                 &changes);
        ReportChanges(changes);
        STARLING_LOG(INFO) << options_.node_id << " joined through " << seed
                           << " (" << resp.members_size() << " members known)";
        joined_ = true;
        return absl::OkStatus();
      }
      if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
          s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
        return absl::FailedPreconditionError(absl::StrCat(
            "peer ", seed, " refused this node: ", s.error_message()));
      }
      if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        return absl::UnauthenticatedError(
            absl::StrCat("peer ", seed, " refused this node's credentials: ",
                         s.error_message(), " (check --join_token_file)"));
      }
      last_error = absl::StrCat(seed, ": ", s.error_message());
      // The seed may have tried to join this node first, been refused and
      // gone: say why instead of timing out.
      absl::MutexLock lock(&state_mu_);
      if (auto it = refused_.find(seed); it != refused_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("this node refused peer ", seed, ": ", it->second));
      }
    }
    if (joined_.load()) {
      // Nobody had joined yet and this node has the smallest id: it
      // admitted the others and founds the swarm.
      STARLING_LOG(INFO) << options_.node_id << " founds the swarm";
      return absl::OkStatus();
    }
    if (HasSelfSeed() && absl::Now() - start >= options_.found_after) {
      // This node is a seed itself and no other seed answered: it founds
      // the swarm alone. The gossip loop keeps calling the seeds, so swarms
      // founded apart merge (the better lineage wins) once they meet.
      joined_ = true;
      STARLING_LOG(INFO) << options_.node_id
                         << " is one of the seeds and no other answered in "
                         << absl::FormatDuration(options_.found_after)
                         << ": it founds the swarm";
      return absl::OkStatus();
    }
    if (absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  return absl::UnavailableError(absl::StrCat(
      "cannot reach any of --peers=", absl::StrJoin(options_.seeds, ","),
      " after ", attempts, " attempts (last error: ", last_error, ")"));
}

absl::Status Swarm::WaitForMembers(int n, absl::Time deadline) {
  while (true) {
    // Counted: this node, and every member that is ready (its JoinSwarm
    // returned: not joining) and live or already LEFT. Not a member still
    // joining: the others could count it, train and leave while it is in
    // JoinSwarm, and it would then wait for them in vain. Not a member that
    // left while joining or died. Counting a ready member that left keeps
    // the barrier one-way: one that saw the others, trained and left before
    // they saw it ready still lets them start.
    int ready = 0;
    for (const MemberEntry& e : membership_->Snapshot()) {
      const bool counted = IsLive(e) || e.state() == peer::v1::MEMBER_LEFT;
      if (e.id() == options_.node_id || (counted && !e.joining())) ++ready;
    }
    if (ready >= n) {
      GossipToEveryone();
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline || stopping_.load()) {
      // Every member this node knows of, with its state and address: a
      // member declared dead, or one whose address is this node's own (two
      // servers sharing a port), tells what went wrong.
      std::vector<std::string> alive, others;
      for (const MemberEntry& e : membership_->Snapshot()) {
        std::string line =
            absl::StrCat(e.id(), " ", MemberStateName(e.state()),
                         e.joining() && e.id() != options_.node_id && IsLive(e)
                             ? " (still joining)"
                             : "",
                         " at ", e.address());
        (IsLive(e) ? alive : others).push_back(std::move(line));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "waited for ", n, " members but only ", ready,
          " are ready (alive or suspect: ", absl::StrJoin(alive, ", "),
          "); also known: ",
          others.empty() ? "none" : absl::StrJoin(others, ", ")));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

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

void Swarm::ServeState(SwarmState state) {
  absl::MutexLock lock(&to_serve_mu_);
  to_serve_ = std::make_unique<SwarmState>(std::move(state));
}

int64_t Swarm::ServedRound() const {
  absl::MutexLock lock(&state_mu_);
  return served_ == nullptr ? -1 : served_->round();
}

void Swarm::StateLoop() {
  while (true) {
    std::unique_ptr<SwarmState> state;
    {
      absl::MutexLock lock(&to_serve_mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(to_serve_mu_) {
        return to_serve_ != nullptr || stopping_.load();
      };
      to_serve_mu_.Await(absl::Condition(&woken));
      if (stopping_.load()) return;
      state = std::move(to_serve_);
    }
    std::shared_ptr<const StateBlob> blob = StateBlob::Make(*state);
    absl::MutexLock lock(&state_mu_);
    served_ = std::move(blob);
  }
}

bool Swarm::Ahead(const Lineage& a, const Lineage& b) {
  if (a.round != b.round) return a.round > b.round;
  // One θ_global is one lineage, whatever weight a member claims for it;
  // and a member with none yet (starting) is on no other.
  if (a.lineage.empty() || b.lineage.empty() || a.lineage == b.lineage) {
    return false;
  }
  if (a.member_rounds != b.member_rounds) {
    return a.member_rounds > b.member_rounds;
  }
  return a.lineage < b.lineage;
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

std::vector<MemberEntry> Swarm::Members() const {
  return membership_->Snapshot();
}

int64_t Swarm::bytes_sent() const {
  return transport_->bytes_sent() + control_bytes_.load() + push_sent_.load();
}

int64_t Swarm::bytes_received() const {
  return transport_->bytes_received() + push_received_.load();
}

bool Swarm::ReservePush(std::shared_ptr<PushSlot> slot) {
  absl::MutexLock lock(&push_mu_);
  if (static_cast<int>(pushes_.size() + receiving_.size()) >=
      std::max(1, options_.push_inbox)) {
    return false;
  }
  receiving_.push_back(std::move(slot));
  return true;
}

void Swarm::EndPush(const std::shared_ptr<PushSlot>& slot, ReceivedPush* push) {
  absl::MutexLock lock(&push_mu_);
  auto it = std::find(receiving_.begin(), receiving_.end(), slot);
  if (it == receiving_.end()) return;
  receiving_.erase(it);
  if (push != nullptr) pushes_.push_back(std::move(*push));
}

std::vector<ReceivedPush> Swarm::TakePushes() {
  std::vector<ReceivedPush> out;
  absl::MutexLock lock(&push_mu_);
  out.swap(pushes_);
  return out;
}

absl::Status Swarm::LinkError() const {
  return options_.links ? options_.links->Error() : absl::OkStatus();
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
  absl::StatusOr<MemberEntry> e = membership_->Get(peer_id);
  if (!e.ok()) {
    return absl::UnavailableError(absl::StrCat(peer_id, " is unknown"));
  }
  if (e->state() != peer::v1::MEMBER_ALIVE) {
    return absl::UnavailableError(absl::StrCat(peer_id, " is not alive"));
  }
  if (Blocked(e->address())) {
    return absl::UnavailableError(
        absl::StrCat(peer_id, " is across a network partition"));
  }
  const int64_t elements = static_cast<int64_t>(share.sent.size());
  // The emulated link: chunks that fit its rate, and its latency once per
  // push, before the stream.
  LinkShaper* link =
      options_.links ? options_.links->For(e->address()) : nullptr;
  int64_t chunk_bytes = options_.chunk_bytes;
  if (link != nullptr) {
    StreamLimits limits;
    limits.idle = deadlines_->idle();
    limits.stream = options_.push_timeout;
    limits.stream_flag = "--gossip_timeout";
    limits.sender = timeout;
    limits.sender_flag = "--gossip_timeout";
    absl::StatusOr<int64_t> c = options_.links->ChunkBytes(
        *link, e->address(), static_cast<int64_t>(share.payload.size()),
        chunk_bytes, limits);
    if (!c.ok()) {
      return absl::Status(
          c.status().code(),
          absl::StrCat("push to ", peer_id, ": ", c.status().message()));
    }
    chunk_bytes = *c;
  }
  const int64_t seq = push_sequence_.fetch_add(1) + 1;
  std::vector<PushChunk> chunks =
      MakePushChunks(options_.identity.run_id, options_.node_id, seq, share,
                     elements, chunk_bytes);
  const absl::Time deadline = absl::Now() + timeout;
  if (link != nullptr) {
    if (absl::Status ls = link->StartMessage(deadline); !ls.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "push to ", peer_id, " at ", e->address(), ": ", ls.message()));
    }
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  options_.credentials.Sign(&ctx, "Push");
  PushAck ack;
  std::unique_ptr<grpc::ClientWriter<PushChunk>> writer =
      StubFor(e->address())->stub->Push(&ctx, &ack);
  absl::Status shaped;  // not OK when the emulated link missed the deadline
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i == chunks.size() / 2 && i > 0) {
      CrashPoint("push_mid_stream");  // test hook: die in the middle
    }
    const int64_t bytes = static_cast<int64_t>(chunks[i].ByteSizeLong());
    if (link != nullptr) {
      shaped = link->Acquire(bytes, deadline);
      if (!shaped.ok()) {
        ctx.TryCancel();
        break;
      }
    }
    push_sent_ += bytes;
    if (!writer->Write(chunks[i])) break;  // Finish says why
  }
  if (chunks.size() == 1) CrashPoint("push_mid_stream");
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!shaped.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "push to ", peer_id, " at ", e->address(), ": ", shaped.message()));
  }
  transport_->rpc_errors().Record(s.error_code());
  if (s.ok()) {
    if (sequence != nullptr) *sequence = seq;
    return absl::OkStatus();
  }
  const std::string why = absl::StrCat("push to ", peer_id, " at ",
                                       e->address(), ": ", s.error_message());
  switch (s.error_code()) {
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return absl::ResourceExhaustedError(why);
    case grpc::StatusCode::INVALID_ARGUMENT:
      return absl::InvalidArgumentError(why);
    case grpc::StatusCode::FAILED_PRECONDITION:
      return absl::FailedPreconditionError(why);
    default:
      return absl::UnavailableError(why);
  }
}

absl::Status Swarm::OnJoin(const JoinRequest& req, JoinResponse* resp) {
  if (absl::Status s = CheckNodeId(req.self().id()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "joiner at ", QuoteForLog(req.hello().address()), ": ", s.message()));
  }
  PeerIdentity mine = options_.identity;
  mine.world = 0;
  std::string why = HandshakeMismatch(req.hello(), mine);
  if (!why.empty()) {
    STARLING_LOG(WARNING) << "refused joiner " << req.self().id() << " at "
                          << QuoteForLog(req.hello().address()) << ": " << why;
    absl::MutexLock lock(&state_mu_);
    refused_[req.hello().address()] = why;
    return absl::FailedPreconditionError(why);
  }
  // A node that is still looking for the swarm itself admits only joiners
  // with larger ids: nodes that all start (or resume) together form one
  // swarm around the smallest id, and two that look for each other do not
  // pair up in both directions.
  if (!joined_.load() && req.self().id() < options_.node_id) {
    return absl::UnavailableError(
        absl::StrCat(options_.node_id, " has not joined the swarm itself yet"));
  }
  if (req.self().id() == options_.node_id &&
      req.hello().address() == address()) {
    return absl::AlreadyExistsError("this is the node itself");
  }
  if (req.self().id() == options_.node_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("node id '", req.self().id(), "' is this node's own"));
  }
  std::vector<MembershipChange> changes;
  STARLING_RETURN_IF_ERROR(
      membership_->Merge({req.self()}, absl::Now(), &changes));
  ReportChanges(changes);
  joined_ = true;
  for (const MemberEntry& e : membership_->Snapshot()) {
    *resp->add_members() = e;
  }
  return absl::OkStatus();
}

absl::Status Swarm::OnGossip(const GossipRequest& req, GossipResponse* resp) {
  if (req.run_id() != options_.identity.run_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gossip for run ", QuoteForLog(req.run_id()), "; this node is in run ",
        QuoteForLog(options_.identity.run_id)));
  }
  if (req.from() == options_.node_id) {
    return absl::AlreadyExistsError("this is the node itself");
  }
  std::vector<MembershipChange> changes;
  absl::Status s =
      membership_->Merge(ToVector(req.members()), absl::Now(), &changes);
  if (absl::IsResourceExhausted(s)) {
    // This node's table is full of live members: not the caller's fault,
    // and it still gets this node's view.
    if (!warned_table_full_.exchange(true)) {
      STARLING_LOG(WARNING) << s.message();
    }
    s = absl::OkStatus();
  }
  ReportChanges(changes);
  if (!changes.empty()) {
    absl::MutexLock lock(&coord_->mu);
    coord_->cv.Signal();
  }
  for (const MemberEntry& e : membership_->Snapshot()) {
    *resp->add_members() = e;
  }
  return s;
}

void Swarm::GossipTo(const std::vector<std::string>& addresses,
                     absl::Duration timeout,
                     std::vector<MembershipChange>* changes) {
  GossipRequest req;
  req.set_run_id(options_.identity.run_id);
  req.set_from(options_.node_id);
  for (const MemberEntry& e : membership_->Snapshot()) *req.add_members() = e;
  struct Call {
    std::string address;
    std::shared_ptr<Stub> stub;
    grpc::ClientContext ctx;
    GossipResponse resp;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (const std::string& address : addresses) {
    if (address == this->address() || Blocked(address)) continue;
    calls.push_back(std::make_unique<Call>());
    calls.back()->address = address;
  }
  absl::BlockingCounter pending(static_cast<int>(calls.size()));
  for (const std::unique_ptr<Call>& call : calls) {
    Call& c = *call;
    c.ctx.set_deadline(Deadline(timeout));
    options_.credentials.Sign(&c.ctx, "Gossip");
    c.stub = StubFor(c.address);
    control_bytes_ += static_cast<int64_t>(req.ByteSizeLong());
    c.stub->stub->async()->Gossip(&c.ctx, &req, &c.resp,
                                  [&pending, &c](grpc::Status s) {
                                    c.status = std::move(s);
                                    pending.DecrementCount();
                                  });
  }
  pending.Wait();
  for (const std::unique_ptr<Call>& c : calls) {
    if (c->status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      absl::MutexLock lock(&state_mu_);
      self_seeds_.insert(c->address);  // this node under another name
    } else {
      transport_->rpc_errors().Record(c->status.error_code());
    }
    if (c->status.ok()) {
      (void)membership_->Merge(ToVector(c->resp.members()), absl::Now(),
                               changes);
    }
  }
}

void Swarm::GossipLoop() {
  std::mt19937_64 rng(std::hash<std::string>()(options_.node_id) ^
                      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  // Each call waits at most this long, and all run at once: a hung peer
  // (stopped, or behind a black hole) must not hold up the heartbeats that
  // tell the others this node is alive.
  const absl::Duration call_timeout =
      std::min(absl::Seconds(1), options_.suspect_after / 4);
  absl::Time last_tick = absl::InfinitePast();
  absl::Duration last_calls = absl::ZeroDuration();
  while (!stopping_.load()) {
    ReadPartitionFile();
    membership_->Beat();
    // The time since the last tick beyond the sleep and the calls was a
    // pause of this process: nobody's silence then counts against them.
    const absl::Time now = absl::Now();
    if (last_tick != absl::InfinitePast()) {
      membership_->ForgivePause(now - last_tick - options_.gossip_interval -
                                    std::min(last_calls, call_timeout),
                                now);
    }
    last_tick = now;
    std::vector<MembershipChange> changes;
    membership_->Tick(now, &changes);
    // Two random live peers, plus (rarely) a suspected or seed address so
    // that partitions and lost seeds heal.
    std::vector<MemberEntry> table = membership_->Snapshot();
    std::vector<std::string> live, others;
    for (const MemberEntry& e : table) {
      if (e.id() == options_.node_id) continue;
      if (e.state() == peer::v1::MEMBER_ALIVE) {
        live.push_back(e.address());
      } else if (e.state() != peer::v1::MEMBER_LEFT) {
        others.push_back(e.address());
      }
    }
    std::shuffle(live.begin(), live.end(), rng);
    std::vector<std::string> targets(
        live.begin(), live.begin() + std::min<size_t>(2, live.size()));
    std::uniform_int_distribution<int> coin(0, 9);
    // Half the ticks also try one member this node thinks is gone (every
    // tick three, while nobody is live): after a partition heals, that is
    // how both sides learn to refute.
    if (!others.empty() && (live.empty() || coin(rng) < 5)) {
      std::shuffle(others.begin(), others.end(), rng);
      targets.insert(targets.end(), others.begin(),
                     others.begin() +
                         std::min<size_t>(live.empty() ? 3 : 1, others.size()));
    }
    // With nobody live, often; otherwise every ~2 s: a seed that is not a
    // live member's address (a DNS name), so that swarms founded apart
    // (seeds that could not see each other at start) meet and merge.
    if (!options_.seeds.empty() && coin(rng) < (live.empty() ? 3 : 1)) {
      const std::string& seed = options_.seeds[rng() % options_.seeds.size()];
      if (!IsSelfSeed(seed) &&
          std::find(live.begin(), live.end(), seed) == live.end()) {
        targets.push_back(seed);
      }
    }
    const absl::Time calls_start = absl::Now();
    GossipTo(targets, call_timeout, &changes);
    last_calls = absl::Now() - calls_start;
    ReportChanges(changes);
    if (!changes.empty()) {
      absl::MutexLock lock(&coord_->mu);
      coord_->cv.Signal();
    }
    CancelAttemptIfDue();
    absl::SleepFor(options_.gossip_interval);
  }
}

void Swarm::CancelAttemptIfDue() {
  const bool interrupted = options_.interrupted && options_.interrupted();
  std::map<std::string, MemberEntry> live;
  for (const MemberEntry& e : membership_->Live()) live[e.id()] = e;
  auto entry = [&](const std::string& id) -> const MemberEntry* {
    auto it = live.find(id);
    return it == live.end() ? nullptr : &it->second;
  };
  absl::MutexLock lock(&inbox_->mu);
  if (inbox_->running_mailbox == nullptr ||
      inbox_->running_mailbox->cancelled()) {
    return;
  }
  const std::vector<std::string>& members = inbox_->running_members;
  const std::vector<int64_t>& incarnations = inbox_->running_incarnations;
  std::string why = interrupted ? "this node is stopping" : "";
  for (size_t i = 0; i < members.size() && why.empty(); ++i) {
    why = GoneSincePlan(
        members[i], entry(members[i]),
        incarnations.size() == members.size() ? incarnations[i] : -1);
  }
  if (why.empty()) {
    const std::string& coordinator = inbox_->running_coordinator;
    why = GoneSincePlan(coordinator, entry(coordinator), -1);
  }
  if (why.empty()) return;
  const std::string what =
      absl::StrCat("round ", inbox_->round, " attempt ",
                   inbox_->running_attempt, " called off here: ", why);
  STARLING_LOG(WARNING) << what;
  inbox_->running_mailbox->Cancel(absl::AbortedError(what));
}

std::map<std::string, int64_t> Swarm::refusals() const {
  const std::shared_ptr<PeerRateLimiter>& limit =
      options_.credentials.rate_limit;
  return {{"rate_limit", limit != nullptr ? limit->refused() : 0},
          {"stream_limit", deadlines_->refused()},
          {"stream_cancelled", deadlines_->cancelled()}};
}

void Swarm::ReportChanges(const std::vector<MembershipChange>& changes) {
  for (const MembershipChange& c : changes) {
    // A copy per sender ever heard from would grow with churn.
    if (c.to == peer::v1::MEMBER_DEAD || c.to == peer::v1::MEMBER_LEFT) {
      push_copies_.Forget(c.id);
    }
  }
  if (!options_.on_member_change) return;
  for (const MembershipChange& c : changes) options_.on_member_change(c);
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

void Swarm::Leave() {
  membership_->Leave();
  GossipToEveryone();
}

void Swarm::GossipToEveryone() {
  std::vector<std::string> live;
  for (const MemberEntry& e : membership_->Snapshot()) {
    if (e.id() != options_.node_id && IsLive(e)) live.push_back(e.address());
  }
  GossipTo(live, absl::Seconds(1), /*changes=*/nullptr);
}

absl::StatusOr<ControlAck> Swarm::SendControl(const std::string& to_id,
                                              const ControlMessage& m) {
  if (to_id == options_.node_id) return OnControl(m);
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
    options_.credentials.Sign(&ctx, "Control");
    control_bytes_ += static_cast<int64_t>(m.ByteSizeLong());
    s = StubFor(e->address())->stub->Control(&ctx, m, &ack);
    transport_->rpc_errors().Record(s.error_code());
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

std::vector<absl::StatusOr<ControlAck>> Swarm::SendControls(
    absl::Span<const std::pair<std::string, ControlMessage>> msgs) {
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

ControlAck Swarm::OnControl(const ControlMessage& m) {
  ControlAck ack;
  ack.set_accepted(true);
  if (std::string bad = OutOfRange(m); !bad.empty()) {
    ack.set_accepted(false);
    ack.set_reason(absl::StrCat(options_.node_id,
                                " refused a round message from ",
                                QuoteForLog(m.from()), ": ", bad));
    return ack;
  }
  switch (m.kind()) {
    case ControlMessage::READY:
    case ControlMessage::DONE:
    case ControlMessage::FAILED: {
      // Only members speak in a round. A READY from an id this node does
      // not know (yet) is resent every two seconds, so refusing it delays
      // a member still unknown here by at most that. The culprit a FAILED
      // names must be a member too: otherwise any caller could bar a
      // member from a round at no cost to itself.
      auto unknown = [this](const std::string& id) {
        return !membership_->Get(id).ok();
      };
      const std::string* stranger =
          unknown(m.from())                              ? &m.from()
          : !m.culprit().empty() && unknown(m.culprit()) ? &m.culprit()
                                                         : nullptr;
      if (stranger != nullptr) {
        ack.set_accepted(false);
        ack.set_reason(absl::StrCat(options_.node_id, " knows no member ",
                                    QuoteForLog(*stranger)));
        return ack;
      }
      Coordinator& c = *coord_;
      absl::MutexLock lock(&c.mu);
      // DONE and FAILED of the running attempt count only from its members.
      const bool in_plan =
          std::find(c.plan.begin(), c.plan.end(), m.from()) != c.plan.end();
      auto reply = [&](ControlMessage::Kind kind) {
        ControlMessage r;
        r.set_run_id(options_.identity.run_id);
        r.set_from(options_.node_id);
        r.set_kind(kind);
        r.set_round(m.round());
        c.outbox.emplace_back(m.from(), r);
      };
      if (m.kind() == ControlMessage::READY) {
        if (m.round() <= c.committed ||
            Ahead({c.round, c.lineage, c.member_rounds},
                  {m.round(), m.lineage(), m.member_rounds()})) {
          reply(ControlMessage::STALE);
        } else if (std::string alone = AloneAhead(m, c.round); !alone.empty()) {
          ack.set_accepted(false);
          ack.set_reason(std::move(alone));
          return ack;
        } else {
          if (m.round() > c.round || m.lineage() != c.lineage) {
            // A newer round (or a better lineage of this one): whoever is
            // ready on the old one is behind.
            for (const auto& [id, addr] : c.ready) {
              ControlMessage r;
              r.set_run_id(options_.identity.run_id);
              r.set_from(options_.node_id);
              r.set_kind(ControlMessage::STALE);
              r.set_round(c.round);
              c.outbox.emplace_back(id, r);
            }
            if (c.running) {
              for (const std::string& id : c.plan) {
                ControlMessage r;
                r.set_run_id(options_.identity.run_id);
                r.set_from(options_.node_id);
                r.set_kind(ControlMessage::ABORT);
                r.set_round(c.round);
                r.set_attempt(c.attempt);
                c.outbox.emplace_back(id, r);
              }
            }
            c.round = m.round();
            c.lineage = m.lineage();
            c.member_rounds = m.member_rounds();
            c.ready.clear();
            c.excluded.clear();
            c.banned.clear();
            c.running = false;
            c.replan_now = false;
            c.hold_after_abort = false;
            c.attempt = 0;
            c.out_of_attempts = false;
            c.aborted = 0;
            c.next_plan_at = absl::InfinitePast();
            c.first_ready = absl::Now();
          }
          c.attempt = std::max(c.attempt, m.last_attempt());
          if (c.banned.count(m.from())) {
            // Sits this round out; it catches up once the round commits.
            c.cv.Signal();
            return ack;
          }
          if (c.ready.empty()) c.first_ready = absl::Now();
          c.excluded.erase(m.from());
          std::string addr =
              m.addresses_size() > 0 ? m.addresses(0) : std::string();
          c.ready[m.from()] = addr;
        }
      } else if (m.kind() == ControlMessage::DONE) {
        if (c.running && in_plan && m.round() == c.round &&
            m.attempt() == c.attempt) {
          c.done.insert(m.from());
        }
      } else {
        if (c.running && in_plan && m.round() == c.round &&
            m.attempt() == c.attempt) {
          c.abort = true;
          c.abort_reason = absl::StrCat(m.from(), " failed: ", m.unreachable());
        }
        if (m.round() == c.round && !m.culprit().empty() &&
            m.culprit() != m.from() && !c.banned.count(m.culprit())) {
          // One of the two is faulty (or lying): neither takes part in the
          // rest of this round, so a hostile member can neither stall the
          // round by resending bad data nor exclude others for free. This
          // holds even when the attempt it failed was already called off
          // (the culprit's own failure often arrives first).
          STARLING_LOG(WARNING)
              << "round " << c.round << ": " << m.from()
              << " refused invalid data from " << m.culprit()
              << "; both sit out the rest of round " << c.round;
          for (const std::string& id : {m.culprit(), m.from()}) {
            c.banned.insert(id);
            c.excluded.insert(id);
            c.ready.erase(id);
            if (c.running &&
                std::find(c.plan.begin(), c.plan.end(), id) != c.plan.end()) {
              c.abort = true;
              c.abort_reason = absl::StrCat(id, " sits out round ", c.round);
            }
          }
        }
      }
      c.cv.Signal();
      return ack;
    }
    case ControlMessage::PLAN: {
      absl::MutexLock lock(&inbox_->mu);
      std::string coordinator = CoordinatorId();
      if (inbox_->messages.size() >= kMaxInboxMessages) {
        ack.set_accepted(false);
        ack.set_reason(InboxFull());
      } else if (m.round() != inbox_->round) {
        ack.set_accepted(false);
        ack.set_reason(absl::StrCat(options_.node_id,
                                    " is not waiting for round ", m.round(),
                                    " (at ", inbox_->round, ")"));
      } else if (m.from() != coordinator) {
        ack.set_accepted(false);
        ack.set_reason(absl::StrCat(options_.node_id, " follows coordinator ",
                                    coordinator, ", not ", m.from()));
        ack.set_follows(coordinator);
      } else {
        if (inbox_->running_mailbox != nullptr &&
            m.attempt() > inbox_->running_attempt) {
          inbox_->running_mailbox->Cancel(absl::AbortedError(absl::StrCat(
              "attempt ", inbox_->running_attempt, " superseded")));
        }
        inbox_->messages.push_back(m);
      }
      return ack;
    }
    case ControlMessage::COMMIT:
    case ControlMessage::ABORT:
    case ControlMessage::STALE: {
      // Coordinators send these; a member heeds them only from the one it
      // follows (SyncRound), but holds them from any member until then.
      if (!membership_->Get(m.from()).ok()) {
        ack.set_accepted(false);
        ack.set_reason(absl::StrCat(options_.node_id, " knows no member ",
                                    QuoteForLog(m.from())));
        return ack;
      }
      absl::MutexLock lock(&inbox_->mu);
      if (inbox_->messages.size() >= kMaxInboxMessages) {
        ack.set_accepted(false);
        ack.set_reason(InboxFull());
        return ack;
      }
      if (m.kind() == ControlMessage::ABORT &&
          inbox_->running_mailbox != nullptr && m.round() == inbox_->round &&
          m.attempt() == inbox_->running_attempt &&
          m.from() == inbox_->running_coordinator) {
        inbox_->running_mailbox->Cancel(absl::AbortedError(
            absl::StrCat("round ", m.round(), " attempt ", m.attempt(),
                         " called off by the coordinator")));
      }
      inbox_->messages.push_back(m);
      return ack;
    }
    default:
      ack.set_accepted(false);
      ack.set_reason(absl::StrCat(
          options_.node_id, " refused a round message of unknown kind ",
          static_cast<int>(m.kind()), " from ", QuoteForLog(m.from())));
      return ack;
  }
}

bool Swarm::Vouched(int64_t round,
                    const std::map<std::string, MemberEntry>& live) const {
  int others = 0;
  for (const auto& [id, e] : live) {
    if (e.round() < round) continue;
    if (id == options_.node_id || ++others >= 2) return true;
  }
  return false;
}

std::string Swarm::AloneAhead(const ControlMessage& ready,
                              int64_t coordinated) const {
  // A READY for the round after this coordinator's (or an earlier one) is
  // the usual progression. One further ahead is real when members went on
  // under another coordinator while this one was away, and then this node
  // or another member is there too (this node, once it has caught up).
  // Taken on one member's word, it would move the coordinator to any round
  // that member names: every honest READY would then hear STALE and find
  // nobody ahead to catch up from, for good.
  // This node's own progress needs nobody to vouch for it (one that
  // resumes alone from its checkpoint at round 5, say).
  if (ready.round() <= coordinated + 1 || ready.from() == options_.node_id) {
    return "";
  }
  int64_t self_round = -1;
  for (const MemberEntry& e : membership_->Live()) {
    if (e.id() == options_.node_id) self_round = e.round();
    if (e.id() != ready.from() && e.round() >= ready.round()) return "";
  }
  return absl::StrCat(options_.node_id, " is at round ", self_round,
                      " and no member but ", QuoteForLog(ready.from()),
                      " is at round ", ready.round(), " yet");
}

std::string Swarm::InboxFull() const {
  return absl::StrCat(options_.node_id, " holds ", kMaxInboxMessages,
                      " round messages its training thread has not taken yet");
}

void Swarm::CoordinatorLoop() {
  Coordinator& c = *coord_;
  while (!stopping_.load()) {
    std::vector<std::pair<std::string, ControlMessage>> outbox;
    std::vector<std::pair<std::string, ControlMessage>> plans;
    {
      absl::MutexLock lock(&c.mu);
      c.cv.WaitWithTimeout(&c.mu, absl::Milliseconds(50));
      if (stopping_.load()) break;
      auto msg = [&](ControlMessage::Kind kind) {
        ControlMessage r;
        r.set_run_id(options_.identity.run_id);
        r.set_from(options_.node_id);
        r.set_kind(kind);
        r.set_round(c.round);
        r.set_attempt(c.attempt);
        return r;
      };
      std::map<std::string, MemberEntry> live;
      for (const MemberEntry& e : membership_->Live()) live[e.id()] = e;
      if (c.running) {
        for (size_t i = 0; i < c.plan.size(); ++i) {
          const std::string& id = c.plan[i];
          auto it = live.find(id);
          std::string why =
              GoneSincePlan(id, it == live.end() ? nullptr : &it->second,
                            c.plan_incarnations[i]);
          if (!why.empty()) {
            c.abort = true;
            c.abort_reason = std::move(why);
            c.excluded.insert(id);
          }
        }
        if (!c.abort && absl::Now() - c.plan_started > options_.rpc_timeout) {
          c.abort = true;
          c.abort_reason = "it ran past --round_timeout";
        }
        if (c.abort) {
          STARLING_LOG(WARNING) << "round " << c.round << " attempt "
                                << c.attempt << " aborted: " << c.abort_reason;
          for (const std::string& id : c.plan) {
            outbox.emplace_back(id, msg(ControlMessage::ABORT));
          }
          for (const std::string& id : c.excluded) c.ready.erase(id);
          c.running = false;
          c.abort = false;
          c.replan_now = !c.hold_after_abort;
          c.hold_after_abort = false;
          if (++c.aborted >= 2) {
            c.next_plan_at =
                absl::Now() +
                std::min(absl::Milliseconds(100) *
                             (int64_t{1} << std::min(c.aborted - 2, 6)),
                         absl::Seconds(5));
          }
        } else if (c.done.size() == c.plan.size()) {
          CrashPoint("commit");
          for (const std::string& id : c.plan) {
            outbox.emplace_back(id, msg(ControlMessage::COMMIT));
          }
          std::set<std::string> in_plan(c.plan.begin(), c.plan.end());
          for (const auto& [id, addr] : c.ready) {
            if (!in_plan.count(id)) {
              outbox.emplace_back(id, msg(ControlMessage::STALE));
            }
          }
          c.committed = c.round;
          c.ready.clear();
          c.running = false;
          c.plan.clear();
        }
      }
      // A live member (this node or another) has moved past the round the
      // others are ready for: an earlier coordinator committed it and died
      // before telling them all, or this node was cut off (stopped, starved)
      // while the rest went on. The ready ones must catch up with that
      // commit, not run the round again among themselves (two different
      // models for one round). Only the coordinator decides this: any other
      // node's ready set is left over from a time it was taken for the
      // coordinator.
      // A round that neither this node nor two other members have reached
      // (AloneAhead's rule): a READY took this coordinator there on the word
      // of gossiped rounds that have changed since (a false entry, say).
      // After kUnvouchedGrace of that it forgets the round and the READYs
      // for it; members that really are there resend theirs every 2 s.
      if (!c.running && c.round > c.committed &&
          CoordinatorId() == options_.node_id && !Vouched(c.round, live)) {
        if (c.unvouched_since == absl::InfiniteFuture()) {
          c.unvouched_since = absl::Now();
        } else if (absl::Now() - c.unvouched_since > kUnvouchedGrace) {
          STARLING_LOG(WARNING)
              << "round " << c.round << ": neither this node nor two "
              << "other members are at it any more (" << c.ready.size()
              << " ready for it); back to round " << c.committed + 1;
          c.round = c.committed;
          c.lineage.clear();
          c.member_rounds = 0;
          c.ready.clear();
          c.excluded.clear();
          c.banned.clear();
          c.unvouched_since = absl::InfiniteFuture();
        }
      } else {
        c.unvouched_since = absl::InfiniteFuture();
      }
      const MemberEntry* ahead = nullptr;
      if (!c.running && !c.ready.empty() && c.round > c.committed &&
          CoordinatorId() == options_.node_id) {
        for (const auto& [id, e] : live) {
          if (e.state() == peer::v1::MEMBER_ALIVE && !e.joining() &&
              e.round() > c.round) {
            ahead = &e;
            break;
          }
        }
      }
      if (ahead != nullptr) {
        STARLING_LOG(INFO) << "round " << c.round
                           << " was committed without its ready members ("
                           << c.ready.size() << "): " << ahead->id()
                           << " is at round " << ahead->round()
                           << "; they catch up";
        for (const auto& [id, addr] : c.ready) {
          outbox.emplace_back(id, msg(ControlMessage::STALE));
        }
        c.committed = c.round;
        c.ready.clear();
      }
      if (!c.running && !c.ready.empty() && c.round > c.committed) {
        for (auto it = c.ready.begin(); it != c.ready.end();) {
          auto l = live.find(it->first);
          it = (l == live.end() || c.excluded.count(it->first))
                   ? c.ready.erase(it)
                   : std::next(it);
        }
        int waiting = 0;
        for (const auto& [id, e] : live) {
          // Every member not ahead of this round: those behind in this
          // node's table may only be slow to gossip, and those truly behind
          // turn to joining (not waited for) once they learn it.
          // Joiners too: one that fetched this round's state takes part
          // in it (bounded by the deadline like everyone).
          if (!c.ready.count(id) && !c.excluded.count(id) &&
              e.state() == peer::v1::MEMBER_ALIVE && e.round() <= c.round) {
            ++waiting;
          }
        }
        const bool due = absl::Now() - c.first_ready >= options_.round_deadline;
        const bool plan_now = !c.ready.empty() &&
                              (waiting == 0 || due || c.replan_now) &&
                              absl::Now() >= c.next_plan_at;
        if (plan_now && c.attempt + 1 >= kAttemptsPerRound) {
          if (!c.out_of_attempts) {
            c.out_of_attempts = true;
            STARLING_LOG(ERROR)
                << "round " << c.round << ": every attempt number up to "
                << c.attempt << " is taken; this coordinator plans no more "
                << "attempts of it";
          }
        } else if (plan_now) {
          ++c.attempt;
          c.plan.clear();
          c.plan_addresses.clear();
          c.plan_incarnations.clear();
          for (const auto& [id, addr] : c.ready) {
            c.plan.push_back(id);
            c.plan_addresses.push_back(live[id].address());
            c.plan_incarnations.push_back(live[id].incarnation());
          }
          c.done.clear();
          c.running = true;
          c.plan_started = absl::Now();
          c.replan_now = false;
          ControlMessage p = msg(ControlMessage::PLAN);
          p.set_lineage(c.lineage);
          for (size_t i = 0; i < c.plan.size(); ++i) {
            p.add_members(c.plan[i]);
            p.add_addresses(c.plan_addresses[i]);
            p.add_incarnations(c.plan_incarnations[i]);
          }
          for (const std::string& id : c.plan) plans.emplace_back(id, p);
        }
      }
      // Replies queued by the handlers go first.
      outbox.insert(outbox.begin(), c.outbox.begin(), c.outbox.end());
      c.outbox.clear();
    }
    // Members at once. The messages up to the first COMMIT to another
    // member go first, so that a crash right after it (commit_partial)
    // leaves the rest uncommitted.
    size_t first_commit = outbox.size();
    for (size_t i = 0; i < outbox.size(); ++i) {
      if (outbox[i].second.kind() == ControlMessage::COMMIT &&
          outbox[i].first != options_.node_id) {
        first_commit = i;
        break;
      }
    }
    const absl::Span<const std::pair<std::string, ControlMessage>> all(outbox);
    if (first_commit < outbox.size()) {
      (void)SendControls(all.subspan(0, first_commit + 1));
      CrashPoint("commit_partial");
      (void)SendControls(all.subspan(first_commit + 1));
    } else {
      (void)SendControls(all);
    }
    // Plans need every member's acceptance; every member that refused (or
    // could not be reached) is dealt with in this attempt.
    const std::vector<absl::StatusOr<ControlAck>> acks = SendControls(plans);
    for (size_t i = 0; i < plans.size(); ++i) {
      const std::string& to = plans[i].first;
      const ControlMessage& m = plans[i].second;
      const absl::StatusOr<ControlAck>& ack = acks[i];
      if (!ack.ok() || !ack->accepted()) {
        STARLING_LOG(INFO) << "plan for round " << m.round() << " attempt "
                           << m.attempt() << " refused by " << to << ": "
                           << (ack.ok() ? ack->reason()
                                        : std::string(ack.status().message()));
        absl::MutexLock lock(&c.mu);
        if (c.running && c.round == m.round() && c.attempt == m.attempt()) {
          if (!c.abort) c.abort_reason = absl::StrCat(to, " refused the plan");
          c.abort = true;
          c.ready.erase(to);
          if (ack.ok() && !ack->follows().empty()) {
            // Alive, but it takes another member for the coordinator: the
            // views differ for a gossip interval or two (this node was
            // suspected while it was stopped, say). Running the round
            // without it could make two models of one round if its
            // coordinator runs the round too. Wait for its READY (sent
            // when it takes this node for the coordinator), for a member
            // seen past the round, or for the deadline.
            c.hold_after_abort = true;
          } else {
            // Unreachable or not ready: left out of this round; it resends
            // READY if it still wants in.
            c.excluded.insert(to);
          }
        }
      }
    }
  }
}

absl::StatusOr<Swarm::RoundResult> Swarm::SyncRound(
    const Lineage& at, const Reduce& reduce,
    const std::function<bool()>& stop) {
  const int64_t round = at.round;
  {
    absl::MutexLock lock(&inbox_->mu);
    inbox_->round = round;
    // Messages of earlier rounds are moot now.
    std::deque<ControlMessage> keep;
    for (ControlMessage& m : inbox_->messages) {
      if (m.round() == round) keep.push_back(std::move(m));
    }
    inbox_->messages.swap(keep);
  }
  SetCrashRound(round);
  CrashPoint("ready");
  int last_attempt = 0;
  int done_attempt = -1;
  std::vector<std::string> done_members;
  std::string done_coordinator;
  std::string sent_to;
  absl::Time sent_at = absl::InfinitePast();
  // Since when the coordinator of the attempt done here is past this round.
  absl::Time coordinator_past = absl::InfiniteFuture();
  auto send_ready = [&] {
    sent_to = CoordinatorId();
    sent_at = absl::Now();
    ControlMessage m;
    m.set_run_id(options_.identity.run_id);
    m.set_from(options_.node_id);
    m.set_kind(ControlMessage::READY);
    m.set_round(round);
    m.set_lineage(at.lineage);
    m.set_member_rounds(at.member_rounds);
    m.set_last_attempt(last_attempt);
    m.add_addresses(address());
    absl::StatusOr<ControlAck> ack = SendControl(sent_to, m);
    if (!ack.ok()) {
      STARLING_LOG(INFO) << "READY to " << sent_to << ": " << ack.status();
    }
  };
  // Leaves the round: `stop` said so.
  auto stopped = [this] {
    RoundResult res;
    res.outcome = Outcome::kStopped;
    absl::MutexLock lock(&inbox_->mu);
    inbox_->round = -1;
    return res;
  };
  send_ready();
  while (true) {
    ControlMessage m;
    bool have = false;
    {
      absl::MutexLock lock(&inbox_->mu);
      auto nonempty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(inbox_->mu) {
        return !inbox_->messages.empty();
      };
      inbox_->mu.AwaitWithTimeout(absl::Condition(&nonempty),
                                  absl::Milliseconds(100));
      if (!inbox_->messages.empty()) {
        m = std::move(inbox_->messages.front());
        inbox_->messages.pop_front();
        have = true;
      }
    }
    if (have && m.round() == round) {
      switch (m.kind()) {
        case ControlMessage::PLAN: {
          if (m.attempt() <= last_attempt) break;
          // Told to leave at once: no new attempt (its plan is left to fail
          // as any member's departure fails it). Checked here too, since
          // plans that keep coming would otherwise never let the loop reach
          // the check below.
          if (stop && stop()) {
            STARLING_LOG(INFO)
                << "round " << round << ": not taking part in "
                << "attempt " << m.attempt() << ": this node is stopping";
            return stopped();
          }
          last_attempt = m.attempt();
          done_attempt = -1;
          std::vector<std::string> members(m.members().begin(),
                                           m.members().end());
          std::vector<std::string> addresses(m.addresses().begin(),
                                             m.addresses().end());
          int rank = static_cast<int>(
              std::find(members.begin(), members.end(), options_.node_id) -
              members.begin());
          if (rank >= static_cast<int>(members.size())) break;
          MailboxOptions mo = options_.mailbox;
          mo.first_round = round * kAttemptsPerRound + m.attempt();
          mo.plan = PlanDigest(m);
          transport_->InstallRound(addresses, rank, mo, members);
          {
            absl::MutexLock lock(&inbox_->mu);
            inbox_->running_attempt = m.attempt();
            inbox_->running_mailbox = &transport_->mailbox();
            inbox_->running_members = members;
            inbox_->running_incarnations.assign(m.incarnations().begin(),
                                                m.incarnations().end());
            inbox_->running_coordinator = m.from();
            // An ABORT may have arrived before the mailbox existed.
            for (const ControlMessage& q : inbox_->messages) {
              if (q.kind() == ControlMessage::ABORT &&
                  q.attempt() == m.attempt() && q.round() == round) {
                inbox_->running_mailbox->Cancel(
                    absl::AbortedError("called off"));
              }
            }
          }
          absl::Status s = reduce(*transport_, mo.first_round, members);
          bool cancelled;
          {
            absl::MutexLock lock(&inbox_->mu);
            cancelled = inbox_->running_mailbox->cancelled();
            inbox_->running_attempt = -1;
            inbox_->running_mailbox = nullptr;
            inbox_->running_members.clear();
            inbox_->running_incarnations.clear();
          }
          ControlMessage r;
          r.set_run_id(options_.identity.run_id);
          r.set_from(options_.node_id);
          r.set_round(round);
          r.set_attempt(m.attempt());
          if (s.ok()) {
            CrashPoint("done");
            done_attempt = m.attempt();
            done_members = members;
            done_coordinator = m.from();
            r.set_kind(ControlMessage::DONE);
            (void)SendControl(m.from(), r);
          } else if (!cancelled) {
            STARLING_LOG(WARNING) << "round " << round << " attempt "
                                  << m.attempt() << " failed: " << s;
            r.set_kind(ControlMessage::FAILED);
            r.set_unreachable(std::string(s.message()));
            if (int bad = BlamedRank(s);
                bad >= 0 && bad < static_cast<int>(members.size()) &&
                bad != rank) {
              r.set_culprit(members[bad]);
            }
            (void)SendControl(m.from(), r);
            // An emulated link that cannot carry this run's messages fails
            // every attempt alike: stop instead of retrying forever.
            if (absl::Status link = LinkError(); !link.ok()) {
              absl::MutexLock lock(&inbox_->mu);
              inbox_->round = -1;
              return link;
            }
          }
          break;
        }
        // COMMIT, ABORT and STALE count only from the coordinator that
        // planned the attempt or was last sent READY: another node's view
        // of the round (one this node once took for the coordinator, say)
        // is not the swarm's decision.
        case ControlMessage::COMMIT:
          if (m.attempt() == done_attempt && m.from() == done_coordinator) {
            RoundResult res;
            res.outcome = Outcome::kCommitted;
            res.members = done_members;
            res.attempt = done_attempt;
            absl::MutexLock lock(&inbox_->mu);
            inbox_->round = -1;
            return res;
          }
          break;
        case ControlMessage::ABORT:
          if (m.attempt() == done_attempt && m.from() == done_coordinator) {
            done_attempt = -1;
          }
          break;
        case ControlMessage::STALE: {
          if (m.from() != sent_to) {
            STARLING_LOG(INFO)
                << "round " << round << ": ignoring STALE from " << m.from()
                << " (READY went to " << sent_to << ")";
            break;
          }
          RoundResult res;
          res.outcome = Outcome::kStale;
          absl::MutexLock lock(&inbox_->mu);
          inbox_->round = -1;
          return res;
        }
        default:
          break;
      }
      continue;
    }
    if (stopping_.load()) {
      return absl::CancelledError("the swarm is shutting down");
    }
    // Waiting for a plan, or with its part done for the coordinator's
    // decision: either way `stop` leaves the round at once. After DONE the
    // others may still commit the attempt without this node, which keeps
    // its state from before the round.
    if (stop && stop()) {
      if (done_attempt >= 0) {
        STARLING_LOG(WARNING)
            << "round " << round << ": stopping with attempt " << done_attempt
            << " done but not yet committed by " << done_coordinator;
      }
      return stopped();
    }
    // The coordinator went past this round and its COMMIT or ABORT for this
    // node's attempt never came (lost while this node was stopped, say):
    // ask again, and hear STALE. A COMMIT merely late by then is ignored;
    // the catch-up fetches the same model.
    if (done_attempt >= 0) {
      absl::StatusOr<MemberEntry> e = membership_->Get(done_coordinator);
      if (!e.ok() || e->state() != peer::v1::MEMBER_ALIVE ||
          e->round() <= round) {
        coordinator_past = absl::InfiniteFuture();
      } else if (coordinator_past == absl::InfiniteFuture()) {
        coordinator_past = absl::Now();
      } else if (absl::Now() - coordinator_past > absl::Seconds(2)) {
        STARLING_LOG(INFO) << "round " << round << ": " << done_coordinator
                           << " is at round " << e->round()
                           << " without a word about attempt " << done_attempt
                           << "; asking again";
        done_attempt = -1;
        coordinator_past = absl::InfiniteFuture();
        send_ready();
        continue;
      }
    }
    // Resend READY when the coordinator changed (it died or a partition
    // healed) and, while waiting for a plan, every two seconds in case it
    // was lost.
    const std::string coordinator = CoordinatorId();
    if (coordinator != sent_to ||
        (done_attempt < 0 && absl::Now() - sent_at > absl::Seconds(2))) {
      if (done_attempt >= 0 && coordinator != sent_to &&
          coordinator != done_coordinator) {
        done_attempt = -1;  // the old coordinator is gone: start over
      }
      send_ready();
    }
  }
}

absl::StatusOr<SwarmState> Swarm::FetchState(
    const std::vector<std::string>& donors, const Lineage* at_least,
    absl::Time deadline, FetchStats* stats) {
  const absl::Time start = absl::Now();
  StateAssembler assembler(
      MaxStateBytesFor(options_.identity.model.parameters()));
  std::string last_error = "no donors";
  int retries = 0;
  // What this call took and retried, added to *stats on either way out.
  auto account = [&] {
    if (stats == nullptr) return;
    stats->seconds += absl::ToDoubleSeconds(absl::Now() - start);
    stats->retries += retries;
  };
  for (size_t i = 0; i < donors.size() && absl::Now() < deadline; ++i) {
    absl::StatusOr<MemberEntry> e = membership_->Get(donors[i]);
    if (!e.ok() || Blocked(e->address())) continue;
    int corrupt_retries = 0;
    while (absl::Now() < deadline) {
      StateRequest req;
      req.set_run_id(options_.identity.run_id);
      req.set_from(options_.node_id);
      req.set_offset(assembler.next_offset());
      req.set_digest(assembler.digest());
      if (at_least != nullptr) {
        req.set_round(at_least->round);
        req.set_lineage(at_least->lineage);
        req.set_member_rounds(at_least->member_rounds);
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      options_.credentials.Sign(&ctx, "FetchState");
      std::unique_ptr<grpc::ClientReader<StateChunk>> reader =
          StubFor(e->address())->stub->FetchState(&ctx, req);
      StateChunk chunk;
      absl::Status bad;
      bool any = false;  // chunks in this call
      while (reader->Read(&chunk)) {
        any = true;
        if (stats) stats->bytes += static_cast<int64_t>(chunk.data().size());
        bad = assembler.Add(chunk.digest(), chunk.total_bytes(), chunk.offset(),
                            chunk.data(), chunk.checksum());
        if (!bad.ok()) break;
      }
      if (!bad.ok()) {
        ctx.TryCancel();
        (void)reader->Finish();
        STARLING_LOG(WARNING) << "state chunk from " << donors[i] << ": " << bad
                              << "; fetching again";
        ++retries;
        last_error = std::string(bad.message());
        if (++corrupt_retries > 3) break;
        continue;  // same donor, from next_offset()
      }
      grpc::Status s = reader->Finish();
      transport_->rpc_errors().Record(s.error_code());
      if (assembler.complete()) {
        absl::StatusOr<SwarmState> state = assembler.Finish();
        if (state.ok() && at_least != nullptr &&
            Ahead(*at_least,
                  {state->round, state->lineage, state->member_rounds})) {
          last_error = absl::StrCat(donors[i], " serves round ", state->round,
                                    ", behind round ", at_least->round);
          break;  // the next donor
        }
        if (state.ok()) {
          account();
          if (stats) stats->donor = donors[i];
          return state;
        }
        last_error = std::string(state.status().message());
        ++retries;
        if (++corrupt_retries > 3) break;
        continue;
      }
      last_error = absl::StrCat(
          donors[i], ": ", s.ok() ? "stream ended early" : s.error_message());
      if (!any && s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        // Refused before any byte (its state has not reached the round
        // asked for, is on a losing lineage, or is another run's): the
        // next donor, but no transfer broke off.
        STARLING_LOG(INFO) << "state from " << last_error;
        break;
      }
      STARLING_LOG(WARNING) << "state transfer from " << donors[i]
                            << " broke off at byte " << assembler.next_offset()
                            << ": " << last_error << "; trying the next donor";
      ++retries;
      break;
    }
  }
  account();
  return absl::UnavailableError(
      absl::StrCat("state transfer failed from every donor (",
                   absl::StrJoin(donors, ", "), "): ", last_error));
}

}  // namespace starling
