#include "gossip/grpc_transport.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/crash_point.h"
#include "gossip/protocol.h"
#include "starling/peer/v1/peer.grpc.pb.h"

namespace starling {
namespace {

using peer::v1::HandshakeRequest;
using peer::v1::HandshakeResponse;
using peer::v1::SendAck;
using peer::v1::TensorChunk;

grpc::StatusCode ToGrpc(absl::StatusCode code) {
  return static_cast<grpc::StatusCode>(static_cast<int>(code));
}

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  return absl::ToChronoTime(t);
}

// OK when message `m` belongs to the plan of the attempt that `o` installs.
// A chunk of another plan under the same sequence number (another
// coordinator's attempt, numbered alike) is refused as not this node's
// attempt: FailedPrecondition, never blamed on the member at that rank here.
absl::Status CheckPlan(const Message& m, const MailboxOptions& o) {
  if (m.plan == o.plan) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("message from rank ", m.from, " of attempt ", m.round,
                   " belongs to another plan of that attempt (",
                   absl::Hex(m.plan), "; this node runs ", absl::Hex(o.plan),
                   "): another coordinator numbered its attempt alike"));
}

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Cuts a message's payload into serialized TensorChunks: the header fields,
// then field `data`'s key and length, then the bytes (the wire format
// protobuf writes: `data` is last). With an `owner` of the payload's
// memory, a chunk's bytes go out from where they lie, in a slice that
// holds a reference to `owner` for as long as gRPC keeps it; without one,
// they are copied once into a slice that gRPC owns.
class ChunkSerializer {
 public:
  // `owner` (may be null) must outlive the serializer.
  ChunkSerializer(TensorChunk header, absl::string_view payload,
                  const std::shared_ptr<const void>& owner, size_t step)
      : header_(std::move(header)),
        payload_(payload),
        owner_(owner),
        step_(step) {}

  // The next chunk into *out; returns its size in bytes on the wire.
  int64_t Next(grpc::ByteBuffer* out) {
    const size_t len = std::min(step_, payload_.size() - offset_);
    header_.set_offset(static_cast<int64_t>(offset_));
    std::string head = header_.SerializeAsString();
    if (len > 0) {
      AppendVarint(kChunkDataTag, &head);
      AppendVarint(len, &head);
    }
    if (owner_ != nullptr && len > 0) {
      grpc::Slice slices[2] = {
          grpc::Slice(head),
          grpc::Slice(const_cast<char*>(payload_.data() + offset_), len,
                      &DropOwner, new std::shared_ptr<const void>(owner_))};
      grpc::ByteBuffer buffer(slices, 2);
      out->Swap(&buffer);
    } else {
      grpc::Slice slice(head.size() + len);
      uint8_t* dst = const_cast<uint8_t*>(slice.begin());
      std::memcpy(dst, head.data(), head.size());
      if (len > 0) {
        std::memcpy(dst + head.size(), payload_.data() + offset_, len);
      }
      grpc::ByteBuffer buffer(&slice, 1);
      out->Swap(&buffer);
    }
    offset_ += len;
    ++written_;
    return static_cast<int64_t>(head.size() + len);
  }
  // Whether every chunk has been cut (a message has at least one).
  bool done() const { return written_ > 0 && offset_ >= payload_.size(); }
  int written() const { return written_; }

 private:
  // A payload slice's destructor: gRPC is done with the bytes.
  static void DropOwner(void* owner) {
    delete static_cast<std::shared_ptr<const void>*>(owner);
  }

  TensorChunk header_;
  const absl::string_view payload_;
  const std::shared_ptr<const void>& owner_;
  const size_t step_;
  size_t offset_ = 0;
  int written_ = 0;
};

// One SendChunks call on gRPC's callback API. Chunk k+1 is serialized
// while chunk k is written, and written from k's completion; the last
// chunk closes the stream. Run() blocks until the call is over. (A
// std::mutex, as in gRPC's examples: OnDone touches nothing after its
// unlock, so Run's caller may destroy the writer as soon as Run returns.)
class ChunkWriter : public grpc::ClientWriteReactor<grpc::ByteBuffer> {
 public:
  ChunkWriter(ChunkSerializer* chunks, std::atomic<int64_t>* sent,
              bool crash_after_first)
      : chunks_(chunks), sent_(sent), crash_after_first_(crash_after_first) {}

