// Unit tests of the node's Prometheus endpoint (node/metrics.h): values
// recorded through NodeMetrics, scraped over HTTP and checked with promtool.
#include "node/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "node/health.h"
#include "tests/core/test_util.h"
#include "tests/harness/wait.h"
#include "tests/node/http_get.h"
#include "tests/node/promtool.h"

namespace starling {
namespace {

using ::starling::testing::HttpGet;
using ::starling::testing::WaitFor;
using ::testing::HasSubstr;

BuildInfo TestInfo() {
  return BuildInfo{.version = "0.1.0",
                   .torch = "2.0.0",
                   .device = "cpu",
                   .algo = "diloco",
                   .node_id = "n0"};
}

std::unique_ptr<NodeMetrics> StartOrDie() {
  absl::StatusOr<std::unique_ptr<NodeMetrics>> m =
      NodeMetrics::Start("127.0.0.1", 0, TestInfo());
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::string Scrape(const NodeMetrics& m) {
  absl::StatusOr<std::string> body = HttpGet(m.address(), "/metrics");
  EXPECT_TRUE(body.ok()) << body.status();
  return body.ok() ? *body : "";
}

// Sample lines of an exposition, `name{labels}` -> value, labels as printed.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.rfind(' ');
    double value = 0;
    EXPECT_NE(space, absl::string_view::npos) << line;
    if (space == absl::string_view::npos) continue;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(space + 1), &value)) << line;
    out[std::string(line.substr(0, space))] = value;
  }
  return out;
}

std::map<std::string, double> ScrapeSamples(const NodeMetrics& m) {
  return Samples(Scrape(m));
}

TEST(NodeMetricsTest, AddressHasTheBoundPort) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(absl::StartsWith(m->address(), "127.0.0.1:")) << m->address();
  int p = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(absl::StripPrefix(m->address(), "127.0.0.1:"), &p));
  EXPECT_GT(p, 0);
  EXPECT_LE(p, 65535);
}

TEST(NodeMetricsTest, FreshEndpointHasEveryMetricWithHelp) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  const std::string text = absl::StrCat("\n", Scrape(*m));
  for (const char* name : {"starling_build_info",
                           "starling_inner_steps_total",
                           "starling_tokens_total",
                           "starling_step_duration_seconds",
                           "starling_train_loss",
                           "starling_rounds_total",
                           "starling_round_duration_seconds",
                           "starling_sync_duration_seconds",
                           "starling_outer_learning_rate",
                           "starling_inner_learning_rate",
                           "starling_pseudo_gradient_norm",
                           "starling_sent_bytes_total",
                           "starling_received_bytes_total",
                           "starling_pseudo_gradient_bytes_total",
                           "starling_peers_known",
                           "starling_peers_connected",
                           "starling_reachable",
                           "starling_members_reachability",
                           "starling_checkpoint_duration_seconds",
                           "starling_last_checkpoint_timestamp_seconds",
                           "starling_val_loss",
                           "starling_val_accuracy",
                           "starling_rpc_errors_total",
                           "starling_peer_refusals_total"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("\n# HELP ", name, " "))) << name;
  }
  std::map<std::string, double> s = Samples(text);
  EXPECT_EQ(s["starling_inner_steps_total"], 0);
  // No evaluation yet: NaN, not a perfect 0.
  EXPECT_TRUE(std::isnan(s["starling_val_loss"]));
  EXPECT_TRUE(std::isnan(s["starling_val_accuracy"]));
  EXPECT_EQ(s["starling_reachable"], -1);  // not checked yet
  // Every error counter exists at 0 from the start, so that rate() and
  // alerts see the first error.
  for (const char* code :
       {"CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED"}) {
    const std::string key =
        absl::StrCat("starling_rpc_errors_total{code=\"", code, "\"}");
    ASSERT_EQ(s.count(key), 1u) << key;
    EXPECT_EQ(s[key], 0) << key;
  }
  for (const char* reason :
       {"rate_limit", "stream_limit", "stream_cancelled"}) {
    const std::string key =
        absl::StrCat("starling_peer_refusals_total{reason=\"", reason, "\"}");
    ASSERT_EQ(s.count(key), 1u) << key;
    EXPECT_EQ(s[key], 0) << key;
  }
  // Every round result is exported from the start, at 0.
  for (const char* result : {"committed", "stale", "aborted", "stopped"}) {
    EXPECT_EQ(
        s.count(absl::StrCat("starling_rounds_total{result=\"", result, "\"}")),
        1u)
        << result;
  }
}

