// The server side of the SendChunks stream. ReadChunks makes the reactor of
// one incoming stream: it parses each chunk (ParseChunk), checks its header
// against the attempt this node had installed when the stream began
// (CheckFirstChunk, CheckSameMessage, CheckChunkBounds), assembles the
// payload (straight into the collective's values through a Sink when the
// collective already waits for them, else into a buffer) and hands the
// message on: to the mailbox, or in elastic rounds to the AttemptRouter,
// which delivers it to the installed attempt, holds it when its attempt is
// a little ahead, or refuses it as stale. A message of an attempt not
// installed yet is held only when this node was sent that attempt's PLAN
// (AttemptRouter::Expect), after the same checks of plan, sender and size
// as the installed attempt's, and within a bound per sender. A refused
// stream of the installed attempt records the refusal against its sender
// when RejectionToRecord says the sender is to blame, so that the
// collective waiting for it fails at once; one of another attempt never
// does (the rank it claims is a rank of another plan).
// The checks are pure functions, testable without sockets.
// Ownership: AttemptRouter owns the held early messages and shares each
// installed Mailbox with the streams that began under it; a reactor deletes
// itself when its stream is over.
// Thread-safety: AttemptRouter is thread-safe (one absl::Mutex; the
// mailbox, which calls nothing back, is the only thing it calls under it);
// gRPC runs one reaction of a reactor at a time, and a reactor's state is
// its own.
#ifndef STARLING_GOSSIP_CHUNK_READER_H_
#define STARLING_GOSSIP_CHUNK_READER_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gossip/mailbox.h"
#include "gossip/peer_credentials.h"
#include "gossip/peer_limits.h"
#include "starling/peer/v1/peer.pb.h"

