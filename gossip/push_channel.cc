#include "gossip/push_channel.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/crash_point.h"

namespace starling {

using peer::v1::MemberEntry;
using peer::v1::PushAck;
using peer::v1::PushChunk;

// Receives one push: checks every chunk as it arrives (PushAssembler), then
// deposits the whole push in the inbox. Never blocks: the inbox place was
// reserved when the stream started.
class PushChannel::Reader : public grpc::ServerReadReactor<PushChunk> {
 public:
  Reader(PushChannel* channel, grpc::CallbackServerContext* ctx, PushAck* ack)
      : channel_(channel),
        options_(channel->options_),
        ctx_(ctx),
        ack_(ack),
        assembler_(options_.run_id, options_.push_elements, options_.push_codec,
                   options_.push_codec ? options_.push_codec->MaxEncodedBytes(
                                             options_.push_elements)
                                       : 0) {
    if (grpc::Status a = channel->client_->credentials().Admit(ctx, "Push");
        !a.ok()) {
      End(a);
      return;
    }
    if (options_.push_elements <= 0) {
      End(grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat(options_.node_id, " does not take pushes (algorithm ",
                       options_.algo, ")")));
      return;
    }
    ticket_ = channel_->inbox_.Reserve();
    if (ticket_ < 0) {
      End(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat(options_.node_id, "'s push inbox is full")));
      return;
    }
    // A push that stalls is cancelled, so no inbox place is held forever.
    absl::StatusOr<std::unique_ptr<StreamDeadlines::Watched>> watch =
        channel_->deadlines_->Watch(ctx, "Push", options_.push_timeout);
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
      Deposit();  // the sender is done (or the stream was cancelled)
      return;
    }
    watch_->Progress();
    channel_->received_ += static_cast<int64_t>(chunk_.ByteSizeLong());
    // The first chunk names the sender (the assembler holds the rest to
    // it): an impostor is refused before its model streams in.
    if (first_chunk_) {
      first_chunk_ = false;
      if (grpc::Status a = channel_->client_->credentials().CheckCaller(
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
    if (ticket_ >= 0) channel_->inbox_.End(ticket_, nullptr);
    delete this;
  }

 private:
  // The whole push is in: checks it and deposits it.
  void Deposit() {
    absl::StatusOr<ReceivedPush> push = assembler_.Finish();
    if (!push.ok()) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       std::string(push.status().message())));
      return;
    }
    // Only another member's model is averaged in (and kept as a copy: one
    // per made-up sender would grow without bound).
    if (push->from == options_.node_id ||
        !channel_->membership_->Get(push->from).ok()) {
      End(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat(options_.node_id,
                                    " takes pushes only from "
                                    "other members it knows, not from ",
                                    QuoteForLog(push->from))));
      return;
    }
    if (absl::Status s = channel_->copies_.Resolve(*push); !s.ok()) {
      End(grpc::Status(absl::IsFailedPrecondition(s)
                           ? grpc::StatusCode::FAILED_PRECONDITION
                           : grpc::StatusCode::INVALID_ARGUMENT,
                       std::string(s.message())));
      return;
    }
    ack_->set_inbox(1);
    channel_->inbox_.End(ticket_, &*push);
    ticket_ = -1;
    Finish(grpc::Status::OK);
  }
  // Ends the stream with an error; a refused push is counted and logged.
  void End(grpc::Status status) {
    channel_->refused_.fetch_add(1);
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      STARLING_LOG(WARNING) << "refused a push: " << status.error_message();
    }
    if (ticket_ >= 0) channel_->inbox_.End(ticket_, nullptr);
    ticket_ = -1;
    Finish(status);
  }

  PushChannel* const channel_;
  const Options& options_;
  grpc::CallbackServerContext* ctx_;  // valid until OnDone
  PushAck* ack_;
  int64_t ticket_ = -1;  // the inbox place held, while one is
  std::unique_ptr<StreamDeadlines::Watched> watch_;
  PushAssembler assembler_;
  PushChunk chunk_;
  bool first_chunk_ = true;
};

PushChannel::PushChannel(Options options, const Membership* membership,
                         SwarmClient* client,
                         std::shared_ptr<StreamDeadlines> deadlines)
    : options_(std::move(options)),
      membership_(membership),
      client_(client),
      deadlines_(std::move(deadlines)),
      inbox_(options_.push_inbox) {}

grpc::ServerReadReactor<PushChunk>* PushChannel::Receive(
    grpc::CallbackServerContext* ctx, PushAck* ack) {
  return new Reader(this, ctx, ack);
}

absl::Status PushChannel::Push(const std::string& peer_id,
                               const PushShare& share, absl::Duration timeout,
                               int64_t* sequence) {
  absl::StatusOr<MemberEntry> e = membership_->Get(peer_id);
  if (!e.ok()) {
    return absl::UnavailableError(absl::StrCat(peer_id, " is unknown"));
  }
  if (e->state() != peer::v1::MEMBER_ALIVE) {
    return absl::UnavailableError(absl::StrCat(peer_id, " is not alive"));
  }
  if (client_->Blocked(e->address())) {
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
    STARLING_ASSIGN_OR_RETURN(
        chunk_bytes, ChunkBytes(peer_id, e->address(), *link, share, timeout));
  }
  const int64_t seq = sequence_.fetch_add(1) + 1;
  std::vector<PushChunk> chunks = MakePushChunks(
      options_.run_id, options_.node_id, seq, share, elements, chunk_bytes);
  const absl::Time deadline = absl::Now() + timeout;
  if (link != nullptr) {
    if (absl::Status ls = link->StartMessage(deadline); !ls.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "push to ", peer_id, " at ", e->address(), ": ", ls.message()));
    }
  }
  STARLING_RETURN_IF_ERROR(
      Stream(peer_id, e->address(), link, chunks, deadline));
  if (sequence != nullptr) *sequence = seq;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PushChannel::ChunkBytes(const std::string& peer_id,
                                                const std::string& address,
                                                const LinkShaper& link,
                                                const PushShare& share,
                                                absl::Duration timeout) {
  StreamLimits limits;
  limits.idle = deadlines_->idle();
  limits.stream = options_.push_timeout;
  limits.stream_flag = "--gossip_timeout";
  limits.sender = timeout;
  limits.sender_flag = "--gossip_timeout";
  absl::StatusOr<int64_t> c = options_.links->ChunkBytes(
      link, address, static_cast<int64_t>(share.payload.size()),
      options_.chunk_bytes, limits);
  if (!c.ok()) {
    return absl::Status(
        c.status().code(),
        absl::StrCat("push to ", peer_id, ": ", c.status().message()));
  }
  return c;
}

absl::Status PushChannel::Stream(const std::string& peer_id,
                                 const std::string& address, LinkShaper* link,
                                 const std::vector<PushChunk>& chunks,
                                 absl::Time deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  client_->credentials().Sign(&ctx, "Push");
  PushAck ack;
  std::unique_ptr<grpc::ClientWriter<PushChunk>> writer =
      client_->StubFor(address)->Push(&ctx, &ack);
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
    sent_ += bytes;
    if (!writer->Write(chunks[i])) break;  // Finish says why
  }
  if (chunks.size() == 1) CrashPoint("push_mid_stream");
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!shaped.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "push to ", peer_id, " at ", address, ": ", shaped.message()));
  }
  client_->rpc_errors().Record(s.error_code());
  if (s.ok()) return absl::OkStatus();
  const std::string why = absl::StrCat("push to ", peer_id, " at ", address,
                                       ": ", s.error_message());
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

}  // namespace starling