TEST(NodeMetricsTest, BuildInfoIsOneWithLabels) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(ScrapeSamples(*m)["starling_build_info{algo=\"diloco\","
                              "device=\"cpu\",node=\"n0\",torch=\"2.0.0\","
                              "version=\"0.1.0\"}"],
            1);
}

TEST(NodeMetricsTest, InnerStepsAndGauges) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  m->InnerStep(0.003, 512, 2.5);
  m->InnerStep(0.2, 512, 2.25);
  m->SetOuterLr(0.7);
  m->SetInnerLr(0.0004);
  m->SetPseudoGradientNorm(3.5);
  m->SetPeers(4, 3);
  m->SetReachability(0, 2, 1, 1);
  m->Checkpoint(0.02, absl::FromUnixSeconds(1700000000));

  std::map<std::string, double> s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_inner_steps_total"], 2);
  EXPECT_EQ(s["starling_tokens_total"], 1024);
  EXPECT_EQ(s["starling_train_loss"], 2.25);
  EXPECT_EQ(s["starling_step_duration_seconds_count"], 2);
  EXPECT_DOUBLE_EQ(s["starling_step_duration_seconds_sum"], 0.203);
  EXPECT_EQ(s["starling_step_duration_seconds_bucket{le=\"0.001\"}"], 0);
  EXPECT_EQ(s["starling_step_duration_seconds_bucket{le=\"0.005\"}"], 1);
  EXPECT_EQ(s["starling_step_duration_seconds_bucket{le=\"0.25\"}"], 2);
  EXPECT_EQ(s["starling_step_duration_seconds_bucket{le=\"10\"}"], 2);
  EXPECT_EQ(s["starling_step_duration_seconds_bucket{le=\"+Inf\"}"], 2);
  EXPECT_EQ(s["starling_outer_learning_rate"], 0.7);
  EXPECT_EQ(s["starling_inner_learning_rate"], 0.0004);
  EXPECT_EQ(s["starling_pseudo_gradient_norm"], 3.5);
  EXPECT_EQ(s["starling_peers_known"], 4);
  EXPECT_EQ(s["starling_peers_connected"], 3);
  EXPECT_EQ(s["starling_reachable"], 0);
  EXPECT_EQ(s["starling_members_reachability{reachability=\"reachable\"}"], 2);
  EXPECT_EQ(s["starling_members_reachability{reachability=\"unreachable\"}"],
            1);
  EXPECT_EQ(s["starling_members_reachability{reachability=\"unknown\"}"], 1);
  EXPECT_EQ(s["starling_checkpoint_duration_seconds_count"], 1);
  EXPECT_EQ(s["starling_checkpoint_duration_seconds_bucket{le=\"0.01\"}"], 0);
  EXPECT_EQ(s["starling_checkpoint_duration_seconds_bucket{le=\"0.025\"}"], 1);
  EXPECT_EQ(s["starling_checkpoint_duration_seconds_bucket{le=\"60\"}"], 1);
  EXPECT_EQ(s["starling_last_checkpoint_timestamp_seconds"], 1700000000);
}