namespace starling {

// ---------------------------------------------------------------------------
// Pure checks.

// Where a message of attempt (mailbox sequence) `round` belongs while this
// node has attempt `current` installed, holding at most `window` sequence
// numbers ahead.
enum class AttemptFit { kCurrent, kStale, kEarly, kTooFarAhead };
AttemptFit FitAttempt(int64_t round, int64_t current, int64_t window);

// OK when message `m` belongs to the plan of the attempt that `o` installs.
// A chunk of another plan under the same sequence number (another
// coordinator's attempt, numbered alike) is refused as not this node's
// attempt: FailedPrecondition, never blamed on the member at that rank here.
absl::Status CheckPlan(const Message& m, const MailboxOptions& o);

// With ids bound (credentials.bind_node_ids, --tls_bind_node_ids): OK when
// a caller whose certificate carries `names` may send `m`, i.e. they name
// the member at m's rank among `ids` (the members' ids by rank);
// PermissionDenied otherwise. OK when ids are not bound.
absl::Status CheckSender(const PeerCredentials& credentials,
                         const std::vector<std::string>& ids,
                         const std::vector<std::string>& names,
                         const Message& m);

// An attempt this node was sent a PLAN for and has not installed yet: its
// mailbox options (rank, world, first_round and plan set) and its members'
// ids by rank.
struct PlannedAttempt {
  MailboxOptions options;
  std::vector<std::string> ids;
};

// The attempt a stream's chunks are checked against.
struct AttemptView {
  const MailboxOptions* options = nullptr;  // its mailbox's
  int64_t round = 0;                        // its mailbox's round
  // Elastic rounds: one mailbox per attempt; a message of a later attempt
  // (up to kEarlyWindow ahead) is held for it, an older one refused.
  bool exact_round = false;
  // The planned attempt of the round the first chunk names, if this node
  // was sent its PLAN (null otherwise).
  const PlannedAttempt* planned = nullptr;
};

// The message a stream carries, as its first chunk announces it.
struct StreamHead {
  Message message;  // every header field; the payload is assembled apart
  int64_t segment_bytes = 0;
  bool early = false;  // of an attempt not installed yet: held for it
  // A raw fp32 segment of the installed attempt: it may stream into the
  // collective's values (Mailbox::ClaimSink).
  bool may_claim = false;
};

// The checks of a stream's first chunk `chunk` against `attempt`, in order:
// the run (FailedPrecondition), a stale attempt (FailedPrecondition), one
// too far ahead or, in elastic rounds, one of a later attempt that is not
// attempt.planned (Unavailable: its sender retries); the plan (CheckPlan)
// and `check_sender` (PermissionDenied), against the installed attempt or
// the planned one; then the tensor and its size (InvalidArgument), a
// segment of the attempt's member count. Fills *head; head->message.from
// is set as soon as the run matches, so that a refusal names the sender,
// and head->early as soon as the attempt is known.
absl::Status CheckFirstChunk(
    const peer::v1::TensorChunk& chunk, const AttemptView& attempt,
    const std::function<absl::Status(const Message&)>& check_sender,
    StreamHead* head);

// A later chunk of the stream of `m`: InvalidArgument when its header names
// another message.
absl::Status CheckSameMessage(const peer::v1::TensorChunk& chunk,
                              const Message& m);

// Every chunk, the `chunks`-th of the stream of `head` with `received`
// payload bytes so far, carrying `data_len` bytes: InvalidArgument when the
// stream takes more than segment_bytes / kMinChunkBytes + 2 chunks, or the
// chunk does not continue the payload or overruns it.
absl::Status CheckChunkBounds(const peer::v1::TensorChunk& chunk,
                              uint32_t data_len, int64_t chunks,
                              int64_t received, const StreamHead& head);

// What a stream refused with `why` records against its sender in the
// installed attempt's mailbox (Mailbox::RecordRejection): nothing before a
// header was read (`header_seen`), nor for a message of another attempt
// (`early`: the rank it claims is a rank of that attempt's plan, and a
// message of an attempt this node has not installed speaks for nobody
// here), nor for a refusal that does not speak for the member at that rank
// (Unavailable: the sender retries; FailedPrecondition: another attempt's
// or plan's; PermissionDenied: an impostor). Otherwise `why` when
// `blame_sender` (invalid data: the collective blames the sender), or an
// Aborted with its message (a stream that ended early, as a sender's
// cancelled call looks).
std::optional<absl::Status> RejectionToRecord(const absl::Status& why,
                                              bool header_seen, bool early,
                                              bool blame_sender);

// How many payload bytes of early messages one sender (one rank of one
// planned attempt) may have held at a receiver whose attempt is `o`: twice
// the largest whole tensor of `o`, more than the sender sends the receiver
// in one attempt (the ring: 2 (N - 1) / N of it; the all-gather: one).
int64_t EarlyBytesPerSender(const MailboxOptions& o);

// Where a serialized chunk's `data` lies.
struct ChunkFrame {
  size_t data_start = 0;  // the first byte of `data` in the buffer
  uint32_t data_len = 0;  // 0 when the chunk carries none
};

// Parses the header fields of the serialized chunk in `buffer` into
// *header (`data` apart: see kChunkDataTag) and finds its data. False when
// the bytes are not a TensorChunk. Does not check that the data ends the
// buffer: a receiver refuses bytes after it once the header is checked.
bool ParseChunk(grpc::ByteBuffer* buffer, peer::v1::TensorChunk* header,
                ChunkFrame* frame);

// ---------------------------------------------------------------------------
// Assembly.

// Applies a raw fp32 payload that arrives in pieces of any length to a
// sink: the whole values of each piece at once, a value split between
// pieces once it is complete. Not thread-safe.
class SinkFeeder {
 public:
  explicit SinkFeeder(std::shared_ptr<Sink> sink) : sink_(std::move(sink)) {}
  // Sink::Apply's errors (the values then partly written).
  absl::Status Feed(const char* p, size_t n);

 private:
  const std::shared_ptr<Sink> sink_;
  int64_t applied_ = 0;  // values applied so far
  std::string carry_;    // the bytes of a value split between pieces
};

// Which attempt's mailbox incoming messages go to, the attempts this node
// was sent a PLAN for but has not installed yet, and their messages that
// come early, held until their attempt is installed (at most
// EarlyBytesPerSender per sender, kEarlyBytes in all). Also counts the
// bytes streams take off the wire, and the early messages refused.
class AttemptRouter {
 public:
  // Held early messages, in payload bytes: beyond this, Unavailable.
  static constexpr int64_t kEarlyBytes = int64_t{1} << 30;
  // Planned attempts remembered (the latest by sequence).
  static constexpr int kPlannedAttempts = 4;

  explicit AttemptRouter(const PeerCredentials& credentials)
      : credentials_(credentials) {}

