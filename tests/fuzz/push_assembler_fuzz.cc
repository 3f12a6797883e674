// Fuzz target for the push-sum chunk reassembler (gossip/push_sum.h): push
// streams of serialized PushChunk protos fed to PushAssembler (Add each
// chunk, Finish at the end of a stream, as the Swarm's Push service does),
// and the finished pushes resolved against the receiver's public copies.
// Input: u8 codec (0: raw fp32, else a lossy policy codec), u16 element
// count, then records: u8 kind, and for a chunk a u32 length and the
// serialized PushChunk. Kinds: 0 chunk, 1 end of stream, 2 chunk whose run
// id, element count and codec name are forced to the receiver's.
// Invariants: errors are InvalidArgument (FailedPrecondition from Resolve
// for a missing base copy); a finished push has exactly the model's element
// count, finite values, a finite weight > 0 and the announced byte count;
// a resolved push is absolute and finite.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compression/tensor_policy.h"
#include "gossip/push_sum.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  fuzz::Reader in(data, size);
  using fuzz::kRunId;
  const int which = in.Get<uint8_t>() % (1 + fuzz::Count(fuzz::kPushCodecs));
  const int64_t elements = 1 + in.Get<uint16_t>() % 2048;
  std::unique_ptr<PolicyCodec> policy;
  if (which > 0) {
    PolicyOptions o;
    o.main = fuzz::kPushCodecs[which - 1];
    o.small_elements = 0;  // one tensor, always the main codec
    policy = std::move(PolicyCodec::Create({elements}, o)).value();
  }
  const int64_t max_bytes = policy ? policy->MaxEncodedBytes(elements) : 0;
  PublicCopies copies;

  auto assembler = std::make_unique<PushAssembler>(kRunId, elements,
                                                   policy.get(), max_bytes);
  bool failed = false;
  bool any = false;
  auto finish = [&] {
    if (failed || !any) return;  // the service ends a failed stream at once
    absl::StatusOr<ReceivedPush> push = assembler->Finish();
    if (!push.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(push.status()), "Finish: %s",
                 push.status().ToString().c_str());
      return;
    }
    FUZZ_CHECK(static_cast<int64_t>(push->values.size()) == elements,
               "push of %zu values, model has %lld", push->values.size(),
               static_cast<long long>(elements));
    FUZZ_CHECK(push->weight > 0 && std::isfinite(push->weight), "weight %f",
               push->weight);
    FUZZ_CHECK(push->wire_bytes == assembler->bytes(), "wire bytes");
    if (push->codec.empty()) {
      FUZZ_CHECK(push->wire_bytes == 4 * elements, "raw push of %lld bytes",
                 static_cast<long long>(push->wire_bytes));
    }
    for (float v : push->values) FUZZ_CHECK(std::isfinite(v), "value %f", v);
    const absl::Status r = copies.Resolve(*push);
    if (!r.ok()) {
      FUZZ_CHECK(absl::IsFailedPrecondition(r) || absl::IsInvalidArgument(r),
                 "Resolve: %s", r.ToString().c_str());
      return;
    }
    FUZZ_CHECK(push->base_sequence == 0, "resolved push is still relative");
    for (float v : push->values) FUZZ_CHECK(std::isfinite(v), "value %f", v);
  };
  auto next_stream = [&] {
    finish();
    assembler = std::make_unique<PushAssembler>(kRunId, elements, policy.get(),
                                                max_bytes);
    failed = false;
    any = false;
  };

  while (!in.empty()) {
    const int kind = in.Get<uint8_t>() % 3;
    if (kind == 1) {
      next_stream();
      continue;
    }
    peer::v1::PushChunk chunk;
    const absl::string_view bytes = in.LenBytes(1 << 20);
    if (!chunk.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      continue;
    }
    if (kind == 2) {
      chunk.set_run_id(kRunId);
      chunk.set_elements(elements);
      chunk.set_codec(policy ? policy->Name() : "");
    }
    if (failed) continue;
    any = true;
    const absl::Status s = assembler->Add(chunk);
    if (!s.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(s), "Add: %s", s.ToString().c_str());
      failed = true;
    }
    FUZZ_CHECK(assembler->bytes() <= (policy ? max_bytes : 4 * elements),
               "assembler holds %lld bytes",
               static_cast<long long>(assembler->bytes()));
  }
  finish();
  return 0;
}
