// Writes the seed corpus of the fuzz targets: a few small valid inputs per
// target, made with Starling's own encoders (codecs, MakePushChunks,
// StateBlob, EncodeSwarmState, WriteCheckpoint, WriteTensors, protos) in the
// input layout each target reads (tests/fuzz/fuzz_util.h). Deterministic: the
// same tree writes the same bytes. The seeds are committed under
// tests/fuzz/corpus/<target>/, so CI needs no generation. To regenerate them
// after a format change:
//   cmake -S . -B build-fuzz -DSTARLING_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
//       -DSTARLING_BUILD_TESTS=OFF -DSTARLING_BUILD_BENCH=OFF
//   cmake --build build-fuzz --target make_seeds
//   rm -rf tests/fuzz/corpus && build-fuzz/tests/fuzz/make_seeds \
//       tests/fuzz/corpus
// and bring back the regression-* seeds, which fuzzing found and this does
// not write: git checkout -- 'tests/fuzz/corpus/*/regression-*'
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/codec.h"
#include "compression/tensor_policy.h"
#include "compression/zstd_stage.h"
#include "core/byte_stream.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/optimizer_state.h"
#include "core/tensor_stream.h"
#include "gossip/grpc_transport.h"
#include "gossip/mailbox.h"
#include "gossip/push_sum.h"
#include "gossip/state_transfer.h"
#include "outer_opt/outer_optimizer.h"
#include "starling/config/v1/config.pb.h"
#include "starling/peer/v1/peer.pb.h"
#include "starling/peer/v1/swarm.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace starling {
namespace {

using fuzz::Writer;

std::string g_root;
int g_files = 0;

void Save(const std::string& target, const std::string& name,
          const std::string& bytes) {
  const std::filesystem::path dir =
      std::filesystem::path(g_root) / absl::StrCat(target, "_fuzz");
  std::filesystem::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  FUZZ_CHECK(f.good(), "cannot write %s", (dir / name).c_str());
  ++g_files;
}

template <typename T>
T Must(absl::StatusOr<T> v) {
  FUZZ_CHECK(v.ok(), "%s", v.status().ToString().c_str());
  return std::move(v).value();
}

// Compressible values: few distinct magnitudes, both signs.
std::vector<float> Values(size_t n, float scale = 0.125f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = scale * static_cast<float>(static_cast<int>((i * 7) % 13) - 6);
  }
  return v;
}

// Values that do not compress (a fixed LCG).
std::vector<float> Noise(size_t n) {
  std::vector<float> v(n);
  uint32_t x = 12345;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x)) * 1e-9f;
  }
  return v;
}

std::string Serialized(const google::protobuf::MessageLite& m) {
  return m.SerializeAsString();
}

void CodecSeeds() {
  for (size_t i = 0; i < fuzz::Count(fuzz::kCodecSpecs); ++i) {
    const std::string spec = fuzz::kCodecSpecs[i];
    auto plain = Must(MakeCodec(spec));
    auto zstd = Must(MakeCodec(spec + "+zstd"));
    for (size_t n : {5, 64, 300}) {
      Writer w;
      w.Put<uint8_t>(i).Bytes(Must(plain->Encode(Values(n))));
      Save("codec", absl::StrCat(spec.substr(0, 4), "-", n), w.str());
    }
    Writer w;
    w.Put<uint8_t>(i).Bytes(Must(zstd->Encode(Values(600))));
    Save("codec", absl::StrCat(spec.substr(0, 4), "-zstd-600"), w.str());
  }
}

