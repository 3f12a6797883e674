#include "gossip/state_transfer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/flat_params.h"
#include "gossip/membership.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

SwarmState RandomState(size_t n, std::mt19937_64& rng, int64_t round = 12) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  SwarmState s;
  s.round = round;
  s.step = round * 50 + 3;
  s.theta.resize(n);
  for (float& x : s.theta) x = normal(rng);
  s.lineage = FlatHash(s.theta);
  s.member_rounds = round * 3 + 1;
  // Outer state: momentum (compressible zeros) plus a few random bytes.
  s.outer_state.assign(8 * n + 5, '\0');
  for (size_t i = 0; i < s.outer_state.size(); i += 7) {
    s.outer_state[i] = static_cast<char>(rng());
  }
  return s;
}

void ExpectSameState(const SwarmState& a, const SwarmState& b) {
  EXPECT_EQ(a.round, b.round);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.lineage, b.lineage);
  EXPECT_EQ(a.member_rounds, b.member_rounds);
  ASSERT_EQ(a.theta.size(), b.theta.size());
  EXPECT_TRUE(a.theta.empty() || std::memcmp(a.theta.data(), b.theta.data(),
                                             4 * a.theta.size()) == 0);
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  EXPECT_TRUE(a.buffers.empty() ||
              std::memcmp(a.buffers.data(), b.buffers.data(),
                          4 * a.buffers.size()) == 0);
  EXPECT_EQ(a.outer_state, b.outer_state);
}

// Feeds `blob` to `as` from `offset` to `end` in chunks of random size.
void Feed(const StateBlob& blob, StateAssembler& as, int64_t offset,
          int64_t end, std::mt19937_64& rng) {
  const std::string& bytes = blob.bytes();
  const int64_t total = static_cast<int64_t>(bytes.size());
  while (offset < end) {
    const int64_t len = std::min<int64_t>(
        end - offset, 1 + static_cast<int64_t>(rng() % (total / 3 + 1)));
    absl::string_view data(bytes.data() + offset, len);
    ASSERT_TRUE(
        as.Add(blob.digest(), total, offset, data, ChunkChecksum(data)).ok());
    offset += len;
  }
}

TEST(StateTransferTest, EncodeDecodeRoundTrip) {
  std::mt19937_64 rng(1);
  for (size_t n : {0, 1, 7, 1000, 100003}) {
    SwarmState s = RandomState(n, rng);
    std::string bytes = EncodeSwarmState(s);
    auto got = DecodeSwarmState(bytes);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status();
    ExpectSameState(*got, s);
  }
}

TEST(StateTransferTest, BlobRoundTripInRandomChunks) {
  std::mt19937_64 rng(2);
  for (size_t n : {0, 1, 13, 4097, 300001}) {
    SwarmState s = RandomState(n, rng, 40 + n);
    auto blob = StateBlob::Make(s);
    EXPECT_EQ(blob->round(), s.round);
    EXPECT_EQ(blob->lineage(), s.lineage);
    EXPECT_EQ(blob->member_rounds(), s.member_rounds);
    EXPECT_EQ(blob->raw_bytes(),
              static_cast<int64_t>(EncodeSwarmState(s).size()));
    ASSERT_EQ(blob->digest().size(), 16u);
    EXPECT_EQ(blob->digest().find_first_not_of("0123456789abcdef"),
              std::string::npos);
    // Deterministic: another donor with the same state serves the same blob.
    EXPECT_EQ(StateBlob::Make(s)->digest(), blob->digest());
    for (int trial = 0; trial < 3; ++trial) {
      StateAssembler as;
      Feed(*blob, as, 0, static_cast<int64_t>(blob->bytes().size()), rng);
      ASSERT_TRUE(as.complete());
      EXPECT_EQ(as.digest(), blob->digest());
      auto got = as.Finish();
      ASSERT_TRUE(got.ok()) << n << ": " << got.status();
      ExpectSameState(*got, s);
      EXPECT_FALSE(as.complete());
      EXPECT_EQ(as.next_offset(), 0);
    }
  }
}

