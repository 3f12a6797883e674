#include "gossip/state_server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gossip/crash_point.h"
#include "gossip/round_protocol.h"

namespace starling {
namespace {

using peer::v1::StateChunk;
using peer::v1::StateRequest;

// A request refused before any chunk.
class Refusal : public grpc::ServerWriteReactor<StateChunk> {
 public:
  Refusal(grpc::StatusCode code, const std::string& why) {
    Finish(grpc::Status(code, why));
  }
  void OnDone() override { delete this; }
};

// Why a joiner asking for `req` would throw away the state at (round,
// lineage, member_rounds), or empty when it would not: that state is
// behind the round it asks for (its next one is still being committed, or
// this node is behind), or of the same round on a lineage that lost (a
// partition's other side).
std::string BehindRequest(const StateRequest& req, int64_t round,
                          const std::string& lineage, int64_t member_rounds) {
  if (!LineageAhead({req.round(), req.lineage(), req.member_rounds()},
                    {round, lineage, member_rounds})) {
    return "";
  }
  return req.round() > round
             ? absl::StrCat("this node serves round ", round,
                            ", not yet round ", req.round())
             : absl::StrCat("this node serves round ", round, " of lineage ",
                            lineage, ", not ", req.lineage());
}

}  // namespace

// Streams a blob from the requested offset (or from 0 when the requester's
// digest is not the blob's). Created before its blob exists when the state
// is still to be encoded: the state thread then calls Begin.
class StateServer::Writer : public grpc::ServerWriteReactor<StateChunk> {
 public:
  Writer(const StateRequest& req, int64_t chunk_bytes,
         std::unique_ptr<StreamDeadlines::Watched> watch)
      : req_(req),
        chunk_bytes_(std::max<int64_t>(1024, chunk_bytes)),
        watch_(std::move(watch)) {}

  // Streams `blob`, or refuses the request when `blob` is null (the server
  // is closing) or behind what the request asks for. Called once.
  void Begin(std::shared_ptr<const StateBlob> blob) {
    if (blob == nullptr) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "this node is leaving; ask another donor"));
      return;
    }
    // A state newer than the one the request was checked against may have
    // been encoded since; an older one only when the request came first.
    if (std::string behind = BehindRequest(req_, blob->round(), blob->lineage(),
                                           blob->member_rounds());
        !behind.empty()) {
      Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, behind));
      return;
    }
    blob_ = std::move(blob);
    const int64_t size = static_cast<int64_t>(blob_->bytes().size());
    // The joiner resumes from where a cancelled transfer stopped.
    if (req_.digest() == blob_->digest() && req_.offset() > 0 &&
        req_.offset() < size) {
      offset_ = req_.offset();
    }
    half_ = size / 2;
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

  const StateRequest req_;
  std::shared_ptr<const StateBlob> blob_;
  int64_t offset_ = 0;
  const int64_t chunk_bytes_;
  int64_t len_ = 0;
  int64_t half_ = 0;
  std::unique_ptr<StreamDeadlines::Watched> watch_;
  bool crashed_checked_ = false;
  StateChunk chunk_;
};

StateServer::StateServer(std::string run_id, int64_t chunk_bytes,
                         PeerCredentials credentials,
                         std::shared_ptr<StreamDeadlines> deadlines,
                         const std::atomic<bool>* stopping)
    : run_id_(std::move(run_id)),
      chunk_bytes_(chunk_bytes),
      credentials_(std::move(credentials)),
      deadlines_(std::move(deadlines)),
      stopping_(stopping) {}

void StateServer::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void StateServer::Wake() {
  absl::MutexLock lock(&mu_);  // Loop's Await sees stopping_ on release
}

void StateServer::Join() {
  if (thread_.joinable()) thread_.join();
}

void StateServer::Serve(SwarmState state) {
  std::shared_ptr<const SwarmState> handed =
      std::make_shared<const SwarmState>(std::move(state));
  std::shared_ptr<const StateBlob> old_blob;
  {
    absl::MutexLock lock(&mu_);
    latest_.swap(handed);
    served_.swap(old_blob);
  }
  // `handed` and `old_blob` now hold what they replaced (a transfer in
  // flight keeps its own reference): freed with the lock released.
}

int64_t StateServer::ServedRound() const {
  absl::MutexLock lock(&mu_);
  return latest_ == nullptr ? -1 : latest_->round;
}

void StateServer::Loop() {
  while (true) {
    std::shared_ptr<const SwarmState> state;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !waiting_.empty() || stopping_->load();
      };
      mu_.Await(absl::Condition(&woken));
      if (stopping_->load()) {
        closed_ = true;
        break;
      }
      state = latest_;
    }
    std::shared_ptr<const StateBlob> blob = StateBlob::Make(*state);
    {
      absl::MutexLock lock(&mu_);
      if (latest_ == state) served_ = blob;
    }
    StartWaiting(blob);
  }
  StartWaiting(nullptr);
}

void StateServer::StartWaiting(const std::shared_ptr<const StateBlob>& blob) {
  std::vector<Writer*> waiting;
  {
    absl::MutexLock lock(&mu_);
    waiting.swap(waiting_);
  }
  for (Writer* w : waiting) w->Begin(blob);
}

grpc::ServerWriteReactor<StateChunk>* StateServer::Open(
    grpc::CallbackServerContext* ctx, const StateRequest* req) {
  if (grpc::Status a = credentials_.Admit(ctx, "FetchState"); !a.ok()) {
    return new Refusal(a.error_code(), a.error_message());
  }
  if (req->run_id() != run_id_) {
    return new Refusal(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat("state request for run '", req->run_id(),
                                    "'; this node is in run '", run_id_, "'"));
  }
  std::shared_ptr<const SwarmState> state;
  {
    absl::MutexLock lock(&mu_);
    state = latest_;
  }
  if (state == nullptr) {
    return new Refusal(grpc::StatusCode::UNAVAILABLE,
                       "this node has no committed state to serve yet");
  }
  if (std::string behind = BehindRequest(*req, state->round, state->lineage,
                                         state->member_rounds);
      !behind.empty()) {
    return new Refusal(grpc::StatusCode::FAILED_PRECONDITION, behind);
  }
  absl::StatusOr<std::unique_ptr<StreamDeadlines::Watched>> watch =
      deadlines_->Watch(ctx, "FetchState", absl::Minutes(10));
  if (!watch.ok()) {
    return new Refusal(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       std::string(watch.status().message()));
  }
  auto* writer = new Writer(*req, chunk_bytes_, *std::move(watch));
  std::shared_ptr<const StateBlob> blob;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      // Begin(nullptr) below refuses it.
    } else if (served_ != nullptr) {
      blob = served_;
    } else {
      waiting_.push_back(writer);  // the state thread encodes latest_
      return writer;
    }
  }
  writer->Begin(std::move(blob));
  return writer;
}

}  // namespace starling
