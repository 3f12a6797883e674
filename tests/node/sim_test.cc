// Integration tests of `starling sim` and `starling node` as real processes
// on loopback: model agreement every round, byte accounting, failures.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::ListenAddress;
using ::starling::testing::Process;
using ::starling::testing::ReadJson;
using ::starling::testing::RunStarling;
using ::starling::testing::TempDir;
using ::starling::testing::WaitForText;

std::string TinyFlags() {
  static const std::string* flags = new std::string(
      absl::StrCat(testing::TinyTextFlags(300000), " --eval_every=20"));
  return *flags;
}

// gpt(layers=1, width=32, heads=2, context=32, vocab=256) parameters.
constexpr double kParams =
    256 * 32 + 32 * 32 +
    (64 + 32 * 96 + 96 + 32 * 32 + 32 + 64 + 32 * 128 + 128 + 128 * 32 + 32) +
    64 + 32 * 256 + 256;

TEST(SimTest, FourNodeDilocoAgreesEveryRoundAndCountsBytes) {
  const std::string out = TempDir() + "/sim";
  auto r =
      RunStarling(absl::StrCat("sim --nodes=4 --steps=40 --inner_steps=10 ",
                               TinyFlags(), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("hashes agree: yes"), std::string::npos) << r.err;
  // The live line's last state is the run's end, however short the run.
  EXPECT_NE(r.err.find("sim | round 4 | step 40/40 | loss "), std::string::npos)
      << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& rounds = Field(summary, "rounds").list_value();
  ASSERT_EQ(rounds.values_size(), 4);
  for (const auto& v : rounds.values()) {
    const auto& round = v.struct_value();
    EXPECT_TRUE(Field(round, "hashes_agree").bool_value());
    const auto& hashes = Field(round, "node_hashes").list_value();
    ASSERT_EQ(hashes.values_size(), 4);
    for (const auto& h : hashes.values()) {
      EXPECT_EQ(h.string_value(), Field(round, "model_hash").string_value());
    }
    EXPECT_EQ(Field(round, "members").list_value().values_size(), 4);
  }
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(Field(fin, "all_hashes_agree").bool_value());
  EXPECT_GT(Field(fin, "val_loss").number_value(), 0.5);
  // Per node per round: 2·(N−1)/N · (P + 1 weight) · 4 bytes of
  // pseudo-gradient in the committed attempts, exactly (fp32: before and
  // after compression alike).
  const double want = 4 * 4 * 2.0 * 3 / 4 * (kParams + 1) * 4;
  const double payload = Field(fin, "bytes_before_compression").number_value();
  EXPECT_GE(payload, want);
  EXPECT_LT(payload, want * 1.001);
  EXPECT_EQ(Field(fin, "bytes_after_compression").number_value(), payload);
  // Everything on the wire: that, plus framing, membership gossip and
  // control messages (which grow with the run's wall time) and any attempt
  // that was called off and run again (a node suspected on a loaded
  // machine): a few percent here, up to a quarter more under heavy load.
  const double total = Field(fin, "total_bytes").number_value();
  EXPECT_GT(total, payload);
  EXPECT_LT(total, want * 1.25);
  // vs per-step all-reduce of gradients: about H = 10x less.
  const double reduction = Field(fin, "comm_reduction").number_value();
  EXPECT_GT(reduction, 10.0 / 1.25);
  EXPECT_LE(reduction, 10.0);
  const auto& nodes = Field(summary, "nodes").list_value();
  ASSERT_EQ(nodes.values_size(), 4);
  for (int i = 0; i < 4; ++i) {
    const auto& node = nodes.values(i).struct_value();
    EXPECT_EQ(Field(node, "id").string_value(), absl::StrCat("n", i));
    EXPECT_EQ(Field(node, "inner_steps").number_value(), 40);
    EXPECT_TRUE(FileExists(absl::StrCat(out, "/n", i, "/events.jsonl")));
    // The round time split (docs/training.md), the same on a CPU.
    EXPECT_EQ(Field(node, "precision").string_value(), "fp32");
    const auto& split = Field(node, "round_time_split").struct_value();
    EXPECT_EQ(Field(split, "rounds").number_value(), 4);
    for (const char* part : {"inner_seconds", "copy_seconds",
                             "exchange_seconds", "outer_seconds"}) {
      EXPECT_GT(Field(split, part).number_value(), 0) << part;
    }
    EXPECT_LT(Field(split, "copy_seconds").number_value(),
              Field(split, "inner_seconds").number_value());
  }
  // report.html is self-contained: each chart is inlined as a data: URI.
  std::string html = *ReadFile(out + "/report.html");
  for (const char* chart : {"val_loss_vs_time.png", "loss_vs_bytes.png",
                            "bytes_per_node.png", "hash_agreement.png"}) {
    absl::StatusOr<std::string> png =
        ReadFile(absl::StrCat(out, "/report/", chart));
    ASSERT_TRUE(png.ok()) << chart << ": " << png.status();
    EXPECT_NE(html.find(absl::StrCat("data:image/png;base64,",
                                     absl::Base64Escape(*png))),
              std::string::npos)
        << chart;
  }
}

TEST(SimTest, DdpSendsEveryStepAndAgrees) {
  const std::string out = TempDir() + "/ddp";
  auto r = RunStarling(absl::StrCat("sim --nodes=3 --steps=12 --algo=ddp ",
                                    TinyFlags(), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(Field(fin, "all_hashes_agree").bool_value());
  EXPECT_EQ(Field(summary, "rounds").list_value().values_size(), 12);
  // The baseline itself: about as many bytes as per-step all-reduce.
  EXPECT_NEAR(Field(fin, "comm_reduction").number_value(), 1.0, 0.05);
}

// A text of one 64 KiB iid chunk passes the sim's own data check (which
// loads it unsharded) but leaves one of two nodes an empty shard: that node
// fails at start, and the sim stops, naming it and its log.
TEST(SimTest, AFailingNodeStopsTheSimAndIsNamed) {
  const std::string out = TempDir() + "/fail";
  auto r =
      RunStarling(absl::StrCat("sim --nodes=2 --steps=10 ",
                               testing::TinyTextFlags(20000), " --out=", out));
  // Bad input, as a node's exit code says: 2, not a failure at run time.
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("failed (exit 2)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("has no training window"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("node.log"), std::string::npos) << r.err;
}

// A node that leaves before the swarm formed strands the others at the
// start barrier: the sim says so when it makes the node leave, rather than
// leave the user to match the others' timeout with --leave.
TEST(SimTest, ALeaveBeforeTheSwarmFormedIsExplained) {
  const std::string out = TempDir() + "/early-leave";
  auto r = RunStarling(absl::StrCat("sim --nodes=2 --steps=20 ", TinyFlags(),
                                    " --leave=n1@0.2s --connect_timeout=3",
                                    " --out=", out));
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("leave n1 before the swarm formed: the others wait for "
                       "all 2 starting nodes (--min_members) and fail after "
                       "--connect_timeout=3 s"),
            std::string::npos)
      << r.err;
}

// --partition cuts the sim's nodes into two sides for a while: each side
// trains on by itself (rounds of two members, whose hashes differ between
// the sides), and after the heal one lineage wins and every node ends on
// its model. The summary and the last line say which rounds split and that
// the final models agree. (The run lasts well past the heal: sides that
// finish apart end on two models. The suspect timeout is long enough that
// a loaded machine does not declare a live member of the same side dead.)
TEST(SimTest, APartitionsSidesTrainApartThenEndOnOneModel) {
  const std::string out = TempDir() + "/partition";
  auto r = RunStarling(
      absl::StrCat("sim --nodes=4 --steps=3000 --inner_steps=10 ", TinyFlags(),
                   " --suspect_timeout=2 --connect_timeout=30",
                   " '--partition=n0,n1|n2,n3@3s-11s' --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_FALSE(Field(fin, "all_hashes_agree").bool_value());
  EXPECT_TRUE(Field(fin, "final_models_agree").bool_value());
  const auto& split = Field(fin, "split_rounds").list_value();
  ASSERT_GT(split.values_size(), 0);
  // Split rounds are those the sides ran apart, each without the other.
  // The first may be listed with every member: when the cut falls between
  // a round's all-reduce and its commit, the side that got the commit keeps
  // that round (as all four ran it), and the other side runs it again by
  // itself.
  const double first_split = split.values(0).number_value();
  for (const auto& v : Field(summary, "rounds").list_value().values()) {
    const auto& round = v.struct_value();
    if (Field(round, "hashes_agree").bool_value()) continue;
    if (Field(round, "round").number_value() == first_split) continue;
    EXPECT_LT(Field(round, "members").list_value().values_size(), 4)
        << "round " << Field(round, "round").number_value();
  }
  const std::string hash = Field(fin, "model_hash").string_value();
  for (const auto& v : Field(summary, "nodes").list_value().values()) {
    EXPECT_EQ(Field(v.struct_value(), "status").string_value(), "finished");
    EXPECT_EQ(Field(v.struct_value(), "model_hash").string_value(), hash);
  }
  const auto& faults = Field(summary, "faults").list_value();
  ASSERT_EQ(faults.values_size(), 2);
  EXPECT_EQ(Field(faults.values(0).struct_value(), "kind").string_value(),
            "partition_start");
  EXPECT_EQ(Field(faults.values(1).struct_value(), "kind").string_value(),
            "partition_end");
  const int first = static_cast<int>(split.values(0).number_value());
  EXPECT_NE(
      r.err.find(absl::StrCat("hashes agree: NO in round",
                              split.values_size() > 1 ? "s " : " ", first)),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("; the final models agree |"), std::string::npos)
      << r.err;
}

// A bad node flag stops the sim before it makes its run directory or starts
// a node, naming the flag once (not once per child, after each data load).
// The model is built there too: an unknown one, or a shape it refuses.
// n2 and n3 behind emulated NAT: nobody can dial them, they train every
// round with n0 and n1 through relays, and the sim reports the bytes the
// relays forwarded.
TEST(SimTest, NodesBehindEmulatedNatTrainThroughRelays) {
  const std::string out = TempDir() + "/nat";
  auto r =
      RunStarling(absl::StrCat("sim --nodes=4 --steps=40 --inner_steps=10",
                               " --nat=n2,n3 ", TinyFlags(), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("hashes agree: yes"), std::string::npos) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  for (const auto& v : Field(summary, "rounds").list_value().values()) {
    EXPECT_EQ(Field(v.struct_value(), "node_hashes").list_value().values_size(),
              4);
  }
  EXPECT_GT(
      Field(Field(summary, "final").struct_value(), "relay_forwarded_bytes")
          .number_value(),
      0);
  for (const char* id : {"n2", "n3"}) {
    auto node = ReadJson(absl::StrCat(out, "/", id, "/summary.json"));
    EXPECT_EQ(Field(node, "reachability").string_value(), "unreachable") << id;
    EXPECT_FALSE(Field(node, "relay").string_value().empty()) << id;
  }
  auto n0 = ReadJson(out + "/n0/summary.json");
  EXPECT_EQ(Field(n0, "relay").string_value(), "");
  testing::ExpectSimRefused("--nodes=2 --steps=10 --nat=n0,n1", out + "2",
                            "--nat=n0,n1");
}

TEST(SimTest, BadNodeFlagFailsBeforeAnyNodeStarts) {
  const std::string out = TempDir() + "/badflag";
  for (const char* flag :
       {"--model=nonsense", "--model=torchscript:/no/m.pt", "--heads=3",
        "--compression=topk:2", "--small_tensor_codec=int3",
        "--error_feedback=maybe", "--outer_momentum=1.5", "--aggregate=bogus",
        "--join_token_file=/no/token", "--peer_rate_limit=-1",
        "--tls_cert=/no/cert.pem",
        // A negative round timeout used to leave every node waiting forever;
        // the others failed only once each node had loaded its data.
        "--round_timeout=-1", "--connect_timeout=0", "--round_deadline=0",
        "--suspect_timeout=-2", "--gossip_timeout=0", "--gossip_outer_lr=0",
        "--gossip_momentum=1", "--found_after=-1", "--snapshot_every=-3"}) {
    testing::ExpectSimRefused(absl::StrCat("--nodes=2 --steps=10 ", flag), out,
                              flag);
  }
}

// The start-up memory check (core/memory.h) against --memory_limit_mb: a
// node, or a sim's nodes and the sim together, planned above the limit are
// refused before any work, naming the need, what a node holds and the
// limit. The default model's node needs its code, its runtime and the
// process (a few hundred MB) whatever its size.
TEST(SimTest, AMemoryPlanAboveTheLimitIsRefusedBeforeAnyWork) {
  const std::string out = TempDir() + "/memory_limit";
  const testing::RunResult node = testing::ExpectRefused(
      absl::StrCat("node --insecure --memory_limit_mb=100 --out=", out,
                   "/node"),
      "more than --memory_limit_mb=100 allows");
  for (const char* want :
       {"a process needs ", "at peak (a round's exchange)",
        "of transport buffers", "of code", "a larger --memory_limit_mb"}) {
    EXPECT_NE(node.err.find(want), std::string::npos) << node.err;
  }
  // 4 nodes of the same plan, and the sim itself, need more than 4 times
  // what one node may hold alone.
  testing::ExpectSimRefused("--nodes=4 --memory_limit_mb=400", out + "/sim",
                            "4 nodes and this process need about");
  testing::ExpectSimRefused("--nodes=4 --memory_limit_mb=400", out + "/sim",
                            "more than --memory_limit_mb=400 allows");
}

// Starts a 3-node sim that would run for long into `out` and waits for its
// first round.
Process StartLongSim(const std::string& out) {
  Process sim = Process::Start(absl::StrCat("sim --nodes=3 --steps=100000 ",
                                            TinyFlags(), " --out=", out),
                               out + ".err");
  EXPECT_TRUE(WaitForText(out + "/n2/events.jsonl", "\"event\":\"round\"",
                          absl::Seconds(60)));
  return sim;
}

// Whether a node process of the sim writing into `out` is running.
// "[-]" keeps the pattern from matching the shell that runs pgrep.
bool NodesRunning(const std::string& out) {
  const std::string check =
      absl::StrCat("pgrep -f -- '[-]-out=", out, "/n' >/dev/null");
  return std::system(check.c_str()) == 0;
}

TEST(SimTest, CtrlCStopsEveryNode) {
  const std::string out = TempDir() + "/interrupted";
  Process sim = StartLongSim(out);
  ASSERT_TRUE(sim.started());
  EXPECT_EQ(sim.Interrupt(), 1);
  EXPECT_NE(ReadFile(out + ".err")->find("interrupted"), std::string::npos);
  EXPECT_FALSE(NodesRunning(out)) << "a node outlived the sim";
}

// The first Ctrl-C lets the nodes finish their round; a round that cannot
// finish soon (over a link so slow that each message takes 97 s) must not
// hold them until the sim's SIGKILL. A second Ctrl-C tells them to leave at
// once, and each leaves with a checkpoint.
TEST(SimTest, ASecondCtrlCLeavesAtOnce) {
  const std::string out = TempDir() + "/stuck";
  Process sim =
      Process::Start(absl::StrCat("sim --nodes=2 --steps=100000 ", TinyFlags(),
                                  " --link_bandwidth_mbps=0.005 --out=", out),
                     out + ".err");
  ASSERT_TRUE(sim.started());
  // Logged as the round's first message goes out.
  ASSERT_TRUE(WaitForText(out + "/n0/node.log", "tensor message to",
                          absl::Seconds(60)));
  // The sim's line says what the run waits for, from 5 s into the exchange.
  EXPECT_TRUE(WaitForText(out + ".err", "| exchanging round 1 for ",
                          absl::Seconds(30)));
  sim.Signal(SIGINT);
  EXPECT_TRUE(
      WaitForText(out + ".err", "stopping all nodes", absl::Seconds(10)));
  ASSERT_EQ(sim.Interrupt(), 1);
  const std::string err = ReadFile(out + ".err").value_or("");
  EXPECT_NE(err.find("telling the nodes to leave at once"), std::string::npos)
      << err;
  for (const char* id : {"n0", "n1"}) {
    const std::string dir = absl::StrCat(out, "/", id);
    EXPECT_NE(ReadFile(dir + "/node.log")
                  .value_or("")
                  .find(absl::StrCat(id, " left the swarm on signal")),
              std::string::npos)
        << id;
    EXPECT_TRUE(FileExists(dir + "/checkpoint.ckpt")) << id;
  }
}

// A link that can never carry a round's message within the run's limits
// (each 60 KB message would take 8 minutes, and a receiver cancels a tensor
// stream after --round_deadline plus a minute) is an error naming the link
// and the flags, as soon as the first round's exchange starts: not retries
// of the round with backoff, forever.
// The same for ddp's per-step exchange and for gossip's pushes (a 120 KB
// push at 0.001 Mbit/s would take 16 minutes, past --gossip_timeout).
TEST(SimTest, ALinkTooSlowForTheRunFailsNamingIt) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"diloco", "(--round_deadline plus a minute)"},
      {"ddp", "(--round_timeout plus a minute)"},
      {"gossip", "(--gossip_timeout)"}};
  const std::string root = TempDir();
  for (const auto& [algo, limit] : cases) {
    const std::string out = root + "/too_slow_" + algo;
    auto r = RunStarling(
        absl::StrCat("sim --nodes=2 --steps=100000 --algo=", algo, " ",
                     TinyFlags(), " --link_bandwidth_mbps=0.001 --out=", out));
    EXPECT_EQ(r.exit_code, 1) << algo << "\n" << r.err;
    for (const std::string& part :
         {std::string("node n"), std::string("is too slow for this run"),
          std::string("0.001 Mbit/s"), limit,
          std::string("--link_bandwidth_mbps")}) {
      EXPECT_NE(r.err.find(part), std::string::npos)
          << algo << ": " << part << "\n"
          << r.err;
    }
    EXPECT_FALSE(NodesRunning(out)) << algo << ": a node outlived the sim";
  }
  // DiLoCo's nodes keep what they committed (here: round 0's start), and
  // gossip's their model and push-sum weight as of the failed push.
  for (const char* algo : {"diloco", "gossip"}) {
    for (const char* id : {"n0", "n1"}) {
      EXPECT_TRUE(FileExists(
          absl::StrCat(root, "/too_slow_", algo, "/", id, "/checkpoint.ckpt")))
          << algo << " " << id;
    }
  }
}

// A sim killed outright (kill -9, a crash) cannot stop its nodes: they go
// with it, rather than run on, holding ports and writing into the run.
TEST(SimTest, KilledSimTakesItsNodesWithIt) {
  const std::string out = TempDir() + "/killed";
  Process sim = StartLongSim(out);
  ASSERT_TRUE(sim.started());
  sim.Signal(SIGKILL);
  ASSERT_EQ(sim.Wait(), 128 + SIGKILL);
  EXPECT_TRUE(testing::WaitFor([&] { return !NodesRunning(out); },
                               absl::Seconds(10), absl::Milliseconds(100)))
      << "a node outlived the killed sim";
}

// A node killed from outside (kill -9, the kernel's out-of-memory killer)
// cannot log why: the sim stops and says which signal it was and what
// sends SIGKILL, not just "exit 137".
TEST(SimTest, ANodeKilledBySignalIsNamedWithTheSignal) {
  const std::string out = TempDir() + "/oom";
  Process sim = StartLongSim(out);
  ASSERT_TRUE(sim.started());
  const std::string kill_n1 =
      absl::StrCat("pkill -KILL -f -- '[-]-out=", out, "/n1 '");
  ASSERT_EQ(std::system(kill_n1.c_str()), 0);
  EXPECT_EQ(sim.Wait(), 1);
  const std::string err = ReadFile(out + ".err").value_or("");
  EXPECT_NE(err.find("node n1 was killed by signal 9 ("), std::string::npos)
      << err;
  EXPECT_NE(err.find("out-of-memory killer"), std::string::npos) << err;
  EXPECT_NE(err.find("its log: " + out + "/n1/node.log"), std::string::npos)
      << err;
  EXPECT_FALSE(NodesRunning(out)) << "a node outlived the stopped sim";
}

// Interrupt a sim, resume it: the result is bit-identical to a run that was
// never interrupted, and the byte accounting spans both sessions. Also with
// top-k and error feedback, whose residual is in the checkpoints (and in
// the node's own model, which trains from θ_global − e), and which ends
// with a residual flush round.
class ResumeTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ResumeTest, InterruptedThenResumedEqualsAStraightRun) {
  const std::string dir = TempDir();
  const std::string flags =
      absl::StrCat("sim --nodes=3 --steps=600 --inner_steps=10 --seed=4 ",
                   TinyFlags(), " ", GetParam());
  auto straight = RunStarling(absl::StrCat(flags, " --out=", dir, "/straight"));
  ASSERT_EQ(straight.exit_code, 0) << straight.err;

  const std::string out = dir + "/cut";
  Process cut =
      Process::Start(absl::StrCat(flags, " --out=", out), dir + "/cut.err");
  ASSERT_TRUE(cut.started());
  EXPECT_TRUE(
      WaitForText(out + "/n0/events.jsonl", "\"round\":5,", absl::Seconds(30)));
  ASSERT_EQ(cut.Interrupt(), 1) << cut.LogText();
  auto resumed = RunStarling(absl::StrCat(flags, " --out=", out, " --resume"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;

  auto a = ReadJson(dir + "/straight/summary.json");
  auto b = ReadJson(out + "/summary.json");
  const auto& fa = Field(a, "final").struct_value();
  const auto& fb = Field(b, "final").struct_value();
  EXPECT_EQ(Field(fa, "model_hash").string_value(),
            Field(fb, "model_hash").string_value());
  EXPECT_EQ(Field(fa, "val_loss").number_value(),
            Field(fb, "val_loss").number_value());
  EXPECT_TRUE(Field(fb, "all_hashes_agree").bool_value());
  const bool flush = std::string(GetParam()).find("topk") != std::string::npos;
  EXPECT_EQ(Field(b, "rounds").list_value().values_size(), flush ? 61 : 60);
  // The pseudo-gradient payload is the same to the byte across the two
  // sessions. total_bytes adds membership gossip, which goes with wall time
  // (a straight top-k run took 7.6 s against the two sessions' 5.5 s and
  // sent 56 KB more of it): it must span both sessions (one session alone
  // would be about half) without being compared exactly.
  for (const char* field :
       {"bytes_before_compression", "bytes_after_compression"}) {
    EXPECT_GT(Field(fa, field).number_value(), 0) << field;
    EXPECT_EQ(Field(fa, field).number_value(), Field(fb, field).number_value())
        << field;
  }
  const double total_a = Field(fa, "total_bytes").number_value();
  const double total_b = Field(fb, "total_bytes").number_value();
  EXPECT_GT(total_b, Field(fb, "bytes_after_compression").number_value());
  EXPECT_NEAR(total_b, total_a, 0.1 * total_a);
}

INSTANTIATE_TEST_SUITE_P(
    SimTest, ResumeTest,
    ::testing::Values("--compression=fp32", "--compression=topk:0.05+int8"),
    [](const auto& info) {
      return std::string(info.index == 0 ? "fp32" : "topk_error_feedback");
    });

// --slow and --drift reach the right nodes: n2 runs slowed, n0 drifts at
// step 15 and the others stay on the first data region; the merged summary
// lists the drift.
TEST(SimTest, SlowAndDriftReachTheirNodes) {
  const std::string out = TempDir() + "/drift";
  auto r = RunStarling(absl::StrCat(
      "sim --nodes=3 --steps=30 --inner_steps=10 --slow=n2:3x --drift=n0@15 ",
      TinyFlags(), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& [id, drift, slowdown] :
       std::vector<std::tuple<std::string, std::string, double>>{
           {"n0", "15", 1.0}, {"n1", "never", 1.0}, {"n2", "never", 3.0}}) {
    auto node = ReadJson(absl::StrCat(out, "/", id, "/summary.json"));
    const auto& config = Field(node, "config").struct_value();
    EXPECT_EQ(Field(config, "drift").string_value(), drift) << id;
    EXPECT_EQ(Field(config, "slowdown").number_value(), slowdown) << id;
  }
  auto summary = ReadJson(out + "/summary.json");
  EXPECT_TRUE(Field(Field(summary, "final").struct_value(), "all_hashes_agree")
                  .bool_value());
  EXPECT_EQ(Field(Field(summary, "sim").struct_value(), "drift").string_value(),
            "n0@15");
  const auto& drifts = Field(summary, "drift").list_value();
  ASSERT_EQ(drifts.values_size(), 1);
  const auto& d = drifts.values(0).struct_value();
  EXPECT_EQ(Field(d, "node").string_value(), "n0");
  EXPECT_EQ(Field(d, "step").number_value(), 15);
  EXPECT_GT(Field(d, "seconds").number_value(), 0);
  EXPECT_NE(ReadFile(out + "/report.html")->find("drift n0"),
            std::string::npos);
}

// A poisoned member among four sends NaN in rounds 1-2 and its
// pseudo-gradient x1000 in rounds 3-4. With a trimmed mean and a norm
// bound every member drops its contribution in those rounds, names it and
// the reason, and all stay bit-identical with a finite model.
TEST(SimTest, PoisonedPeerIsDroppedByEveryMemberAlike) {
  const std::string out = TempDir() + "/poison";
  auto r = RunStarling(absl::StrCat(
      "sim --nodes=4 --steps=60 --inner_steps=10 --aggregate=trimmed_mean:1 "
      "--norm_bound=10 --poison=n3:nan@1-2+x1000@3-4 ",
      TinyFlags(), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("hashes agree: yes"), std::string::npos) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(Field(fin, "all_hashes_agree").bool_value());
  const double val = Field(fin, "val_loss").number_value();
  EXPECT_TRUE(std::isfinite(val) && val > 0.5 && val < 6) << val;
  for (int i = 0; i < 4; ++i) {
    const std::string id = absl::StrCat("n", i);
    auto node = ReadJson(absl::StrCat(out, "/", id, "/summary.json"));
    EXPECT_EQ(Field(node, "aggregate").string_value(), "trimmed_mean:1");
    EXPECT_EQ(Field(node, "contributions_dropped").number_value(), 4) << id;
    const std::string events =
        ReadFile(absl::StrCat(out, "/", id, "/events.jsonl")).value_or("");
    for (const char* want :
         {"\"round\":1,\"peer\":\"n3\",\"reason\":\"",
          "\"round\":4,\"peer\":\"n3\",\"reason\":\"norm "}) {
      EXPECT_NE(events.find(want), std::string::npos) << id << " " << want;
    }
    EXPECT_NE(events.find("non-finite"), std::string::npos) << id;
    EXPECT_NE(events.find("--norm_bound=10"), std::string::npos) << id;
  }
  // Every member's log names the peer and the reason.
  const std::string log0 = ReadFile(out + "/n0/node.log").value_or("");
  EXPECT_NE(log0.find("dropped the contribution of n3"), std::string::npos)
      << log0;
}

// The plain ring (--aggregate=mean) cannot drop one contribution: a member
// that receives NaN refuses it and reports the sender, and the coordinator
// leaves both out of the rest of that round instead of retrying it forever.
// The NaN never reaches a model and the swarm ends bit-identical.
TEST(SimTest, RingLeavesANaNSenderOutOfItsRound) {
  const std::string out = TempDir() + "/ringnan";
  auto r =
      RunStarling(absl::StrCat("sim --nodes=4 --steps=60 --inner_steps=10 "
                               "--poison=n3:nan@1-2 ",
                               TinyFlags(), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(Field(fin, "all_hashes_agree").bool_value());
  const double val = Field(fin, "val_loss").number_value();
  EXPECT_TRUE(std::isfinite(val) && val > 0.5 && val < 6) << val;
  EXPECT_EQ(Field(fin, "rounds").number_value(), 6);
  std::string logs;
  for (int i = 0; i < 4; ++i) {
    logs += ReadFile(absl::StrCat(out, "/n", i, "/node.log")).value_or("");
  }
  EXPECT_NE(logs.find("refused invalid data from n3; both sit out the rest "
                      "of round 1"),
            std::string::npos)
      << logs;
}

// --overlap: rounds after the first run their exchange behind the next
// round's inner steps; the last one is synchronous. Every member applies
// the same update at the same step, so hashes agree after every round.
TEST(SimTest, OverlapAppliesEachUpdateOneRoundLateAndAgrees) {
  const std::string out = TempDir() + "/sim";
  auto r = RunStarling(
      absl::StrCat("sim --nodes=3 --steps=60 --inner_steps=10 --overlap ",
                   TinyFlags(), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("hashes agree: yes"), std::string::npos) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& rounds = Field(summary, "rounds").list_value();
  ASSERT_EQ(rounds.values_size(), 6);
  for (const auto& v : rounds.values()) {
    const auto& round = v.struct_value();
    EXPECT_TRUE(Field(round, "hashes_agree").bool_value());
    EXPECT_EQ(Field(round, "members").list_value().values_size(), 3);
  }
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(Field(fin, "all_hashes_agree").bool_value());
  EXPECT_GT(Field(fin, "val_loss").number_value(), 0.5);
  EXPECT_LT(Field(fin, "val_loss").number_value(), 5.0);
  // A round's exchange runs during the next round's inner steps, yet each
  // byte counts in one round: together they are at most what was sent.
  double round_bytes = 0;
  for (const auto& v : rounds.values()) {
    round_bytes += Field(v.struct_value(), "bytes").number_value();
  }
  const double total = Field(fin, "total_bytes").number_value();
  EXPECT_LE(round_bytes, total);
  EXPECT_GT(round_bytes, 0.5 * total);
  for (int i = 0; i < 3; ++i) {
    auto node = ReadJson(absl::StrCat(out, "/n", i, "/summary.json"));
    const auto& nr = Field(node, "rounds").list_value();
    ASSERT_EQ(nr.values_size(), 6);
    int overlapped = 0;
    for (int k = 0; k < 6; ++k) {
      const auto& round = nr.values(k).struct_value();
      EXPECT_EQ(Field(round, "step").number_value(), 10 * (k + 1));
      const bool o = round.fields().count("overlapped") > 0 &&
                     Field(round, "overlapped").bool_value();
      // The first round sets the membership; the last one is synchronous.
      if (k == 0 || k == 5) EXPECT_FALSE(o) << "round " << k;
      overlapped += o ? 1 : 0;
    }
    EXPECT_GE(overlapped, 3) << "n" << i;
    EXPECT_EQ(Field(Field(node, "final").struct_value(), "inner_steps")
                  .number_value(),
              60);
  }
}

// Under the sparse codec a round all-gathers every member's encoded pack
// instead of running the ring: the members agree every round, send fewer
// pseudo-gradient bytes than top-k's ring at the same fraction, and end with
// the residual flush.
TEST(SimTest, SparseCodecGathersEncodedPacksAndAgrees) {
  auto run = [](const std::string& codec) {
    const std::string out = absl::StrCat(TempDir(), "/sparse-", codec.size());
    auto r = RunStarling(absl::StrCat(
        "sim --nodes=3 --steps=40 --inner_steps=10 --small_tensor_elems=0 ",
        TinyFlags(), " --compression=", codec, " --out=", out));
    EXPECT_EQ(r.exit_code, 0) << codec << "\n" << r.err;
    EXPECT_NE(r.err.find("hashes agree: yes"), std::string::npos) << r.err;
    return ReadJson(out + "/summary.json");
  };
  const auto sparse = run("sparse:0.05");
  const auto topk = run("topk:0.05+int8");
  const auto& rounds = Field(sparse, "rounds").list_value();
  ASSERT_EQ(rounds.values_size(), 5);
  for (int k = 0; k < 5; ++k) {
    const auto& round = rounds.values(k).struct_value();
    EXPECT_TRUE(Field(round, "hashes_agree").bool_value()) << k;
    EXPECT_EQ(Field(round, "members").list_value().values_size(), 3) << k;
  }
  EXPECT_TRUE(
      Field(rounds.values(4).struct_value(), "residual_flush").bool_value());
  const auto& fs = Field(sparse, "final").struct_value();
  const auto& ft = Field(topk, "final").struct_value();
  EXPECT_EQ(Field(fs, "compression").string_value().rfind("sparse:0.05 ", 0),
            0u)
      << Field(fs, "compression").string_value();
  EXPECT_LT(Field(fs, "bytes_after_compression").number_value(),
            Field(ft, "bytes_after_compression").number_value());
  // The all-gather hands each pack whole to the N − 1 others, the ring
  // 2·(N − 1)/N of it: with 3 nodes, 4 rounds and the flush (a ring in
  // both) about 1.4 times the bytes before compression.
  EXPECT_GT(Field(fs, "bytes_before_compression").number_value(),
            1.3 * Field(ft, "bytes_before_compression").number_value());
  EXPECT_GT(Field(fs, "val_loss").number_value(), 0.5);
  EXPECT_LT(Field(fs, "val_loss").number_value(), 5.0);
}

// --overlap_steps runs a round's exchange behind the next round's first
// steps and merges its update under them: members still agree every round,
// most rounds overlap, and no inner step is lost or run twice.
TEST(SimTest, OverlapStepsMergesTheUpdateUnderTheStepsBehindIt) {
  const std::string out = TempDir() + "/overlap-steps";
  auto r = RunStarling(absl::StrCat(
      "sim --nodes=3 --steps=60 --inner_steps=10 --overlap_steps=3 ",
      TinyFlags(), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("hashes agree: yes"), std::string::npos) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& rounds = Field(summary, "rounds").list_value();
  ASSERT_EQ(rounds.values_size(), 6);
  for (const auto& v : rounds.values()) {
    EXPECT_TRUE(Field(v.struct_value(), "hashes_agree").bool_value());
  }
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(Field(fin, "all_hashes_agree").bool_value());
  EXPECT_LT(Field(fin, "val_loss").number_value(), 5.0);
  for (int i = 0; i < 3; ++i) {
    auto node = ReadJson(absl::StrCat(out, "/n", i, "/summary.json"));
    const auto& nr = Field(node, "rounds").list_value();
    ASSERT_EQ(nr.values_size(), 6);
    int overlapped = 0;
    for (const auto& v : nr.values()) {
      const auto& round = v.struct_value();
      overlapped += round.fields().count("overlapped") > 0 &&
                            Field(round, "overlapped").bool_value()
                        ? 1
                        : 0;
    }
    EXPECT_GE(overlapped, 3) << "n" << i;
    EXPECT_EQ(Field(Field(node, "final").struct_value(), "inner_steps")
                  .number_value(),
              60)
        << "n" << i;
  }
}

// With error feedback the residual stays in each node's own model, and one
// more round after the last averages the members' residuals: θ_global
// becomes the average of their models, evaluated then and not before.
// Without error feedback, or with --overlap, there is no such round.
TEST(SimTest, ErrorFeedbackEndsWithOneResidualFlush) {
  const std::string base = absl::StrCat(
      "sim --nodes=3 --steps=40 --inner_steps=10 --compression=topk:0.05+int8 ",
      TinyFlags());
  const std::string out = TempDir() + "/flush";
  auto r = RunStarling(absl::StrCat(base, " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("hashes agree: yes"), std::string::npos) << r.err;
  auto summary = ReadJson(out + "/summary.json");
  const auto& rounds = Field(summary, "rounds").list_value();
  ASSERT_EQ(rounds.values_size(), 5);
  for (int k = 0; k < 5; ++k) {
    const auto& round = rounds.values(k).struct_value();
    EXPECT_TRUE(Field(round, "hashes_agree").bool_value()) << k;
    EXPECT_EQ(round.fields().count("residual_flush") > 0 &&
                  Field(round, "residual_flush").bool_value(),
              k == 4)
        << "round " << k;
  }
  // Evaluated at step 20 and after the flush; not at step 40 before it.
  auto is_number = [](const google::protobuf::Value& v) {
    return v.kind_case() == google::protobuf::Value::kNumberValue;
  };
  EXPECT_TRUE(is_number(Field(rounds.values(1).struct_value(), "val_loss")));
  EXPECT_FALSE(is_number(Field(rounds.values(3).struct_value(), "val_loss")));
  const auto& last = rounds.values(4).struct_value();
  ASSERT_TRUE(is_number(Field(last, "val_loss")));
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_EQ(Field(fin, "val_loss").number_value(),
            Field(last, "val_loss").number_value());
  EXPECT_EQ(Field(fin, "model_hash").string_value(),
            Field(last, "model_hash").string_value());
  EXPECT_NE(
      Field(last, "model_hash").string_value(),
      Field(rounds.values(3).struct_value(), "model_hash").string_value());
  // The flush is dense (int8): it sends more than a 5% top-k round. About
  // twice as much here; a round's bytes also count the membership gossip
  // sent while it ran, which grows with its wall time, so the bound leaves
  // room for that.
  EXPECT_GT(
      Field(last, "bytes").number_value(),
      1.5 * Field(rounds.values(3).struct_value(), "bytes").number_value());
  for (int i = 0; i < 3; ++i) {
    auto node = ReadJson(absl::StrCat(out, "/n", i, "/summary.json"));
    const auto& nr = Field(node, "rounds").list_value();
    ASSERT_EQ(nr.values_size(), 5);
    const auto& flush = nr.values(4).struct_value();
    EXPECT_EQ(Field(flush, "step").number_value(), 40);
    EXPECT_EQ(flush.fields().count("inner_steps"), 0u);
    EXPECT_EQ(Field(Field(node, "final").struct_value(), "inner_steps")
                  .number_value(),
              40);
  }
  for (const char* flags : {"--error_feedback=off", "--overlap"}) {
    const std::string other = absl::StrCat(TempDir(), "/no-flush-", flags + 2);
    auto o = RunStarling(absl::StrCat(base, " ", flags, " --out=", other));
    ASSERT_EQ(o.exit_code, 0) << flags << "\n" << o.err;
    auto s = ReadJson(other + "/summary.json");
    const auto& rs = Field(s, "rounds").list_value();
    ASSERT_EQ(rs.values_size(), 4) << flags;
    for (const auto& v : rs.values()) {
      EXPECT_EQ(v.struct_value().fields().count("residual_flush"), 0u) << flags;
    }
  }
}

// A lone member whose outer step is plain (lr 1, no momentum) moves
// θ_global, on the coordinates top-k sent, to where its own model went, and
// keeps the rest of its progress in its model as the residual. Flushed
// after the last round, the residual takes θ_global to that model: the run
// ends where fp32 does, to rounding and the flush's int8. (Before the
// flush θ_global has moved only on what top-k sent.)
TEST(SimTest, ALoneMembersResidualFlushEndsOnTheModelItTrained) {
  auto run = [](const std::string& codec) {
    const std::string out = absl::StrCat(TempDir(), "/lone-", codec.size());
    auto r = RunStarling(
        absl::StrCat("sim --nodes=1 --steps=60 --inner_steps=10 --outer_lr=1 "
                     "--outer_momentum=0 --small_tensor_elems=0 ",
                     TinyFlags(), " --compression=", codec, " --out=", out));
    EXPECT_EQ(r.exit_code, 0) << codec << "\n" << r.err;
    return ReadJson(out + "/summary.json");
  };
  auto val = [](const auto& summary) {
    return Field(Field(summary, "final").struct_value(), "val_loss")
        .number_value();
  };
  const auto fp32 = run("fp32");
  const auto topk = run("topk:0.01+int8");
  EXPECT_NEAR(val(topk), val(fp32), 1e-4);
  const auto& rounds = Field(topk, "rounds").list_value();
  ASSERT_EQ(rounds.values_size(), 7);
  EXPECT_TRUE(
      Field(rounds.values(6).struct_value(), "residual_flush").bool_value());
}

// The divergence trigger measures a node's progress in the round, from
// where the round started: with the residual in the model that is
// θ_global − e, not θ_global. Measured from θ_global it counted the residual
// too, which an early round does not shrink, and fired after the first step
// of every round (the median round ran 1 inner step; measured from the
// round's start, 7).
TEST(SimTest, TheDivergenceTriggerMeasuresFromTheRoundsStart) {
  const std::string out = TempDir() + "/divergence";
  auto r = RunStarling(absl::StrCat(
      "sim --nodes=3 --steps=200 --inner_steps=20 --seed=0 "
      "--compression=topk:0.01+int8 --divergence_threshold=5 --out=",
      out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto node = ReadJson(out + "/n0/summary.json");
  std::vector<double> steps;
  for (const auto& v : Field(node, "rounds").list_value().values()) {
    const auto& round = v.struct_value();
    if (round.fields().count("inner_steps")) {
      steps.push_back(Field(round, "inner_steps").number_value());
    }
  }
  ASSERT_GT(steps.size(), 3u);
  std::sort(steps.begin(), steps.end());
  EXPECT_GE(steps[steps.size() / 2], 4) << "median inner steps per round";
  EXPECT_LT(steps.size(), 40u);
}

TEST(NodeTest, UnreachablePeerIsRetriedThenNamed) {
  const std::string out = TempDir() + "/node";
  auto r = RunStarling(
      absl::StrCat("node --insecure --listen=127.0.0.1:0 --peers=127.0.0.1:9 "
                   "--connect_timeout=2 "
                   "--steps=5 ",
                   TinyFlags(), " --out=", out));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("cannot reach any of --peers=127.0.0.1:9"),
            std::string::npos)
      << r.err;
}

TEST(NodeTest, MismatchedModelsRefuseEachOther) {
  std::string dir = TempDir();
  // Node a founds a swarm and waits for a second member; node b, whose
  // --width differs, tries to join it: the handshake names the difference.
  // So does it for error feedback, which adds a round (the residual flush)
  // that only one side would run.
  // Both listen on port 0, so no other process can hold their ports.
  Process a =
      Process::Start(absl::StrCat("node --insecure --listen=127.0.0.1:0 "
                                  "--min_members=2 "
                                  "--connect_timeout=60 --compression=int4 ",
                                  TinyFlags(), " --steps=5 --out=", dir, "/a"),
                     dir + "/a.log");
  const std::string address = ListenAddress(a.log_path(), absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << a.LogText();
  auto r = RunStarling(
      absl::StrCat("node --insecure --listen=127.0.0.1:0 --peers=", address,
                   " --connect_timeout=20 ", TinyFlags(),
                   " --width=64 --aggregate=median --compression=int4 "
                   "--error_feedback=off --steps=5 --out=",
                   dir, "/b"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("model architecture differs"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("aggregation (--aggregate, --norm_bound) differs"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("compression differs"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bf16) with error feedback\")"), std::string::npos)
      << r.err;
}

TEST(NodeTest, BadNodeFlagsExitTwo) {
  for (const auto& [args, mention] :
       std::vector<std::pair<std::string, std::string>>{
           {"node --insecure --algo=allreduce", "--algo=allreduce"},
           {"node --insecure --inner_steps=0", "--inner_steps=0"},
           {"node --insecure --peers=nonsense", "nonsense"},
           {"node --insecure --algo=ddp --listen=127.0.0.1:0 "
            "--peers=127.0.0.1:5000",
            "fixed port"},
           {"sim --nodes=0", "--nodes=0"},
           {"node --insecure --outer=adam", "--outer=adam"},
           {"train --slowdown=0.5", "--slowdown"},
           {"node --insecure --slowdown=inf", "--slowdown"},
           {"train --drift=abc", "--drift"},
           {"node --insecure --drift=-4", "--drift"},
           {"sim --slow=n9:4x", "--slow="},
           {"sim --slow=n1:0.5x", "--slow="},
           {"sim --drift=n0@abc", "--drift="},
           {"sim --drift=n7@10", "--drift="},
           {"node --insecure --overlap --round_seconds=2", "--overlap"},
           {"node --insecure --overlap --algo=gossip", "--overlap"},
           {"node --insecure --aggregate=avg", "--aggregate=avg"},
           {"node --insecure --norm_bound=0.5", "--norm_bound=0.5"},
           {"node --insecure --aggregate=median --algo=gossip", "--aggregate"},
           {"node --insecure --test_poison=nan", "--test_poison=nan"},
           {"node --insecure --stream_idle_timeout=0",
            "--stream_idle_timeout=0"},
           {"node --insecure --stream_idle_timeout=-1",
            "--stream_idle_timeout=-1"},
           {"node --insecure --peer_max_streams=-1", "--peer_max_streams=-1"},
           {"node --insecure --round_timeout=-1", "--round_timeout=-1"},
           {"node --insecure --min_members=0", "--min_members=0"},
           {"node --insecure --advertise=nohost", "--advertise=nohost"},
           {"node --insecure --advertise=127.0.0.1:0",
            "--advertise=127.0.0.1:0: expected host:port with a fixed port"},
           {"node --insecure --algo=ddp --advertise=127.0.0.1:7000",
            "--algo=ddp has no membership"},
           {"node --insecure --algo=ddp --compression=int8",
            "--compression=int8: ddp"},
           {"sim --nodes=2 --resume", "holds no checkpoint for 2 of its 2"},
           {"sim --nodes=4 --batch=100000000",
            "--batch=100000000: a training step holds at least"},
           {"train --threads=100000", "--threads=100000: at most 4 per core"},
           // 10^15 parameters: refused before anything is allocated.
           {"sim --layers=1000 --width=300000 --heads=1",
            "--model=gpt: the weights, gradients and optimizer state need"},
           {"node --insecure --layers=1000 --width=300000 --heads=1",
            "--model=gpt: the weights, gradients and optimizer state need"},
           {"sim --poison=n9:nan@1-2", "--poison="}}) {
    testing::ExpectRefused(args + " --out=" + TempDir() + "/x", mention);
  }
}

}  // namespace
}  // namespace starling