void PolicySeeds() {
  struct Case {
    int main, small;
    std::vector<int64_t> tensors;
    int small_elements, trailing;
    int64_t offset, length;  // length -1: to the end
  };
  const Case cases[] = {
      {3, 0, {300, 10, 200}, 64, 2, 0, -1},  {0, 0, {50, 20}, 32, 0, 10, 40},
      {5, 3, {400, 5}, 16, 1, 100, 300},     {6, 1, {1000}, 16, 0, 0, -1},
      {8, 2, {300, 3, 300}, 10, 3, 290, 20}, {4, 0, {64, 64}, 100, 0, 0, -1},
  };
  int k = 0;
  for (const Case& c : cases) {
    PolicyOptions o;
    o.main = fuzz::kPolicyMain[c.main];
    o.small = fuzz::kPolicySmall[c.small];
    o.small_elements = c.small_elements;
    o.trailing_fp32 = c.trailing;
    auto policy = Must(PolicyCodec::Create(c.tensors, o));
    const int64_t length = c.length < 0 ? policy->size() - c.offset : c.length;
    Writer w;
    w.Put<uint8_t>(c.main).Put<uint8_t>(c.small);
    w.Put<uint8_t>(c.tensors.size());
    for (int64_t t : c.tensors) w.Put<uint16_t>(t);
    w.Put<uint16_t>(c.small_elements).Put<uint8_t>(c.trailing);
    w.Put<uint32_t>(c.offset).Put<uint32_t>(length);
    w.Bytes(Must(policy->EncodeSlice(c.offset, Values(length))));
    Save("policy_codec", absl::StrCat("slice-", k++), w.str());
  }
}

void ZstdSeeds() {
  namespace ci = compression_internal;
  std::string raw;
  for (int i = 0; i < 500; ++i) absl::StrAppend(&raw, "starling ", i % 7);
  for (uint32_t chunk : {1024u, 1u << 20}) {
    std::string z;
    FUZZ_CHECK(ci::ZstdCompressChunks(raw, 1, chunk, &z), "zstd did not pay");
    Writer w;
    w.Put<uint32_t>(raw.size()).Bytes(z);
    Save("zstd_stage", absl::StrCat("chunks-", chunk), w.str());
  }
  Writer empty;  // zero bytes: the layout header only
  empty.Put<uint32_t>(0).Put<uint32_t>(1024).Put<uint32_t>(0);
  Save("zstd_stage", "empty", empty.str());
}

void PushSeeds() {
  struct Case {
    int which;
    int64_t elements;
    int64_t chunk_bytes;
    bool relative;  // a second push relative to the first
  };
  const Case cases[] = {
      {0, 100, 150, false},  {1, 300, 128, true},  {2, 500, 64, true},
      {4, 200, 1000, false}, {5, 256, 200, false},
  };
  int k = 0;
  for (const Case& c : cases) {
    std::unique_ptr<PolicyCodec> policy;
    if (c.which > 0) {
      PolicyOptions o;
      o.main = fuzz::kPushCodecs[c.which - 1];
      o.small_elements = 0;
      policy = Must(PolicyCodec::Create({c.elements}, o));
    }
    Writer w;
    w.Put<uint8_t>(c.which).Put<uint16_t>(c.elements - 1);
    PushSum ps;
    std::vector<float> y = Values(c.elements, 0.5f);
    auto stream = [&](int64_t seq, const PushShare& share) {
      for (const auto& chunk : MakePushChunks(
               fuzz::kRunId, "node-x", seq, share, c.elements, c.chunk_bytes)) {
        w.Put<uint8_t>(0).LenBytes(Serialized(chunk));
      }
      w.Put<uint8_t>(1);
    };
    const PushShare first = Must(ps.Share(absl::MakeSpan(y), policy.get()));
    stream(1, first);
    if (c.relative) {
      PublicCopy base;
      base.sequence = 1;
      base.values = first.sent;
      for (size_t i = 0; i < y.size(); i += 3) y[i] += 0.01f;
      stream(2, Must(ps.Share(absl::MakeSpan(y), policy.get(), &base)));
    }
    Save("push_assembler", absl::StrCat("push-", k++), w.str());
  }
}

std::vector<peer::v1::StateChunk> StateChunks(const SwarmState& s, int parts) {
  std::shared_ptr<const StateBlob> blob = StateBlob::Make(s);
  const std::string& b = blob->bytes();
  std::vector<peer::v1::StateChunk> chunks;
  const size_t step = (b.size() + parts - 1) / parts;
  for (size_t off = 0; off < b.size(); off += step) {
    peer::v1::StateChunk c;
    c.set_round(blob->round());
    c.set_lineage(blob->lineage());
    c.set_digest(blob->digest());
    c.set_total_bytes(static_cast<int64_t>(b.size()));
    c.set_offset(static_cast<int64_t>(off));
    c.set_data(b.substr(off, step));
    c.set_checksum(ChunkChecksum(c.data()));
    chunks.push_back(std::move(c));
  }
  return chunks;
}