TEST(NodeMetricsTest, RoundsCountEveryResultButTimeOnlyCommitted) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  m->Round(kRoundCommitted, 12, 1.5);
  m->Round(kRoundCommitted, 30, 4);
  m->Round(kRoundStale, 99, 99);
  m->Round(kRoundAborted, 99, 99);
  m->Round(kRoundAborted, 99, 99);

  std::map<std::string, double> s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_rounds_total{result=\"committed\"}"], 2);
  EXPECT_EQ(s["starling_rounds_total{result=\"stale\"}"], 1);
  EXPECT_EQ(s["starling_rounds_total{result=\"aborted\"}"], 2);
  EXPECT_EQ(s["starling_rounds_total{result=\"stopped\"}"], 0);
  EXPECT_EQ(s["starling_round_duration_seconds_count"], 2);
  EXPECT_EQ(s["starling_round_duration_seconds_sum"], 42);
  EXPECT_EQ(s["starling_round_duration_seconds_bucket{le=\"10\"}"], 0);
  EXPECT_EQ(s["starling_round_duration_seconds_bucket{le=\"25\"}"], 1);
  EXPECT_EQ(s["starling_round_duration_seconds_bucket{le=\"600\"}"], 2);
  EXPECT_EQ(s["starling_sync_duration_seconds_count"], 2);
  EXPECT_EQ(s["starling_sync_duration_seconds_sum"], 5.5);
  EXPECT_EQ(s["starling_sync_duration_seconds_bucket{le=\"0.1\"}"], 0);
  EXPECT_EQ(s["starling_sync_duration_seconds_bucket{le=\"2.5\"}"], 1);
}

TEST(NodeMetricsTest, TrafficCountersFollowTheLargestTotal) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  const std::string before =
      "starling_pseudo_gradient_bytes_total{stage=\"before_compression\"}";
  const std::string after =
      "starling_pseudo_gradient_bytes_total{stage=\"after_compression\"}";
  m->SetTraffic(100, 200, 4000, 400);
  m->SetTraffic(150, 260, 8000, 800);
  std::map<std::string, double> s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_sent_bytes_total"], 150);
  EXPECT_EQ(s["starling_received_bytes_total"], 260);
  EXPECT_EQ(s[before], 8000);
  EXPECT_EQ(s[after], 800);

  // A decrease is ignored, and growth resumes from the largest total seen.
  m->SetTraffic(10, 20, 30, 40);
  s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_sent_bytes_total"], 150);
  EXPECT_EQ(s["starling_received_bytes_total"], 260);
  EXPECT_EQ(s[before], 8000);
  EXPECT_EQ(s[after], 800);
  m->SetTraffic(175, 260, 9000, 801);
  s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_sent_bytes_total"], 175);
  EXPECT_EQ(s["starling_received_bytes_total"], 260);
  EXPECT_EQ(s[before], 9000);
  EXPECT_EQ(s[after], 801);
}

TEST(NodeMetricsTest, RefusalsByReason) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  m->SetRefusals({{"rate_limit", 0}, {"stream_limit", 2}});
  m->SetRefusals({{"rate_limit", 7}, {"stream_limit", 1}});  // 1: ignored
  std::map<std::string, double> s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_peer_refusals_total{reason=\"rate_limit\"}"], 7);
  EXPECT_EQ(s["starling_peer_refusals_total{reason=\"stream_limit\"}"], 2);
}

TEST(NodeMetricsTest, EarlyMessageBytesIsAGauge) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  m->SetEarlyBytes(5000);
  m->SetEarlyBytes(1200);  // a gauge: it goes down as messages are taken
  EXPECT_EQ(ScrapeSamples(*m)["starling_early_message_bytes"], 1200);
}

TEST(NodeMetricsTest, RpcErrorsByCode) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  m->SetRpcErrors({{"UNAVAILABLE", 3}});
  m->SetRpcErrors({{"UNAVAILABLE", 5}, {"DEADLINE_EXCEEDED", 2}});
  m->SetRpcErrors({{"UNAVAILABLE", 4}});  // a decrease: ignored
  std::map<std::string, double> s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_rpc_errors_total{code=\"UNAVAILABLE\"}"], 5);
  EXPECT_EQ(s["starling_rpc_errors_total{code=\"DEADLINE_EXCEEDED\"}"], 2);
  EXPECT_EQ(s["starling_rpc_errors_total{code=\"INTERNAL\"}"], 0);
}

