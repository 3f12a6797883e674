#include "gossip/ring_allreduce.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace starling {
namespace {

std::string Bytes(absl::Span<const float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

}  // namespace

absl::Status RingAllReduceSum(Transport& t, absl::Span<float> data,
                              const RingOptions& o) {
  const int n = t.world(), r = t.rank();
  if (n == 1) return absl::OkStatus();
  const int64_t total = static_cast<int64_t>(data.size());
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto segment = [&](int s) {
    return data.subspan(SegmentOffset(total, n, s), SegmentLength(total, n, s));
  };
  for (RingPhase phase : {RingPhase::kReduceScatter, RingPhase::kAllGather}) {
    for (int k = 0; k < n - 1; ++k) {
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
      m.payload = Bytes(segment(send_seg));
      const absl::Time deadline = absl::Now() + o.step_timeout;
      absl::Status s = t.Send(next, m, deadline);
      if (!s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat("round ", o.round, ": sending to rank ",
                                         next, " failed: ", s.message()));
      }
      absl::StatusOr<Message> in =
          t.mailbox().Take(prev, o.round, o.tensor, phase, k, deadline);
      if (!in.ok()) {
        return absl::Status(in.status().code(),
                            absl::StrCat("round ", o.round, ": ",
                                         in.status().message()));
      }
      if (in->segment != recv_seg) {
        return absl::InvalidArgumentError(absl::StrCat(
            "round ", o.round, ": rank ", prev, " sent segment ", in->segment,
            " at step ", k, "; the ring expects segment ", recv_seg));
      }
      absl::Span<float> dst = segment(recv_seg);
      const float* src = reinterpret_cast<const float*>(in->payload.data());
      if (phase == RingPhase::kReduceScatter) {
        for (size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
      } else {
        std::memcpy(dst.data(), src, dst.size() * 4);
      }
    }
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
  std::vector<float> buf(values.size() + 1);
  const float w = static_cast<float>(weight);
  for (size_t i = 0; i < values.size(); ++i) buf[i] = values[i] * w;
  buf.back() = w;
  absl::Status s = RingAllReduceSum(t, absl::MakeSpan(buf), o);
  if (!s.ok()) return s;
  const float total = buf.back();
  if (!(total > 0)) {
    return absl::InternalError("the sum of averaging weights is not positive");
  }
  for (size_t i = 0; i < values.size(); ++i) values[i] = buf[i] / total;
  return absl::OkStatus();
}

}  // namespace starling