SwarmState State(int64_t round, std::vector<float> theta, std::string outer,
                 std::vector<float> buffers = {}) {
  SwarmState s;
  s.round = round;
  s.step = 40 * round;
  s.theta = std::move(theta);
  s.buffers = std::move(buffers);
  s.lineage = FlatHash(s.theta, s.buffers);
  s.outer_state = std::move(outer);
  return s;
}

void StateSeeds() {
  const SwarmState zstd = State(3, Values(400), "outer-state");
  const SwarmState raw = State(7, Noise(60), "");
  {
    Writer w;
    w.Put<uint8_t>(0);
    for (const auto& c : StateChunks(zstd, 3)) w.LenBytes(Serialized(c));
    Save("state_assembler", "zstd-3-chunks", w.str());
  }
  {
    Writer w;
    w.Put<uint8_t>(0x0F);
    for (const auto& c : StateChunks(raw, 2)) w.LenBytes(Serialized(c));
    Save("state_assembler", "raw-2-chunks-fixups", w.str());
  }
  {
    // A donor that moved on: one chunk of an older state, then a newer one.
    Writer w;
    w.Put<uint8_t>(0);
    w.LenBytes(Serialized(StateChunks(raw, 2)[0]));
    for (const auto& c : StateChunks(zstd, 2)) w.LenBytes(Serialized(c));
    Save("state_assembler", "restart", w.str());
  }
  Save("swarm_state", "empty", EncodeSwarmState(State(0, {}, "")));
  Save("swarm_state", "small", EncodeSwarmState(State(2, Values(10), "xyz")));
  // BatchNorm's statistics: running means, variances and a step count.
  Save("swarm_state", "buffers",
       EncodeSwarmState(
           State(4, Values(10), "xyz", {0.1f, -0.2f, 1.5f, 0.9f, 12.0f})));
  auto outer = Must(OuterOptimizer::Create({}, 12));
  std::vector<float> theta = Values(12), delta = Values(12, 0.01f);
  FUZZ_CHECK(outer->Step(absl::MakeSpan(theta), delta).ok(), "outer step");
  Save("swarm_state", "outer",
       EncodeSwarmState(State(5, theta, outer->SaveState())));
}

// Mailbox input helpers, in the layout of mailbox_fuzz.cc's ReadMessage.
void MailboxMessage(Writer& w, int32_t from, int8_t round_delta, int tensor,
                    RingPhase phase, int32_t step, int32_t segment,
                    int64_t total, const std::string* payload) {
  w.Put<int32_t>(from).Put<uint8_t>(0).Put<int8_t>(round_delta);
  w.Put<uint8_t>(tensor).Put<int32_t>(static_cast<int32_t>(phase));
  w.Put<int32_t>(step).Put<int32_t>(segment).Put<int64_t>(total);
  if (payload != nullptr) w.LenBytes(*payload);
  w.Put<uint8_t>(0);  // applied
}

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size());
}

