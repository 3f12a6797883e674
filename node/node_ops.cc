#include "node/node_ops.h"

#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/node_flags.h"
#include "node/peer_address.h"

namespace starling {

void NodeOps::Step(const StepResult& r, int step) {
  if (step == stall_step) {
    LogEvent(LogLevel::kWarning, "test_stall",
             absl::StrCat("--test_stall: stalling for ", stall_seconds, " s"));
    absl::SleepFor(absl::Seconds(stall_seconds));
  }
  watchdog->Step(absl::Seconds(r.seconds));
  if (metrics) {
    metrics->InnerStep(r.seconds, r.tokens, r.loss);
    metrics->SetInnerLr(r.lr);
  }
}

void RecordInnerStep(const NodeOps& ops, const StepResult& r) {
  if (ops.watchdog) ops.watchdog->Step(absl::Seconds(r.seconds));
  if (ops.metrics) {
    ops.metrics->InnerStep(r.seconds, r.tokens, r.loss);
    ops.metrics->SetInnerLr(r.lr);
  }
}

absl::Status StartOps(const std::string& node_id, const std::string& algo,
                      const std::string& device, NodeOps* ops) {
  WatchdogOptions wo;
  wo.multiple = absl::GetFlag(FLAGS_watchdog_multiple);
  const double min_s = absl::GetFlag(FLAGS_watchdog_min_seconds);
  if (!(wo.multiple > 0) || !(min_s >= 0)) {
    return absl::InvalidArgumentError(
        "--watchdog_multiple must be > 0 and --watchdog_min_seconds >= 0");
  }
  wo.min_allowance = absl::Seconds(min_s);
  ops->watchdog = std::make_unique<Watchdog>(wo);
  if (std::string stall = absl::GetFlag(FLAGS_test_stall); !stall.empty()) {
    std::pair<std::string, std::string> parts = absl::StrSplit(stall, ':');
    if (!absl::SimpleAtoi(parts.first, &ops->stall_step) ||
        !absl::SimpleAtod(parts.second, &ops->stall_seconds) ||
        ops->stall_step < 1 || !(ops->stall_seconds > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--test_stall=", stall, ": expected STEP:SECONDS, e.g. 20:5"));
    }
  }
  std::string host = HostOf(absl::GetFlag(FLAGS_listen));
  if (host == "localhost") host = "127.0.0.1";
  if (host.empty()) host = "0.0.0.0";
  const int health_port = absl::GetFlag(FLAGS_health_port);
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  for (auto [name, port] :
       {std::pair<const char*, int>{"health_port", health_port},
        {"metrics_port", metrics_port}}) {
    if (port < -1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, "=", port, ": expected a port, 0 (any) or -1 (off)"));
    }
  }
  if (health_port >= 0) {
    STARLING_ASSIGN_OR_RETURN(
        ops->health,
        HealthServer::Start(host, health_port, ops->watchdog.get()));
    LogEvent(LogLevel::kInfo, "health",
             absl::StrCat("health checks (readiness, liveness) on ",
                          ops->health->address()),
             {{"address", ops->health->address()}});
  }
  if (metrics_port >= 0) {
    BuildInfo info;
    info.version = STARLING_VERSION;
    info.torch = TORCH_VERSION;
    info.device = device;
    info.algo = algo;
    info.node_id = node_id;
    absl::StatusOr<std::unique_ptr<NodeMetrics>> m =
        NodeMetrics::Start(host, metrics_port, info);
    if (!m.ok()) {
      return absl::Status(
          m.status().code(),
          absl::StrCat("--metrics_port: ", m.status().message()));
    }
    ops->metrics = std::move(m).value();
    LogEvent(LogLevel::kInfo, "metrics",
             absl::StrCat("Prometheus metrics on http://",
                          ops->metrics->address(), "/metrics"),
             {{"address", ops->metrics->address()}});
  }
  return absl::OkStatus();
}

}  // namespace starling
