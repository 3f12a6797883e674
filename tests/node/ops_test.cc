// Integration tests of a node's operational side on real `starling node`
// processes: the gRPC health services (checked with a real
// grpc.health.v1 client), liveness under an artificial stall, the
// Prometheus endpoint scraped mid-run and checked by promtool, JSON logs,
// and Kubernetes-style seeds (a node that lists itself, host names mapped by
// --hosts). Every wait is bounded.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <fstream>
#include <map>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/core/run_util.h"
#include "tests/node/http_get.h"
#include "tests/node/promtool.h"

namespace starling {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::starling::testing::Field;
using ::starling::testing::FreePort;
using ::starling::testing::HttpGet;
using ::starling::testing::ListenAddress;
using ::starling::testing::PromtoolCheckMetrics;
using ::starling::testing::PromtoolRequired;
using ::starling::testing::PromtoolResult;
using ::starling::testing::ReadJson;
using ::starling::testing::SpawnStarling;
using ::starling::testing::TempDir;
using ::starling::testing::TinyTextFlags;
using ::starling::testing::WaitForText;
using ::starling::testing::WaitUntil;

// The "address" of the first log line of `event` (JSON logs), waiting for it.
std::string EventAddress(const std::string& log, const std::string& event) {
  const std::string needle = absl::StrCat("\"event\":\"", event, "\"");
  if (!WaitForText(log, needle, absl::Seconds(60))) return "";
  std::string text = ReadFile(log).value_or("");
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.find(needle) == absl::string_view::npos) continue;
    std::smatch m;
    std::string l(line);
    if (std::regex_search(l, m, std::regex("\"address\":\"([^\"]+)\""))) {
      return m[1];
    }
  }
  return "";
}