  grpc::Status Run() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Prepare();
      WriteNext();
    }
    StartCall();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    return status_;
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return;                        // the stream failed; OnDone follows
    std::lock_guard<std::mutex> lock(mu_);  // WriteNext may still be cutting
    if (++completed_ == 1 && crash_after_first_) CrashPoint("send");
    if (!wrote_last_) WriteNext();
  }
  void OnDone(const grpc::Status& s) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = s;
    done_ = true;
    cv_.notify_one();
  }

 private:
  void Prepare() {
    next_bytes_ = chunks_->Next(&next_);
    next_last_ = chunks_->done();
  }
  void WriteNext() {
    current_.Swap(&next_);
    *sent_ += next_bytes_;
    if (next_last_) {
      wrote_last_ = true;
      StartWriteLast(&current_, grpc::WriteOptions());
    } else {
      StartWrite(&current_);
      Prepare();  // while current_ is on its way
    }
  }

  ChunkSerializer* const chunks_;
  std::atomic<int64_t>* const sent_;
  const bool crash_after_first_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  grpc::ByteBuffer current_, next_;
  int64_t next_bytes_ = 0;
  bool next_last_ = false;
  bool wrote_last_ = false;
  int completed_ = 0;
  bool done_ = false;
  grpc::Status status_;
};

// HTTP/2 settings for tensor streams (see GrpcTransport::Start).
constexpr int kMaxFrameBytes = (16 << 20) - 1;  // HTTP/2's largest frame
constexpr int kStreamWindowBytes = 16 << 20;

}  // namespace

void SetReconnectBackoff(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(
      GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
      static_cast<int>(absl::ToInt64Milliseconds(kMaxReconnectBackoff)));
}

