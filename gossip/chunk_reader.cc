#include "gossip/chunk_reader.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/grpc_status.h"
#include "gossip/protocol.h"

namespace starling {

using peer::v1::SendAck;
using peer::v1::TensorChunk;

AttemptFit FitAttempt(int64_t round, int64_t current, int64_t window) {
  if (round < current) return AttemptFit::kStale;
  if (round == current) return AttemptFit::kCurrent;
  return round > current + window ? AttemptFit::kTooFarAhead
                                  : AttemptFit::kEarly;
}

namespace {

absl::Status AttemptOver(int64_t round, int64_t current) {
  return absl::FailedPreconditionError(
      absl::StrCat("attempt ", round, " is over; this node is at ", current));
}

// Calls fn(p, n) on the pieces of bytes [start, start + len) of `buffer`,
// straight from gRPC's slices. Internal when the buffer cannot be read or
// is shorter; fn's first error.
template <typename Fn>
absl::Status ForEachPiece(grpc::ByteBuffer& buffer, size_t start, size_t len,
                          Fn fn) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) {
    return absl::InternalError("cannot read a chunk's bytes");
  }
  for (const grpc::Slice& slice : slices) {
    if (len == 0) break;
    const char* p = reinterpret_cast<const char*>(slice.begin());
    size_t n = slice.size();
    if (start >= n) {
      start -= n;
      continue;
    }
    p += start;
    n = std::min(n - start, len);
    start = 0;
    len -= n;
    STARLING_RETURN_IF_ERROR(fn(p, n));
  }
  if (len != 0) return absl::InternalError("a chunk is shorter than said");
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPlan(const Message& m, const MailboxOptions& o) {
  if (m.plan == o.plan) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("message from rank ", m.from, " of attempt ", m.round,
                   " belongs to another plan of that attempt (",
                   absl::Hex(m.plan), "; this node runs ", absl::Hex(o.plan),
                   "): another coordinator numbered its attempt alike"));
}

absl::Status CheckSender(const PeerCredentials& credentials,
                         const std::vector<std::string>& ids,
                         const std::vector<std::string>& names,
                         const Message& m) {
  if (!credentials.bind_node_ids) return absl::OkStatus();
  const std::string what =
      absl::StrCat("tensor chunks from rank ", m.from, " of attempt ", m.round);
  if (m.from < 0 || m.from >= static_cast<int>(ids.size())) {
    return absl::PermissionDeniedError(
        absl::StrCat(what,
                     ": this node knows no member id at that rank "
                     "(--tls_bind_node_ids)"));
  }
  return FromGrpc(credentials.CheckNames(names, ids[m.from], what));
}

