// Integration tests of a node's operational side on real `starling node`
// processes: the gRPC health services (checked with a real
// grpc.health.v1 client), liveness under an artificial stall, the
// Prometheus endpoint scraped mid-run and checked by promtool, JSON logs,
// and Kubernetes-style seeds (a node that lists itself, host names mapped by
// --hosts). Every wait is bounded.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <map>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/harness/node_group.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"
#include "tests/node/http_get.h"
#include "tests/node/promtool.h"

namespace starling {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::starling::testing::Field;
using ::starling::testing::FreePort;
using ::starling::testing::HttpGet;
using ::starling::testing::NodeGroup;
using ::starling::testing::PromtoolCheckMetrics;
using ::starling::testing::PromtoolRequired;
using ::starling::testing::PromtoolResult;
using ::starling::testing::TempDir;
using ::starling::testing::TinyTextFlags;
using ::starling::testing::WaitFor;
using ::starling::testing::WaitForText;

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
    return testing::WaitFor([&] { return Check(service) == want; }, timeout,
                            absl::Milliseconds(50));
  }

 private:
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

constexpr int kServing = HealthCheckResponse::SERVING;
constexpr int kNotServing = HealthCheckResponse::NOT_SERVING;

class OpsTest : public ::testing::Test {
 protected:
  std::string common_ = absl::StrCat(
      TinyTextFlags(60000),
      " --shard_mode=contiguous --threads=1 --eval_every=0 "
      "--suspect_timeout=1 --round_deadline=20 --insecure --run_id=ops "
      "--log_format=json");
};

