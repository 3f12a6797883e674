#include "gossip/coordinator_thread.h"

#include <utility>
#include <vector>

#include "core/logging.h"
#include "gossip/crash_point.h"

namespace starling {

using peer::v1::ControlAck;
using peer::v1::ControlMessage;
using peer::v1::MemberEntry;

CoordinatorThread::CoordinatorThread(RoundCoordinatorOptions options,
                                     const Membership* membership,
                                     SwarmClient* client,
                                     const std::atomic<bool>* stopping)
    : membership_(membership),
      client_(client),
      stopping_(stopping),
      machine_(std::move(options)) {}

void CoordinatorThread::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void CoordinatorThread::Join() {
  if (thread_.joinable()) thread_.join();
}

std::string CoordinatorThread::OnReady(const ControlMessage& ready) {
  const std::vector<MemberEntry> live = membership_->Live();
  absl::MutexLock lock(&mu_);
  std::string refused = machine_.OnReady(ready, live, absl::Now());
  if (refused.empty()) cv_.Signal();
  return refused;
}

void CoordinatorThread::OnDone(const ControlMessage& done) {
  absl::MutexLock lock(&mu_);
  machine_.OnDone(done);
  cv_.Signal();
}

void CoordinatorThread::OnFailed(const ControlMessage& failed) {
  std::vector<LogLine> log;
  {
    absl::MutexLock lock(&mu_);
    log = machine_.OnFailed(failed);
    cv_.Signal();
  }
  WriteLog(log);
}

void CoordinatorThread::Wake() {
  absl::MutexLock lock(&mu_);
  cv_.SignalAll();
}

void CoordinatorThread::Loop() {
  while (!stopping_->load()) {
    {
      absl::MutexLock lock(&mu_);
      cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
    }
    if (stopping_->load()) break;
    const std::vector<MemberEntry> live = membership_->Live();
    RoundCoordinator::Decisions d;
    {
      absl::MutexLock lock(&mu_);
      d = machine_.Tick(live, absl::Now());
    }
    Send(d);
  }
}

void CoordinatorThread::Send(const RoundCoordinator::Decisions& d) {
  if (d.commit) CrashPoint("commit");
  WriteLog(d.log);
  // Members at once. The messages up to the first COMMIT to another member
  // go first, so that a crash right after it (commit_partial) leaves the
  // rest uncommitted.
  const std::vector<Outgoing>& out = d.messages;
  size_t first_commit = out.size();
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].second.kind() == ControlMessage::COMMIT &&
        out[i].first != membership_->self_id()) {
      first_commit = i;
      break;
    }
  }
  const absl::Span<const Outgoing> all(out);
  if (first_commit < out.size()) {
    (void)client_->SendControls(all.subspan(0, first_commit + 1));
    CrashPoint("commit_partial");
    (void)client_->SendControls(all.subspan(first_commit + 1));
  } else {
    (void)client_->SendControls(all);
  }
  // Plans need every member's acceptance; every member that refused (or
  // could not be reached) is dealt with in this attempt.
  const std::vector<absl::StatusOr<ControlAck>> acks =
      client_->SendControls(d.plans);
  for (size_t i = 0; i < d.plans.size(); ++i) {
    const auto& [to, plan] = d.plans[i];
    const absl::StatusOr<ControlAck>& ack = acks[i];
    if (ack.ok() && ack->accepted()) continue;
    STARLING_LOG(INFO) << "plan for round " << plan.round() << " attempt "
                       << plan.attempt() << " refused by " << to << ": "
                       << (ack.ok() ? ack->reason()
                                    : std::string(ack.status().message()));
    absl::MutexLock lock(&mu_);
    machine_.OnPlanRefused(plan, to, ack.ok() ? ack->follows() : "");
  }
}

}  // namespace starling
