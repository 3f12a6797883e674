#include "gossip/ring_allreduce.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/crash_point.h"

namespace starling {
namespace {

absl::string_view Bytes(absl::Span<const float> v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()),
                           v.size() * 4);
}

constexpr char kBlamePayload[] = "type.starling/blamed_rank";

}  // namespace

absl::Status BlameRank(absl::Status s, int rank) {
  s.SetPayload(kBlamePayload, absl::Cord(absl::StrCat(rank)));
  return s;
}

int BlamedRank(const absl::Status& s) {
  auto p = s.GetPayload(kBlamePayload);  // absl::optional<absl::Cord>
  int rank = -1;
  if (!p.has_value() || !absl::SimpleAtoi(std::string(*p), &rank)) return -1;
  return rank;
}

namespace {

// One rank's run of RingAllReduceSum over `data`: 2(n-1) steps, each a send
// to the next rank and a receive from the previous one. Steps 0..n-2 are
// the reduce-scatter: after step k, rank r holds the partial sum of segment
// (r-k-1) over ranks r-k-1..r, and ends owning segment r+1. Steps n-1..
// 2n-3 are the all-gather: the owners' reduced segments travel round the
// ring unchanged.
class RingRun {
 public:
  RingRun(Transport& t, absl::Span<float> data, const RingOptions& o)
      : t_(t),
        data_(data),
        o_(o),
        n_(t.world()),
        r_(t.rank()),
        next_((r_ + 1) % n_),
        prev_((r_ + n_ - 1) % n_),
        total_(static_cast<int64_t>(data.size())),
        steps_(2 * (n_ - 1)),
        sinks_(steps_) {}

  // Every sink is closed on every way out, before `data` can go away.
  ~RingRun() {
    for (std::shared_ptr<Sink>& s : sinks_) {
      if (s != nullptr) s->Close();
    }
  }

  absl::Status Run() {
    for (int i = 0; i < steps_; ++i) STARLING_RETURN_IF_ERROR(Step(i));
    return absl::OkStatus();
  }

 private:
  RingPhase PhaseOf(int i) const {
    return i < n_ - 1 ? RingPhase::kReduceScatter : RingPhase::kAllGather;
  }
  // The segment step i sends and the one it receives.
  int SendSegment(int i) const {
    const int shift = i < n_ - 1 ? 0 : 1, k = i % (n_ - 1);
    return ((r_ + shift - k) % n_ + n_) % n_;
  }
  int RecvSegment(int i) const {
    const int shift = i < n_ - 1 ? 0 : 1, k = i % (n_ - 1);
    return ((r_ + shift - k - 1) % n_ + n_) % n_;
  }
  int64_t Offset(int s) const { return SegmentOffset(total_, n_, s); }
  absl::Span<float> Segment(int s) const {
    return data_.subspan(Offset(s), SegmentLength(total_, n_, s));
  }
  absl::Status Fail(const absl::Status& s, absl::string_view what) const {
    return absl::Status(
        s.code(), absl::StrCat("round ", o_.round, ": ", what, s.message()));
  }

  // Raw fp32: the transport may add (copy) what arrives straight into the
  // receiving segment, chunk by chunk, through a sink the mailbox hands it
  // (see Mailbox::Expect). Step i's sink is set up before step i-1's send
  // when that send reads another segment (3 or more ranks), so that a
  // sender that is a step ahead still finds it.
  void Expect(int i) {
    if (o_.codec != nullptr || i >= steps_ || sinks_[i] != nullptr) return;
    const int seg = RecvSegment(i);
    sinks_[i] = t_.mailbox().Expect(prev_, o_.round, o_.tensor, PhaseOf(i),
                                    i % (n_ - 1), seg, Segment(seg),
                                    PhaseOf(i) == RingPhase::kReduceScatter);
  }