TEST(NodeMetricsTest, ValidationGauges) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  m->SetValidation(1.75, 0.8125);
  std::map<std::string, double> s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_val_loss"], 1.75);
  EXPECT_EQ(s["starling_val_accuracy"], 0.8125);
  // A language model has no accuracy: the gauge keeps its value.
  m->SetValidation(1.5, -1);
  s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_val_loss"], 1.5);
  EXPECT_EQ(s["starling_val_accuracy"], 0.8125);
}

TEST(NodeMetricsTest, ConcurrentUpdatesAreAllCounted) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  constexpr int kThreads = 4;
  constexpr int kSteps = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 1; i <= kSteps; ++i) {
        m->InnerStep(0.001, 1, 1.0);
        m->SetRpcErrors({{absl::StrCat("CODE_", t), i}});
        m->SetTraffic(i, i, i, i);
      }
    });
  }
  // Scrape while the writers run.
  for (int i = 0; i < 5; ++i) Scrape(*m);
  for (std::thread& t : threads) t.join();
  std::map<std::string, double> s = ScrapeSamples(*m);
  EXPECT_EQ(s["starling_inner_steps_total"], kThreads * kSteps);
  EXPECT_EQ(s["starling_sent_bytes_total"], kSteps);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(
        s[absl::StrCat("starling_rpc_errors_total{code=\"CODE_", t, "\"}")],
        kSteps);
  }
}

TEST(NodeMetricsTest, BindConflictIsUnavailableNamingTheAddress) {
  std::unique_ptr<NodeMetrics> first = StartOrDie();
  ASSERT_NE(first, nullptr);
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(
      absl::StripPrefix(first->address(), "127.0.0.1:"), &port));
  absl::StatusOr<std::unique_ptr<NodeMetrics>> second =
      NodeMetrics::Start("127.0.0.1", port, TestInfo());
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("127.0.0.1:", port)));
  // The first endpoint still serves.
  EXPECT_THAT(Scrape(*first), HasSubstr("starling_build_info"));
}

TEST(NodeMetricsTest, BadHostOrPortIsInvalidArgument) {
  for (auto [host, port] :
       std::vector<std::pair<std::string, int>>{{"localhost", 0},
                                                {"", 0},
                                                {"127.0.0.1", -1},
                                                {"127.0.0.1", 65536}}) {
    absl::StatusOr<std::unique_ptr<NodeMetrics>> m =
        NodeMetrics::Start(host, port, TestInfo());
    ASSERT_FALSE(m.ok()) << host << ":" << port;
    EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  }
}

TEST(NodeMetricsTest, OtherPathsAreNotFound) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  absl::StatusOr<std::string> body = HttpGet(m->address(), "/nope");
  EXPECT_FALSE(body.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(body.status())) << body.status();
  EXPECT_THAT(body.status().message(), HasSubstr("404"));
}

// A connected socket to `m` that sends nothing.
int ConnectIdle(const NodeMetrics& m) {
  int port = 0;
  EXPECT_TRUE(
      absl::SimpleAtoi(absl::StripPrefix(m.address(), "127.0.0.1:"), &port));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << strerror(errno);
  return fd;
}

// Connections to 127.0.0.1:`port` not yet accepted: the receive queue of
// that listening socket in the kernel's table of TCP sockets
// (/proc/net/tcp); -1 when there is no such socket.
int AcceptQueue(int port) {
  const std::string local = absl::StrFormat("0100007F:%04X", port);
  const std::string table = ReadFile("/proc/net/tcp").value_or("");
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    // sl local_address rem_address st tx_queue:rx_queue ...; 0A is LISTEN.
    std::vector<absl::string_view> f =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 5 || f[1] != local || f[3] != "0A") continue;
    int queued = -1;
    const absl::string_view rx = f[4].substr(f[4].find(':') + 1);
    return absl::SimpleHexAtoi(rx, &queued) ? queued : -1;
  }
  return -1;
}