void MailboxSeeds() {
  constexpr int kPg = 10, kGrad = 7;
  {
    Writer w;
    w.Put<uint8_t>(3 - 1).Put<uint8_t>(0);  // world 3, rank 0
    w.Put<uint16_t>(kPg).Put<uint16_t>(kGrad).Put<uint8_t>(0).Put<uint8_t>(5);
    // Deliver pseudo_grad segment 1 from rank 1; check duplicate and Take.
    std::string p = Floats(Values(SegmentLength(kPg, 3, 1)));
    w.Put<uint8_t>(0);
    MailboxMessage(w, 1, 0, 0, RingPhase::kReduceScatter, 0, 1, kPg, &p);
    w.Put<uint8_t>(3);
    // Deliver grad segment 2 from rank 2, next round, all-gather step 1.
    p = Floats(Values(SegmentLength(kGrad, 3, 2)));
    w.Put<uint8_t>(0);
    MailboxMessage(w, 2, 1, 1, RingPhase::kAllGather, 1, 2, kGrad, &p);
    w.Put<uint8_t>(0);
    // Expect pseudo_grad segment 0 from rank 1 at step 1, then stream it.
    const int64_t seg0 = SegmentLength(kPg, 3, 0);
    w.Put<uint8_t>(3);
    MailboxMessage(w, 1, 0, 0, RingPhase::kReduceScatter, 1, 0, kPg, nullptr);
    w.Put<uint8_t>(1).Put<uint16_t>(seg0);
    w.Put<uint8_t>(4);
    MailboxMessage(w, 1, 0, 0, RingPhase::kReduceScatter, 1, 0, kPg, nullptr);
    const std::string all = Floats(Values(seg0));
    w.Put<int64_t>(4 * seg0).Put<uint8_t>(2);
    w.LenBytes(all.substr(0, 6)).LenBytes(all.substr(6));
    w.Put<int32_t>(0).LenBytes(all.substr(0, 4));
    // Take (nothing there), advance, reject, cancel.
    w.Put<uint8_t>(2);
    MailboxMessage(w, 2, 1, 1, RingPhase::kAllGather, 0, 0, kGrad, nullptr);
    w.Put<uint8_t>(1).Put<uint8_t>(1);
    w.Put<uint8_t>(5).Put<int32_t>(1);
    w.Put<uint8_t>(6).Put<uint8_t>(0xCA);
    Save("mailbox", "ring-3", w.str());
  }
  {
    Writer w;
    w.Put<uint8_t>(4 - 1).Put<uint8_t>(2);  // world 4, rank 2
    // pseudo_grad compressed (1 + 3 % 8 = 4 bytes per element), grad whole.
    w.Put<uint16_t>(kPg).Put<uint16_t>(kGrad).Put<uint8_t>(3).Put<uint8_t>(0);
    std::string p = "\xC5\x04\x01\x00 a compressed segment";
    w.Put<uint8_t>(0);
    MailboxMessage(w, 0, 0, 0, RingPhase::kReduceScatter, 2, 3, kPg, &p);
    w.Put<uint8_t>(2);
    p = Floats(Values(kGrad));
    w.Put<uint8_t>(0);
    MailboxMessage(w, 3, 0, 1, RingPhase::kAllGather, 0, 0, kGrad, &p);
    w.Put<uint8_t>(3);
    Save("mailbox", "compressed-whole-4", w.str());
  }
}

peer::v1::HandshakeRequest Hello(int world) {
  peer::v1::HandshakeRequest r;
  r.set_protocol_version(kProtocolVersion);
  r.set_run_id(fuzz::kRunId);
  *r.mutable_model() =
      MakeFingerprint("mlp(784,128,10)", 101770, "0123456789abcdef",
                      {"parameter fc1.weight float32[128,784]",
                       "parameter fc1.bias float32[128]",
                       "parameter fc2.weight float32[10,128]",
                       "parameter fc2.bias float32[10]"});
  r.set_address("10.0.0.9:7000");
  r.set_algo("diloco");
  r.set_world(world);
  r.set_compression("int8");
  r.set_aggregate("mean");
  return r;
}

void HandshakeSeeds() {
  Writer ok;
  ok.Put<uint8_t>(0).Bytes(Serialized(Hello(3)));
  Save("handshake", "match", ok.str());
  peer::v1::HandshakeRequest bad = Hello(4);
  bad.set_run_id("other-run");
  bad.set_compression("fp32");
  bad.mutable_model()->set_init_hash("fedcba9876543210");
  bad.mutable_model()->set_architecture("mlp(784,64,10)");
  bad.mutable_model()->set_tensors(0, "parameter fc1.weight float32[64,784]");
  Writer mismatch;
  mismatch.Put<uint8_t>(0).Bytes(Serialized(bad));
  Save("handshake", "mismatch", mismatch.str());
  peer::v1::JoinRequest join;
  *join.mutable_hello() = Hello(0);
  peer::v1::MemberEntry* self = join.mutable_self();
  self->set_id("node-z");
  self->set_address("10.0.0.9:7000");
  self->set_incarnation(5);
  self->set_state(peer::v1::MEMBER_ALIVE);
  self->set_heartbeat(3);
  self->set_joining(true);
  Writer j;
  j.Put<uint8_t>(1).Bytes(Serialized(join));
  Save("handshake", "join", j.str());
}