// grpc.health.v1.Health/Check; the status, or -1 with `error` set.
class HealthClient {
 public:
  explicit HealthClient(const std::string& address)
      : stub_(grpc::health::v1::Health::NewStub(grpc::CreateChannel(
            address, grpc::InsecureChannelCredentials()))) {}
  int Check(const std::string& service, grpc::Status* error = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(2));
    HealthCheckRequest req;
    req.set_service(service);
    HealthCheckResponse resp;
    grpc::Status s = stub_->Check(&ctx, req, &resp);
    if (error != nullptr) *error = s;
    return s.ok() ? resp.status() : -1;
  }
  // Polls until `service` reports `want`; false after `timeout`.
  bool WaitFor(const std::string& service, int want, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (Check(service) == want) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

 private:
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

constexpr int kServing = HealthCheckResponse::SERVING;
constexpr int kNotServing = HealthCheckResponse::NOT_SERVING;

class OpsTest : public ::testing::Test {
 protected:
  std::string dir_ = TempDir();
  std::string common_ = absl::StrCat(
      TinyTextFlags(60000),
      " --shard_mode=contiguous --threads=1 --eval_every=0 "
      "--suspect_timeout=1 --round_deadline=20 --insecure --run_id=ops "
      "--log_format=json");
};

// Readiness waits for the swarm and then holds steady across rounds;
// liveness goes NOT_SERVING while the training loop is stalled and comes
// back after; the metrics endpoint passes promtool mid-run; every stderr
// line is a JSON object with the node's context.
TEST_F(OpsTest, HealthMetricsAndLogsOfARunningNode) {
  const std::string log0 = dir_ + "/n0.log", log1 = dir_ + "/n1.log";
  // n0 waits for a second member: not ready until n1 joins.
  pid_t n0 = SpawnStarling(
      absl::StrCat("node ", common_, " --steps=400 --inner_steps=10",
                   " --node_id=n0 --listen=127.0.0.1:0",
                   " --min_members=2 --shard=0/2 --out=", dir_, "/n0",
                   " --health_port=0 --metrics_port=0",
                   " --test_stall=200:6 --watchdog_multiple=5",
                   " --watchdog_min_seconds=1.5"),
      log0);
  const std::string health = EventAddress(log0, "health");
  const std::string metrics = EventAddress(log0, "metrics");
  const std::string seed = ListenAddress(log0, absl::Seconds(60));
  ASSERT_FALSE(seed.empty()) << ReadFile(log0).value_or("");
  ASSERT_FALSE(health.empty()) << ReadFile(log0).value_or("");
  ASSERT_FALSE(metrics.empty()) << ReadFile(log0).value_or("");
  HealthClient client(health);
  ASSERT_TRUE(client.WaitFor("liveness", kServing, absl::Seconds(30)));
  EXPECT_EQ(client.Check("readiness"), kNotServing);
  grpc::Status unknown;
  EXPECT_EQ(client.Check("nope", &unknown), -1);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(client.Check("readiness"), kNotServing) << "ready without peers";

  pid_t n1 = SpawnStarling(
      absl::StrCat("node ", common_, " --steps=400 --inner_steps=10",
                   " --node_id=n1 --listen=127.0.0.1:0 --peers=", seed,
                   " --shard=1/2 --out=", dir_, "/n1"),
      log1);
  ASSERT_TRUE(client.WaitFor("readiness", kServing, absl::Seconds(60)))
      << ReadFile(log0).value_or("");

  // Mid-run: rounds are committing. Readiness does not flap across them.
  ASSERT_TRUE(
      WaitForText(dir_ + "/n0/events.jsonl", "\"round\":3", absl::Seconds(60)));
  int flaps = 0;
  for (int i = 0; i < 40; ++i) {
    if (client.Check("readiness") != kServing) ++flaps;
    absl::SleepFor(absl::Milliseconds(25));
  }
  EXPECT_EQ(flaps, 0);
  absl::StatusOr<std::string> scraped = HttpGet(metrics, "/metrics");
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  for (const char* want :
       {"starling_build_info{", "starling_inner_steps_total",
        "starling_rounds_total{", "result=\"committed\"",
        "starling_peers_connected", "starling_sent_bytes_total",
        "starling_round_duration_seconds_bucket",
        "starling_peer_refusals_total{reason=\"stream_limit\"} 0"}) {
    EXPECT_NE(scraped->find(want), std::string::npos) << want << "\n"
                                                      << *scraped;
  }
  EXPECT_NE(scraped->find("starling_peers_connected 1"), std::string::npos)
      << *scraped;
  absl::StatusOr<PromtoolResult> promtool = PromtoolCheckMetrics(*scraped);
  if (promtool.ok()) {
    EXPECT_TRUE(promtool->ok) << promtool->output << "\n" << *scraped;
    EXPECT_EQ(promtool->output, "") << *scraped;
  } else {
    EXPECT_FALSE(PromtoolRequired()) << promtool.status();
  }

  // The stall: liveness turns NOT_SERVING, readiness stays, and liveness
  // recovers once the loop moves again.
  ASSERT_TRUE(WaitForText(log0, "\"event\":\"test_stall\"", absl::Seconds(60)))
      << ReadFile(log0).value_or("");
  EXPECT_TRUE(client.WaitFor("liveness", kNotServing, absl::Seconds(5)))
      << ReadFile(log0).value_or("");
  EXPECT_EQ(client.Check("readiness"), kServing);
  EXPECT_TRUE(client.WaitFor("liveness", kServing, absl::Seconds(20)));

  EXPECT_EQ(WaitUntil(n0, absl::Now() + absl::Seconds(120)), 0)
      << ReadFile(log0).value_or("");
  EXPECT_EQ(WaitUntil(n1, absl::Now() + absl::Seconds(60)), 0)
      << ReadFile(log1).value_or("");

  // JSON logs: one object per line, each with the node; rounds carry round
  // and step; membership lines name the peer.
  for (const auto& [log, id, peer] :
       {std::tuple<std::string, std::string, std::string>{log0, "n0", "n1"},
        {log1, "n1", "n0"}}) {
    std::string text = ReadFile(log).value_or("");
    int lines = 0, rounds = 0, peers = 0;
    for (absl::string_view line :
         absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      ++lines;
      google::protobuf::Struct ev;
      ASSERT_TRUE(
          google::protobuf::util::JsonStringToMessage(std::string(line), &ev)
              .ok())
          << "not JSON: " << line;
      EXPECT_EQ(Field(ev, "node").string_value(), id) << line;
      const std::string event = Field(ev, "event").string_value();
      if (event == "round") {
        ++rounds;
        EXPECT_GT(Field(ev, "round").number_value(), 0) << line;
        EXPECT_GT(Field(ev, "step").number_value(), 0) << line;
      }
      if (ev.fields().count("peer") &&
          ev.fields().at("peer").string_value() == peer) {
        ++peers;
      }
    }
    EXPECT_GT(lines, 10) << log;
    EXPECT_GE(rounds, 30) << text;
    EXPECT_GE(peers, 1) << text;
  }
}

// Kubernetes-style seeds: every node lists the same host names, its own
// among them, mapped to addresses by --hosts. The first node finds only
// itself and, after --found_after, founds the swarm; the second joins it
// (both wait for two members before their first round).
TEST_F(OpsTest, ANodeThatIsItsOwnSeedFoundsTheSwarmAndOthersJoin) {
  const int p0 = FreePort();
  int p1 = FreePort();
  while (p1 == p0) p1 = FreePort();
  const std::string hosts = dir_ + "/hosts";
  // node-0 listens on 0.0.0.0 and its seed name maps to 127.0.0.1: not
  // its --listen string, so it must learn from its own answer that the
  // seed is itself (as a pod does with its DNS name). No "localhost": a
  // minimal system may have no /etc/hosts.
  ASSERT_TRUE(WriteFileAtomic(hosts,
                              "# test hosts\n127.0.0.1 node-0.peers\n"
                              "127.0.0.1 node-1.peers\n")
                  .ok());
  const std::string seeds = absl::StrCat(
      " --hosts=", hosts, " --peers=node-0.peers:", p0, ",node-1.peers:", p1,
      " --found_after=1 --steps=200 --inner_steps=10 --min_members=2");
  const std::string log0 = dir_ + "/k0.log", log1 = dir_ + "/k1.log";
  pid_t n0 =
      SpawnStarling(absl::StrCat("node ", common_, seeds, " --node_id=node-0",
                                 " --listen=0.0.0.0:", p0,
                                 " --shard=0/2 --out=", dir_, "/k0"),
                    log0);
  ASSERT_TRUE(WaitForText(log0, "founds the swarm", absl::Seconds(60)))
      << ReadFile(log0).value_or("");
  EXPECT_NE(ReadFile(log0).value_or("").find(
                absl::StrCat("seed 127.0.0.1:", p0, " is this node")),
            std::string::npos)
      << ReadFile(log0).value_or("");
  pid_t n1 =
      SpawnStarling(absl::StrCat("node ", common_, seeds, " --node_id=node-1",
                                 " --listen=127.0.0.1:", p1,
                                 " --shard=1/2 --out=", dir_, "/k1"),
                    log1);
  EXPECT_EQ(WaitUntil(n0, absl::Now() + absl::Seconds(120)), 0)
      << ReadFile(log0).value_or("");
  EXPECT_EQ(WaitUntil(n1, absl::Now() + absl::Seconds(60)), 0)
      << ReadFile(log1).value_or("");
  auto s0 = ReadJson(dir_ + "/k0/summary.json");
  auto s1 = ReadJson(dir_ + "/k1/summary.json");
  const std::string h0 =
      Field(Field(s0, "final").struct_value(), "model_hash").string_value();
  EXPECT_FALSE(h0.empty());
  EXPECT_EQ(
      h0,
      Field(Field(s1, "final").struct_value(), "model_hash").string_value());
  // Some round had both members.
  EXPECT_NE(ReadFile(dir_ + "/k1/events.jsonl")
                .value_or("")
                .find("\"members\":[\"node-0\",\"node-1\"]"),
            std::string::npos);
}

TEST_F(OpsTest, BadOpsFlagsAreRefusedByName) {
  for (const auto& [flag, want] :
       std::vector<std::pair<std::string, std::string>>{
           {"--log_format=xml", "--log_format=xml"},
           {"--health_port=70000", "--health_port=70000"},
           {"--hosts=/nonexistent/hosts", "--hosts=/nonexistent/hosts"},
           {"--test_stall=abc", "--test_stall=abc"}}) {
    auto r = ::starling::testing::RunStarling(absl::StrCat(
        "node ", common_, " --steps=10 --out=", TempDir(), "/x ", flag));
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << flag << "\n" << r.err;
  }
}

}  // namespace
}  // namespace starling
