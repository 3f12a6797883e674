#include "gossip/chunk_writer.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/sync_stream.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "gossip/crash_point.h"
#include "gossip/protocol.h"

namespace starling {
namespace {

using peer::v1::TensorChunk;

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// A payload slice's destructor: gRPC is done with the bytes.
void DropOwner(void* owner) {
  delete static_cast<std::shared_ptr<const void>*>(owner);
}

// One SendChunks call on gRPC's callback API. Chunk k+1 is cut while chunk k
// is on its way and written from k's completion, on gRPC's thread: the
// stream does not wait for the calling thread between chunks. A write is
// started with mu_ released; the flags under mu_ decide which thread starts
// the next one (the one that finished cutting it, or the one that saw the
// previous write complete, whichever comes second).
class PipelinedWriter : public grpc::ClientWriteReactor<grpc::ByteBuffer> {
 public:
  // `chunks` must outlive Run; `sent` adds the bytes of every chunk written.
  static std::shared_ptr<PipelinedWriter> Create(ChunkSerializer* chunks,
                                                 std::atomic<int64_t>* sent,
                                                 bool crash_after_first) {
    auto writer = std::shared_ptr<PipelinedWriter>(
        new PipelinedWriter(chunks, sent, crash_after_first));
    writer->self_ = writer;
    return writer;
  }

  // Starts the call (bound to this reactor) and waits until it is over.
  grpc::Status Run() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      Cut();
    }
    WriteReady();
    StartCall();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    if (!ok) return;  // the stream failed; OnDone follows
    bool crash, write_next;
    {
      absl::MutexLock lock(&mu_);
      crash = ++completed_ == 1 && crash_after_first_;
      write_done_ = true;
      write_next = !wrote_last_ && next_ready_;
    }
    if (crash) CrashPoint("send");
    if (write_next) WriteReady();
  }

  void OnDone(const grpc::Status& s) override ABSL_LOCKS_EXCLUDED(mu_) {
    // Run's caller may drop its reference as soon as done_ is set: this one
    // keeps the writer alive until the lock below is released.
    std::shared_ptr<PipelinedWriter> self = std::move(self_);
    absl::MutexLock lock(&mu_);
    status_ = s;
    done_ = true;
  }

 private:
  PipelinedWriter(ChunkSerializer* chunks, std::atomic<int64_t>* sent,
                  bool crash_after_first)
      : chunks_(chunks), sent_(sent), crash_after_first_(crash_after_first) {}

  // Cuts the next chunk into next_.
  void Cut() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    next_bytes_ = chunks_->Next(&next_);
    next_last_ = chunks_->done();
    next_ready_ = true;
  }

  // Writes the cut chunk, and cuts the one after it while that is on its
  // way; writes that one too when the write completed in the meantime.
  void WriteReady() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      bool last;
      {
        absl::MutexLock lock(&mu_);
        current_.Swap(&next_);
        next_ready_ = false;
        write_done_ = false;
        *sent_ += next_bytes_;
        last = wrote_last_ = next_last_;
      }
      if (last) {
        StartWriteLast(&current_, grpc::WriteOptions());
        return;
      }
      StartWrite(&current_);
      absl::MutexLock lock(&mu_);
      Cut();
      if (!write_done_) return;  // OnWriteDone writes next_
    }
  }

  ChunkSerializer* const chunks_;
  std::atomic<int64_t>* const sent_;
  const bool crash_after_first_;
  // Set by Create, dropped by OnDone (the last reaction).
  std::shared_ptr<PipelinedWriter> self_;
  // The chunk being written: only the thread that starts a write touches
  // it, and gRPC until that write completes.
  grpc::ByteBuffer current_;

  absl::Mutex mu_;
  grpc::ByteBuffer next_ ABSL_GUARDED_BY(mu_);
  int64_t next_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool next_last_ ABSL_GUARDED_BY(mu_) = false;
  bool next_ready_ ABSL_GUARDED_BY(mu_) = false;  // next_ is cut, not written
  bool write_done_ ABSL_GUARDED_BY(mu_) = false;  // the last write completed
  bool wrote_last_ ABSL_GUARDED_BY(mu_) = false;
  int completed_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

