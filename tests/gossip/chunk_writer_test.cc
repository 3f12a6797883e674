// The sender's chunks without sockets: what ChunkSerializer cuts is a valid
// TensorChunk that the reader's ParseChunk takes apart again, chunk by
// chunk, and a payload with an owner goes out from its own memory, which
// the chunks hold only as long as they live.
#include "gossip/chunk_writer.h"

#include <memory>
#include <string>
#include <vector>

#include "gossip/chunk_reader.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

using peer::v1::TensorChunk;

Message Header() {
  Message m;
  m.from = 2;
  m.round = 41;
  m.tensor = "pseudo_grad";
  m.phase = RingPhase::kAllGather;
  m.step = 1;
  m.segment = 3;
  m.total_elements = 12345;
  return m;
}

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 + 1);
  return s;
}

// The chunk's bytes, whole.
std::string Flatten(grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

TEST(ChunkHeaderForTest, CarriesTheMessagesFields) {
  const TensorChunk c = ChunkHeaderFor(Header(), "run", 99, 2500);
  EXPECT_EQ(c.run_id(), "run");
  EXPECT_EQ(c.from_rank(), 2);
  EXPECT_EQ(c.round(), 41);
  EXPECT_EQ(c.tensor(), "pseudo_grad");
  EXPECT_EQ(c.phase(), peer::v1::PHASE_ALL_GATHER);
  EXPECT_EQ(c.step(), 1);
  EXPECT_EQ(c.segment(), 3);
  EXPECT_EQ(c.total_elements(), 12345);
  EXPECT_EQ(c.segment_bytes(), 2500);
  EXPECT_EQ(c.plan(), 99u);
}

// Cuts `payload` in chunks of `step` (with `owner` or not) and reads each
// back: a protobuf TensorChunk, whose data the reader finds where it lies.
void RoundTrip(const std::string& payload, size_t step,
               const std::shared_ptr<const void>& owner) {
  const TensorChunk header = ChunkHeaderFor(Header(), "run", 99, 2500);
  ChunkSerializer chunks(header, payload, owner, step);
  std::string got;
  do {
    grpc::ByteBuffer b;
    const int64_t bytes = chunks.Next(&b);
    EXPECT_EQ(bytes, static_cast<int64_t>(b.Length()));
    const std::string wire = Flatten(b);
    TensorChunk whole;  // protobuf's own reading of the bytes
    ASSERT_TRUE(whole.ParseFromString(wire));
    EXPECT_EQ(whole.offset(), static_cast<int64_t>(got.size()));
    TensorChunk parsed;
    ChunkFrame frame;
    ASSERT_TRUE(ParseChunk(&b, &parsed, &frame));
    EXPECT_EQ(frame.data_start + frame.data_len, b.Length());
    EXPECT_EQ(wire.substr(frame.data_start), whole.data());
    whole.clear_data();
    EXPECT_EQ(parsed.SerializeAsString(), whole.SerializeAsString());
    got += wire.substr(frame.data_start);
  } while (!chunks.done());
  EXPECT_EQ(got, payload);
  EXPECT_EQ(chunks.written(),
            payload.empty()
                ? 1
                : static_cast<int>((payload.size() + step - 1) / step));
}

TEST(ChunkSerializerTest, ChunksAreTensorChunksThatReadBackToThePayload) {
  RoundTrip(Pattern(2500), 1024, nullptr);
  RoundTrip(Pattern(2048), 1024, nullptr);
  RoundTrip(Pattern(300), 1024, nullptr);
  RoundTrip("", 1024, nullptr);  // one chunk with no data
  auto owner = std::make_shared<const std::string>(Pattern(2500));
  RoundTrip(*owner, 1000, owner);
}

TEST(ChunkSerializerTest, AnOwnedPayloadGoesOutFromItsMemoryWhileHeld) {
  auto owner = std::make_shared<const std::string>(Pattern(3000));
  const std::shared_ptr<const void> held = owner;
  std::vector<grpc::ByteBuffer> out;
  {
    ChunkSerializer chunks(ChunkHeaderFor(Header(), "run", 0, 3000), *owner,
                           held, 1024);
    do {
      out.emplace_back();
      chunks.Next(&out.back());
    } while (!chunks.done());
  }
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(owner.use_count(), 2 + 3);  // owner, held and one per chunk
  for (size_t k = 0; k < out.size(); ++k) {
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(out[k].Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 2u);  // the header, then the payload's bytes
    EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()),
              owner->data() + k * 1024);
  }
  out.clear();
  EXPECT_EQ(owner.use_count(), 2);
}

}  // namespace
}  // namespace starling