absl::Status CheckFirstChunk(
    const TensorChunk& chunk, const AttemptView& attempt,
    const std::function<absl::Status(const Message&)>& check_sender,
    StreamHead* head) {
  const MailboxOptions& o = *attempt.options;
  if (chunk.run_id() != o.run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk for run '", chunk.run_id(),
                     "'; this node is in run '", o.run_id, "'"));
  }
  Message& m = head->message;
  m.from = chunk.from_rank();
  m.round = chunk.round();
  const AttemptFit fit = attempt.exact_round
                             ? FitAttempt(m.round, attempt.round, kEarlyWindow)
                             : AttemptFit::kCurrent;
  // Elastic rounds: one mailbox per attempt; an older one is over.
  if (fit == AttemptFit::kStale) return AttemptOver(m.round, attempt.round);
  if (fit == AttemptFit::kTooFarAhead) {
    return absl::UnavailableError(
        absl::StrCat("attempt ", m.round, " is too far ahead"));
  }
  // A sender a little ahead (this node has not installed that attempt
  // yet): its message is held until it does (AttemptRouter::Place), if
  // this node was sent the attempt's plan. Without it nothing can be
  // checked: the sender retries, as when it is too far ahead.
  head->early = fit == AttemptFit::kEarly;
  if (head->early && attempt.planned == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("attempt ", m.round, " is not planned here yet"));
  }
  const MailboxOptions& checked = head->early ? attempt.planned->options : o;
  m.plan = chunk.plan();
  // The sender is checked before its first byte is taken.
  STARLING_RETURN_IF_ERROR(CheckPlan(m, checked));
  STARLING_RETURN_IF_ERROR(check_sender(m));
  m.tensor = chunk.tensor();
  m.phase = static_cast<RingPhase>(chunk.phase());
  m.step = chunk.step();
  m.segment = chunk.segment();
  m.total_elements = chunk.total_elements();
  head->segment_bytes = chunk.segment_bytes();
  // Refuse impossible sizes before buffering anything; Deliver checks the
  // exact size.
  const int64_t max_bytes = MaxMessageBytes(checked, m.tensor, false);
  if (max_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message from rank ", m.from, ": unknown tensor '", m.tensor, "'"));
  }
  head->may_claim =
      !head->early && !o.compressed_bytes_per_element.count(m.tensor);
  if (head->segment_bytes < 0 || head->segment_bytes > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("message from rank ", m.from, ": announces ",
                     head->segment_bytes, " bytes for one segment of '",
                     m.tensor, "'; at most ", max_bytes, " fit"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameMessage(const TensorChunk& chunk, const Message& m) {
  if (chunk.from_rank() != m.from || chunk.round() != m.round ||
      chunk.tensor() != m.tensor || chunk.step() != m.step ||
      chunk.segment() != m.segment) {
    return absl::InvalidArgumentError(
        absl::StrCat("message from rank ", m.from,
                     ": a chunk's header changed in the middle of a stream"));
  }
  return absl::OkStatus();
}

absl::Status CheckChunkBounds(const TensorChunk& chunk, uint32_t data_len,
                              int64_t chunks, int64_t received,
                              const StreamHead& head) {
  const int from = head.message.from;
  const int64_t expected = head.segment_bytes;
  if (chunks > expected / kMinChunkBytes + 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("message from rank ", from, ": ", chunks, " chunks for ",
                     expected, " bytes; at most ", chunks - 1, " (one per ",
                     kMinChunkBytes, " bytes, plus 2)"));
  }
  if (chunk.offset() != received || received + data_len > expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "message from rank ", from, ": chunk at offset ", chunk.offset(),
        " with ", data_len, " bytes does not continue the ", received, " of ",
        expected, " bytes received"));
  }
  return absl::OkStatus();
}

std::optional<absl::Status> RejectionToRecord(const absl::Status& why,
                                              bool header_seen, bool early,
                                              bool blame_sender) {
  if (!header_seen || early || absl::IsUnavailable(why) ||
      absl::IsFailedPrecondition(why) || absl::IsPermissionDenied(why)) {
    return std::nullopt;
  }
  return blame_sender ? why : absl::AbortedError(why.message());
}

int64_t EarlyBytesPerSender(const MailboxOptions& o) {
  int64_t largest = 0;
  for (const auto& [tensor, elements] : o.tensors) {
    largest = std::max(largest, MaxMessageBytes(o, tensor, /*any_world=*/true));
  }
  return 2 * largest;
}

bool ParseChunk(grpc::ByteBuffer* buffer, TensorChunk* header,
                ChunkFrame* frame) {
  grpc::ProtoBufferReader reader(buffer);
  google::protobuf::io::CodedInputStream in(&reader);
  in.SetTotalBytesLimit(INT_MAX);
  std::string fields;
  frame->data_len = 0;
  {
    google::protobuf::io::StringOutputStream hs(&fields);
    google::protobuf::io::CodedOutputStream hout(&hs);
    while (true) {
      const uint32_t tag = in.ReadTag();
      if (tag == 0) break;
      if (tag == kChunkDataTag) {
        if (!in.ReadVarint32(&frame->data_len)) return false;
        break;
      }
      if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag,
                                                                 &hout)) {
        return false;
      }
    }
  }
  header->Clear();
  if (!header->ParseFromString(fields)) return false;
  frame->data_start = static_cast<size_t>(in.CurrentPosition());
  return true;
}

absl::Status SinkFeeder::Feed(const char* p, size_t n) {
  if (!carry_.empty()) {
    const size_t take = std::min(4 - carry_.size(), n);
    carry_.append(p, take);
    p += take;
    n -= take;
    if (carry_.size() < 4) return absl::OkStatus();
    STARLING_RETURN_IF_ERROR(sink_->Apply(applied_, carry_));
    ++applied_;
    carry_.clear();
  }
  const size_t whole = n / 4 * 4;
  if (whole > 0) {
    STARLING_RETURN_IF_ERROR(
        sink_->Apply(applied_, absl::string_view(p, whole)));
    applied_ += static_cast<int64_t>(whole / 4);
  }
  carry_.append(p + whole, n - whole);
  return absl::OkStatus();
}