peer::v1::MemberEntry Entry(const std::string& id, int64_t inc,
                            peer::v1::MemberState state, int64_t hb = 0,
                            int64_t round = 0) {
  peer::v1::MemberEntry e;
  e.set_id(id);
  e.set_address(absl::StrCat("host-", id, ":7000"));
  e.set_incarnation(inc);
  e.set_state(state);
  e.set_heartbeat(hb);
  e.set_round(round);
  e.set_lineage(absl::StrCat("lineage-", round));
  return e;
}

void MembershipSeeds() {
  using peer::v1::MEMBER_ALIVE;
  using peer::v1::MEMBER_DEAD;
  using peer::v1::MEMBER_LEFT;
  using peer::v1::MEMBER_SUSPECT;
  Writer w;
  w.Put<uint8_t>(9);  // own incarnation 10
  peer::v1::JoinResponse join;
  *join.add_members() = Entry("node-a", 3, MEMBER_ALIVE, 1);
  *join.add_members() = Entry("node-b", 10, MEMBER_ALIVE);  // this node
  *join.add_members() = Entry("node-c", 2, MEMBER_SUSPECT, 4);
  w.Put<uint8_t>(0).Put<uint8_t>(0).LenBytes(Serialized(join));
  w.Put<uint8_t>(1).Put<uint16_t>(4000);
  w.Put<uint8_t>(2);
  peer::v1::GossipRequest gossip;
  gossip.set_run_id(fuzz::kRunId);
  gossip.set_from("node-a");
  *gossip.add_members() = Entry("node-a", 3, MEMBER_ALIVE, 5, 2);
  *gossip.add_members() = Entry("node-c", 2, MEMBER_DEAD, 4);
  *gossip.add_members() = Entry("node-b", 10, MEMBER_SUSPECT);  // refuted
  w.Put<uint8_t>(0).Put<uint8_t>(1).LenBytes(Serialized(gossip));
  w.Put<uint8_t>(3).Put<uint8_t>(4).Put<uint8_t>(1);
  w.Put<uint8_t>(4).Put<uint8_t>(4);
  peer::v1::GossipResponse resp;
  *resp.add_members() = Entry("node-c", 3, MEMBER_ALIVE, 1);
  *resp.add_members() = Entry("node-d", 1, MEMBER_LEFT);
  *resp.add_members() = Entry("", 1, MEMBER_ALIVE);  // invalid: no id
  w.Put<uint8_t>(0).Put<uint8_t>(2).LenBytes(Serialized(resp));
  w.Put<uint8_t>(1).Put<uint16_t>(7000);
  w.Put<uint8_t>(5).Put<uint8_t>(0x1E);
  peer::v1::JoinResponse later;
  *later.add_members() = Entry("node-b", 12, MEMBER_DEAD);
  w.Put<uint8_t>(0).Put<uint8_t>(0).LenBytes(Serialized(later));
  Save("membership", "gossip-rounds", w.str());
}

void JoinAuthSeeds() {
  auto op = [](int kind, int method) {
    return static_cast<uint8_t>(kind | (method << 4));
  };
  const std::string nonce1 = "00112233445566778899aabbccddeeff";
  const std::string nonce2 = "ffeeddccbbaa99887766554433221100";
  Writer w;
  w.Put<uint16_t>(60000).Put<uint8_t>(3);  // 60 s window, 4 nonces
  // A correctly signed Join at the current time, then its replay.
  w.Put<uint8_t>(op(1, 0)).Put<int32_t>(0).Put<uint8_t>(0).Bytes(nonce1);
  w.Put<uint8_t>(op(1, 0)).Put<int32_t>(0).Put<uint8_t>(0).Bytes(nonce1);
  // A raw header, signed for Gossip at the start time.
  const int64_t ms = fuzz::kStartMs + 1;
  const std::string header =
      absl::StrCat("v1.", ms, ".", nonce2, ".",
                   fuzz::JoinMac(fuzz::kJoinToken, "Gossip", ms, nonce2));
  w.Put<uint8_t>(op(0, 1)).LenBytes(header).Put<uint8_t>(1);
  w.Put<uint8_t>(op(2, 2));
  w.Put<uint8_t>(op(4, 0)).Put<int16_t>(30000);
  // Signed, but outside the window.
  w.Put<uint8_t>(op(1, 3)).Put<int32_t>(-90000).Put<uint8_t>(0).Bytes(nonce2);
  for (int i = 0; i < 5; ++i) {  // more than the nonces remembered
    w.Put<uint8_t>(op(1, i % 4)).Put<int32_t>(-i).Put<uint8_t>(0);
    w.Bytes(absl::StrFormat("%032d", i));
  }
  w.Put<uint8_t>(op(3, 0)).LenBytes("ipv6:[::1]:4242");
  w.Put<uint8_t>(op(0, 0)).LenBytes("v1.12.zz.00").Put<uint8_t>(0);
  Save("join_auth", "sessions", w.str());
}