// The JSON log of node `id` at `log`: one object per line, each with the
// node; rounds carry round and step; membership lines name the `peer`.
void ExpectJsonLog(const std::string& log, const std::string& id,
                   const std::string& peer) {
  const std::string text = ReadFile(log).value_or("");
  int lines = 0, rounds = 0, peers = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++lines;
    google::protobuf::Struct ev;
    ASSERT_TRUE(
        google::protobuf::util::JsonStringToMessage(std::string(line), &ev)
            .ok())
        << "not JSON: " << line;
    EXPECT_EQ(Field(ev, "node").string_value(), id) << line;
    if (Field(ev, "event").string_value() == "round") {
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

// Readiness waits for the swarm and then holds steady across rounds;
// liveness goes NOT_SERVING while the training loop is stalled and comes
// back after; the metrics endpoint passes promtool mid-run; every stderr
// line is a JSON object with the node's context.
TEST_F(OpsTest, HealthMetricsAndLogsOfARunningNode) {
  NodeGroup nodes("ops",
                  absl::StrCat(common_, " --steps=400 --inner_steps=10"));
  const std::string log0 = nodes.Log("n0"), log1 = nodes.Log("n1");
  // n0 waits for a second member: not ready until n1 joins.
  nodes.Start("n0",
              "--min_members=2 --shard=0/2 --health_port=0 --metrics_port=0"
              " --test_stall=200:6 --watchdog_multiple=5"
              " --watchdog_min_seconds=1.5");
  const std::string health = EventAddress(log0, "health");
  const std::string metrics = EventAddress(log0, "metrics");
  ASSERT_FALSE(nodes.Address("n0").empty());
  ASSERT_FALSE(health.empty()) << nodes.LogText("n0");
  ASSERT_FALSE(metrics.empty()) << nodes.LogText("n0");
  HealthClient client(health);
  ASSERT_TRUE(client.WaitFor("liveness", kServing, absl::Seconds(30)));
  EXPECT_EQ(client.Check("readiness"), kNotServing);
  grpc::Status unknown;
  EXPECT_EQ(client.Check("nope", &unknown), -1);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  // A second of waiting alone (nothing n0 logs marks it) must not make it
  // ready.
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(client.Check("readiness"), kNotServing) << "ready without peers";

  nodes.Start("n1", "--shard=1/2", "n0");
  ASSERT_TRUE(client.WaitFor("readiness", kServing, absl::Seconds(60)))
      << nodes.LogText("n0");

  // Mid-run: rounds are committing. Readiness does not flap across them:
  // sampled from round 3 on, 40 times at least and until round 5 has
  // committed.
  ASSERT_TRUE(nodes.WaitForEvent("n0", "\"round\":3"));
  int flaps = 0, samples = 0;
  EXPECT_TRUE(WaitFor(
      [&] {
        if (client.Check("readiness") != kServing) ++flaps;
        return ++samples >= 40 &&
               ReadFile(nodes.EventsPath("n0"))
                       .value_or("")
                       .find("\"round\":5") != std::string::npos;
      },
      absl::Seconds(60), absl::Milliseconds(25)))
      << nodes.LogText("n0");
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

  // The stall: liveness turns NOT_SERVING (it can only while the 6 s stall
  // lasts), readiness stays, and liveness recovers once the loop moves
  // again.
  ASSERT_TRUE(WaitForText(log0, "\"event\":\"test_stall\"", absl::Seconds(60)))
      << nodes.LogText("n0");
  EXPECT_TRUE(client.WaitFor("liveness", kNotServing, absl::Seconds(60)))
      << nodes.LogText("n0");
  EXPECT_EQ(client.Check("readiness"), kServing);
  EXPECT_TRUE(client.WaitFor("liveness", kServing, absl::Seconds(20)));

  EXPECT_EQ(nodes.Wait("n0", absl::Seconds(120)), 0) << nodes.LogText("n0");
  EXPECT_EQ(nodes.Wait("n1", absl::Seconds(60)), 0) << nodes.LogText("n1");

  ExpectJsonLog(log0, "n0", "n1");
  ExpectJsonLog(log1, "n1", "n0");
}

// Kubernetes-style seeds: every node lists the same host names, its own
// among them, mapped to addresses by --hosts. The first node finds only
// itself and, after --found_after, founds the swarm; the second joins it
// (both wait for two members before their first round).
TEST_F(OpsTest, ANodeThatIsItsOwnSeedFoundsTheSwarmAndOthersJoin) {
  const int p0 = FreePort();
  int p1 = FreePort();
  while (p1 == p0) p1 = FreePort();
  const std::string hosts = TempDir() + "/hosts";
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
  // Each node's --listen (a fixed port, the first on 0.0.0.0) overrides the
  // group's.
  NodeGroup nodes("seeds", absl::StrCat(common_, seeds));
  nodes.Start("node-0", absl::StrCat("--listen=0.0.0.0:", p0, " --shard=0/2"));
  ASSERT_TRUE(
      WaitForText(nodes.Log("node-0"), "founds the swarm", absl::Seconds(60)))
      << nodes.LogText("node-0");
  EXPECT_NE(nodes.LogText("node-0").find(
                absl::StrCat("seed 127.0.0.1:", p0, " is this node")),
            std::string::npos)
      << nodes.LogText("node-0");
  nodes.Start("node-1",
              absl::StrCat("--listen=127.0.0.1:", p1, " --shard=1/2"));
  EXPECT_EQ(nodes.Wait("node-0", absl::Seconds(120)), 0)
      << nodes.LogText("node-0");
  EXPECT_EQ(nodes.Wait("node-1", absl::Seconds(60)), 0)
      << nodes.LogText("node-1");
  const std::string h0 = nodes.FinalHash("node-0");
  EXPECT_FALSE(h0.empty());
  EXPECT_EQ(h0, nodes.FinalHash("node-1"));
  // Some round had both members.
  EXPECT_NE(ReadFile(nodes.EventsPath("node-1"))
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
    testing::ExpectRefused(absl::StrCat("node ", common_, " --steps=10 --out=",
                                        TempDir(), "/x ", flag),
                           want);
  }
}

}  // namespace
}  // namespace starling