AttemptRouter::Attempt AttemptRouter::Current() const {
  absl::MutexLock lock(&mu_);
  return Attempt{mailbox_, exact_round_, ids_};
}

void AttemptRouter::Install(std::shared_ptr<Mailbox> mailbox, bool exact_round,
                            std::vector<std::string> ids) {
  absl::MutexLock lock(&mu_);
  mailbox_ = std::move(mailbox);
  exact_round_ = exact_round;
  ids_ = std::make_shared<const std::vector<std::string>>(std::move(ids));
  // Early messages of this attempt go in now (Deliver records a refusal
  // against its sender: the attempt is the installed one now, and the
  // sender passed its plan's checks); older ones are moot.
  const int64_t current = mailbox_->round();
  std::vector<Early> keep;
  early_bytes_ = 0;
  early_by_sender_.clear();
  for (Early& e : early_) {
    if (e.m.round == current) {
      absl::Status s = DeliverNow(std::move(e.m), e.names);
      if (!s.ok()) {
        LogRefusal("chunk_refused", "",
                   absl::StrCat("rejected: ", s.message()));
      }
    } else if (e.m.round > current) {
      const int64_t size = static_cast<int64_t>(e.m.payload.size());
      early_bytes_ += size;
      early_by_sender_[{e.m.round, e.m.from}] += size;
      keep.push_back(std::move(e));
    }
  }
  early_.swap(keep);
  planned_.erase(planned_.begin(), planned_.upper_bound(current));
}

void AttemptRouter::Expect(PlannedAttempt planned) {
  const int64_t round = planned.options.first_round;
  absl::MutexLock lock(&mu_);
  if (mailbox_ != nullptr && round <= mailbox_->round()) return;
  planned_[round] = std::make_shared<const PlannedAttempt>(std::move(planned));
  while (planned_.size() > kPlannedAttempts) planned_.erase(planned_.begin());
}

std::shared_ptr<const PlannedAttempt> AttemptRouter::Planned(
    int64_t round) const {
  absl::MutexLock lock(&mu_);
  auto it = planned_.find(round);
  return it == planned_.end() ? nullptr : it->second;
}

absl::Status AttemptRouter::EarlyRoom(int64_t round, int from, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  return EarlyRoomLocked(round, from, bytes);
}

absl::Status AttemptRouter::EarlyRoomLocked(int64_t round, int from,
                                            int64_t bytes) {
  auto planned = planned_.find(round);
  if (planned == planned_.end()) {
    return absl::UnavailableError(
        absl::StrCat("attempt ", round, " is not planned here (any more)"));
  }
  const int64_t per_sender = EarlyBytesPerSender(planned->second->options);
  auto sender = early_by_sender_.find({round, from});
  const int64_t held = sender == early_by_sender_.end() ? 0 : sender->second;
  if (held + bytes <= per_sender && early_bytes_ + bytes <= kEarlyBytes) {
    return absl::OkStatus();
  }
  ++early_refused_;
  return absl::UnavailableError(
      absl::StrCat("early messages from rank ", from, " of attempt ", round,
                   ": ", held + bytes, " bytes would exceed the ", per_sender,
                   " held per sender (or ", kEarlyBytes, " in all); retry"));
}

int64_t AttemptRouter::early_bytes() const {
  absl::MutexLock lock(&mu_);
  return early_bytes_;
}

absl::Status AttemptRouter::Place(Message m, std::vector<std::string> names) {
  absl::MutexLock lock(&mu_);
  const int64_t current = mailbox_->round();
  switch (FitAttempt(m.round, current, kEarlyWindow)) {
    case AttemptFit::kCurrent:
      return DeliverNow(std::move(m), names);
    case AttemptFit::kStale:
      return AttemptOver(m.round, current);
    case AttemptFit::kEarly:
    case AttemptFit::kTooFarAhead:  // it was not when its stream began
      break;
  }
  const int64_t size = static_cast<int64_t>(m.payload.size());
  STARLING_RETURN_IF_ERROR(EarlyRoomLocked(m.round, m.from, size));
  early_bytes_ += size;
  early_by_sender_[{m.round, m.from}] += size;
  early_.push_back(Early{std::move(m), std::move(names)});
  return absl::OkStatus();
}

