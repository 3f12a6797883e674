// The node's gRPC health endpoint (grpc.health.v1.Health) for Kubernetes'
// native gRPC probes, and the watchdog behind its liveness.
//  - "readiness": SERVING once the model is loaded and the node takes part
//    in the swarm; it stays so across rounds and turns NOT_SERVING when the
//    node leaves.
//  - "liveness": SERVING while the training loop makes progress. The
//    Watchdog flips it when no inner step completes within a multiple of
//    the expected (measured) step time, or within the bound the loop
//    declared for a wait (a round's sync, a state transfer).
// Both services answer Check from the moment the server starts (readiness
// NOT_SERVING, liveness SERVING); Watch is not served. Thread-safe.
#ifndef STARLING_NODE_HEALTH_H_
#define STARLING_NODE_HEALTH_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace starling {

struct WatchdogOptions {
  // Liveness allows this many expected step times without a step...
  double multiple = 100;
  // ...and never less than this.
  absl::Duration min_allowance = absl::Seconds(60);
};

class Watchdog {
 public:
  explicit Watchdog(const WatchdogOptions& options) : options_(options) {}

  // An inner step completed after `took`. The first call arms the watchdog.
  void Step(absl::Duration took, absl::Time now = absl::Now())
      ABSL_LOCKS_EXCLUDED(mu_);
  // The loop is alive but about to wait (or still waiting) for something
  // that ends within `bound`: a round's sync, a state transfer, a
  // checkpoint. Arms the watchdog.
  void Waiting(absl::Duration bound, absl::Time now = absl::Now())
      ABSL_LOCKS_EXCLUDED(mu_);
  // True when armed and the allowance since the last Step/Waiting is spent.
  bool Stalled(absl::Time now = absl::Now()) const ABSL_LOCKS_EXCLUDED(mu_);
  // The current allowance after a step: max(multiple * expected step time,
  // min_allowance).
  absl::Duration Allowance() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const WatchdogOptions options_;
  mutable absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  double expected_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // moving average
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

class HealthServer {
 public:
  // Serves the health services on host:port (port 0: any free port).
  // `watchdog` (not owned, may be null) drives liveness; it must outlive
  // the server. Unavailable naming the address when it cannot bind.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(
      const std::string& host, int port, const Watchdog* watchdog);
  ~HealthServer();

  // The bound "host:port".
  const std::string& address() const { return address_; }
  void SetReady(bool ready);
  bool ready() const { return ready_.load(); }
  bool live() const { return live_.load(); }

 private:
  class Service;
  HealthServer() = default;
  void Poll();

  std::string address_;
  const Watchdog* watchdog_ = nullptr;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> live_{true};
  std::atomic<bool> stopping_{false};
  std::thread poller_;
};

}  // namespace starling

#endif  // STARLING_NODE_HEALTH_H_
