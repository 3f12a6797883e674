// Fuzz target for the per-tensor policy decoder (compression/tensor_policy.h):
// DecodeSlice and DecodeSliceAccumulate of a slice payload (u32-prefixed
// parts, one codec payload per tensor range) under a policy built from the
// input.
// Input: u8 main codec, u8 small codec, u8 tensor count, that many u16 tensor
// sizes, u16 small-tensor threshold, u8 trailing fp32 elements, u32 slice
// offset, u32 slice length, then the slice payload.
// Invariants: the accumulating decode fails where DecodeSlice does (and
// then leaves the accumulator unchanged) or where a sum overflows (some
// accumulator elements are 3e38), and otherwise adds exactly the decoded
// values; decoded values are finite and re-encode, and a lossless policy
// round-trips them.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "compression/tensor_policy.h"
#include "tests/fuzz/fuzz_util.h"

namespace {}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  fuzz::Reader in(data, size);
  PolicyOptions o;
  o.main =
      fuzz::kPolicyMain[in.Get<uint8_t>() % fuzz::Count(fuzz::kPolicyMain)];
  o.small =
      fuzz::kPolicySmall[in.Get<uint8_t>() % fuzz::Count(fuzz::kPolicySmall)];
  std::vector<int64_t> tensors(in.Get<uint8_t>() % 8);
  for (int64_t& t : tensors) t = in.Get<uint16_t>() % 5000;
  o.small_elements = in.Get<uint16_t>();
  o.trailing_fp32 = in.Get<uint8_t>() % 5;
  absl::StatusOr<std::unique_ptr<PolicyCodec>> made =
      PolicyCodec::Create(tensors, o);
  FUZZ_CHECK(made.ok(), "PolicyCodec::Create: %s",
             made.status().ToString().c_str());
  const PolicyCodec& policy = **made;
  const int64_t total = policy.size();
  const int64_t offset = in.Get<uint32_t>() % (total + 1);
  const int64_t length = in.Get<uint32_t>() % (total - offset + 1);
  const absl::string_view payload = in.Rest();
  const size_t n = static_cast<size_t>(length);

  std::vector<float> out(n, 7.0f);
  const absl::Status s =
      policy.DecodeSlice(offset, payload, absl::MakeSpan(out));
  std::vector<float> acc(n);
  for (size_t i = 0; i < n; ++i) acc[i] = fuzz::AccumulatorBase(i);
  const std::vector<float> base = acc;
  const absl::Status sa =
      policy.DecodeSliceAccumulate(offset, payload, absl::MakeSpan(acc));
  if (!s.ok()) {
    FUZZ_CHECK(!sa.ok(), "DecodeSlice: %s; DecodeSliceAccumulate: OK",
               s.ToString().c_str());
    FUZZ_CHECK(fuzz::SameBits(acc, base),
               "DecodeSliceAccumulate changed acc: %s", sa.ToString().c_str());
    return 0;
  }
  fuzz::CheckAccumulated(out, base, acc, sa);
  absl::StatusOr<std::string> again = policy.EncodeSlice(offset, out);
  FUZZ_CHECK(again.ok(), "re-encode: %s", again.status().ToString().c_str());
  FUZZ_CHECK(
      static_cast<int64_t>(again->size()) <= policy.MaxEncodedBytes(length),
      "re-encoded slice of %lld elements has %zu bytes, over "
      "MaxEncodedBytes %lld",
      static_cast<long long>(length), again->size(),
      static_cast<long long>(policy.MaxEncodedBytes(length)));
  std::vector<float> back(n, 7.0f);
  const absl::Status sb =
      policy.DecodeSlice(offset, *again, absl::MakeSpan(back));
  FUZZ_CHECK(sb.ok(), "decode of the re-encoded slice: %s",
             sb.ToString().c_str());
  if (policy.lossless()) {
    FUZZ_CHECK(fuzz::SameBits(back, out),
               "lossless policy does not round-trip");
  }
  return 0;
}