absl::Status AttemptRouter::DeliverNow(Message m,
                                       const std::vector<std::string>& names) {
  STARLING_RETURN_IF_ERROR(CheckPlan(m, mailbox_->options()));
  STARLING_RETURN_IF_ERROR(CheckSender(*ids_, names, m));
  return mailbox_->Deliver(std::move(m));
}

absl::Status AttemptRouter::CheckSender(const std::vector<std::string>& ids,
                                        const std::vector<std::string>& names,
                                        const Message& m) const {
  return starling::CheckSender(credentials_, ids, names, m);
}

namespace {

// Assembles one stream of chunks into a Message (see the file comment).
class ChunkReader : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  ChunkReader(IncomingStream stream, grpc::ByteBuffer* ack)
      : router_(stream.router),
        mailbox_(std::move(stream.attempt.mailbox)),
        exact_round_(stream.attempt.exact_round),
        ids_(std::move(stream.attempt.ids)),
        names_(std::move(stream.names)),
        peer_host_(std::move(stream.peer_host)),
        ack_(ack),
        watch_(std::move(stream.watch)) {
    if (!stream.admitted.ok()) {
      Finish(stream.admitted);
      return;
    }
    if (mailbox_ == nullptr) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "this node has not joined its peers yet"));
      return;
    }
    StartRead(&buffer_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Complete();
      return;
    }
    if (watch_) watch_->Progress();
    absl::Status s = Absorb();
    if (!s.ok()) {
      Reject(s);
      return;
    }
    // The whole segment is in: answer now rather than after one more read
    // for the stream's end (a step less for every message).
    if (received_ == head_.segment_bytes) {
      Complete();
      return;
    }
    StartRead(&buffer_);
  }

  void OnDone() override {
    watch_.reset();  // waits out a cancellation in flight
    delete this;
  }

 private:
  // Takes buffer_: the header fields into chunk_, checked, and `data`,
  // which must come last, into the message.
  absl::Status Absorb() {
    router_->AddReceived(static_cast<int64_t>(buffer_.Length()));
    const int named = header_seen_ ? head_.message.from : -1;
    auto malformed = [named] {
      return absl::InvalidArgumentError(
          absl::StrCat("message from rank ", named, ": a malformed chunk"));
    };
    ChunkFrame frame;
    if (!ParseChunk(&buffer_, &chunk_, &frame)) return malformed();
    STARLING_RETURN_IF_ERROR(CheckChunk(frame.data_len));
    // Nothing may follow `data`.
    if (frame.data_start + frame.data_len != buffer_.Length()) {
      return malformed();
    }
    if (frame.data_len > 0) {
      STARLING_RETURN_IF_ERROR(MaybeClaimSink());
      if (sink_.has_value()) {
        absl::Status s = ForEachPiece(
            buffer_, frame.data_start, frame.data_len,
            [this](const char* p, size_t n) { return sink_->Feed(p, n); });
        if (!s.ok()) return Located(s);
      } else if (!Buffer(frame)) {
        return malformed();
      }
    }
    received_ += frame.data_len;
    return absl::OkStatus();
  }

  // The header checks of chunk_, which carries `data_len` bytes.
  absl::Status CheckChunk(uint32_t data_len) {
    if (!header_seen_) {
      header_seen_ = true;
      if (exact_round_) planned_ = router_->Planned(chunk_.round());
      const AttemptView attempt{&mailbox_->options(), mailbox_->round(),
                                exact_round_, planned_.get()};
      STARLING_RETURN_IF_ERROR(CheckFirstChunk(
          chunk_, attempt,
          [this](const Message& m) {
            return router_->CheckSender(head_.early ? planned_->ids : *ids_,
                                        names_, m);
          },
          &head_));
      if (head_.early) {
        STARLING_RETURN_IF_ERROR(router_->EarlyRoom(
            head_.message.round, head_.message.from, head_.segment_bytes));
      }
    } else {
      STARLING_RETURN_IF_ERROR(CheckSameMessage(chunk_, head_.message));
    }
    return CheckChunkBounds(chunk_, data_len, ++chunks_, received_, head_);
  }

  // A raw segment the collective waits for goes straight into its values
  // (reduced while it streams in); anything else is buffered whole and
  // delivered at the end. A message that began before the collective
  // expected it (this node reached the step late) switches to the sink as
  // soon as one waits: what is buffered so far is applied, the rest
  // streams in.
  absl::Status MaybeClaimSink() {
    if (sink_.has_value() || !head_.may_claim) return absl::OkStatus();
    std::shared_ptr<Sink> sink =
        mailbox_->ClaimSink(head_.message, head_.segment_bytes);
    if (sink == nullptr) return absl::OkStatus();
    sink_.emplace(std::move(sink));
    std::string& payload = head_.message.payload;
    absl::Status s = sink_->Feed(payload.data(), payload.size());
    std::string().swap(payload);
    return s.ok() ? s : Located(s);
  }

  // Appends the chunk's data to the buffered payload; false when its bytes
  // cannot be read.
  bool Buffer(const ChunkFrame& frame) {
    std::string& payload = head_.message.payload;
    if (payload.empty()) {
      payload.reserve(static_cast<size_t>(head_.segment_bytes));
    }
    return ForEachPiece(buffer_, frame.data_start, frame.data_len,
                        [&payload](const char* p, size_t n) {
                          payload.append(p, n);
                          return absl::OkStatus();
                        })
        .ok();
  }

  // `s`, saying which message it is about.
  absl::Status Located(const absl::Status& s) const {
    const Message& m = head_.message;
    return absl::Status(s.code(),
                        absl::StrCat("message from rank ", m.from, ": segment ",
                                     m.segment, " of '", m.tensor, "' round ",
                                     m.round, ": ", s.message()));
  }

  void Complete() {
    if (!header_seen_) {
      Reject(absl::InvalidArgumentError("empty chunk stream"));
      return;
    }
    if (received_ != head_.segment_bytes) {
      Reject(
          absl::InvalidArgumentError(absl::StrCat(
              "message from rank ", head_.message.from, ": stream ended after ",
              received_, " of ", head_.segment_bytes, " bytes")),
          /*blame=*/false);
      return;
    }
    const int64_t bytes = head_.segment_bytes;
    Message& m = head_.message;
    absl::Status s = sink_.has_value() ? mailbox_->DeliverApplied(std::move(m))
                     : exact_round_    ? router_->Place(std::move(m), names_)
                                       : mailbox_->Deliver(std::move(m));
    if (!s.ok()) {
      if (!absl::IsUnavailable(s)) {
        LogRefusal("chunk_refused", peer_host_,
                   absl::StrCat("rejected: ", s.message()));
      }
      Finish(ToGrpc(s));
      return;
    }
    SendAck ack;
    ack.set_bytes_received(bytes);
    bool own = false;
    Finish(grpc::SerializationTraits<SendAck>::Serialize(ack, ack_, &own));
  }

  // Refuses the stream with `s`, recording it against the sender as
  // RejectionToRecord says (`blame`: the sender is at fault).
  void Reject(const absl::Status& s, bool blame = true) {
    // Unavailable: an elastic peer ahead of this node retries; not news.
    if (!absl::IsUnavailable(s)) {
      LogRefusal("chunk_refused", peer_host_,
                 absl::StrCat("rejected: ", s.message()));
      if (head_.early) router_->CountEarlyRefused();
    }
    if (std::optional<absl::Status> record =
            RejectionToRecord(s, header_seen_, head_.early, blame)) {
      mailbox_->RecordRejection(head_.message.from, *record);
    }
    Finish(ToGrpc(s));
  }

  AttemptRouter* const router_;
  const std::shared_ptr<Mailbox> mailbox_;
  const bool exact_round_;
  // The members' ids by rank when the stream began, and the names in the
  // caller's certificate (empty unless ids are bound).
  const std::shared_ptr<const std::vector<std::string>> ids_;
  const std::vector<std::string> names_;
  const std::string peer_host_;
  // The planned attempt the first chunk names, if any (see AttemptView).
  std::shared_ptr<const PlannedAttempt> planned_;
  grpc::ByteBuffer* const ack_;
  std::unique_ptr<StreamDeadlines::Watched> watch_;
  grpc::ByteBuffer buffer_;
  TensorChunk chunk_;  // the header fields of the last chunk
  StreamHead head_;    // the message, once the first chunk is checked
  bool header_seen_ = false;
  int64_t received_ = 0;  // payload bytes so far
  int64_t chunks_ = 0;    // chunks so far
  // Set when the collective's values take the chunks (Mailbox::Expect).
  std::optional<SinkFeeder> sink_;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* ReadChunks(IncomingStream stream,
                                                      grpc::ByteBuffer* ack) {
  return new ChunkReader(std::move(stream), ack);
}

}  // namespace starling