// The server's deadline for a connection's request (kConnectionDeadline in
// node/metrics.cc): a stop that waited for an idle client would take it all.
constexpr absl::Duration kConnectionDeadline = absl::Seconds(5);

TEST(NodeMetricsTest, StopsPromptlyWithAnIdleClient) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  int port = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(absl::StripPrefix(m->address(), "127.0.0.1:"), &port));
  const int idle = ConnectIdle(*m);
  // The server has taken the idle connection and waits for its request.
  ASSERT_TRUE(
      WaitFor([&] { return AcceptQueue(port) == 0; }, absl::Seconds(10)))
      << "the server did not accept the connection: " << AcceptQueue(port);
  const absl::Time start = absl::Now();
  m.reset();
  EXPECT_LT(absl::Now() - start, kConnectionDeadline)
      << "the stop waited for the idle client";
  close(idle);
}

TEST(NodeMetricsTest, IdleClientIsDroppedAfterTheDeadline) {
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  const int idle = ConnectIdle(*m);
  // Served after the idle connection's 5 s deadline, not never.
  absl::StatusOr<std::string> body =
      HttpGet(m->address(), "/metrics", absl::Seconds(20));
  EXPECT_TRUE(body.ok()) << body.status();
  close(idle);
}

TEST(NodeMetricsTest, PromtoolAcceptsTheExposition) {
  if (starling::testing::PromtoolPath().empty()) {
    if (starling::testing::PromtoolRequired()) {
      FAIL() << "promtool not found and STARLING_REQUIRE_PROMTOOL=1: run "
                "scripts/setup.sh (extracts Debian's prometheus package into "
                ".tools/prometheus) and re-run cmake";
    }
    GTEST_SKIP() << "promtool not found (run scripts/setup.sh and re-run "
                    "cmake; set STARLING_REQUIRE_PROMTOOL=1 to fail instead)";
  }
  std::unique_ptr<NodeMetrics> m = StartOrDie();
  ASSERT_NE(m, nullptr);
  // Fresh: the NaN gauges and the zero counters pass too.
  absl::StatusOr<starling::testing::PromtoolResult> fresh =
      starling::testing::PromtoolCheckMetrics(Scrape(*m));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->ok) << fresh->output;
  EXPECT_EQ(fresh->output, "");
  // Every metric has samples, including the labelled families.
  m->InnerStep(0.01, 64, 3.0);
  m->SetValidation(2.5, 0.5);
  m->Round(kRoundCommitted, 20, 2);
  m->SetOuterLr(0.7);
  m->SetInnerLr(0.001);
  m->SetPseudoGradientNorm(1.25);
  m->SetTraffic(10, 20, 30, 3);
  m->SetPeers(2, 1);
  m->SetRpcErrors({{"UNAVAILABLE", 1}});
  m->SetRefusals({{"stream_limit", 1}});
  m->Checkpoint(0.5, absl::Now());
  const std::string text = Scrape(*m);
  ASSERT_FALSE(text.empty());

  absl::StatusOr<starling::testing::PromtoolResult> r =
      starling::testing::PromtoolCheckMetrics(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok) << r->output << "\n--- scraped:\n" << text;
  EXPECT_EQ(r->output, "") << "--- scraped:\n" << text;
}

TEST(HealthServerTest, APortInUseIsRefused) {
  auto a = HealthServer::Start("127.0.0.1", 0, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  int port = 0;
  const std::string& address = (*a)->address();
  ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port))
      << address;
  auto b = HealthServer::Start("127.0.0.1", port, nullptr);
  EXPECT_TRUE(absl::IsUnavailable(b.status())) << b.status();
  EXPECT_NE(b.status().message().find(address), std::string::npos)
      << b.status();
}

}  // namespace
}  // namespace starling