// The call without a link: PipelinedWriter.
grpc::Status WriteStreaming(const ChunkStream& stream, ChunkSerializer* chunks,
                            grpc::ClientContext* ctx, grpc::ByteBuffer* ack) {
  std::shared_ptr<PipelinedWriter> writer = PipelinedWriter::Create(
      chunks, stream.bytes_sent, stream.crash_after_first);
  grpc::internal::ClientCallbackWriterFactory<grpc::ByteBuffer>::Create(
      stream.channel, *stream.method, ctx, ack, writer.get());
  return writer->Run();
}

// The call over the emulated link: blocking writes, each after the link
// lets the chunk's bytes through. `*shaped` is not OK when the link missed
// the deadline or was called off (the call is then cancelled).
grpc::Status WriteShaped(const ChunkStream& stream,
                         const LinkShaper::Sleep& sleep,
                         ChunkSerializer* chunks, grpc::ClientContext* ctx,
                         grpc::ByteBuffer* ack, absl::Status* shaped) {
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          stream.channel, *stream.method, ctx, ack));
  do {
    grpc::ByteBuffer buffer;
    const int64_t bytes = chunks->Next(&buffer);
    // Called off: the cancel hook has cancelled the call.
    if (stream.attempt != nullptr && stream.attempt->cancelled()) break;
    *shaped = stream.link->Acquire(bytes, stream.deadline, sleep);
    if (!shaped->ok()) {
      ctx->TryCancel();
      break;
    }
    *stream.bytes_sent += bytes;
    if (!writer->Write(buffer)) break;  // the server ended the stream early
    if (chunks->written() == 1 && stream.crash_after_first) CrashPoint("send");
  } while (!chunks->done());
  writer->WritesDone();
  return writer->Finish();
}

}  // namespace

TensorChunk ChunkHeaderFor(const Message& m, const std::string& run_id,
                           uint64_t plan, int64_t payload_bytes) {
  TensorChunk chunk;
  chunk.set_run_id(run_id);
  chunk.set_from_rank(m.from);
  chunk.set_round(m.round);
  chunk.set_tensor(m.tensor);
  chunk.set_phase(static_cast<peer::v1::Phase>(m.phase));
  chunk.set_step(m.step);
  chunk.set_segment(m.segment);
  chunk.set_total_elements(m.total_elements);
  chunk.set_segment_bytes(payload_bytes);
  chunk.set_plan(plan);
  return chunk;
}

ChunkSerializer::ChunkSerializer(TensorChunk header, absl::string_view payload,
                                 const std::shared_ptr<const void>& owner,
                                 size_t step)
    : header_(std::move(header)),
      payload_(payload),
      owner_(owner),
      step_(step) {}

int64_t ChunkSerializer::Next(grpc::ByteBuffer* out) {
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

ChunkStreamStatus WriteChunks(const ChunkStream& stream, TensorChunk header,
                              absl::string_view payload,
                              const std::shared_ptr<const void>& owner) {
  ChunkStreamStatus result;
  // The link's waits end early when the attempt is called off.
  LinkShaper::Sleep sleep;
  if (stream.attempt != nullptr) {
    sleep = [box = stream.attempt](absl::Duration d) {
      return box->SleepUnlessCancelled(d);
    };
  }
  // The link's latency: once per message, before the stream.
  if (stream.link != nullptr) {
    result.link = stream.link->StartMessage(stream.deadline, sleep);
    if (!result.link.ok()) return result;
  }
  ChunkSerializer chunks(std::move(header), payload, owner,
                         static_cast<size_t>(stream.chunk_bytes));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(stream.deadline));
  stream.credentials->Sign(&ctx, "SendChunks");
  std::unique_ptr<Mailbox::CancelHook> on_cancel;
  if (stream.attempt != nullptr) {
    on_cancel = stream.attempt->OnCancel([&ctx] { ctx.TryCancel(); });
  }
  grpc::ByteBuffer ack;
  result.call =
      stream.link == nullptr
          ? WriteStreaming(stream, &chunks, &ctx, &ack)
          : WriteShaped(stream, sleep, &chunks, &ctx, &ack, &result.link);
  return result;
}

}  // namespace starling