  absl::Status Step(int i) {
    const RingPhase phase = PhaseOf(i);
    const int k = i % (n_ - 1);
    const int send_seg = SendSegment(i), recv_seg = RecvSegment(i);
    Message m;
    m.from = r_;
    m.round = o_.round;
    m.tensor = o_.tensor;
    m.phase = phase;
    m.step = k;
    m.segment = send_seg;
    m.total_elements = total_;
    absl::string_view payload;
    std::shared_ptr<const void> owner;
    STARLING_RETURN_IF_ERROR(Outgoing(i, &payload, &owner));
    if (o_.stats != nullptr) {
      o_.stats->raw_bytes += static_cast<int64_t>(Segment(send_seg).size()) * 4;
      o_.stats->wire_bytes += static_cast<int64_t>(payload.size());
    }
    Expect(i);
    if (n_ >= 3) Expect(i + 1);
    const absl::Time deadline = absl::Now() + o_.step_timeout;
    absl::Status s = t_.SendPayload(next_, m, payload, owner, deadline);
    Expect(i + 1);
    if (!s.ok()) {
      return Fail(s, absl::StrCat("sending to rank ", next_, " failed: "));
    }
    if (phase == RingPhase::kAllGather) CrashPoint("all_gather");
    absl::StatusOr<Message> in =
        t_.mailbox().Take(prev_, o_.round, o_.tensor, phase, k, deadline);
    if (absl::IsInvalidArgument(in.status())) {
      return BlameRank(Fail(in.status(), ""), prev_);
    }
    if (!in.ok()) return Fail(in.status(), "");
    if (phase == RingPhase::kReduceScatter) CrashPoint("reduce");
    if (in->segment != recv_seg) {
      return absl::InvalidArgumentError(absl::StrCat(
          "round ", o_.round, ": rank ", prev_, " sent segment ", in->segment,
          " at step ", k, "; the ring expects segment ", recv_seg));
    }
    if (o_.codec != nullptr) return DecodeIncoming(i, std::move(*in));
    if (in->applied) return absl::OkStatus();
    return ApplyIncoming(i, *in);
  }

  // What step i sends: raw fp32 straight from `data` (the transport streams
  // it without a copy when `data` has an owner), or encoded bytes (never
  // copied, owned by the shared string).
  absl::Status Outgoing(int i, absl::string_view* payload,
                        std::shared_ptr<const void>* owner) {
    const int send_seg = SendSegment(i);
    const absl::Span<float> out_seg = Segment(send_seg);
    if (o_.codec == nullptr) {
      *payload = Bytes(out_seg);
      *owner = o_.data_owner;
      return absl::OkStatus();
    }
    if (PhaseOf(i) == RingPhase::kAllGather) {
      if (i == n_ - 1) STARLING_RETURN_IF_ERROR(EncodeOwnSegment(send_seg));
      *payload = *forward_;
      *owner = forward_;
      return absl::OkStatus();
    }
    absl::StatusOr<std::string> enc =
        o_.codec->EncodeSlice(Offset(send_seg), out_seg);
    if (!enc.ok()) return Fail(enc.status(), "encoding: ");
    auto encoded = std::make_shared<const std::string>(std::move(enc).value());
    *payload = *encoded;
    *owner = std::move(encoded);
    return absl::OkStatus();
  }

  // The all-gather's first step: the owner quantizes its reduced segment
  // once and keeps exactly what the others will decode.
  absl::Status EncodeOwnSegment(int seg) {
    const absl::Span<float> values = Segment(seg);
    absl::StatusOr<std::string> enc =
        o_.codec->EncodeSlice(Offset(seg), values);
    if (!enc.ok()) return Fail(enc.status(), "encoding: ");
    absl::Status s = o_.codec->DecodeSlice(Offset(seg), *enc, values);
    if (!s.ok()) return Fail(s, "decoding own segment: ");
    forward_ = std::make_shared<const std::string>(std::move(enc).value());
    return absl::OkStatus();
  }

  // Step i's compressed segment `in`: added (reduce-scatter) or copied
  // (all-gather) into its segment, and kept to forward unchanged. The
  // codecs refuse NaN/Inf in a payload, decode finite values only, and
  // refuse a sum that overflows (checked as it is added): no non-finite
  // value gets into `data` unnoticed.
  absl::Status DecodeIncoming(int i, Message in) {
    const int seg = RecvSegment(i);
    const absl::Span<float> dst = Segment(seg);
    absl::Status d =
        PhaseOf(i) == RingPhase::kReduceScatter
            ? o_.codec->DecodeSliceAccumulate(Offset(seg), in.payload, dst)
            : o_.codec->DecodeSlice(Offset(seg), in.payload, dst);
    if (!d.ok()) {
      // An overflow error with a NaN in the sum is this node's own value,
      // nobody else's fault.
      if (d == AccumulateOverflowError()) {
        absl::Status own = OwnValueNotFinite(dst);
        if (!own.ok()) {
          return Fail(
              own, absl::StrCat("segment ", seg, " from rank ", prev_, ": "));
        }
      }
      return BlameRank(Fail(d, absl::StrCat("bad compressed segment from rank ",
                                            prev_, ": ")),
                       prev_);
    }
    forward_ = std::make_shared<const std::string>(std::move(in.payload));
    return absl::OkStatus();
  }