// Server side: handshakes and chunk streams, on gRPC's callback threads.
// SendChunks is raw (ByteBuffer) so that a chunk's bytes are copied once,
// straight into the message.
class GrpcTransport::Service final
    : public peer::v1::Peer::WithRawCallbackMethod_SendChunks<
          peer::v1::Peer::CallbackService> {
 public:
  Service(const PeerIdentity& identity, const PeerCredentials& credentials,
          StreamDeadlines* deadlines, absl::Duration chunk_stream_deadline)
      : identity_(identity),
        credentials_(credentials),
        deadlines_(deadlines),
        chunk_stream_deadline_(chunk_stream_deadline) {}

  // `ids`: the members' node ids by rank, or empty (see InstallRound).
  void SetMailbox(std::shared_ptr<Mailbox> mailbox, int rank,
                  std::string address, bool exact_round,
                  std::vector<std::string> ids) {
    absl::MutexLock lock(&mu_);
    mailbox_ = std::move(mailbox);
    exact_round_ = exact_round;
    ids_ = std::make_shared<const std::vector<std::string>>(std::move(ids));
    // Early messages of this attempt go in now; older ones are moot.
    const int64_t current = mailbox_->round();
    std::vector<Early> keep;
    early_bytes_ = 0;
    for (Early& e : early_) {
      if (e.m.round == current) {
        absl::Status s = CheckPlan(e.m, mailbox_->options());
        if (s.ok()) s = CheckSender(*ids_, e.names, e.m);
        if (s.ok()) s = mailbox_->Deliver(std::move(e.m));
        if (!s.ok()) STARLING_LOG(WARNING) << "rejected: " << s.message();
      } else if (e.m.round > current) {
        early_bytes_ += static_cast<int64_t>(e.m.payload.size());
        keep.push_back(std::move(e));
      }
    }
    early_.swap(keep);
    rank_ = rank;
    address_ = std::move(address);
  }
  int64_t received() const { return received_.load(); }

  // Why this node refused the peer that listens on `address`, if it did.
  std::string Refusal(const std::string& address) {
    absl::MutexLock lock(&mu_);
    auto it = refused_.find(address);
    return it == refused_.end() ? "" : it->second;
  }

  grpc::ServerUnaryReactor* Handshake(grpc::CallbackServerContext* ctx,
                                      const HandshakeRequest* req,
                                      HandshakeResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    if (grpc::Status a = credentials_.Admit(ctx, "Handshake"); !a.ok()) {
      reactor->Finish(a);
      return reactor;
    }
    std::string why = HandshakeMismatch(*req, identity_);
    if (!why.empty()) {
      STARLING_LOG(WARNING) << "refused peer " << req->address() << ": " << why;
      {
        absl::MutexLock lock(&mu_);
        refused_[req->address()] = why;
      }
      reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, why));
      return reactor;
    }
    absl::MutexLock lock(&mu_);
    if (mailbox_ == nullptr) {
      // Started but not yet told its members and rank: the caller retries.
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "this node has not joined its peers yet"));
      return reactor;
    }
    resp->set_protocol_version(kProtocolVersion);
    resp->set_address(address_);
    resp->set_rank(rank_);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerReadReactor<grpc::ByteBuffer>* SendChunks(
      grpc::CallbackServerContext* ctx, grpc::ByteBuffer* ack) override {
    std::shared_ptr<Mailbox> mailbox;
    bool exact;
    std::shared_ptr<const std::vector<std::string>> ids;
    {
      absl::MutexLock lock(&mu_);
      mailbox = mailbox_;
      exact = exact_round_;
      ids = ids_;
    }
    grpc::Status admitted = credentials_.Admit(ctx, "SendChunks");
    std::unique_ptr<StreamDeadlines::Watched> watch;
    if (admitted.ok()) {
      absl::StatusOr<std::unique_ptr<StreamDeadlines::Watched>> w =
          deadlines_->Watch(ctx, "SendChunks", chunk_stream_deadline_);
      if (w.ok()) {
        watch = *std::move(w);
      } else {
        admitted = grpc::Status(ToGrpc(w.status().code()),
                                std::string(w.status().message()));
      }
    }
    std::vector<std::string> names;
    if (credentials_.bind_node_ids) names = PeerCredentials::CallerNames(*ctx);
    return new ChunkReader(this, std::move(mailbox), exact, std::move(ids),
                           std::move(names), ack, admitted, std::move(watch));
  }

 private:
  // With ids bound (--tls_bind_node_ids): OK when a caller whose
  // certificate carries `names` may send `m`, i.e. they name the member at
  // m's rank among `ids`; PermissionDenied otherwise.
  absl::Status CheckSender(const std::vector<std::string>& ids,
                           const std::vector<std::string>& names,
                           const Message& m) const {
    if (!credentials_.bind_node_ids) return absl::OkStatus();
    const std::string what = absl::StrCat("tensor chunks from rank ", m.from,
                                          " of attempt ", m.round);
    if (m.from < 0 || m.from >= static_cast<int>(ids.size())) {
      return absl::PermissionDeniedError(
          absl::StrCat(what,
                       ": this node knows no member id at that rank "
                       "(--tls_bind_node_ids)"));
    }
    return FromGrpc(credentials_.CheckNames(names, ids[m.from], what));
  }

  // Assembles one stream of chunks into a Message.
  class ChunkReader : public grpc::ServerReadReactor<grpc::ByteBuffer> {
   public:
    ChunkReader(Service* service, std::shared_ptr<Mailbox> mailbox,
                bool exact_round,
                std::shared_ptr<const std::vector<std::string>> ids,
                std::vector<std::string> names, grpc::ByteBuffer* ack,
                grpc::Status admitted,
                std::unique_ptr<StreamDeadlines::Watched> watch)
        : service_(service),
          mailbox_(std::move(mailbox)),
          exact_round_(exact_round),
          ids_(std::move(ids)),
          names_(std::move(names)),
          ack_(ack),
          watch_(std::move(watch)) {
      if (!admitted.ok()) {
        Finish(admitted);
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
      // The whole segment is in: answer now rather than after one more
      // read for the stream's end (a step less for every message).
      if (received_ == expected_bytes_) {
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
    // Parses buffer_: the header fields into chunk_ (with protobuf), and
    // `data`, which must come last, straight into the payload.
    absl::Status Absorb() {
      service_->received_ += static_cast<int64_t>(buffer_.Length());
      const absl::Status malformed = absl::InvalidArgumentError(absl::StrCat(
          "message from rank ", first_ ? -1 : m_.from, ": a malformed chunk"));
      grpc::ProtoBufferReader reader(&buffer_);
      google::protobuf::io::CodedInputStream in(&reader);
      in.SetTotalBytesLimit(INT_MAX);
      std::string header;
      uint32_t data_len = 0;
      {
        google::protobuf::io::StringOutputStream hs(&header);
        google::protobuf::io::CodedOutputStream hout(&hs);
        while (true) {
          const uint32_t tag = in.ReadTag();
          if (tag == 0) break;
          if (tag == kChunkDataTag) {
            if (!in.ReadVarint32(&data_len)) return malformed;
            break;
          }
          if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag,
                                                                     &hout)) {
            return malformed;
          }
        }
      }
      chunk_.Clear();
      if (!chunk_.ParseFromString(header)) return malformed;
      STARLING_RETURN_IF_ERROR(CheckHeader(data_len));
      const size_t start = static_cast<size_t>(in.CurrentPosition());
      // Nothing may follow `data`.
      if (start + data_len != buffer_.Length()) return malformed;
      // A raw segment the collective waits for goes straight into its
      // values (reduced while it streams in); anything else is buffered
      // whole and delivered at the end. A message that began before the
      // collective expected it (this node reached the step late) switches
      // to the sink as soon as one waits: what is buffered so far is
      // applied, the rest streams in.
      if (sink_ == nullptr && may_claim_ && data_len > 0) {
        sink_ = mailbox_->ClaimSink(m_, expected_bytes_);
        if (sink_ != nullptr) {
          absl::Status s = ApplyBytes(m_.payload.data(), m_.payload.size());
          std::string().swap(m_.payload);
          if (!s.ok()) return Located(s);
        }
      }
      if (data_len > 0 && sink_ != nullptr) {
        absl::Status s = ApplyToSink(start, data_len);
        if (!s.ok()) return Located(s);
      } else if (data_len > 0) {
        if (m_.payload.empty()) {
          m_.payload.reserve(static_cast<size_t>(expected_bytes_));
        }
        const size_t old = m_.payload.size();
        m_.payload.resize(old + data_len);
        if (!in.ReadRaw(&m_.payload[old], static_cast<int>(data_len))) {
          return malformed;
        }
      }
      received_ += data_len;
      return absl::OkStatus();
    }

    // `s`, saying which message it is about.
    absl::Status Located(const absl::Status& s) const {
      return absl::Status(
          s.code(), absl::StrCat("message from rank ", m_.from, ": segment ",
                                 m_.segment, " of '", m_.tensor, "' round ",
                                 m_.round, ": ", s.message()));
    }

    // Applies the next n bytes of the payload to sink_: the whole fp32
    // values at once, a value split between pieces through carry_.
    absl::Status ApplyBytes(const char* p, size_t n) {
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

    // Applies bytes [start, start + len) of buffer_ to sink_ straight from
    // gRPC's slices.
    absl::Status ApplyToSink(size_t start, size_t len) {
      std::vector<grpc::Slice> slices;
      if (!buffer_.Dump(&slices).ok()) {
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
        STARLING_RETURN_IF_ERROR(ApplyBytes(p, n));
      }
      if (len != 0) return absl::InternalError("a chunk is shorter than said");
      return absl::OkStatus();
    }

    // The checks of a chunk's header (in chunk_) that carries `data_len`
    // bytes of data.
    absl::Status CheckHeader(uint32_t data_len) {
      const MailboxOptions& o = mailbox_->options();
      if (first_) {
        first_ = false;
        if (chunk_.run_id() != o.run_id) {
          return absl::FailedPreconditionError(
              absl::StrCat("chunk for run '", chunk_.run_id(),
                           "'; this node is in run '", o.run_id, "'"));
        }
        m_.from = chunk_.from_rank();
        m_.round = chunk_.round();
        if (exact_round_ && m_.round < mailbox_->round()) {
          // Elastic rounds: one mailbox per attempt; this one is over.
          return absl::FailedPreconditionError(
              absl::StrCat("attempt ", m_.round, " is over; this node is at ",
                           mailbox_->round()));
        }
        // A sender a little ahead (this node has not installed that attempt
        // yet): keep the message until it does (see Service::Place).
        early_ = exact_round_ && m_.round > mailbox_->round();
        if (early_ && m_.round > mailbox_->round() + kEarlyWindow) {
          return absl::UnavailableError(
              absl::StrCat("attempt ", m_.round, " is too far ahead"));
        }
        m_.plan = chunk_.plan();
        // A sender of the installed attempt is checked before its first
        // byte is taken; an early one when its attempt is installed.
        if (!early_) {
          STARLING_RETURN_IF_ERROR(CheckPlan(m_, o));
          STARLING_RETURN_IF_ERROR(service_->CheckSender(*ids_, names_, m_));
        }
        m_.tensor = chunk_.tensor();
        m_.phase = static_cast<RingPhase>(chunk_.phase());
        m_.step = chunk_.step();
        m_.segment = chunk_.segment();
        m_.total_elements = chunk_.total_elements();
        expected_bytes_ = chunk_.segment_bytes();
        // Refuse impossible sizes before buffering anything. An early
        // message's member count is not known yet: bound it by the whole
        // tensor; Deliver checks the exact size later.
        const int64_t max_bytes = MaxMessageBytes(o, m_.tensor, early_);
        if (max_bytes < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("message from rank ", m_.from, ": unknown tensor '",
                           m_.tensor, "'"));
        }
        // Only a raw fp32 segment of the installed round can go into a
        // sink; decided once, not at every chunk.
        may_claim_ =
            !early_ && !o.compressed_bytes_per_element.count(m_.tensor);
        if (expected_bytes_ < 0 || expected_bytes_ > max_bytes) {
          return absl::InvalidArgumentError(
              absl::StrCat("message from rank ", m_.from, ": announces ",
                           expected_bytes_, " bytes for one segment of '",
                           m_.tensor, "'; at most ", max_bytes, " fit"));
        }
      } else if (chunk_.from_rank() != m_.from || chunk_.round() != m_.round ||
                 chunk_.tensor() != m_.tensor || chunk_.step() != m_.step ||
                 chunk_.segment() != m_.segment) {
        return absl::InvalidArgumentError(absl::StrCat(
            "message from rank ", m_.from,
            ": a chunk's header changed in the middle of a stream"));
      }
      // Every chunk but the last carries at least kMinChunkBytes (senders
      // use chunk_bytes >= 1 KiB): a flood of tiny or empty chunks is
      // refused, so a message takes a bounded number of chunks.
      if (++chunks_ > expected_bytes_ / kMinChunkBytes + 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "message from rank ", m_.from, ": ", chunks_, " chunks for ",
            expected_bytes_, " bytes; at most ", chunks_ - 1, " (one per ",
            kMinChunkBytes, " bytes, plus 2)"));
      }
      if (chunk_.offset() != received_ ||
          received_ + data_len > expected_bytes_) {
        return absl::InvalidArgumentError(
            absl::StrCat("message from rank ", m_.from, ": chunk at offset ",
                         chunk_.offset(), " with ", data_len,
                         " bytes does not continue the ", received_, " of ",
                         expected_bytes_, " bytes received"));
      }
      return absl::OkStatus();
    }

    void Complete() {
      if (first_) {
        Reject(absl::InvalidArgumentError("empty chunk stream"));
        return;
      }
      if (received_ != expected_bytes_) {
        // Also what a sender's cancelled attempt looks like: refused, but
        // not blamed on the sender (see BlameRank).
        Reject(absl::InvalidArgumentError(absl::StrCat(
                   "message from rank ", m_.from, ": stream ended after ",
                   received_, " of ", expected_bytes_, " bytes")),
               /*blame=*/false);
        return;
      }
      const int64_t bytes = expected_bytes_;
      absl::Status s = sink_ != nullptr
                           ? mailbox_->DeliverApplied(std::move(m_))
                       : exact_round_ ? service_->Place(std::move(m_), names_)
                                      : mailbox_->Deliver(std::move(m_));
      if (!s.ok()) {
        STARLING_LOG(WARNING) << "rejected: " << s.message();
        Finish(grpc::Status(ToGrpc(s.code()), std::string(s.message())));
        return;
      }
      SendAck ack;
      ack.set_bytes_received(bytes);
      bool own = false;
      grpc::Status serialized =
          grpc::SerializationTraits<SendAck>::Serialize(ack, ack_, &own);
      Finish(serialized);
    }

    // `blame`: the collective waiting for this message fails as for
    // invalid data from its sender (InvalidArgument, which the ring blames
    // on it); otherwise it fails as aborted.
    void Reject(const absl::Status& s, bool blame = true) {
      // Unavailable: an elastic peer ahead of this node retries; not news.
      if (!absl::IsUnavailable(s)) {
        STARLING_LOG(WARNING) << "rejected: " << s.message();
      }
      // A refused impostor (PermissionDenied) is not the member whose rank
      // it claimed.
      if (!first_ && !absl::IsUnavailable(s) &&
          !absl::IsFailedPrecondition(s) && !absl::IsPermissionDenied(s)) {
        mailbox_->RecordRejection(m_.from,
                                  blame ? s : absl::AbortedError(s.message()));
      }
      Finish(grpc::Status(ToGrpc(s.code()), std::string(s.message())));
    }

    Service* service_;
    std::shared_ptr<Mailbox> mailbox_;
    const bool exact_round_;
    // The members' ids by rank when the stream began, and the names in the
    // caller's certificate (empty unless ids are bound).
    const std::shared_ptr<const std::vector<std::string>> ids_;
    const std::vector<std::string> names_;
    grpc::ByteBuffer* ack_;
    std::unique_ptr<StreamDeadlines::Watched> watch_;
    grpc::ByteBuffer buffer_;
    TensorChunk chunk_;  // the header fields of the last chunk
    Message m_;
    bool first_ = true;
    bool early_ = false;
    bool may_claim_ = false;  // see CheckHeader
    int64_t expected_bytes_ = 0;
    int64_t received_ = 0;  // payload bytes so far
    int64_t chunks_ = 0;    // chunks so far
    // Set when the collective's values take the chunks (see Mailbox::Expect).
    std::shared_ptr<Sink> sink_;
    int64_t applied_ = 0;  // values applied to sink_ so far
    std::string carry_;    // bytes of a value split between slices
  };

 public:
  // Elastic rounds: delivers `m` to the installed attempt's mailbox, keeps
  // it if its attempt is a little ahead (at most kEarlyBytes in all), or
  // refuses it as stale. `names`: its sender's, for CheckSender.
  absl::Status Place(Message m, std::vector<std::string> names) {
    absl::MutexLock lock(&mu_);
    const int64_t current = mailbox_->round();
    if (m.round == current) {
      STARLING_RETURN_IF_ERROR(CheckPlan(m, mailbox_->options()));
      STARLING_RETURN_IF_ERROR(CheckSender(*ids_, names, m));
      return mailbox_->Deliver(std::move(m));
    }
    if (m.round < current) {
      return absl::FailedPreconditionError(absl::StrCat(
          "attempt ", m.round, " is over; this node is at ", current));
    }
    const int64_t size = static_cast<int64_t>(m.payload.size());
    if (early_bytes_ + size > kEarlyBytes) {
      return absl::UnavailableError("too many early messages; retry");
    }
    early_bytes_ += size;
    early_.push_back(Early{std::move(m), std::move(names)});
    return absl::OkStatus();
  }

 private:
  static constexpr int64_t kEarlyBytes = int64_t{1} << 30;

  const PeerIdentity identity_;
  const PeerCredentials credentials_;
  StreamDeadlines* const deadlines_;
  const absl::Duration chunk_stream_deadline_;
  absl::Mutex mu_;
  std::shared_ptr<Mailbox> mailbox_ ABSL_GUARDED_BY(mu_);
  bool exact_round_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const std::vector<std::string>> ids_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const std::vector<std::string>>();
  // A message of an attempt not installed yet, and its sender's names.
  struct Early {
    Message m;
    std::vector<std::string> names;
  };
  std::vector<Early> early_ ABSL_GUARDED_BY(mu_);
  int64_t early_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int rank_ ABSL_GUARDED_BY(mu_) = 0;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> refused_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> received_{0};
};

