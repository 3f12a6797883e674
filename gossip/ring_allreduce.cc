#include "gossip/ring_allreduce.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "core/logging.h"
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

absl::Status RingAllReduceSum(Transport& t, absl::Span<float> data,
                              const RingOptions& o) {
  const int n = t.world(), r = t.rank();
  if (n == 1) return absl::OkStatus();
  const int64_t total = static_cast<int64_t>(data.size());
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto segment = [&](int s) {
    return data.subspan(SegmentOffset(total, n, s), SegmentLength(total, n, s));
  };
  auto fail = [&](const absl::Status& s, absl::string_view what) {
    return absl::Status(
        s.code(), absl::StrCat("round ", o.round, ": ", what, s.message()));
  };
  // The bytes the all-gather forwards: the owner's encoded segment first,
  // then what arrived in the previous step, unchanged. Encoded bytes are
  // shared with the transport, which sends them without a copy.
  std::shared_ptr<const std::string> forward;
  // Raw fp32: the transport may add (copy) what arrives straight into the
  // receiving segment, chunk by chunk, through a sink the mailbox hands it
  // (see Mailbox::Expect). Step i's sink is set up before step i-1's send
  // when that send reads another segment (3 or more ranks), so that a
  // sender that is a step ahead still finds it. Every sink is closed on
  // every way out, before `data` can go away.
  const int steps = 2 * (n - 1);
  auto phase_of = [&](int i) {
    return i < n - 1 ? RingPhase::kReduceScatter : RingPhase::kAllGather;
  };
  auto recv_seg_of = [&](int i) {
    const int shift = i < n - 1 ? 0 : 1, k = i % (n - 1);
    return ((r + shift - k - 1) % n + n) % n;
  };
  std::vector<std::shared_ptr<Sink>> sinks(steps);
  struct CloseSinks {
    std::vector<std::shared_ptr<Sink>>& sinks;
    ~CloseSinks() {
      for (auto& s : sinks) {
        if (s != nullptr) s->Close();
      }
    }
  } close_sinks{sinks};
  auto expect = [&](int i) {
    if (o.codec != nullptr || i >= steps || sinks[i] != nullptr) return;
    sinks[i] = t.mailbox().Expect(
        prev, o.round, o.tensor, phase_of(i), i % (n - 1), recv_seg_of(i),
        segment(recv_seg_of(i)), phase_of(i) == RingPhase::kReduceScatter);
  };
  for (RingPhase phase : {RingPhase::kReduceScatter, RingPhase::kAllGather}) {
    for (int k = 0; k < n - 1; ++k) {
      const int i = (phase == RingPhase::kReduceScatter ? 0 : n - 1) + k;
      // Reduce-scatter: after step k, rank r holds the partial sum of
      // segment (r-k-1) over ranks r-k-1..r; rank r ends owning segment r+1.
      // All-gather: owners' reduced segments travel round the ring unchanged.
      const int shift = phase == RingPhase::kReduceScatter ? 0 : 1;
      const int send_seg = ((r + shift - k) % n + n) % n;
      const int recv_seg = ((r + shift - k - 1) % n + n) % n;
      Message m;
      m.from = r;
      m.round = o.round;
      m.tensor = o.tensor;
      m.phase = phase;
      m.step = k;
      m.segment = send_seg;
      m.total_elements = total;
      absl::Span<float> out_seg = segment(send_seg);
      if (phase == RingPhase::kAllGather && k == 0 && o.codec != nullptr) {
        // The owner quantizes its reduced segment once and keeps exactly
        // what the others will decode.
        absl::StatusOr<std::string> enc =
            o.codec->EncodeSlice(SegmentOffset(total, n, send_seg), out_seg);
        if (!enc.ok()) return fail(enc.status(), "encoding: ");
        absl::Status s = o.codec->DecodeSlice(SegmentOffset(total, n, send_seg),
                                              *enc, out_seg);
        if (!s.ok()) return fail(s, "decoding own segment: ");
        forward = std::make_shared<const std::string>(std::move(enc).value());
      }
      // What travels: raw fp32 straight from `data` (the transport streams
      // it without a copy when `data` has an owner), or the encoded bytes
      // (never copied).
      absl::string_view payload;
      std::shared_ptr<const void> owner;
      if (phase == RingPhase::kAllGather && o.codec != nullptr) {
        payload = *forward;
        owner = forward;
      } else if (o.codec != nullptr) {
        absl::StatusOr<std::string> enc =
            o.codec->EncodeSlice(SegmentOffset(total, n, send_seg), out_seg);
        if (!enc.ok()) return fail(enc.status(), "encoding: ");
        auto encoded =
            std::make_shared<const std::string>(std::move(enc).value());
        payload = *encoded;
        owner = std::move(encoded);
      } else {
        payload = Bytes(out_seg);
        owner = o.data_owner;
      }
      if (o.stats != nullptr) {
        o.stats->raw_bytes += static_cast<int64_t>(out_seg.size()) * 4;
        o.stats->wire_bytes += static_cast<int64_t>(payload.size());
      }
      expect(i);
      if (n >= 3) expect(i + 1);
      const absl::Time deadline = absl::Now() + o.step_timeout;
      absl::Status s = t.SendPayload(next, m, payload, owner, deadline);
      expect(i + 1);
      if (!s.ok()) {
        return fail(s, absl::StrCat("sending to rank ", next, " failed: "));
      }
      if (phase == RingPhase::kAllGather) CrashPoint("all_gather");
      absl::StatusOr<Message> in =
          t.mailbox().Take(prev, o.round, o.tensor, phase, k, deadline);
      if (absl::IsInvalidArgument(in.status())) {
        return BlameRank(fail(in.status(), ""), prev);
      }
      if (!in.ok()) return fail(in.status(), "");
      if (phase == RingPhase::kReduceScatter) CrashPoint("reduce");
      if (in->segment != recv_seg) {
        return absl::InvalidArgumentError(absl::StrCat(
            "round ", o.round, ": rank ", prev, " sent segment ", in->segment,
            " at step ", k, "; the ring expects segment ", recv_seg));
      }
      absl::Span<float> dst = segment(recv_seg);
      const int64_t dst_offset = SegmentOffset(total, n, recv_seg);
      if (o.codec != nullptr) {
        // The codecs refuse NaN/Inf in a payload, decode finite values
        // only, and refuse a sum that overflows (checked as it is added):
        // no non-finite value gets into `dst` unnoticed.
        absl::Status d =
            phase == RingPhase::kReduceScatter
                ? o.codec->DecodeSliceAccumulate(dst_offset, in->payload, dst)
                : o.codec->DecodeSlice(dst_offset, in->payload, dst);
        if (!d.ok()) {
          // The codecs decode finite values only: an overflow error with a
          // NaN in the sum is this node's own value, nobody else's fault.
          if (d == AccumulateOverflowError()) {
            absl::Status own = OwnValueNotFinite(dst);
            if (!own.ok()) {
              return fail(own, absl::StrCat("segment ", recv_seg, " from rank ",
                                            prev, ": "));
            }
          }
          return BlameRank(
              fail(d, absl::StrCat("bad compressed segment from rank ", prev,
                                   ": ")),
              prev);
        }
        forward = std::make_shared<const std::string>(std::move(in->payload));
      } else if (!in->applied) {
        absl::Status a =
            ApplyFromPeer(in->payload, dst, phase == RingPhase::kReduceScatter);
        if (!a.ok()) {
          const absl::Status why = fail(
              a, absl::StrCat("segment ", recv_seg, " from rank ", prev, ": "));
          return absl::IsInvalidArgument(a) ? BlameRank(why, prev) : why;
        }
      }
    }
  }
  return absl::OkStatus();
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
  Message m;
  m.from = r;
  m.round = o.round;
  m.tensor = o.tensor;
  m.phase = RingPhase::kAllGather;
  m.step = 0;
  m.segment = 0;
  m.total_elements = static_cast<int64_t>(mine.size());
  const absl::Time deadline = absl::Now() + o.step_timeout;
  const absl::string_view payload = Bytes(mine);
  std::vector<absl::Status> sent(n);
  std::vector<std::thread> senders;
  for (int to = 0; to < n; ++to) {
    if (to == r) continue;
    senders.emplace_back([&, to] {
      sent[to] = t.SendPayload(to, m, payload, nullptr, deadline);
    });
  }
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
  for (std::thread& s : senders) s.join();
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

}  // namespace starling