  // Step i's raw segment `in`, which no sink took: added or copied, checked.
  absl::Status ApplyIncoming(int i, const Message& in) {
    const int seg = RecvSegment(i);
    absl::Status a = ApplyFromPeer(in.payload, Segment(seg),
                                   PhaseOf(i) == RingPhase::kReduceScatter);
    if (a.ok()) return a;
    const absl::Status why =
        Fail(a, absl::StrCat("segment ", seg, " from rank ", prev_, ": "));
    return absl::IsInvalidArgument(a) ? BlameRank(why, prev_) : why;
  }

  Transport& t_;
  const absl::Span<float> data_;
  const RingOptions& o_;
  const int n_, r_, next_, prev_;
  const int64_t total_;
  const int steps_;
  // The bytes the all-gather forwards: the owner's encoded segment first,
  // then what arrived in the previous step, unchanged. Shared with the
  // transport, which sends them without a copy.
  std::shared_ptr<const std::string> forward_;
  std::vector<std::shared_ptr<Sink>> sinks_;  // by step; raw fp32 only
};

// Sends one whole-tensor message to every other rank at once, a thread
// each, from the caller's memory (or `owner`'s); Join waits for them all
// and returns their outcomes by rank (OK for this rank).
class SendToEveryRank {
 public:
  SendToEveryRank(Transport& t, const Message& m, absl::string_view payload,
                  std::shared_ptr<const void> owner, absl::Time deadline)
      : sent_(t.world()) {
    for (int to = 0; to < t.world(); ++to) {
      if (to == t.rank()) continue;
      senders_.emplace_back([&t, m, payload, owner, deadline, to, this] {
        sent_[to] = t.SendPayload(to, m, payload, owner, deadline);
      });
    }
  }
  ~SendToEveryRank() { Join(); }
  const std::vector<absl::Status>& Join() {
    for (std::thread& s : senders_) s.join();
    senders_.clear();
    return sent_;
  }

 private:
  std::vector<absl::Status> sent_;
  std::vector<std::thread> senders_;
};

// The whole-tensor message this rank sends in round o.round.
Message WholeMessage(const Transport& t, const RingOptions& o,
                     int64_t elements) {
  Message m;
  m.from = t.rank();
  m.round = o.round;
  m.tensor = o.tensor;
  m.phase = RingPhase::kAllGather;
  m.step = 0;
  m.segment = 0;
  m.total_elements = elements;
  return m;
}

}  // namespace

absl::Status RingAllReduceSum(Transport& t, absl::Span<float> data,
                              const RingOptions& o) {
  if (t.world() == 1) return absl::OkStatus();
  return RingRun(t, data, o).Run();
}

absl::Status AllGatherWhole(Transport& t, absl::Span<const float> mine,
                            const RingOptions& o,
                            std::vector<std::vector<float>>* packs,
                            std::vector<std::string>* refused) {
  const int n = t.world(), r = t.rank();
  packs->assign(n, {});
  refused->assign(n, "");
  (*packs)[r].assign(mine.begin(), mine.end());
  if (o.codec != nullptr) {
    return absl::InvalidArgumentError("AllGatherWhole sends raw fp32 only");
  }
  if (n == 1) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + o.step_timeout;
  const absl::string_view payload = Bytes(mine);
  SendToEveryRank senders(t,
                          WholeMessage(t, o, static_cast<int64_t>(mine.size())),
                          payload, nullptr, deadline);
  absl::Status first_error;
  for (int from = 0; from < n; ++from) {
    if (from == r) continue;
    absl::StatusOr<Message> in = t.mailbox().Take(
        from, o.round, o.tensor, RingPhase::kAllGather, 0, deadline);
    if (absl::IsInvalidArgument(in.status())) {
      (*refused)[from] = std::string(in.status().message());
      continue;
    }
    if (!in.ok()) {
      first_error = absl::Status(
          in.status().code(),
          absl::StrCat("round ", o.round, ": ", in.status().message()));
      break;  // the senders end by the same deadline (or the cancel)
    }
    const float* src = reinterpret_cast<const float*>(in->payload.data());
    (*packs)[from].assign(src, src + mine.size());
  }
  const std::vector<absl::Status>& sent = senders.Join();
  if (!first_error.ok()) return first_error;
  for (int to = 0; to < n; ++to) {
    if (to == r || sent[to].ok()) continue;
    if (absl::IsInvalidArgument(sent[to])) {
      STARLING_LOG(WARNING)
          << "round " << o.round << ": rank " << to
          << " refused this node's contribution: " << sent[to].message();
      continue;
    }
    return absl::Status(sent[to].code(),
                        absl::StrCat("round ", o.round, ": sending to rank ",
                                     to, " failed: ", sent[to].message()));
  }
  if (o.stats != nullptr) {
    o.stats->raw_bytes += static_cast<int64_t>(payload.size()) * (n - 1);
    o.stats->wire_bytes += static_cast<int64_t>(payload.size()) * (n - 1);
  }
  return absl::OkStatus();
}