void CheckpointSeeds() {
  Checkpoint ckpt;
  config::v1::TrainerState st;
  st.set_step(120);
  st.set_samples(3840);
  st.set_wall_seconds(12.5);
  ckpt.sections["trainer_state"] = Serialized(st);
  ckpt.sections["architecture"] = "mlp(784,128,10)";
  auto outer = Must(OuterOptimizer::Create({}, 6));
  std::vector<float> theta = Values(6), delta = Values(6, 0.01f);
  FUZZ_CHECK(outer->Step(absl::MakeSpan(theta), delta).ok(), "outer step");
  ckpt.sections["outer"] = outer->SaveState();
  auto codec = Must(MakeCodec("int8"));
  ErrorFeedback ef(6);
  std::vector<float> sent(6);
  (void)Must(ef.Compress(*codec, delta, absl::MakeSpan(sent)));
  ckpt.sections["error_feedback"] = ef.SaveState();
  ckpt.sections["round"] = "12";
  ckpt.sections["comm"] = "100,200,3,4";
  ckpt.sections["gossip_weight"] = std::string("\0\0\0\0\0\0\xe0?", 8);
  const std::string path = fuzz::ScratchDir() + "/seed.ckpt";
  auto file = [&](const Checkpoint& c) {
    FUZZ_CHECK(WriteCheckpoint(path, c).ok(), "WriteCheckpoint");
    return Must(ReadFile(path));
  };
  const std::string full = file(ckpt);
  Writer fixed;  // mode 1: the target appends the checksum
  fixed.Put<uint8_t>(1).Bytes(full.substr(0, full.size() - 8));
  Save("checkpoint", "resume-sections", fixed.str());
  Writer whole;
  whole.Put<uint8_t>(0).Bytes(full);
  Save("checkpoint", "resume-file", whole.str());
  const std::string none = file(Checkpoint{});
  Writer empty;
  empty.Put<uint8_t>(1).Bytes(none.substr(0, none.size() - 8));
  Save("checkpoint", "no-sections", empty.str());
  // A trainer's tensor sections: a model of two tensors (the shapes
  // checkpoint_fuzz's AdamW has) and its optimizer state after one step.
  std::vector<torch::Tensor> params = {
      torch::arange(6, torch::kFloat32).reshape({2, 3}).requires_grad_(),
      torch::full({3}, 0.5f).requires_grad_()};
  torch::optim::AdamW opt(params);
  (params[0].sum() * 2 + params[1].sum()).backward();
  opt.step();
  auto stream = [](const NamedTensors& t) {
    std::string out;
    StringSink sink(&out);
    FUZZ_CHECK(WriteTensors(t, sink).ok(), "WriteTensors");
    return out;
  };
  Checkpoint tensors;
  tensors.sections["model_tensors"] = stream(
      {{"param.0", params[0].detach()}, {"param.1", params[1].detach()}});
  tensors.sections["optimizer_tensors"] =
      stream(Must(OptimizerStateTensors(opt)));
  tensors.sections["architecture"] = "tiny";
  const std::string streamed = file(tensors);
  Writer with_tensors;
  with_tensors.Put<uint8_t>(1).Bytes(streamed.substr(0, streamed.size() - 8));
  Save("checkpoint", "tensor-sections", with_tensors.str());
}

}  // namespace
}  // namespace starling

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  starling::g_root = argv[1];
  starling::CodecSeeds();
  starling::PolicySeeds();
  starling::ZstdSeeds();
  starling::PushSeeds();
  starling::StateSeeds();
  starling::MailboxSeeds();
  starling::HandshakeSeeds();
  starling::MembershipSeeds();
  starling::JoinAuthSeeds();
  starling::CheckpointSeeds();
  std::printf("wrote %d seed files under %s\n", starling::g_files, argv[1]);
  return 0;
}