  // The attempt a stream that begins now is checked against.
  struct Attempt {
    std::shared_ptr<Mailbox> mailbox;  // null before the first Install
    bool exact_round = false;          // see AttemptView
    // The members' node ids by rank (see CheckSender).
    std::shared_ptr<const std::vector<std::string>> ids;
  };
  Attempt Current() const ABSL_LOCKS_EXCLUDED(mu_);

  // Installs `mailbox` for the streams that begin from now on; with
  // `exact_round`, delivers the held messages of its attempt (each checked
  // as Place does; a refusal is logged and, being the installed attempt's
  // now, recorded against its sender) and drops those of older attempts,
  // and the planned attempts up to it.
  void Install(std::shared_ptr<Mailbox> mailbox, bool exact_round,
               std::vector<std::string> ids) ABSL_LOCKS_EXCLUDED(mu_);

  // This node was sent the PLAN of the attempt `planned` (ahead of the
  // installed one): messages of that attempt are checked against it and
  // held until it is installed. Keeps the kPlannedAttempts latest.
  void Expect(PlannedAttempt planned) ABSL_LOCKS_EXCLUDED(mu_);
  // The planned attempt of sequence `round`, or null.
  std::shared_ptr<const PlannedAttempt> Planned(int64_t round) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Unavailable (counted as refused) when rank `from` of planned attempt
  // `round` may not have `bytes` more held: EarlyBytesPerSender, or
  // kEarlyBytes in all.
  absl::Status EarlyRoom(int64_t round, int from, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Elastic rounds: delivers the whole message `m` (from a caller whose
  // certificate names `names`) to the installed attempt's mailbox after
  // CheckPlan and CheckSender, holds it if it is of a planned attempt
  // ahead, or refuses it as stale (FailedPrecondition). Unavailable when
  // its attempt is not planned (any more), or EarlyRoom refuses it.
  absl::Status Place(Message m, std::vector<std::string> names)
      ABSL_LOCKS_EXCLUDED(mu_);

  // CheckSender with this node's credentials.
  absl::Status CheckSender(const std::vector<std::string>& ids,
                           const std::vector<std::string>& names,
                           const Message& m) const;

  void AddReceived(int64_t bytes) { received_ += bytes; }
  int64_t received() const { return received_.load(); }
  // Early messages refused so far for their plan, sender, size or bound
  // (not those of an attempt not planned yet, which their senders retry).
  void CountEarlyRefused() { ++early_refused_; }
  int64_t early_refused() const { return early_refused_.load(); }
  // Payload bytes of early messages held now.
  int64_t early_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A message of an attempt not installed yet, and its sender's names.
  struct Early {
    Message m;
    std::vector<std::string> names;
  };
  // Delivers `m` of the installed attempt.
  absl::Status DeliverNow(Message m, const std::vector<std::string>& names)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // EarlyRoom with mu_ held.
  absl::Status EarlyRoomLocked(int64_t round, int from, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PeerCredentials credentials_;
  std::atomic<int64_t> received_{0};
  std::atomic<int64_t> early_refused_{0};
  mutable absl::Mutex mu_;
  std::shared_ptr<Mailbox> mailbox_ ABSL_GUARDED_BY(mu_);
  bool exact_round_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const std::vector<std::string>> ids_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const std::vector<std::string>>();
  std::vector<Early> early_ ABSL_GUARDED_BY(mu_);
  int64_t early_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Held early bytes by (attempt, rank).
  std::map<std::pair<int64_t, int>, int64_t> early_by_sender_
      ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::shared_ptr<const PlannedAttempt>> planned_
      ABSL_GUARDED_BY(mu_);
};

// One incoming SendChunks stream, as the service admitted it.
struct IncomingStream {
  AttemptRouter* router = nullptr;  // outlives the stream
  AttemptRouter::Attempt attempt;   // the router's when the stream began
  // The names in the caller's certificate (empty unless ids are bound).
  std::vector<std::string> names;
  std::string peer_host;  // the caller's, for the log
  // Not OK: the stream is refused at once with this status.
  grpc::Status admitted;
  std::unique_ptr<StreamDeadlines::Watched> watch;  // may be null
};

// The reactor of `stream`, which answers with a SendAck in `ack`, and
// deletes itself when the stream is over.
grpc::ServerReadReactor<grpc::ByteBuffer>* ReadChunks(IncomingStream stream,
                                                      grpc::ByteBuffer* ack);

}  // namespace starling

#endif  // STARLING_GOSSIP_CHUNK_READER_H_