TEST(StateTransferTest, CompressesWhenItPaysAndStoresRawOtherwise) {
  std::mt19937_64 rng(3);
  SwarmState zeros;
  zeros.theta.assign(1 << 18, 0.0f);  // 1 MiB: more than one zstd chunk
  zeros.lineage = FlatHash(zeros.theta);
  zeros.outer_state.assign(3 << 20, '\0');
  auto small = StateBlob::Make(zeros);
  EXPECT_LT(small->bytes().size() * 10,
            static_cast<size_t>(small->raw_bytes()));
  StateAssembler as;
  Feed(*small, as, 0, small->bytes().size(), rng);
  auto got = as.Finish();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameState(*got, zeros);

  SwarmState noise;
  noise.lineage = FlatHash(noise.theta);
  noise.outer_state.resize(100000);
  for (char& c : noise.outer_state) c = static_cast<char>(rng());
  auto raw = StateBlob::Make(noise);
  EXPECT_GE(raw->bytes().size(), static_cast<size_t>(raw->raw_bytes()));
  EXPECT_LE(raw->bytes().size(), static_cast<size_t>(raw->raw_bytes()) + 16);
  Feed(*raw, as, 0, raw->bytes().size(), rng);
  got = as.Finish();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameState(*got, noise);
}

TEST(StateTransferTest, CorruptChunkIsDataLossAndRefetchSucceeds) {
  std::mt19937_64 rng(4);
  SwarmState s = RandomState(5000, rng);
  auto blob = StateBlob::Make(s);
  const std::string& bytes = blob->bytes();
  const int64_t total = bytes.size();
  StateAssembler as;
  const int64_t half = total / 2;
  Feed(*blob, as, 0, half, rng);
  ASSERT_EQ(as.next_offset(), half);

  std::string bad(bytes.substr(half, 100));
  const uint64_t checksum = ChunkChecksum(bad);
  bad[37] ^= 0x10;
  absl::Status st = as.Add(blob->digest(), total, half, bad, checksum);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_EQ(as.next_offset(), half);  // nothing taken

  Feed(*blob, as, as.next_offset(), total, rng);
  auto got = as.Finish();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameState(*got, s);
}

TEST(StateTransferTest, ResumesFromASecondDonorWithTheSameDigest) {
  std::mt19937_64 rng(5);
  SwarmState s = RandomState(20000, rng);
  auto first = StateBlob::Make(s);
  auto second = StateBlob::Make(s);
  ASSERT_EQ(first->digest(), second->digest());
  const int64_t total = first->bytes().size();
  StateAssembler as;
  Feed(*first, as, 0, total / 3, rng);
  // The first donor dies; the joiner asks the second for (digest, offset).
  Feed(*second, as, as.next_offset(), total, rng);
  auto got = as.Finish();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameState(*got, s);
}

TEST(StateTransferTest, DonorWithANewDigestRestartsTheAssembly) {
  std::mt19937_64 rng(6);
  SwarmState old_state = RandomState(3000, rng, 10);
  SwarmState new_state = RandomState(3000, rng, 11);
  auto old_blob = StateBlob::Make(old_state);
  auto new_blob = StateBlob::Make(new_state);
  ASSERT_NE(old_blob->digest(), new_blob->digest());
  const std::string& nb = new_blob->bytes();
  const int64_t new_total = nb.size();

  StateAssembler as;
  Feed(*old_blob, as, 0, old_blob->bytes().size() / 2, rng);
  const int64_t old_next = as.next_offset();
  // A new digest must start at 0 ...
  absl::string_view mid(nb.data() + 10, 10);
  absl::Status st =
      as.Add(new_blob->digest(), new_total, 10, mid, ChunkChecksum(mid));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_EQ(as.digest(), old_blob->digest());
  EXPECT_EQ(as.next_offset(), old_next);
  // ... and then replaces the old assembly.
  absl::string_view head(nb.data(), 50);
  ASSERT_TRUE(
      as.Add(new_blob->digest(), new_total, 0, head, ChunkChecksum(head)).ok());
  EXPECT_EQ(as.digest(), new_blob->digest());
  EXPECT_EQ(as.next_offset(), 50);
  Feed(*new_blob, as, 50, new_total, rng);
  auto got = as.Finish();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameState(*got, new_state);
}

