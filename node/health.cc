#include "node/health.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace starling {
namespace {

constexpr char kReadiness[] = "readiness";
constexpr char kLiveness[] = "liveness";

}  // namespace

void Watchdog::Step(absl::Duration took, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const double s = absl::ToDoubleSeconds(took);
  // A slow moving average: one slow step does not move the bar much, a
  // lasting slowdown (a busier machine) does.
  expected_seconds_ =
      armed_ && expected_seconds_ > 0 ? 0.9 * expected_seconds_ + 0.1 * s : s;
  armed_ = true;
  deadline_ =
      now + std::max(options_.min_allowance,
                     absl::Seconds(options_.multiple * expected_seconds_));
}

void Watchdog::Waiting(absl::Duration bound, absl::Time now) {
  absl::MutexLock lock(&mu_);
  armed_ = true;
  deadline_ = now + bound +
              std::max(options_.min_allowance,
                       absl::Seconds(options_.multiple * expected_seconds_));
}

bool Watchdog::Stalled(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  return armed_ && now > deadline_;
}

absl::Duration Watchdog::Allowance() const {
  absl::MutexLock lock(&mu_);
  return std::max(options_.min_allowance,
                  absl::Seconds(options_.multiple * expected_seconds_));
}

// grpc.health.v1.Health/Check over the server's two statuses. Watch is
// not served (UNIMPLEMENTED); Kubernetes probes use Check.
class HealthServer::Service : public grpc::health::v1::Health::CallbackService {
 public:
  explicit Service(const HealthServer* owner) : owner_(owner) {}
  grpc::ServerUnaryReactor* Check(
      grpc::CallbackServerContext* ctx,
      const grpc::health::v1::HealthCheckRequest* req,
      grpc::health::v1::HealthCheckResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    using Status = grpc::health::v1::HealthCheckResponse;
    if (req->service() == kReadiness) {
      resp->set_status(owner_->ready() ? Status::SERVING : Status::NOT_SERVING);
    } else if (req->service() == kLiveness || req->service().empty()) {
      resp->set_status(owner_->live() ? Status::SERVING : Status::NOT_SERVING);
    } else {
      reactor->Finish(grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("unknown service '", req->service(),
                       "' (this node serves readiness and liveness)")));
      return reactor;
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const HealthServer* owner_;
};

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(
    const std::string& host, int port, const Watchdog* watchdog) {
  std::unique_ptr<HealthServer> h(new HealthServer());
  h->watchdog_ = watchdog;
  h->service_ = std::make_unique<Service>(h.get());
  grpc::ServerBuilder builder;
  // As for the peer server: no silent sharing of a port in use (gRPC sets
  // SO_REUSEPORT by default), so a probe never reaches another process.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int bound = 0;
  const std::string want = absl::StrCat(host, ":", port);
  builder.AddListeningPort(want, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(h->service_.get());
  h->server_ = builder.BuildAndStart();
  if (h->server_ == nullptr || bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("--health_port: cannot serve health checks on ", want,
                     " (address in use or not local?)"));
  }
  h->address_ = absl::StrCat(host, ":", bound);
  h->poller_ = std::thread([p = h.get()] { p->Poll(); });
  return h;
}

HealthServer::~HealthServer() {
  stopping_ = true;
  if (poller_.joinable()) poller_.join();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(1));
  }
}

void HealthServer::SetReady(bool ready) { ready_ = ready; }

void HealthServer::Poll() {
  while (!stopping_.load()) {
    const bool live = watchdog_ == nullptr || !watchdog_->Stalled();
    if (live_.exchange(live) != live) {
      if (!live) {
        LogEvent(LogLevel::kWarning, "liveness",
                 absl::StrCat("no progress of the training loop within ",
                              absl::FormatDuration(watchdog_->Allowance()),
                              ": liveness is NOT_SERVING"));
      } else {
        LogEvent(LogLevel::kInfo, "liveness",
                 "the training loop moves again: liveness is SERVING");
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace starling
