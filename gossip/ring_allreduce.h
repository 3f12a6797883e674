// Ring all-reduce over a round's members: reduce-scatter then all-gather,
// fp32 accumulation in a fixed order, so that every member ends with
// bit-identical bytes (each segment is reduced by one owner and then copied
// unchanged). Each member sends 2·(N−1)/N of the payload.
// Stateless functions over an injected Transport; call from one thread per
// rank. Every wait has a deadline. Also the whole-vector all-gather that
// robust aggregation (--aggregate) runs instead, and the all-gather of
// encoded vectors that sums sparse contributions (AllGatherSum).
#ifndef STARLING_GOSSIP_RING_ALLREDUCE_H_
#define STARLING_GOSSIP_RING_ALLREDUCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "compression/tensor_policy.h"
#include "gossip/transport.h"

namespace starling {

// Bytes this rank put into ring messages: as fp32 and as sent.
struct RingStats {
  int64_t raw_bytes = 0;
  int64_t wire_bytes = 0;
};

struct RingOptions {
  std::string tensor = "pseudo_grad";
  int64_t round = 0;
  absl::Duration step_timeout = absl::Seconds(60);  // per ring step
  // Null: raw fp32. Otherwise every reduce-scatter hop re-encodes its fp32
  // partial sum (accumulation stays fp32), and each owner encodes its
  // reduced segment once, replaces its own copy with the decoded values and
  // all-gathers those bytes unchanged, so every member stays bit-identical.
  const PolicyCodec* codec = nullptr;
  RingStats* stats = nullptr;  // accumulated when non-null
  // RingAllReduceSum: what owns the memory of its `data`, or null. With an
  // owner, raw fp32 segments go out from `data` itself, not from a copy;
  // the transport may hold a reference after an error (see
  // Transport::SendPayload), so a caller that writes into the memory again
  // after a failed call uses fresh memory instead (as the node does, one
  // buffer per attempt). RingWeightedAverage sets its own.
  std::shared_ptr<const void> data_owner;
  // RingWeightedAverage only: values summed across ranks unweighted, after
  // the weight (e.g. stop votes, so all members stop after the same round).
  // Replaced by the sums on success.
  std::vector<float>* extra_sums = nullptr;
};

// A failed collective that refused rank `rank`'s data as invalid carries
// it: BlamedRank reads it back (-1 when the failure blames nobody).
absl::Status BlameRank(absl::Status s, int rank);
int BlamedRank(const absl::Status& s);

// In place: data ← Σ over ranks of data. data.size() must equal the
// tensor's element count in the mailbox options. On error `data` holds
// partial sums and must be discarded. An error for invalid data from the
// previous rank blames it (BlameRank).
absl::Status RingAllReduceSum(Transport& transport, absl::Span<float> data,
                              const RingOptions& options);

// In place: values ← Σ_i w_i·values_i / Σ_i w_i, with w_i = `weight` of rank
// i (> 0). The weights travel as one extra element (then any extra_sums),
// so the mailbox's tensor size is values.size() + 1 + extra_sums->size().
// On error `values` is left unchanged.
absl::Status RingWeightedAverage(Transport& transport,
                                 std::vector<float>& values, double weight,
                                 const RingOptions& options);

// All-gather of whole vectors, for robust aggregation: sends `mine` raw
// fp32 straight to every other rank (in parallel) as tensor o.tensor, which
// the mailboxes must list in whole_tensors, and fills (*packs)[i] with rank
// i's vector (its own included). Each member sends (N−1)·P values, against
// the ring's 2·(N−1)/N·P. A vector the receiving mailbox refused (NaN,
// wrong size) leaves (*packs)[i] empty and (*refused)[i] saying why: the
// caller drops that member's contribution, which every honest member
// refuses alike. A refusal of this rank's own vector by a peer is logged and
// not an error. Errors: a peer that stays silent or unreachable until
// o.step_timeout, or a cancelled mailbox. o.codec must be null.
absl::Status AllGatherWhole(Transport& transport, absl::Span<const float> mine,
                            const RingOptions& options,
                            std::vector<std::vector<float>>* packs,
                            std::vector<std::string>* refused);

// In place: data ← Σ over ranks, in rank order, of D(E(data_i)), E and D
// being o.codec's EncodeSlice and DecodeSlice over the whole vector. Every
// rank encodes its own vector once, sends those bytes to every other rank at
// once, and adds every rank's decoded bytes (its own too) into a zeroed sum
// in rank order, so every member ends with the same bits. For a sparse codec
// (compression/sparse_codec.h), whose sum of N contributions is not sparse:
// the ring would re-select at every hop and drop, from nobody's error
// feedback, what a hop does not keep. Each rank sends (N−1)·S bytes for an
// encoded vector of S bytes, against the ring's 2·(N−1)/N·S per hop-encoded
// segment (docs/compression.md has the crossover in N). o.tensor must travel
// whole and compressed in the mailboxes; o.codec must not be null. A
// payload that the mailbox refused or that does not decode blames its rank
// (BlameRank); other errors as RingAllReduceSum's. On error `data` must be
// discarded.
absl::Status AllGatherSum(Transport& transport, absl::Span<float> data,
                          const RingOptions& options);

}  // namespace starling

#endif  // STARLING_GOSSIP_RING_ALLREDUCE_H_