TEST(StateTransferTest, RejectsBadOffsetsAndTotals) {
  std::mt19937_64 rng(7);
  auto blob = StateBlob::Make(RandomState(100, rng));
  const std::string& b = blob->bytes();
  const std::string& d = blob->digest();
  const int64_t total = b.size();
  absl::string_view head(b.data(), 10);
  const uint64_t hs = ChunkChecksum(head);
  StateAssembler as;
  EXPECT_EQ(as.Add(d, total, 5, head, hs).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(as.Add("", total, 0, head, hs).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(as.Add(d, 0, 0, head, hs).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(as.Add(d, -3, 0, head, hs).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(as.Add(d, (int64_t{4} << 30) + 1, 0, head, hs).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(as.Add(d, 5, 0, head, hs).code(),  // runs past total
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(as.Add(d, total, 0, head, hs).ok());
  absl::string_view next(b.data() + 10, 10);
  const uint64_t ns = ChunkChecksum(next);
  EXPECT_EQ(as.Add(d, total, 11, next, ns).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(as.Add(d, total, 0, next, ns).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(as.Add(d, total + 1, 10, next, ns).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(as.next_offset(), 10);
  ASSERT_TRUE(as.Add(d, total, 10, next, ns).ok());
  // Incomplete: DataLoss, and the assembler starts over.
  auto got = as.Finish();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(as.next_offset(), 0);
  EXPECT_EQ(as.digest(), "");
  EXPECT_EQ(as.Finish().status().code(), absl::StatusCode::kDataLoss);
}

TEST(StateTransferTest, FinishChecksTheWholeBlobDigest) {
  std::mt19937_64 rng(8);
  auto blob = StateBlob::Make(RandomState(100, rng));
  const std::string& b = blob->bytes();
  StateAssembler as;
  // Right chunk checksums under a digest the bytes do not have.
  ASSERT_TRUE(
      as.Add("0123456789abcdef", b.size(), 0, b, ChunkChecksum(b)).ok());
  auto got = as.Finish();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
}

// A donor's blob that claims a decompressed size larger than this node's
// model can have is refused before that much is allocated (a 290-byte blob
// once made a joiner zero-fill 4 GiB).
TEST(StateTransferTest, ABlobClaimingMoreThanTheModelHoldsIsRefused) {
  std::mt19937_64 rng(9);
  auto blob = StateBlob::Make(RandomState(100000, rng));
  const std::string& b = blob->bytes();
  StateAssembler small(blob->raw_bytes() - 1);
  ASSERT_TRUE(small.Add(blob->digest(), b.size(), 0, b, ChunkChecksum(b)).ok());
  auto got = small.Finish();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_NE(got.status().message().find("a state of this model can take"),
            std::string::npos)
      << got.status();
  StateAssembler fits(MaxStateBytesFor(100000));
  ASSERT_TRUE(fits.Add(blob->digest(), b.size(), 0, b, ChunkChecksum(b)).ok());
  EXPECT_TRUE(fits.Finish().ok());
}

TEST(StateTransferTest, DecodeRejectsTruncatedAndGarbageInput) {
  std::mt19937_64 rng(9);
  SwarmState s = RandomState(33, rng);
  s.outer_state = "outer";
  const std::string bytes = EncodeSwarmState(s);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto got = DecodeSwarmState(absl::string_view(bytes.data(), n));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << n;
  }
  auto got = DecodeSwarmState(bytes + "x");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("trailing"), std::string::npos);
  std::string bad = bytes;
  bad[0] = 'X';
  got = DecodeSwarmState(bad);
  EXPECT_NE(got.status().message().find("magic"), std::string::npos);
  bad = bytes;
  bad[4] = 9;
  got = DecodeSwarmState(bad);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("version"), std::string::npos);
  // A theta count far beyond the bytes present.
  bad = bytes;
  const size_t theta_count_at = 4 + 4 + 8 + 8 + 8 + s.lineage.size() + 8;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(&bad[theta_count_at], &huge, 8);
  got = DecodeSwarmState(bad);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("theta"), std::string::npos);

  for (int i = 0; i < 200; ++i) {
    std::string garbage(rng() % 200, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    if (i % 2 == 0 && garbage.size() >= 8)
      std::memcpy(&garbage[0], "SWST\3\0\0\0", 8);
    EXPECT_FALSE(DecodeSwarmState(garbage).ok());
  }
}

TEST(StateTransferTest, FuzzedStatesAndBlobsNeverCrash) {
  std::mt19937_64 rng(10);
  SwarmState s = RandomState(64, rng);
  s.outer_state.resize(300);
  const std::string state_bytes = EncodeSwarmState(s);
  auto blob = StateBlob::Make(RandomState(2000, rng));
  ASSERT_LT(blob->bytes().size(), static_cast<size_t>(blob->raw_bytes()));
  auto mutate = [&rng](std::string x) {
    const int kind = rng() % 3;
    if (kind == 0 && !x.empty()) {
      x.resize(rng() % x.size());
    } else {
      const int flips = 1 + rng() % 4;
      for (int f = 0; f < flips && !x.empty(); ++f) {
        x[rng() % x.size()] ^= static_cast<char>(1 + rng() % 255);
      }
      if (kind == 2) x.push_back(static_cast<char>(rng()));
    }
    return x;
  };
  int ok = 0;
  for (int i = 0; i < 3000; ++i) {
    auto got = DecodeSwarmState(mutate(state_bytes));
    if (got.ok()) {
      ++ok;
    } else {
      const absl::StatusCode c = got.status().code();
      EXPECT_TRUE(c == absl::StatusCode::kDataLoss ||
                  c == absl::StatusCode::kInvalidArgument)
          << got.status();
    }
  }
  EXPECT_LT(ok, 3000);
  // Blobs mutated after the digest was taken, then re-digested so that the
  // container and zstd decoders see them.
  for (int i = 0; i < 1000; ++i) {
    const std::string b = mutate(blob->bytes());
    if (b.empty()) continue;
    StateAssembler as;
    const std::string digest =
        absl::StrFormat("%016x", HashBytes(b.data(), b.size()));
    ASSERT_TRUE(as.Add(digest, b.size(), 0, b, ChunkChecksum(b)).ok());
    auto got = as.Finish();
    if (!got.ok()) {
      const absl::StatusCode c = got.status().code();
      EXPECT_TRUE(c == absl::StatusCode::kDataLoss ||
                  c == absl::StatusCode::kInvalidArgument)
          << got.status();
    }
  }
}

// A joiner receives the model's buffers (BatchNorm's statistics) with θ,
// and the lineage covers them: a state whose buffers were changed on the
// way is refused. An infinity is a buffer's right (a mask), a NaN is not.
TEST(StateTransferTest, BuffersTravelAndTheLineageCoversThem) {
  std::mt19937_64 rng(13);
  SwarmState s = RandomState(20, rng);
  s.buffers = {0.5f, 1.25f, -std::numeric_limits<float>::infinity(), 42.0f};
  s.lineage = FlatHash(s.theta, s.buffers);
  auto got = DecodeSwarmState(EncodeSwarmState(s));
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameState(*got, s);
  auto blob = StateBlob::Make(s);
  StateAssembler as;
  Feed(*blob, as, 0, blob->bytes().size(), rng);
  got = as.Finish();
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectSameState(*got, s);

  SwarmState changed = s;
  changed.buffers[1] = 1.5f;
  got = DecodeSwarmState(EncodeSwarmState(changed));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("lineage"), std::string::npos);
  SwarmState nan = s;
  nan.buffers[0] = std::numeric_limits<float>::quiet_NaN();
  nan.lineage = FlatHash(nan.theta, nan.buffers);
  got = DecodeSwarmState(EncodeSwarmState(nan));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("buffers[0]"), std::string::npos)
      << got.status();
}

TEST(StateTransferTest, RejectsLineageMismatchAndNonFiniteTheta) {
  std::mt19937_64 rng(11);
  SwarmState s = RandomState(10, rng);
  SwarmState wrong = s;
  wrong.lineage = "0000000000000000";
  auto got = DecodeSwarmState(EncodeSwarmState(wrong));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("lineage"), std::string::npos);
  // Through the transfer path too.
  auto blob = StateBlob::Make(wrong);
  StateAssembler as;
  Feed(*blob, as, 0, blob->bytes().size(), rng);
  EXPECT_EQ(as.Finish().status().code(), absl::StatusCode::kInvalidArgument);

  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    SwarmState nan = s;
    nan.theta[4] = bad;
    nan.lineage = FlatHash(nan.theta);
    got = DecodeSwarmState(EncodeSwarmState(nan));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find("theta[4]"), std::string::npos)
        << got.status();
  }
  SwarmState negative = s;
  negative.round = -1;
  EXPECT_EQ(DecodeSwarmState(EncodeSwarmState(negative)).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A donor's round and step go into arithmetic and into the trainer's int
  // step counter: out of range, they are refused, named.
  SwarmState far = s;
  far.round = kMaxRound + 1;
  got = DecodeSwarmState(EncodeSwarmState(far));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            "swarm state: round 1099511627777 is out of range [0, "
            "1099511627776]");
  far.round = kMaxRound;
  far.step = int64_t{std::numeric_limits<int>::max()} + 1;
  got = DecodeSwarmState(EncodeSwarmState(far));
  EXPECT_EQ(got.status().message(),
            "swarm state: step 2147483648 is out of range [0, 2147483647]");
  far.step = std::numeric_limits<int>::max();
  got = DecodeSwarmState(EncodeSwarmState(far));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->round, kMaxRound);

  // A lineage's weight decides between lineages of one round: a negative
  // or absurd one is refused, named.
  for (int64_t bad_weight : {int64_t{-1}, kMaxMemberRounds + 1}) {
    SwarmState heavy = s;
    heavy.member_rounds = bad_weight;
    got = DecodeSwarmState(EncodeSwarmState(heavy));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(got.status().message(),
              absl::StrCat("swarm state: member_rounds ", bad_weight,
                           " is out of range [0, ", kMaxMemberRounds, "]"));
  }
  s.member_rounds = kMaxMemberRounds;
  got = DecodeSwarmState(EncodeSwarmState(s));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->member_rounds, kMaxMemberRounds);
}

}  // namespace
}  // namespace starling
