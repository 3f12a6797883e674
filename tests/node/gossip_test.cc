// Integration tests of push-sum gossip (`--algo=gossip`) on real processes
// over loopback: a sim finishes with exchanges both ways and a consensus
// curve; a node killed in the middle of a push never stalls the others; a
// DiLoCo node cannot join; malformed and stalled pushes are refused. Every
// wait is bounded.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "starling/peer/v1/swarm.grpc.pb.h"
#include "tests/core/test_util.h"
#include "tests/harness/node_group.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::NodeGroup;
using ::starling::testing::ReadEvents;
using ::starling::testing::ReadJson;
using ::starling::testing::RunStarling;
using ::starling::testing::TempDir;
using ::starling::testing::TinyTextFlags;

// The flags of every node of a gossip run.
std::string Common(const std::string& run_id, int steps) {
  return absl::StrCat(TinyTextFlags(60000), " --steps=", steps,
                      " --inner_steps=5 --shard_mode=contiguous --threads=1"
                      " --suspect_timeout=1 --chunk_bytes=1024"
                      " --gossip_timeout=2 --algo=gossip --insecure --run_id=",
                      run_id);
}

TEST(GossipTest, SimFinishesWithExchangesBothWaysAndConsensus) {
  const std::string out = TempDir() + "/gossip-sim";
  auto r = RunStarling(absl::StrCat(
      "sim --nodes=3 --algo=gossip --steps=60 --inner_steps=5 --eval_every=5 ",
      TinyTextFlags(60000), " --shard_mode=contiguous --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_EQ(Field(fin, "val_loss_of").string_value(), "mean of nodes");
  const double val = Field(fin, "val_loss").number_value();
  EXPECT_TRUE(std::isfinite(val));
  // Every node finished, pushed and absorbed, and learned (its first
  // evaluation is after the first 5 steps, still near the start).
  std::map<std::string, std::set<std::string>> pushed_to;
  double mean_final = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string id = absl::StrCat("n", i);
    const std::string events = absl::StrCat(out, "/", id, "/events.jsonl");
    int pushes = 0, absorbs = 0;
    for (const auto& ev : ReadEvents(events, "exchange")) {
      const std::string kind = Field(ev, "kind").string_value();
      EXPECT_GT(Field(ev, "weight").number_value(), 0);
      EXPECT_GT(Field(ev, "bytes").number_value(), 0);
      if (kind == "push") {
        ++pushes;
        pushed_to[id].insert(Field(ev, "peer").string_value());
        const double loss = Field(ev, "train_loss").number_value();
        EXPECT_TRUE(std::isfinite(loss) && loss > 0) << id << " " << loss;
      } else {
        ++absorbs;
        EXPECT_GE(Field(ev, "distance2").number_value(), 0);
      }
    }
    EXPECT_GT(pushes, 0) << id;
    EXPECT_GT(absorbs, 0) << id;
    auto evals = ReadEvents(events, "eval");
    ASSERT_GE(evals.size(), 2u) << id;
    const double first = Field(evals.front(), "val_loss").number_value();
    const double last = Field(evals.back(), "val_loss").number_value();
    EXPECT_TRUE(std::isfinite(last)) << id;
    EXPECT_LT(last, first) << id;
    EXPECT_EQ(Field(evals.back(), "step").number_value(), 60) << id;
    mean_final += last / 3;
    auto node = ReadJson(absl::StrCat(out, "/", id, "/summary.json"));
    EXPECT_EQ(Field(Field(node, "nodes").list_value().values(0).struct_value(),
                    "inner_steps")
                  .number_value(),
              60);
  }
  EXPECT_NEAR(val, mean_final, 1e-9);
  // The live line counts pushes (gossip has no rounds) and ends at the end.
  EXPECT_NE(r.err.find("| step 60/60 | loss "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sim | pushes "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("sim | round "), std::string::npos) << r.err;
  // Its val is the mean of the nodes' own evaluations, as the result is.
  EXPECT_NE(r.err.find(absl::StrFormat("| val %.4f |", val)), std::string::npos)
      << val << "\n"
      << r.err;
  // Exchanges in both directions: some pair pushed to each other.
  bool both_ways = false;
  for (const auto& [a, peers] : pushed_to) {
    for (const std::string& b : peers) {
      both_ways = both_ways || pushed_to[b].count(a) > 0;
    }
  }
  EXPECT_TRUE(both_ways);
  // Consensus distance per snapshot step; the snapshots are gone.
  const auto& consensus = Field(summary, "consensus").list_value();
  ASSERT_GE(consensus.values_size(), 2);
  for (const auto& v : consensus.values()) {
    EXPECT_GE(Field(v.struct_value(), "distance").number_value(), 0);
    EXPECT_GE(Field(v.struct_value(), "nodes").number_value(), 2);
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(FileExists(absl::StrCat(out, "/n", i, "/snapshots")));
  }
  std::string html = ReadFile(out + "/report.html").value_or("");
  EXPECT_NE(html.find("Consensus distance"), std::string::npos);
}

// Lossy pushes (int8 with gossip error feedback), outer momentum and the
// exponential graph: the run finishes, learns, and sends fewer bytes than
// fp32 pushes would; pushes after the first to a peer are relative to the
// public copy.
TEST(GossipTest, CompressedMomentumExponentialSimLearns) {
  const std::string out = TempDir() + "/gossip-int8";
  auto r = RunStarling(absl::StrCat(
      "sim --nodes=3 --algo=gossip --steps=60 --inner_steps=5 --eval_every=5 "
      "--compression=int8 --gossip_momentum=0.5 --gossip_peers=exponential ",
      TinyTextFlags(60000), " --shard_mode=contiguous --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(std::isfinite(Field(fin, "val_loss").number_value()));
  const double before = Field(fin, "bytes_before_compression").number_value();
  const double after = Field(fin, "bytes_after_compression").number_value();
  EXPECT_GT(after, 0);
  EXPECT_LT(after, before / 2);
  EXPECT_NE(Field(fin, "compression").string_value().find("int8"),
            std::string::npos);
  for (int i = 0; i < 3; ++i) {
    const std::string events = absl::StrCat(out, "/n", i, "/events.jsonl");
    auto evals = ReadEvents(events, "eval");
    ASSERT_GE(evals.size(), 2u);
    EXPECT_LT(Field(evals.back(), "val_loss").number_value(),
              Field(evals.front(), "val_loss").number_value())
        << "n" << i;
    int relative = 0, absolute = 0;
    for (const auto& e : ReadEvents(events, "exchange")) {
      if (Field(e, "kind").string_value() != "push") continue;
      (Field(e, "relative_to").number_value() > 0 ? relative : absolute)++;
    }
    EXPECT_GT(relative, 0) << "n" << i;
    EXPECT_GT(absolute, 0) << "n" << i;  // the first push to each peer
  }
}

// One of four nodes SIGKILLs itself in the middle of its third push: the
// others (including the one it was pushing to) finish every step, in time.
// It joins last, so it passes --min_members at once and dies within
// milliseconds: before its first gossip tick, unless passing the barrier
// tells everyone it is ready (otherwise the others wait for it in vain).
TEST(GossipTest, NodeKilledMidPushNeverStallsTheOthers) {
  NodeGroup g("gossip-crash", Common("gossip-crash", 80));
  const std::vector<std::string> ids = {"n0", "n1", "n2", "n3"};
  // The others join through the address n0 logs; n2 last.
  for (int k : {0, 1, 3, 2}) {
    const std::string& id = ids[k];
    if (id == "n2") {
      for (const char* other : {"n1", "n3"}) {
        ASSERT_TRUE(testing::WaitForText(g.Log(other), "joined through",
                                         absl::Seconds(60)))
            << g.LogText(other);
      }
    }
    g.Start(
        id,
        absl::StrCat("--eval_every=40 --min_members=4 --shard=", k, "/4",
                     id == "n2" ? " --test_crash_at=push_mid_stream@3" : ""),
        id == "n0" ? "" : "n0");
  }
  for (const std::string& id : ids) {
    const int code = g.Wait(id, absl::Seconds(90));
    if (id == "n2") {
      EXPECT_EQ(code, 128 + SIGKILL) << g.LogText(id);
      continue;
    }
    EXPECT_EQ(code, 0) << id << ":\n" << g.LogText(id);
    auto node = ReadJson(g.Out(id) + "/summary.json");
    EXPECT_TRUE(std::isfinite(
        Field(Field(node, "final").struct_value(), "val_loss").number_value()));
  }
  // n2 crashed in a push: it never logged a third one.
  int victim_pushes = 0;
  for (const auto& ev : g.Events("n2", "exchange")) {
    victim_pushes += Field(ev, "kind").string_value() == "push";
  }
  EXPECT_EQ(victim_pushes, 2);
}

TEST(GossipTest, DilocoNodeCannotJoinAGossipSwarm) {
  NodeGroup g("gossip-mixed", "--run_id=mixed --insecure");
  g.Start("g0", absl::StrCat(Common("mixed", 100000), " --eval_every=0"));
  auto r = g.Run("d1",
                 absl::StrCat(TinyTextFlags(60000),
                              " --steps=10 --shard_mode=contiguous --threads=1"
                              " --algo=diloco --connect_timeout=20"),
                 "g0");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("gossip"), std::string::npos) << r.err;
}

// Forged pushes straight to a gossip node's Swarm service. The node never
// reaches the end of its local steps here, so it never drains its inbox.
TEST(GossipTest, MalformedAndStalledPushesAreRefused) {
  NodeGroup g("gossip-bad", absl::StrCat(Common("bad", 100000),
                                         " --eval_every=0 --gossip_timeout=1"
                                         " --inner_steps=100000"));
  g.Start("g0", "");
  const std::string address = g.Address("g0");
  ASSERT_FALSE(address.empty());
  // A second member, whose id the forged pushes carry.
  g.Start("g1", "", "g0");
  ASSERT_TRUE(
      testing::WaitForText(g.Log("g1"), "g1 joined through", absl::Seconds(30)))
      << g.LogText("g1");
  auto stub = peer::v1::Swarm::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const int64_t n = g.Parameters("g0");
  ASSERT_GT(n, 0);
  auto push = [&](std::vector<peer::v1::PushChunk> chunks,
                  bool finish_writes = true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    ctx.set_wait_for_ready(true);  // through a failed first connection attempt
    peer::v1::PushAck ack;
    auto writer = stub->Push(&ctx, &ack);
    for (const auto& c : chunks) {
      if (!writer->Write(c)) break;
    }
    if (finish_writes) writer->WritesDone();
    return writer->Finish();
  };
  auto chunk = [&](int64_t elements, const std::vector<float>& v,
                   double weight) {
    peer::v1::PushChunk c;
    c.set_run_id("bad");
    c.set_from("g1");
    c.set_sequence(1);
    c.set_elements(elements);
    c.set_total_bytes(static_cast<int64_t>(v.size() * sizeof(float)));
    c.set_offset(0);
    c.set_data(reinterpret_cast<const char*>(v.data()),
               v.size() * sizeof(float));
    c.set_weight(weight);
    return c;
  };
  std::vector<float> good(static_cast<size_t>(n), 0.01f);
  // Wrong size.
  grpc::Status s = push({chunk(n + 1, good, 0.5)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("elements"), std::string::npos);
  // NaN.
  std::vector<float> nan = good;
  nan[7] = std::numeric_limits<float>::quiet_NaN();
  s = push({chunk(n, nan, 0.5)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("value 7"), std::string::npos)
      << s.error_message();
  // Bad weight.
  s = push({chunk(n, good, -1)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Truncated: half the bytes, then the stream ends.
  peer::v1::PushChunk half = chunk(n, good, 0.5);
  half.mutable_data()->resize(half.data().size() / 2);
  s = push({half});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("truncated"), std::string::npos);
  // Wrong run.
  peer::v1::PushChunk other = chunk(n, good, 0.5);
  other.set_run_id("other");
  s = push({other});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Stalled: half the bytes and never WritesDone. The node drops the
  // stream after --gossip_timeout, well before the client's own deadline.
  const absl::Time start = absl::Now();
  s = push({half}, /*finish_writes=*/false);
  EXPECT_NE(s.error_code(), grpc::StatusCode::OK);
  EXPECT_NE(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << s.error_message() << " after " << absl::Now() - start;
  // A valid push from an id that is not another member is refused: it
  // would be averaged in, and kept as a copy per made-up id.
  for (const char* from : {"forger", "g0"}) {
    peer::v1::PushChunk c = chunk(n, good, 0.5);
    c.set_from(from);
    s = push({c});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << from;
    EXPECT_NE(s.error_message().find("takes pushes only from other members"),
              std::string::npos)
        << s.error_message();
  }
  // A valid push is accepted; the inbox is bounded: more pushes than it
  // holds are refused with RESOURCE_EXHAUSTED, and the node keeps training.
  s = push({chunk(n, good, 0.5)});
  EXPECT_TRUE(s.ok()) << s.error_message();
  grpc::StatusCode refused = grpc::StatusCode::OK;
  for (int i = 0; i < 50 && refused == grpc::StatusCode::OK; ++i) {
    refused = push({chunk(n, good, 0.5)}).error_code();
  }
  EXPECT_EQ(refused, grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(g.Running("g0")) << "the node died:\n" << g.LogText("g0");
}

// A lone gossip node with SlowMo, interrupted and resumed, ends on the
// model of one never interrupted: the checkpoint keeps the push-sum weight
// and SlowMo's momentum (without it, the momentum restarts at zero and the
// models part).
TEST(GossipTest, AResumedNodeKeepsItsSlowMoMomentum) {
  const std::string dir = TempDir();
  const std::string common = absl::StrCat(
      TinyTextFlags(60000),
      " --algo=gossip --insecure --listen=127.0.0.1:0 --steps=400"
      " --inner_steps=10 --eval_every=0 --threads=1 --gossip_momentum=0.5"
      " --checkpoint_every=10");
  auto straight =
      RunStarling(absl::StrCat("node ", common, " --out=", dir, "/straight"));
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const std::string out = dir + "/cut";
  testing::Process cut = testing::Process::Start(
      absl::StrCat("node ", common, " --out=", out), dir + "/cut.err");
  ASSERT_TRUE(cut.started());
  ASSERT_TRUE(
      testing::WaitForText(dir + "/cut.err", " step 100/", absl::Seconds(60)));
  EXPECT_EQ(cut.Interrupt(), 1);
  auto resumed =
      RunStarling(absl::StrCat("node ", common, " --out=", out, " --resume"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto a =
      Field(ReadJson(dir + "/straight/summary.json"), "final").struct_value();
  const auto b = Field(ReadJson(out + "/summary.json"), "final").struct_value();
  EXPECT_EQ(Field(b, "inner_steps").number_value(), 400);
  EXPECT_EQ(Field(a, "model_hash").string_value(),
            Field(b, "model_hash").string_value());
}

}  // namespace
}  // namespace starling