absl::Status RingWeightedAverage(Transport& t, std::vector<float>& values,
                                 double weight, const RingOptions& o) {
  if (!(weight > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("averaging weight must be positive, got ", weight));
  }
  if (t.world() == 1) return absl::OkStatus();  // the average of one
  const size_t n = values.size();
  const size_t extras = o.extra_sums != nullptr ? o.extra_sums->size() : 0;
  // Fresh memory each call, owned here and by any send gRPC still holds.
  auto shared = std::make_shared<std::vector<float>>(n + 1 + extras);
  std::vector<float>& buf = *shared;
  const float w = static_cast<float>(weight);
  for (size_t i = 0; i < n; ++i) buf[i] = values[i] * w;
  buf[n] = w;
  for (size_t i = 0; i < extras; ++i) buf[n + 1 + i] = (*o.extra_sums)[i];
  RingOptions with_owner = o;
  with_owner.data_owner = shared;
  absl::Status s = RingAllReduceSum(t, absl::MakeSpan(buf), with_owner);
  if (!s.ok()) return s;
  const float total = buf[n];
  if (!(total > 0)) {
    return absl::InternalError("the sum of averaging weights is not positive");
  }
  for (size_t i = 0; i < n; ++i) values[i] = buf[i] / total;
  for (size_t i = 0; i < extras; ++i) (*o.extra_sums)[i] = buf[n + 1 + i];
  return absl::OkStatus();
}

absl::Status AllGatherSum(Transport& t, absl::Span<float> data,
                          const RingOptions& o) {
  if (o.codec == nullptr) {
    return absl::InvalidArgumentError("AllGatherSum needs a codec");
  }
  const int n = t.world(), r = t.rank();
  absl::StatusOr<std::string> enc = o.codec->EncodeSlice(0, data);
  if (!enc.ok()) {
    return absl::Status(enc.status().code(),
                        absl::StrCat("round ", o.round,
                                     ": encoding: ", enc.status().message()));
  }
  auto mine = std::make_shared<const std::string>(std::move(enc).value());
  std::vector<std::string> theirs(n);
  if (n > 1) {
    const absl::Time deadline = absl::Now() + o.step_timeout;
    SendToEveryRank senders(
        t, WholeMessage(t, o, static_cast<int64_t>(data.size())), *mine, mine,
        deadline);
    for (int from = 0; from < n; ++from) {
      if (from == r) continue;
      absl::StatusOr<Message> in = t.mailbox().Take(
          from, o.round, o.tensor, RingPhase::kAllGather, 0, deadline);
      if (!in.ok()) {
        const absl::Status why(
            in.status().code(),
            absl::StrCat("round ", o.round, ": ", in.status().message()));
        return absl::IsInvalidArgument(in.status()) ? BlameRank(why, from)
                                                    : why;
      }
      theirs[from] = std::move(in->payload);
    }
    const std::vector<absl::Status>& sent = senders.Join();
    for (int to = 0; to < n; ++to) {
      if (to == r || sent[to].ok()) continue;
      return absl::Status(sent[to].code(),
                          absl::StrCat("round ", o.round, ": sending to rank ",
                                       to, " failed: ", sent[to].message()));
    }
  }
  // Every member adds the same bytes in the same order.
  std::fill(data.begin(), data.end(), 0.0f);
  for (int from = 0; from < n; ++from) {
    const absl::Status d = o.codec->DecodeSliceAccumulate(
        0, from == r ? *mine : theirs[from], data);
    if (d.ok()) continue;
    const absl::Status why(d.code(), absl::StrCat("round ", o.round,
                                                  ": bad contribution from "
                                                  "rank ",
                                                  from, ": ", d.message()));
    return from == r ? why : BlameRank(why, from);
  }
  if (o.stats != nullptr) {
    o.stats->raw_bytes += static_cast<int64_t>(data.size()) * 4 * (n - 1);
    o.stats->wire_bytes += static_cast<int64_t>(mine->size()) * (n - 1);
  }
  return absl::OkStatus();
}

}  // namespace starling
