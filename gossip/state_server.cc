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

// Streams the served blob from the requested offset (or from 0 when the
// requester's digest is not the one served any more).
class StateWriter : public grpc::ServerWriteReactor<StateChunk> {
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

// A request refused before any chunk.
class Refusal : public grpc::ServerWriteReactor<StateChunk> {
 public:
  Refusal(grpc::StatusCode code, const std::string& why) {
    Finish(grpc::Status(code, why));
  }
  void OnDone() override { delete this; }
};

}  // namespace

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
  auto handed = std::make_unique<SwarmState>(std::move(state));
  {
    absl::MutexLock lock(&mu_);
    to_serve_.swap(handed);
  }
  // `handed` now holds the state it replaced, if one was still waiting:
  // freed with the lock released.
}

int64_t StateServer::ServedRound() const {
  absl::MutexLock lock(&mu_);
  return served_ == nullptr ? -1 : served_->round();
}

void StateServer::Loop() {
  while (true) {
    std::unique_ptr<SwarmState> state;
    {
      absl::MutexLock lock(&mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return to_serve_ != nullptr || stopping_->load();
      };
      mu_.Await(absl::Condition(&woken));
      if (stopping_->load()) return;
      state = std::move(to_serve_);
    }
    std::shared_ptr<const StateBlob> blob = StateBlob::Make(*state);
    {
      absl::MutexLock lock(&mu_);
      served_.swap(blob);
    }
    // The blob served until now goes when its last transfer ends, or here.
  }
}

grpc::ServerWriteReactor<StateChunk>* StateServer::Open(
    grpc::CallbackServerContext* ctx, const StateRequest* req) {
  std::shared_ptr<const StateBlob> blob;
  {
    absl::MutexLock lock(&mu_);
    blob = served_;
  }
  if (grpc::Status a = credentials_.Admit(ctx, "FetchState"); !a.ok()) {
    return new Refusal(a.error_code(), a.error_message());
  }
  if (req->run_id() != run_id_) {
    return new Refusal(grpc::StatusCode::FAILED_PRECONDITION,
                       absl::StrCat("state request for run '", req->run_id(),
                                    "'; this node is in run '", run_id_, "'"));
  }
  if (blob == nullptr) {
    return new Refusal(grpc::StatusCode::UNAVAILABLE,
                       "this node has no committed state to serve yet");
  }
  if (LineageAhead({req->round(), req->lineage(), req->member_rounds()},
                   {blob->round(), blob->lineage(), blob->member_rounds()})) {
    // The joiner would throw this state away: its next one is still being
    // encoded (or this node is behind), or it is of the same round on a
    // lineage that lost (a partition's other side).
    return new Refusal(
        grpc::StatusCode::FAILED_PRECONDITION,
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
      deadlines_->Watch(ctx, "FetchState", absl::Minutes(10));
  if (!watch.ok()) {
    return new Refusal(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       std::string(watch.status().message()));
  }
  // The joiner resumes from where a cancelled transfer stopped.
  return new StateWriter(std::move(blob), offset, chunk_bytes_,
                         *std::move(watch));
}

}  // namespace starling
