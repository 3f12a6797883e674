// Real gRPC on loopback (port 0): handshakes, the ring over sockets, ring
// chunks bound to their senders' certificates, and a hostile peer whose bad
// chunks are refused without corrupting anything.
#include "gossip/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/file_util.h"
#include "gossip/ring_allreduce.h"
#include "gtest/gtest.h"
#include "starling/peer/v1/peer.grpc.pb.h"
#include "tests/core/certs.h"
#include "tests/core/test_util.h"

namespace starling {
namespace {

constexpr int64_t kElems = 3001;  // 3000 values + the weight

PeerIdentity Identity(int world, const std::string& arch = "mlp(x)") {
  PeerIdentity id;
  id.run_id = "test-run";
  id.algo = "diloco";
  id.world = world;
  id.model = MakeFingerprint(arch, kElems - 1, "abc");
  return id;
}

MailboxOptions Mailboxes() {
  MailboxOptions o;
  o.run_id = "test-run";
  o.tensors = {{"pseudo_grad", kElems}};
  return o;
}

struct Swarm {
  std::vector<std::unique_ptr<GrpcTransport>> nodes;
  std::vector<std::string> members;
};

Swarm Start(int world, const GrpcTransportOptions& o) {
  Swarm s;
  for (int r = 0; r < world; ++r) {
    auto t = GrpcTransport::Start(o, Identity(world));
    EXPECT_TRUE(t.ok()) << t.status();
    s.nodes.push_back(std::move(t).value());
  }
  // Ranks follow the sorted addresses.
  std::sort(s.nodes.begin(), s.nodes.end(), [](const auto& a, const auto& b) {
    return a->address() < b->address();
  });
  for (auto& n : s.nodes) s.members.push_back(n->address());
  return s;
}

Swarm Start(int world, int64_t chunk_bytes = 1 << 20,
            std::shared_ptr<JoinAuth> auth = nullptr) {
  GrpcTransportOptions o;
  o.chunk_bytes = chunk_bytes;
  o.credentials.join_auth = std::move(auth);
  return Start(world, o);
}

void ConnectAll(Swarm& s, const MailboxOptions& mo = Mailboxes()) {
  std::vector<std::thread> threads;
  std::vector<absl::Status> st(s.nodes.size());
  for (size_t r = 0; r < s.nodes.size(); ++r) {
    threads.emplace_back([&, r] {
      st[r] = s.nodes[r]->Connect(s.members, static_cast<int>(r), mo,
                                  absl::Now() + absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (size_t r = 0; r < st.size(); ++r) ASSERT_TRUE(st[r].ok()) << st[r];
}

TEST(GrpcTransportTest, RingOverSocketsIsBitIdenticalAndChunked) {
  // 4 KiB chunks: each ~4 KB segment takes more than one chunk.
  Swarm s = Start(3, 4096);
  ConnectAll(s);
  std::vector<std::vector<float>> v(3, std::vector<float>(kElems - 1));
  for (int r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < kElems - 1; ++i) v[r][i] = 0.001f * i * (r + 1);
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> st(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      RingOptions o;
      o.step_timeout = absl::Seconds(20);
      st[r] = RingWeightedAverage(*s.nodes[r], v[r], 1.0, o);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(std::memcmp(v[r].data(), v[0].data(), v[0].size() * 4), 0);
  }
  EXPECT_NEAR(v[0][1000], 0.001f * 1000 * 2, 1e-4);
  // Payload 2·(N−1)/N·P·4 plus a little framing.
  const double payload = 2.0 * 2 / 3 * kElems * 4;
  for (int r = 0; r < 3; ++r) {
    EXPECT_GE(s.nodes[r]->bytes_sent(), payload * 0.99);
    EXPECT_LE(s.nodes[r]->bytes_sent(), payload * 1.05);
  }
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// Streams one whole segment 0 of reduce-scatter step 0 of attempt (mailbox
// sequence) `seq` through `stub`, as `rank` of a 2-member ring, holding
// 1000s; returns the server's status.
grpc::Status SendThousands(peer::v1::Peer::Stub& stub, int rank, int64_t seq) {
  const size_t seg = SegmentLength(kElems, 2, 0);
  peer::v1::TensorChunk c;
  c.set_run_id("test-run");
  c.set_from_rank(rank);
  c.set_round(seq);
  c.set_tensor("pseudo_grad");
  c.set_phase(peer::v1::PHASE_REDUCE_SCATTER);
  c.set_total_elements(kElems);
  c.set_segment_bytes(static_cast<int64_t>(seg * 4));
  c.set_data(Bytes(std::vector<float>(seg, 1000.0f)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  peer::v1::SendAck ack;
  auto w = stub.SendChunks(&ctx, &ack);
  (void)w->Write(c);
  (void)w->WritesDone();
  return w->Finish();
}

// Rank 0's reduce-scatter message (round 0, step 0) of segment 0 of
// "pseudo_grad", holding `values`.
Message SegmentZeroFromRankZero(const std::vector<float>& values) {
  Message m;
  m.from = 0;
  m.tensor = "pseudo_grad";
  m.phase = RingPhase::kReduceScatter;
  m.segment = 0;
  m.total_elements = kElems;
  m.payload = Bytes(values);
  return m;
}

// A segment the receiver's collective already expects is added into its
// values chunk by chunk as it streams in, also where a value straddles two
// chunks (1030-byte chunks); one nobody expects is buffered whole.
TEST(GrpcTransportTest, AnExpectedSegmentStreamsStraightIntoTheValues) {
  Swarm s = Start(2, 1030);
  ConnectAll(s);
  const int64_t seg = SegmentLength(kElems, 2, 0);
  std::vector<float> values(seg), sent(seg);
  for (int64_t i = 0; i < seg; ++i) {
    values[i] = 0.5f * i;
    sent[i] = 0.25f * i + 1;
  }
  std::shared_ptr<Sink> sink = s.nodes[1]->mailbox().Expect(
      0, 0, "pseudo_grad", RingPhase::kReduceScatter, 0, 0,
      absl::MakeSpan(values), /*accumulate=*/true);
  Message m = SegmentZeroFromRankZero(sent);
  ASSERT_TRUE(s.nodes[0]->Send(1, m, absl::Now() + absl::Seconds(20)).ok());
  auto got =
      s.nodes[1]->mailbox().Take(0, 0, "pseudo_grad", RingPhase::kReduceScatter,
                                 0, absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->applied);
  sink->Close();
  for (int64_t i = 0; i < seg; ++i) {
    float want = 0.5f * i;
    want += sent[i];
    ASSERT_EQ(values[i], want) << "element " << i;
  }
  m.phase = RingPhase::kAllGather;
  ASSERT_TRUE(s.nodes[0]->Send(1, m, absl::Now() + absl::Seconds(20)).ok());
  got = s.nodes[1]->mailbox().Take(0, 0, "pseudo_grad", RingPhase::kAllGather,
                                   0, absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->applied);
  EXPECT_EQ(got->payload, m.payload);
}

// Four ranks over sockets, with chunks that split values, reduce segments
// as they stream in and end with exactly the bytes of the in-process ring,

// The receiver's own NaN meets finite values from the sender: both ends
// fail with Internal, worded so that neither reads it as the sender's
// fault (the sender sees the receiver's words after "peer ADDRESS: ").
TEST(GrpcTransportTest, TheReceiversOwnNaNIsNotWordedAsTheSendersFault) {
  Swarm s = Start(2, 1030);
  ConnectAll(s);
  const int64_t seg = SegmentLength(kElems, 2, 0);
  std::vector<float> values(seg, 1.0f), sent(seg, 2.0f);
  values[7] = std::numeric_limits<float>::quiet_NaN();
  std::shared_ptr<Sink> sink = s.nodes[1]->mailbox().Expect(
      0, 0, "pseudo_grad", RingPhase::kReduceScatter, 0, 0,
      absl::MakeSpan(values), /*accumulate=*/true);
  Message m = SegmentZeroFromRankZero(sent);
  absl::Status send = s.nodes[0]->Send(1, m, absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(absl::IsInternal(send)) << send;
  EXPECT_NE(send.message().find(": the receiving node's own value at element "
                                "7 is not finite"),
            std::string::npos)
      << send;
  auto got =
      s.nodes[1]->mailbox().Take(0, 0, "pseudo_grad", RingPhase::kReduceScatter,
                                 0, absl::Now() + absl::Seconds(20));
  sink->Close();
  EXPECT_TRUE(absl::IsInternal(got.status())) << got.status();
  EXPECT_EQ(
      got.status().message().find("could not take the message from rank 0: "),
      0u)
      << got.status();
  EXPECT_NE(got.status().message().find(
                "the receiving node's own value at element 7 is not finite"),
            std::string::npos)
      << got.status();
  EXPECT_EQ(got.status().message().find("bad message"), std::string::npos);
}
// which delivers whole messages.
TEST(GrpcTransportTest, StreamedRingMatchesTheInProcessRingBitForBit) {
  constexpr int kWorld = 4;
  Swarm s = Start(kWorld, 1030);
  ConnectAll(s);
  InProcessNetwork local(kWorld, Mailboxes());
  std::vector<std::vector<float>> over_grpc(kWorld), in_process(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    over_grpc[r].resize(kElems - 1);
    for (int64_t i = 0; i < kElems - 1; ++i) {
      over_grpc[r][i] = std::sin(0.37f * i + r) * (r + 1);
    }
    in_process[r] = over_grpc[r];
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> threads;
    std::vector<absl::Status> st(2 * kWorld);
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        s.nodes[r]->mailbox().AdvanceRound(round);
        RingOptions o;
        o.round = round;
        o.step_timeout = absl::Seconds(30);
        st[r] = RingWeightedAverage(*s.nodes[r], over_grpc[r], r + 1.0, o);
      });
      threads.emplace_back([&, r] {
        local.transport(r).mailbox().AdvanceRound(round);
        RingOptions o;
        o.round = round;
        o.step_timeout = absl::Seconds(30);
        st[kWorld + r] =
            RingWeightedAverage(local.transport(r), in_process[r], r + 1.0, o);
      });
    }
    for (auto& t : threads) t.join();
    for (const absl::Status& x : st) ASSERT_TRUE(x.ok()) << x;
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_EQ(std::memcmp(over_grpc[r].data(), in_process[0].data(),
                            in_process[0].size() * 4),
                0)
          << "rank " << r << " round " << round;
    }
    // Different inputs next round.
    for (int r = 0; r < kWorld; ++r) {
      for (int64_t i = 0; i < kElems - 1; i += 7) {
        over_grpc[r][i] += 0.125f * r;
        in_process[r][i] += 0.125f * r;
      }
    }
  }
}

TEST(GrpcTransportTest, HandshakeRefusesAMismatchedPeerSayingWhatDiffers) {
  GrpcTransportOptions o;
  auto a = GrpcTransport::Start(o, Identity(2, "gpt(layers=2)"));
  auto b = GrpcTransport::Start(o, Identity(2, "gpt(layers=3)"));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<std::string> members = {(*a)->address(), (*b)->address()};
  std::sort(members.begin(), members.end());
  int ra = members[0] == (*a)->address() ? 0 : 1;
  std::thread tb([&] {
    (void)(*b)->Connect(members, 1 - ra, Mailboxes(),
                        absl::Now() + absl::Seconds(3));
  });
  absl::Status s =
      (*a)->Connect(members, ra, Mailboxes(), absl::Now() + absl::Seconds(10));
  tb.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("model architecture differs"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("gpt(layers=3)"), std::string::npos) << s;
}

// With a join token, handshakes and chunk streams carry its proof and the
// ring runs as before; a node with another token is refused at the
// handshake, and a stream without the proof gets UNAUTHENTICATED.
TEST(GrpcTransportTest, JoinTokenAdmitsOnlyPeersThatProveIt) {
  auto token = JoinAuth::FromToken("swarm-secret-0123456789");
  ASSERT_TRUE(token.ok()) << token.status();
  Swarm s = Start(2, 4096, *token);
  ConnectAll(s);
  std::vector<std::vector<float>> v(2, std::vector<float>(kElems - 1, 1.0f));
  v[1].assign(kElems - 1, 3.0f);
  std::vector<std::thread> threads;
  std::vector<absl::Status> st(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RingOptions o;
      o.step_timeout = absl::Seconds(20);
      st[r] = RingWeightedAverage(*s.nodes[r], v[r], 1.0, o);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(v[r][7], 2.0f);
  }
  EXPECT_EQ((*token)->refused(), 0);

  GrpcTransportOptions o;
  o.credentials.join_auth =
      JoinAuth::FromToken("some-other-secret-987654").value();
  auto intruder = GrpcTransport::Start(o, Identity(2));
  ASSERT_TRUE(intruder.ok());
  absl::Status joined =
      (*intruder)->Connect({s.members[0], (*intruder)->address()}, 1,
                           Mailboxes(), absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnauthenticated(joined)) << joined;
  EXPECT_NE(joined.message().find("wrong join token"), std::string::npos)
      << joined;

  auto channel =
      grpc::CreateChannel(s.members[0], grpc::InsecureChannelCredentials());
  auto stub = peer::v1::Peer::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  ctx.set_wait_for_ready(true);  // through a failed first connection attempt
  peer::v1::SendAck ack;
  auto writer = stub->SendChunks(&ctx, &ack);
  peer::v1::TensorChunk chunk;
  chunk.set_run_id("test-run");
  (void)writer->Write(chunk);
  (void)writer->WritesDone();
  grpc::Status unsigned_call = writer->Finish();
  EXPECT_EQ(unsigned_call.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << unsigned_call.error_message();
  EXPECT_GE((*token)->refused(), 2);
}

// With ids bound (--tls_bind_node_ids) a ring chunk is taken only from a
// caller whose certificate names the member at the rank it claims. n2
// holds a valid certificate of the swarm's CA: its chunks as rank 0 (n0)
// are refused in the installed attempt without blaming n0, and so are
// those ahead of their attempt: refused (for the sender to retry) while
// its plan is not here, and for the impostor they are once it is, before
// any byte is held. The members' own rings over mutual TLS give the right
// averages in both attempts.
TEST(GrpcTransportTest, BoundIdsTakeRingChunksOnlyFromTheMemberAtTheirRank) {
  const std::string dir = testing::TempDir();
  ASSERT_TRUE(testing::MakeCa(dir, "swarm"));
  for (const char* name : {"n0", "n1", "n2"}) {
    ASSERT_TRUE(testing::MakeCert(dir, name, "swarm"));
  }
  std::vector<std::unique_ptr<GrpcTransport>> t;
  std::vector<std::string> members;
  const std::vector<std::string> ids = {"n0", "n1"};
  for (const std::string& id : ids) {
    PeerSecurityOptions security;
    security.tls_cert = dir + "/" + id + ".pem";
    security.tls_key = dir + "/" + id + ".key";
    security.tls_ca = dir + "/swarm-ca.pem";
    security.tls_require_client_cert = true;
    security.tls_bind_node_ids = true;
    security.node_id = id;
    absl::StatusOr<PeerCredentials> credentials = LoadPeerCredentials(security);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    GrpcTransportOptions o;
    o.chunk_bytes = 4096;
    o.credentials = *credentials;
    auto started = GrpcTransport::Start(o, Identity(2));
    ASSERT_TRUE(started.ok()) << started.status();
    members.push_back((*started)->address());
    t.push_back(std::move(started).value());
  }
  auto install = [&](int64_t attempt) {
    MailboxOptions mo = Mailboxes();
    mo.first_round = attempt;
    for (int r = 0; r < 2; ++r) t[r]->InstallRound(members, r, mo, ids);
  };
  // Both members average (1, 3) in `attempt`.
  auto ring = [&](int64_t attempt) {
    std::vector<std::vector<float>> v = {std::vector<float>(kElems - 1, 1.0f),
                                         std::vector<float>(kElems - 1, 3.0f)};
    std::vector<absl::Status> st(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        RingOptions o;
        o.round = attempt;
        o.step_timeout = absl::Seconds(20);
        st[r] = RingWeightedAverage(*t[r], v[r], 1.0, o);
      });
    }
    for (auto& th : threads) th.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(st[r].ok()) << "attempt " << attempt << ": " << st[r];
      for (float x : v[r]) ASSERT_EQ(x, 2.0f) << "attempt " << attempt;
    }
  };

  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = ReadFile(dir + "/swarm-ca.pem").value_or("");
  tls.pem_cert_chain = ReadFile(dir + "/n2.pem").value_or("");
  tls.pem_private_key = ReadFile(dir + "/n2.key").value_or("");
  auto impostor = peer::v1::Peer::NewStub(
      grpc::CreateChannel(members[1], grpc::SslCredentials(tls)));
  auto send = [&](int rank, int64_t attempt) {
    return SendThousands(*impostor, rank, attempt);
  };

  install(7);
  grpc::Status as_n0 = send(0, 7);
  EXPECT_EQ(as_n0.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << as_n0.error_message();
  EXPECT_NE(as_n0.error_message().find(
                "tensor chunks from rank 0 of attempt 7 as member \"n0\" from "
                "a caller whose certificate names \"n2\""),
            std::string::npos)
      << as_n0.error_message();
  grpc::Status no_rank = send(5, 7);
  EXPECT_EQ(no_rank.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << no_rank.error_message();
  EXPECT_NE(no_rank.error_message().find("no member id at that rank"),
            std::string::npos)
      << no_rank.error_message();
  // n0 is not blamed for the impostor's chunks: a wait for its message
  // times out rather than failing at once.
  absl::StatusOr<Message> blamed =
      t[1]->mailbox().Take(0, 7, "pseudo_grad", RingPhase::kReduceScatter, 0,
                           absl::Now() + absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(blamed.status())) << blamed.status();
  ring(7);

  // Ahead of its attempt. Held, its 1000s would be in the average, or the
  // real rank 0's segment refused as a duplicate.
  grpc::Status early = send(0, 8);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::UNAVAILABLE)
      << early.error_message();
  MailboxOptions next = Mailboxes();
  next.first_round = 8;
  t[1]->ExpectAttempt(members, 1, next, ids);
  early = send(0, 8);
  EXPECT_EQ(early.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << early.error_message();
  install(8);
  ring(8);
}

// Elastic rounds: a chunk for an attempt that this node has not installed
// yet is held when this node was sent that attempt's plan (ExpectAttempt)
// and it is at most kEarlyRounds rounds ahead, and delivered once that
// attempt is installed; one not planned here, or further ahead, is refused
// for its sender to retry. (With the window counted in attempts rather than
// rounds, a sender one round ahead was refused and resent its segment: 4%
// more ring bytes in the default sim.)
TEST(GrpcTransportTest, AChunkOfAPlannedAttemptAheadIsHeldForIt) {
  Swarm s = Start(2);
  const std::vector<std::string> ids = {"n0", "n1"};
  auto options = [](int64_t seq) {
    MailboxOptions mo = Mailboxes();
    mo.first_round = seq;
    return mo;
  };
  auto install = [&](int64_t seq) {
    for (int r = 0; r < 2; ++r) {
      s.nodes[r]->InstallRound(s.members, r, options(seq), ids);
    }
  };
  auto stub = peer::v1::Peer::NewStub(
      grpc::CreateChannel(s.members[1], grpc::InsecureChannelCredentials()));
  const size_t seg = SegmentLength(kElems, 2, 0);
  auto send = [&](int64_t seq) { return SendThousands(*stub, 0, seq); };
  constexpr int64_t kRound = kAttemptsPerRound;
  const int64_t now = 3 * kRound + 2;  // round 3, attempt 2
  install(now);
  const int64_t next_round = 4 * kRound + 1;
  grpc::Status unplanned = send(next_round);
  EXPECT_EQ(unplanned.error_code(), grpc::StatusCode::UNAVAILABLE)
      << unplanned.error_message();
  EXPECT_NE(unplanned.error_message().find("is not planned here yet"),
            std::string::npos)
      << unplanned.error_message();
  const int64_t last = now + kEarlyRounds * kRound;
  for (int64_t seq : {next_round, last, last + 1}) {
    s.nodes[1]->ExpectAttempt(s.members, 1, options(seq), ids);
  }
  grpc::Status held = send(next_round);
  EXPECT_TRUE(held.ok()) << held.error_message();
  grpc::Status edge = send(last);
  EXPECT_TRUE(edge.ok()) << edge.error_message();
  EXPECT_EQ(s.nodes[1]->early_bytes(), static_cast<int64_t>(2 * seg * 4));
  grpc::Status far = send(last + 1);
  EXPECT_EQ(far.error_code(), grpc::StatusCode::UNAVAILABLE)
      << far.error_message();
  EXPECT_NE(far.error_message().find("too far ahead"), std::string::npos)
      << far.error_message();

  install(next_round);
  absl::StatusOr<Message> got = s.nodes[1]->mailbox().Take(
      0, next_round, "pseudo_grad", RingPhase::kReduceScatter, 0,
      absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->payload.size(), seg * 4);
  float first = 0;
  std::memcpy(&first, got->payload.data(), sizeof(first));
  EXPECT_EQ(first, 1000.0f);
  EXPECT_EQ(s.nodes[1]->early_bytes(), static_cast<int64_t>(seg * 4));
}

// Bogus chunks for an attempt a few rounds ahead, whatever rank they claim,
// neither blame that rank in the attempt running now (the attack that made
// honest members sit rounds out) nor take memory: refused before any byte
// is held, for an attempt not planned here and for one that is.
TEST(GrpcTransportTest, BogusChunksOfALaterAttemptBlameNobodyAndHoldNothing) {
  Swarm s = Start(2);
  const std::vector<std::string> ids = {"n0", "n1"};
  MailboxOptions mo = Mailboxes();
  const int64_t now = 4 * int64_t{kAttemptsPerRound} + 1;
  mo.first_round = now;
  for (int r = 0; r < 2; ++r) s.nodes[r]->InstallRound(s.members, r, mo, ids);
  auto stub = peer::v1::Peer::NewStub(
      grpc::CreateChannel(s.members[1], grpc::InsecureChannelCredentials()));
  auto bogus = [&](int64_t seq) {
    peer::v1::TensorChunk c;
    c.set_run_id("test-run");
    c.set_from_rank(0);
    c.set_round(seq);
    c.set_tensor("bogus");
    c.set_segment_bytes(64);
    c.set_data(std::string(64, 'x'));
    grpc::ClientContext ctx;
    peer::v1::SendAck ack;
    auto w = stub->SendChunks(&ctx, &ack);
    (void)w->Write(c);
    (void)w->WritesDone();
    return w->Finish();
  };
  const int64_t ahead = now + 3 * int64_t{kAttemptsPerRound};
  for (int i = 0; i < 20; ++i) {
    grpc::Status st = bogus(ahead);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE)
        << st.error_message();
  }
  MailboxOptions later = Mailboxes();
  later.first_round = ahead;
  s.nodes[1]->ExpectAttempt(s.members, 1, later, ids);
  grpc::Status st = bogus(ahead);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << st.error_message();
  EXPECT_EQ(s.nodes[1]->early_bytes(), 0);
  EXPECT_EQ(s.nodes[1]->early_refused(), 1);
  // Rank 0 is not blamed in the attempt running now: the wait for its
  // message times out rather than failing at once, and its real message
  // is taken.
  absl::StatusOr<Message> none = s.nodes[1]->mailbox().Take(
      0, now, "pseudo_grad", RingPhase::kReduceScatter, 0,
      absl::Now() + absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(none.status())) << none.status();
  Message m = SegmentZeroFromRankZero(
      std::vector<float>(SegmentLength(kElems, 2, 0), 2.0f));
  m.round = now;
  ASSERT_TRUE(s.nodes[0]->Send(1, m, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(s.nodes[1]
                  ->mailbox()
                  .Take(0, now, "pseudo_grad", RingPhase::kReduceScatter, 0,
                        absl::Now() + absl::Seconds(10))
                  .ok());
}

// Two coordinators can number an attempt of a round alike (seen in a sim
// partition: the new side's coordinator planned attempt 1 of round 50 with
// two members while a chunk of the old coordinator's attempt 1, with four,
// was still on its way). Chunks carry their plan's digest: one of another
// plan is refused without blaming the member at its rank here, early ones
// too (checked against the plan this node was sent), and the plan's own
// chunks are taken.
TEST(GrpcTransportTest, AChunkOfAnotherPlanOfTheSameAttemptIsNotTaken) {
  Swarm s = Start(2);
  const std::vector<std::string> ids = {"n0", "n1"};
  // Rank `rank` runs `plan` in attempt `seq`.
  auto install = [&](int rank, int64_t seq, uint64_t plan) {
    MailboxOptions mo = Mailboxes();
    mo.first_round = seq;
    mo.plan = plan;
    s.nodes[rank]->InstallRound(s.members, rank, mo, ids);
  };
  const size_t seg = SegmentLength(kElems, 2, 0);
  auto send = [&](int64_t seq, float value) {
    Message m = SegmentZeroFromRankZero(std::vector<float>(seg, value));
    m.round = seq;
    return s.nodes[0]->Send(1, m, absl::Now() + absl::Seconds(10));
  };
  auto take = [&](int64_t seq, absl::Duration wait) {
    return s.nodes[1]->mailbox().Take(0, seq, "pseudo_grad",
                                      RingPhase::kReduceScatter, 0,
                                      absl::Now() + wait);
  };
  const uint64_t mine = 0x1111, other = 0x2222;
  const int64_t attempt = 50 * int64_t{kAttemptsPerRound} + 1;
  install(0, attempt, other);
  install(1, attempt, mine);
  absl::Status refused = send(attempt, 1000.0f);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(refused.message().find("belongs to another plan"),
            std::string::npos)
      << refused;
  // Not blamed on rank 0: the wait for its message times out.
  absl::StatusOr<Message> none = take(attempt, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(none.status())) << none.status();
  install(0, attempt, mine);
  absl::Status taken = send(attempt, 2.0f);
  ASSERT_TRUE(taken.ok()) << taken;
  absl::StatusOr<Message> got = take(attempt, absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  float first = 0;
  std::memcpy(&first, got->payload.data(), sizeof(first));
  EXPECT_EQ(first, 2.0f);

  // Early (the receiver is still at `attempt`, planned for its own plan of
  // attempt + 1) under another plan: refused, not held.
  install(0, attempt + 1, other);
  MailboxOptions planned = Mailboxes();
  planned.first_round = attempt + 1;
  planned.plan = mine;
  s.nodes[1]->ExpectAttempt(s.members, 1, planned, ids);
  absl::Status early = send(attempt + 1, 1000.0f);
  EXPECT_TRUE(absl::IsFailedPrecondition(early)) << early;
  EXPECT_EQ(s.nodes[1]->early_bytes(), 0);
  install(1, attempt + 1, mine);
  none = take(attempt + 1, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(none.status())) << none.status();
}

TEST(GrpcTransportTest, MismatchMessageNamesEveryField) {
  PeerIdentity mine = Identity(4);
  peer::v1::HandshakeRequest theirs;
  theirs.set_protocol_version(kProtocolVersion);
  theirs.set_run_id("other");
  theirs.set_algo("ddp");
  theirs.set_world(3);
  theirs.set_compression(mine.compression);
  *theirs.mutable_model() = mine.model;
  std::string why = HandshakeMismatch(theirs, mine);
  EXPECT_NE(why.find("run id differs"), std::string::npos) << why;
  EXPECT_NE(why.find("algorithm differs"), std::string::npos);
  EXPECT_NE(why.find("member count differs"), std::string::npos);
  theirs = MakeHandshakeRequest(mine, "127.0.0.1:1");
  EXPECT_EQ(theirs.protocol_version(), kProtocolVersion);
  EXPECT_EQ(theirs.address(), "127.0.0.1:1");
  EXPECT_EQ(HandshakeMismatch(theirs, mine), "");
  theirs.set_compression("int8");
  EXPECT_NE(HandshakeMismatch(theirs, mine).find("compression differs"),
            std::string::npos);
  theirs.set_compression(mine.compression);
  theirs.set_aggregate("median");
  EXPECT_NE(HandshakeMismatch(theirs, mine).find("aggregation"),
            std::string::npos);
  theirs.set_aggregate(mine.aggregate);
  theirs.mutable_model()->set_init_hash("zzz");
  EXPECT_NE(HandshakeMismatch(theirs, mine).find("--seed"), std::string::npos);
}

// The message is read at both ends (logged here, returned to the peer):
// with this node's address each value is labelled with the address of the
// node that holds it. Another model names the first tensor that differs.
TEST(GrpcTransportTest, MismatchNamesTheNodesAndTheFirstTensor) {
  PeerIdentity mine = Identity(4);
  mine.model = MakeFingerprint("torchscript(aaaa)", 10, "abc",
                               {"parameter conv.weight float32[32,16,3]",
                                "buffer bn.running_var float32[32]"});
  PeerIdentity other = mine;
  other.model = MakeFingerprint("torchscript(bbbb)", 10, "abc",
                                {"parameter conv.weight float32[48,16,3]",
                                 "buffer bn.running_var float32[48]"});
  peer::v1::HandshakeRequest theirs =
      MakeHandshakeRequest(other, "127.0.0.1:7002");
  std::string why = HandshakeMismatch(theirs, mine, "127.0.0.1:7001");
  EXPECT_NE(why.find("model architecture differs (node at \"127.0.0.1:7002\" "
                     "\"torchscript(bbbb)\", node at 127.0.0.1:7001 "
                     "\"torchscript(aaaa)\")"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("parameter conv.weight is float32[48,16,3] at node at "
                     "\"127.0.0.1:7002\", float32[32,16,3] at node at "
                     "127.0.0.1:7001"),
            std::string::npos)
      << why;
  // Without an address: the labels of old, and a peer without a tensor
  // list (or with the same tensors, other code) is named by architecture.
  theirs.mutable_model()->clear_tensors();
  why = HandshakeMismatch(theirs, mine);
  EXPECT_NE(why.find("(peer \"torchscript(bbbb)\", this node "),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find("conv.weight"), std::string::npos) << why;
}

// A second server on a port in use does not start (gRPC's default
// SO_REUSEPORT would let it share the port and half the connections).
TEST(GrpcTransportTest, APortInUseIsRefused) {
  GrpcTransportOptions o;
  auto a = GrpcTransport::Start(o, Identity(2));
  ASSERT_TRUE(a.ok()) << a.status();
  GrpcTransportOptions same = o;
  same.listen = (*a)->address();
  auto b = GrpcTransport::Start(same, Identity(2));
  EXPECT_TRUE(absl::IsUnavailable(b.status())) << b.status();
  if (!b.ok()) {
    EXPECT_NE(b.status().message().find(same.listen), std::string::npos);
  }
}

TEST(GrpcTransportTest, UnreachablePeerFailsWithItsAddress) {
  GrpcTransportOptions o;
  auto a = GrpcTransport::Start(o, Identity(2));
  ASSERT_TRUE(a.ok());
  // A port nobody listens on: bind one, note it, close it.
  auto tmp = GrpcTransport::Start(o, Identity(2));
  std::string dead = (*tmp)->address();
  tmp->reset();
  std::vector<std::string> members = {(*a)->address(), dead};
  std::sort(members.begin(), members.end());
  int rank = members[0] == (*a)->address() ? 0 : 1;
  auto start = absl::Now();
  absl::Status s =
      (*a)->Connect(members, rank, Mailboxes(), absl::Now() + absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find(dead), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

// Two connected nodes whose links the emulator shapes to `mbps` and
// `latency_ms` (--link_bandwidth_mbps / --link_latency_ms values), with one
// tensor "big" of `elements` floats, sent in 256 KiB chunks (smaller where
// the link is too slow to pass one within `idle`, the receivers'
// --stream_idle_timeout).
Swarm ShapedPair(const std::string& mbps, const std::string& latency_ms,
                 int64_t elements, std::shared_ptr<LinkEmulator>* links,
                 absl::Duration idle = absl::Seconds(60)) {
  absl::StatusOr<LinkEmulatorOptions> lo = ParseLinkFlags(mbps, latency_ms);
  EXPECT_TRUE(lo.ok()) << lo.status();
  GrpcTransportOptions o;
  o.chunk_bytes = 256 << 10;
  o.stream_idle_timeout = idle;
  o.links = std::make_shared<LinkEmulator>(lo.value_or(LinkEmulatorOptions()));
  *links = o.links;
  Swarm pair = Start(2, o);
  MailboxOptions mo;
  mo.run_id = "test-run";
  mo.tensors = {{"big", elements}};
  ConnectAll(pair, mo);
  return pair;
}

TEST(GrpcTransportTest, EmulatedLinkShapesBytesAndAddsLatencyPerMessage) {
  // Every link at 64 Mbit/s (8 MB/s) with 100 ms latency; two 2 MiB messages
  // in 256 KiB chunks.
  constexpr int64_t kSegment = 512 << 10;  // floats per message
  std::shared_ptr<LinkEmulator> links;
  Swarm pair = ShapedPair("64", "100", 2 * kSegment, &links);
  std::vector<std::unique_ptr<GrpcTransport>>& nodes = pair.nodes;
  const std::vector<std::string>& members = pair.members;

  Message m;
  m.from = 0;
  m.tensor = "big";
  m.total_elements = 2 * kSegment;
  m.payload.assign(kSegment * 4, '\0');
  const int64_t sent_before = nodes[0]->bytes_sent();
  const absl::Time start = absl::Now();
  for (RingPhase phase : {RingPhase::kReduceScatter, RingPhase::kAllGather}) {
    m.phase = phase;
    absl::Status s = nodes[0]->Send(1, m, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(s.ok()) << s;
  }
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  for (RingPhase phase : {RingPhase::kReduceScatter, RingPhase::kAllGather}) {
    auto got = nodes[1]->mailbox().Take(0, 0, "big", phase, 0,
                                        absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->payload.size(), m.payload.size());
  }
  // The serialized chunks go at the rate (the first burst at once), and
  // each message waits the latency once.
  const int64_t bytes = nodes[0]->bytes_sent() - sent_before;
  LinkShaper* link = links->For(members[1]);
  ASSERT_NE(link, nullptr);
  const double expected =
      2 * 0.1 + (bytes - link->burst_bytes()) / link->bytes_per_second();
  EXPECT_GE(elapsed, expected * 0.9) << bytes << " bytes";
  EXPECT_LE(elapsed, expected * 2 + 2) << bytes << " bytes";

  // A deadline the emulated link cannot meet fails the send in time.
  m.phase = RingPhase::kReduceScatter;
  m.round = 1;
  nodes[1]->mailbox().AdvanceRound(1);
  const absl::Time short_start = absl::Now();
  absl::Status late =
      nodes[0]->Send(1, m, absl::Now() + absl::Milliseconds(150));
  EXPECT_TRUE(absl::IsDeadlineExceeded(late)) << late;
  EXPECT_NE(late.message().find(members[1]), std::string::npos) << late;
  EXPECT_LT(absl::Now() - short_start, absl::Seconds(5));
}

// A send waiting on a slow emulated link ends as soon as its attempt is
// called off, instead of waiting out the link (here about 26 s for the
// message) while the node tries to leave.
TEST(GrpcTransportTest, AShapedSendEndsWhenItsAttemptIsCalledOff) {
  std::shared_ptr<LinkEmulator> links;
  Swarm pair = ShapedPair("0.04", "", 1 << 16, &links);
  // 128 KiB at 5 kB/s, in 75 kB chunks (15 s each at that rate); the first
  // waits about 2 s for what the bucket's 64 KiB lacks.
  Message m;
  m.from = 0;
  m.tensor = "big";
  m.phase = RingPhase::kReduceScatter;
  m.total_elements = 1 << 16;
  m.payload.assign(128 << 10, '\0');  // segment 0 of 2
  std::future<absl::Status> sent = std::async(std::launch::async, [&] {
    return pair.nodes[0]->Send(1, m, absl::Now() + absl::Minutes(10));
  });
  absl::SleepFor(absl::Milliseconds(300));  // into the link's wait
  pair.nodes[0]->mailbox().Cancel(absl::AbortedError("called off"));
  ASSERT_EQ(sent.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the send still waits on the emulated link";
  absl::Status s = sent.get();
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_NE(s.message().find(pair.members[1]), std::string::npos) << s;
}

// A payload whose memory has an owner goes out from that memory, not from a
// copy: the transport holds the owner while chunks are on their way, lets
// it go once the send is over, and the receiver gets exactly the bytes.
// Over an emulated link (chunks written one by one as the link lets them
// through) and over a plain one (written from gRPC's callbacks).
TEST(GrpcTransportTest, APayloadWithAnOwnerGoesOutFromItsMemoryAndIsLetGo) {
  constexpr int64_t kFloats = 64 << 10;  // a 256 KiB segment of 2
  std::shared_ptr<LinkEmulator> links;
  Swarm shaped = ShapedPair("2", "", 2 * kFloats, &links);  // 250 kB/s
  Swarm plain = Start(2, 1030);
  ConnectAll(plain);
  auto send_shared = [](Swarm& pair, const std::string& tensor, int64_t total,
                        int64_t floats, int* most_refs) {
    auto values = std::make_shared<std::vector<float>>(floats);
    for (int64_t i = 0; i < floats; ++i) (*values)[i] = 0.5f * i - 7;
    const std::shared_ptr<const void> owner = values;
    const long ours = owner.use_count();  // the two above
    Message m;
    m.from = 0;
    m.tensor = tensor;
    m.phase = RingPhase::kReduceScatter;
    m.total_elements = total;
    const absl::string_view bytes(reinterpret_cast<const char*>(values->data()),
                                  values->size() * 4);
    std::atomic<bool> done{false};
    std::atomic<long> most{0};
    std::thread watch([&] {
      while (!done) {
        most = std::max<long>(most, owner.use_count());
        std::this_thread::yield();
      }
    });
    absl::Status s = pair.nodes[0]->SendPayload(
        1, m, bytes, owner, absl::Now() + absl::Seconds(30));
    done = true;
    watch.join();
    ASSERT_TRUE(s.ok()) << s;
    *most_refs = static_cast<int>(most.load() - ours);
    auto got =
        pair.nodes[1]->mailbox().Take(0, 0, tensor, RingPhase::kReduceScatter,
                                      0, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->payload, std::string(bytes));
    // gRPC drops its last reference soon after the call (on its own thread).
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (owner.use_count() > ours && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(owner.use_count(), ours) << "the transport still holds it";
  };
  int most_refs = 0;
  send_shared(shaped, "big", 2 * kFloats, kFloats, &most_refs);
  EXPECT_GT(most_refs, 0) << "the chunks on their way did not hold the owner";
  send_shared(plain, "pseudo_grad", kElems, SegmentLength(kElems, 2, 0),
              &most_refs);
}

// A receiver cancels a stream that carries no chunk for its idle time (the
// slow-loris guard). On a link too slow to pass one 256 KiB chunk within
// it, the sender cuts smaller chunks, and the message arrives.
TEST(GrpcTransportTest, ASlowLinkSendsChunksSmallEnoughForTheIdleLimit) {
  constexpr int64_t kFloats = 128 << 10;  // a 512 KiB message
  std::shared_ptr<LinkEmulator> links;
  // 100 kB/s: a 256 KiB chunk takes 2.6 s, past the receivers' 2 s.
  Swarm pair = ShapedPair("0.8", "", 2 * kFloats, &links, absl::Seconds(2));
  Message m;
  m.from = 0;
  m.tensor = "big";
  m.phase = RingPhase::kReduceScatter;
  m.total_elements = 2 * kFloats;
  m.payload.assign(kFloats * 4, '\x3f');  // segment 0 of 2
  absl::Status s = pair.nodes[0]->Send(1, m, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(s.ok()) << s;
  auto got = pair.nodes[1]->mailbox().Take(0, 0, "big", m.phase, 0,
                                           absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->payload, m.payload);
  EXPECT_EQ(pair.nodes[1]->stream_deadlines().cancelled(), 0);
  EXPECT_TRUE(links->Error().ok());
}

// A link that cannot carry a message within the run's limits fails the send
// at once, naming the link, the message and the limit, and stays failed
// (LinkEmulator::Error): no retry can help, so the node stops instead of
// retrying every round attempt forever.
TEST(GrpcTransportTest, ALinkTooSlowForTheRunFailsAtOnceNamingTheLimit) {
  struct Case {
    std::string mbps;
    int64_t floats;
    std::string limit;
  };
  for (const Case& c : std::vector<Case>{
           // 5 kB/s: 512 KiB take 105 s, past the 60 s a sender waits.
           {"0.04", 128 << 10, "--round_timeout"},
           // 500 B/s: even a 4 KiB chunk takes 8 s, past the 2 s idle limit.
           {"0.004", 4 << 10, "--stream_idle_timeout"}}) {
    std::shared_ptr<LinkEmulator> links;
    Swarm pair = ShapedPair(c.mbps, "", 2 * c.floats, &links, absl::Seconds(2));
    Message m;
    m.from = 0;
    m.tensor = "big";
    m.phase = RingPhase::kReduceScatter;
    m.total_elements = 2 * c.floats;
    m.payload.assign(c.floats * 4, '\0');  // segment 0 of 2
    const absl::Time start = absl::Now();
    absl::Status s = pair.nodes[0]->Send(1, m, absl::Now() + absl::Minutes(10));
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << c.mbps;
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    for (const std::string& part :
         {pair.members[1], std::string("too slow"), c.limit, c.mbps + " Mbit/s",
          std::string("--link_bandwidth_mbps")}) {
      EXPECT_NE(s.message().find(part), std::string::npos) << part << ": " << s;
    }
    EXPECT_EQ(links->Error(), s);
    EXPECT_EQ(pair.nodes[0]->bytes_sent(), 0);
  }
}

// A hostile or buggy peer talks to rank 1 directly through the stub.
class HostilePeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    swarm_ = Start(2);
    ConnectAll(swarm_);
    stub_ = peer::v1::Peer::NewStub(grpc::CreateChannel(
        swarm_.members[1], grpc::InsecureChannelCredentials()));
  }

  // Streams `chunks` as one SendChunks call; returns the server's status.
  grpc::Status Send(const std::vector<peer::v1::TensorChunk>& chunks) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    peer::v1::SendAck ack;
    auto w = stub_->SendChunks(&ctx, &ack);
    for (const auto& c : chunks) {
      if (!w->Write(c)) break;
    }
    w->WritesDone();
    return w->Finish();
  }

  static peer::v1::TensorChunk Chunk(size_t floats, float value = 1.0f) {
    peer::v1::TensorChunk c;
    c.set_run_id("test-run");
    c.set_from_rank(0);
    c.set_round(0);
    c.set_tensor("pseudo_grad");
    c.set_phase(peer::v1::PHASE_REDUCE_SCATTER);
    c.set_step(0);
    c.set_segment(0);
    c.set_total_elements(kElems);
    std::vector<float> v(floats, value);
    c.set_segment_bytes(static_cast<int64_t>(floats * 4));
    c.set_offset(0);
    c.set_data(std::string(reinterpret_cast<char*>(v.data()), floats * 4));
    return c;
  }

  Swarm swarm_;
  std::unique_ptr<peer::v1::Peer::Stub> stub_;
};

// A segment whose stream began before the receiver's collective expected it
// (the receiver reached that step late) switches to the collective's values
// as soon as they are expected: the bytes buffered so far (ending inside a
// value) are applied, the rest streams straight in.
TEST_F(HostilePeerTest, ASegmentThatBeganBeforeItWasExpectedSwitchesToTheSink) {
  const size_t seg = SegmentLength(kElems, 2, 0);
  std::vector<float> sent(seg), values(seg);
  for (size_t i = 0; i < seg; ++i) {
    sent[i] = 0.25f * i + 1;
    values[i] = 0.5f * i;
  }
  const std::string bytes = Bytes(sent);
  peer::v1::TensorChunk c = Chunk(seg);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  peer::v1::SendAck ack;
  auto w = stub_->SendChunks(&ctx, &ack);
  const size_t cuts[] = {0, 1001, 2002, bytes.size()};
  for (int k = 0; k < 3; ++k) {
    c.set_offset(static_cast<int64_t>(cuts[k]));
    c.set_data(bytes.substr(cuts[k], cuts[k + 1] - cuts[k]));
    ASSERT_TRUE(w->Write(c));
    if (k > 0) continue;
    // The first chunk has arrived (and, nobody expecting it, was buffered).
    for (int i = 0; i < 1000 && swarm_.nodes[1]->bytes_received() == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    absl::SleepFor(absl::Milliseconds(200));
    swarm_.nodes[1]->mailbox().Expect(0, 0, "pseudo_grad",
                                      RingPhase::kReduceScatter, 0, 0,
                                      absl::MakeSpan(values), true);
  }
  w->WritesDone();
  grpc::Status st = w->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto got = swarm_.nodes[1]->mailbox().Take(0, 0, "pseudo_grad",
                                             RingPhase::kReduceScatter, 0,
                                             absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->applied);
  for (size_t i = 0; i < seg; ++i) {
    ASSERT_EQ(values[i], 0.5f * i + sent[i]) << "element " << i;
  }
}

TEST_F(HostilePeerTest, BadChunksAreRefusedAndTheRoundFailsCleanly) {
  const size_t seg = SegmentLength(kElems, 2, 0);
  struct Case {
    peer::v1::TensorChunk chunk;
    grpc::StatusCode code;
    const char* mention;
  };
  std::vector<Case> cases;
  cases.push_back(
      {Chunk(seg - 3), grpc::StatusCode::INVALID_ARGUMENT, "expected"});
  {
    auto c = Chunk(seg);
    c.set_tensor("optimizer_state");
    cases.push_back({c, grpc::StatusCode::INVALID_ARGUMENT,
                     "unknown tensor 'optimizer_state'"});
  }
  {
    auto c = Chunk(seg, std::numeric_limits<float>::quiet_NaN());
    cases.push_back({c, grpc::StatusCode::INVALID_ARGUMENT, "non-finite"});
  }
  {
    auto c = Chunk(seg);
    c.set_segment_bytes(int64_t{1} << 40);
    cases.push_back({c, grpc::StatusCode::INVALID_ARGUMENT, "announces"});
  }
  {
    auto c = Chunk(seg);
    c.set_run_id("someone-else");
    cases.push_back({c, grpc::StatusCode::FAILED_PRECONDITION, "run"});
  }
  for (const Case& c : cases) {
    grpc::Status s = Send({c.chunk});
    EXPECT_EQ(s.error_code(), c.code) << c.mention << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.mention), std::string::npos)
        << s.error_message();
  }
  // A stale round.
  swarm_.nodes[0]->mailbox().AdvanceRound(5);
  swarm_.nodes[1]->mailbox().AdvanceRound(5);
  grpc::Status stale = Send({Chunk(seg)});
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(stale.error_message().find("stale round 0"), std::string::npos)
      << stale.error_message();

  // Rank 1 in a round where the bad peer (rank 0) sends garbage: the round
  // fails at once with the reason, and rank 1's values are untouched.
  std::vector<float> values(kElems - 1, 2.5f);
  absl::Status round_status;
  std::thread t([&] {
    RingOptions o;
    o.round = 5;
    o.step_timeout = absl::Seconds(30);
    round_status = RingWeightedAverage(*swarm_.nodes[1], values, 1.0, o);
  });
  auto bad = Chunk(seg, std::numeric_limits<float>::infinity());
  bad.set_round(5);
  (void)Send({bad});
  t.join();
  EXPECT_FALSE(round_status.ok());
  EXPECT_NE(round_status.message().find("non-finite"), std::string::npos)
      << round_status;
  EXPECT_EQ(values, std::vector<float>(kElems - 1, 2.5f));
}

TEST_F(HostilePeerTest, BrokenChunkSequencesAreRefused) {
  const size_t seg = SegmentLength(kElems, 2, 0);
  auto first = Chunk(seg);
  first.set_data(first.data().substr(0, 400));
  auto gap = Chunk(seg);
  gap.set_offset(800);  // skips bytes 400..799
  gap.set_data(gap.data().substr(0, 400));
  grpc::Status s = Send({first, gap});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("does not continue"), std::string::npos)
      << s.error_message();
  // A flood of empty chunks: a message takes a bounded number of chunks.
  std::vector<peer::v1::TensorChunk> flood = {first};
  auto empty = Chunk(seg);
  empty.set_offset(400);
  empty.clear_data();
  flood.resize(1000, empty);
  s = Send(flood);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("26 chunks for 6004 bytes; at most 25"),
            std::string::npos)
      << s.error_message();
  // A stream that ends early.
  s = Send({first});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("ended after 400"), std::string::npos)
      << s.error_message();
}

// Slow-loris peers: a chunk stream that goes quiet, or that trickles on past
// its deadline, is cancelled by the server, which goes on serving.
// --peer_max_streams: one peer host may hold only so many streams open,
// however many connections it opens; a stream over the cap is refused at
// once, and a slot that frees up is taken again.
TEST(GrpcTransportTest, StreamsPerPeerHostAreCappedAcrossConnections) {
  GrpcTransportOptions o;
  o.peer_max_streams = 3;
  Swarm s = Start(2, o);
  ConnectAll(s);
  struct Stream {
    std::unique_ptr<peer::v1::Peer::Stub> stub;
    grpc::ClientContext ctx;
    peer::v1::SendAck ack;
    std::unique_ptr<grpc::ClientWriter<peer::v1::TensorChunk>> writer;
  };
  // A stream on a connection of its own (its channel does not share
  // subchannels); it sends no chunk, so it stays open.
  auto open = [&] {
    auto st = std::make_unique<Stream>();
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    st->stub = peer::v1::Peer::NewStub(grpc::CreateCustomChannel(
        s.members[1], grpc::InsecureChannelCredentials(), args));
    st->ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    st->writer = st->stub->SendChunks(&st->ctx, &st->ack);
    return st;
  };
  // Ends a stream without a chunk: the server's refusal, or (admitted) its
  // complaint about an empty stream.
  auto close = [](Stream& st) {
    st.writer->WritesDone();
    return st.writer->Finish();
  };
  std::vector<std::unique_ptr<Stream>> held;
  for (int i = 0; i < 3; ++i) held.push_back(open());
  absl::SleepFor(absl::Milliseconds(500));  // the server has all three
  auto fourth = open();
  const grpc::Status refused = close(*fourth);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("--peer_max_streams=3"),
            std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("127.0.0.1"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(s.nodes[1]->stream_deadlines().refused(), 1);
  // One held stream ends; its slot is free again.
  EXPECT_EQ(close(*held[0]).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status again;
  for (int tries = 0; tries < 50; ++tries) {
    auto next = open();
    again = close(*next);
    if (again.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(again.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << again.error_message();
  for (size_t i = 1; i < held.size(); ++i) close(*held[i]);
}

TEST(GrpcTransportTest, SlowLorisStreamsAreCancelled) {
  GrpcTransportOptions o;
  o.stream_idle_timeout = absl::Seconds(1);
  o.chunk_stream_deadline = absl::Seconds(4);
  Swarm s = Start(2, o);
  ConnectAll(s);
  auto stub = peer::v1::Peer::NewStub(
      grpc::CreateChannel(s.members[1], grpc::InsecureChannelCredentials()));
  const size_t seg = SegmentLength(kElems, 2, 0);
  peer::v1::TensorChunk c;
  c.set_run_id("test-run");
  c.set_from_rank(0);
  c.set_tensor("pseudo_grad");
  c.set_phase(peer::v1::PHASE_REDUCE_SCATTER);
  c.set_total_elements(kElems);
  c.set_segment_bytes(static_cast<int64_t>(seg * 4));
  c.set_data(std::string(400, '\0'));

  // Streams chunks with `write` (which returns once the server has cut
  // the stream, or gives up) and expects the server to cancel the stream
  // no sooner than `after`.
  auto expect_cancelled =
      [&](const std::function<void(grpc::ClientWriter<peer::v1::TensorChunk>*)>&
              write,
          absl::Duration after) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
        peer::v1::SendAck ack;
        const absl::Time start = absl::Now();
        auto w = stub->SendChunks(&ctx, &ack);
        write(w.get());
        grpc::Status st = w->Finish();
        EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED)
            << st.error_message();
        EXPECT_GE(absl::Now() - start, after);
        EXPECT_LT(absl::Now() - start, absl::Seconds(30));
      };

  // Opens a stream and goes quiet after the first chunk.
  expect_cancelled(
      [&](grpc::ClientWriter<peer::v1::TensorChunk>* w) {
        EXPECT_TRUE(w->Write(c));
      },
      absl::Seconds(1));
  EXPECT_EQ(s.nodes[1]->stream_deadlines().cancelled(), 1);

  // Trickles 4 bytes every 300 ms: never idle, but past the deadline.
  expect_cancelled(
      [&](grpc::ClientWriter<peer::v1::TensorChunk>* w) {
        int64_t offset = 0;
        bool cut = false;
        for (int i = 0; i < 150 && !cut; ++i) {
          c.set_offset(offset);
          c.set_data(std::string(i == 0 ? 400 : 4, '\0'));
          offset += static_cast<int64_t>(c.data().size());
          cut = !w->Write(c);
          absl::SleepFor(absl::Milliseconds(300));
        }
        EXPECT_TRUE(cut) << "the server never ended the trickling stream";
      },
      absl::Seconds(4));
  EXPECT_EQ(s.nodes[1]->stream_deadlines().cancelled(), 2);

  // The next round runs as usual, and no honest stream was cancelled.
  std::vector<std::vector<float>> v(2, std::vector<float>(kElems - 1));
  for (int r = 0; r < 2; ++r) {
    for (int64_t i = 0; i < kElems - 1; ++i) v[r][i] = 0.5f * i * (r + 1);
    s.nodes[r]->mailbox().AdvanceRound(1);
  }
  std::vector<std::thread> threads;
  std::vector<absl::Status> st(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RingOptions ro;
      ro.round = 1;
      ro.step_timeout = absl::Seconds(20);
      st[r] = RingWeightedAverage(*s.nodes[r], v[r], 1.0, ro);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(st[r].ok()) << st[r];
  EXPECT_EQ(v[0], v[1]);
  EXPECT_EQ(v[0][10], 0.5f * 10 * 1.5f);
  EXPECT_EQ(s.nodes[0]->stream_deadlines().cancelled(), 0);
  EXPECT_EQ(s.nodes[1]->stream_deadlines().cancelled(), 2);
}

}  // namespace
}  // namespace starling