class GrpcTransport::Peer {
 public:
  Peer(const std::string& address, const PeerCredentials& credentials)
      : address(address) {
    grpc::ChannelArguments args;
    credentials.Apply(&args);
    args.SetMaxSendMessageSize(64 << 20);
    args.SetMaxReceiveMessageSize(64 << 20);
    SetReconnectBackoff(args);
    args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    channel = grpc::CreateCustomChannel(address, credentials.channel, args);
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
  HandshakeRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_run_id(identity_.run_id);
  req.set_algo(identity_.algo);
  req.set_world(identity_.world);
  req.set_compression(identity_.compression);
  req.set_aggregate(identity_.aggregate);
  *req.mutable_model() = identity_.model;
  req.set_address(members[rank]);
  for (int r = 0; r < static_cast<int>(members.size()); ++r) {
    if (r == rank) continue;
    absl::Duration backoff = absl::Milliseconds(100);
    grpc::Status last;
    int attempts = 0;
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(
          ToChrono(std::min(deadline, absl::Now() + absl::Seconds(5))));
      options_.credentials.Sign(&ctx, "Handshake");
      HandshakeResponse resp;
      last = peers_[r]->stub->Handshake(&ctx, req, &resp);
      rpc_errors_.Record(last.error_code());
      ++attempts;
      if (last.ok()) {
        if (resp.rank() != r) {
          return absl::FailedPreconditionError(
              absl::StrCat("peer ", members[r], " thinks it is rank ",
                           resp.rank(), ", this node expects ", r,
                           " (give every node the same members)"));
        }
        break;
      }
      if (last.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        return absl::FailedPreconditionError(absl::StrCat(
            "peer ", members[r], " refused this node: ", last.error_message()));
      }
      if (last.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        return absl::UnauthenticatedError(
            absl::StrCat("peer ", members[r],
                         " refused this node's "
                         "credentials: ",
                         last.error_message(), " (check --join_token_file)"));
      }
      // The peer may have tried us first, been refused and left.
      if (std::string why = service_->Refusal(members[r]); !why.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("this node refused peer ", members[r], ": ", why));
      }
      if (absl::Now() + backoff >= deadline) {
        return absl::UnavailableError(
            absl::StrCat("cannot reach peer ", members[r], " after ", attempts,
                         " attempts (last error: ", last.error_message(), ")"));
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
    }
  }
  return absl::OkStatus();
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
    std::unique_ptr<Peer>& p = stubs_[members[r]];
    if (!p) p = std::make_unique<Peer>(members[r], options_.credentials);
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
  if (options_.blocked && options_.blocked(peers_[to]->address)) {
    return absl::UnavailableError(absl::StrCat(
        "peer ", peers_[to]->address, " is across a network partition"));
  }
  // The emulated link: its latency once per message, before the stream.
  LinkShaper* link =
      options_.links ? options_.links->For(peers_[to]->address) : nullptr;
  // The link's waits end early when the attempt is called off.
  LinkShaper::Sleep sleep;
  if (mailbox_ != nullptr) {
    sleep = [box = mailbox_](absl::Duration d) {
      return box->SleepUnlessCancelled(d);
    };
  }
  int64_t chunk_bytes = std::max<int64_t>(1, options_.chunk_bytes);
  if (link != nullptr) {
    STARLING_ASSIGN_OR_RETURN(
        chunk_bytes, ChunkBytesFor(*link, peers_[to]->address,
                                   static_cast<int64_t>(payload.size())));
    if (absl::Status s = link->StartMessage(deadline, sleep); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("peer ", peers_[to]->address,
                                                 ": ", s.message()));
    }
  }
  TensorChunk chunk;
  chunk.set_run_id(identity_.run_id);
  chunk.set_from_rank(m.from);
  chunk.set_round(m.round);
  chunk.set_tensor(m.tensor);
  chunk.set_phase(static_cast<peer::v1::Phase>(m.phase));
  chunk.set_step(m.step);
  chunk.set_segment(m.segment);
  chunk.set_total_elements(m.total_elements);
  chunk.set_segment_bytes(static_cast<int64_t>(payload.size()));
  if (mailbox_ != nullptr) chunk.set_plan(mailbox_->options().plan);
  ChunkSerializer chunks(std::move(chunk), payload, owner,
                         static_cast<size_t>(chunk_bytes));
  const bool crash_after_first = m.phase == RingPhase::kReduceScatter;
  grpc::ClientContext ctx;
  ctx.set_deadline(ToChrono(deadline));
  options_.credentials.Sign(&ctx, "SendChunks");
  // An attempt called off ends its send in flight too, rather than leaving
  // it to wait for the deadline on a peer that hangs with its connection
  // open.
  std::unique_ptr<Mailbox::CancelHook> on_cancel;
  if (mailbox_ != nullptr) {
    on_cancel = mailbox_->OnCancel([&ctx] { ctx.TryCancel(); });
  }
  grpc::ByteBuffer ack;
  grpc::Status s;
  absl::Status shaped;  // not OK when the emulated link missed the deadline
  if (link == nullptr) {
    // Each next chunk is written from the previous one's completion, on
    // gRPC's thread, and serialized while that one is on its way: the
    // stream does not wait for this thread between chunks.
    ChunkWriter writer(&chunks, &sent_, crash_after_first);
    grpc::internal::ClientCallbackWriterFactory<grpc::ByteBuffer>::Create(
        peers_[to]->channel.get(), *peers_[to]->send_chunks, &ctx, &ack,
        &writer);
    s = writer.Run();
  } else {
    // The stub's SendChunks, writing serialized chunks, each after the
    // emulated link lets its bytes through.
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            peers_[to]->channel.get(), *peers_[to]->send_chunks, &ctx, &ack));
    do {
      grpc::ByteBuffer buffer;
      const int64_t bytes = chunks.Next(&buffer);
      if (mailbox_ != nullptr && mailbox_->cancelled()) break;  // see on_cancel
      shaped = link->Acquire(bytes, deadline, sleep);
      if (!shaped.ok()) {
        ctx.TryCancel();
        break;
      }
      sent_ += bytes;
      if (!writer->Write(buffer)) break;  // the server ended the stream early
      if (chunks.written() == 1 && crash_after_first) CrashPoint("send");
    } while (!chunks.done());
    writer->WritesDone();
    s = writer->Finish();
  }
  if (!shaped.ok()) {
    return absl::Status(
        shaped.code(),
        absl::StrCat("peer ", peers_[to]->address, ": ", shaped.message()));
  }
  if (!s.ok()) {
    rpc_errors_.Record(s.error_code());
    absl::Status st = FromGrpc(s);
    return absl::Status(st.code(), absl::StrCat("peer ", peers_[to]->address,
                                                ": ", st.message()));
  }
  return absl::OkStatus();
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
  absl::MutexLock lock(&slow_mu_);
  if (need > absl::Seconds(5) && slow_links_logged_.insert(address).second) {
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

void GrpcTransport::Shutdown() {
  if (server_) {
    server_->Shutdown(ToChrono(absl::Now() + absl::Seconds(2)));
    server_.reset();
  }
}

}  // namespace starling
