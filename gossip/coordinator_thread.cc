#include "gossip/coordinator_thread.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "gossip/crash_point.h"

namespace starling {

using peer::v1::ControlAck;
using peer::v1::ControlMessage;
using peer::v1::MemberEntry;

namespace {

// Why a DONE or FAILED that lacks its sender's proved round token is
// refused.
std::string WithoutToken(const ControlMessage& m) {
  return absl::StrCat("a ", ControlMessage::Kind_Name(m.kind()), " from ",
                      QuoteForLog(m.from()), " for round ", m.round(),
                      " attempt ", m.attempt(),
                      " does not carry the round token ", m.from(), " proved");
}

}  // namespace

CoordinatorThread::CoordinatorThread(RoundCoordinatorOptions options,
                                     const Membership* membership,
                                     SwarmClient* client,
                                     const std::atomic<bool>* stopping)
    : membership_(membership),
      client_(client),
      stopping_(stopping),
      machine_(options),
      tokens_(options.self_id, options.run_id, NewRoundSecret) {}

void CoordinatorThread::Start() {
  thread_ = std::thread([this] { Loop(); });
  confirm_thread_ = std::thread([this] { ConfirmLoop(); });
}

void CoordinatorThread::Join() {
  if (thread_.joinable()) thread_.join();
  if (confirm_thread_.joinable()) confirm_thread_.join();
}

int64_t CoordinatorThread::IncarnationOf(const std::string& id) const {
  absl::StatusOr<MemberEntry> e = membership_->Get(id);
  return e.ok() ? e->incarnation() : -1;
}

std::string CoordinatorThread::OnReady(const ControlMessage& ready) {
  const int64_t incarnation = IncarnationOf(ready.from());
  const std::vector<MemberEntry> live = membership_->Live();
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  RoundTokens::Decision d = tokens_.OnReady(ready, incarnation, now);
  switch (d.verdict) {
    case RoundTokens::Verdict::kRefused:
      return d.reason;
    case RoundTokens::Verdict::kAsk:
      asks_.push_back(std::move(d.ask));
      return "";
    case RoundTokens::Verdict::kHeld:
      return "";
    case RoundTokens::Verdict::kTaken:
      break;
  }
  std::string refused = machine_.OnReady(ready, live, now);
  if (refused.empty()) cv_.Signal();
  return refused;
}

std::string CoordinatorThread::OnDone(const ControlMessage& done) {
  absl::MutexLock lock(&mu_);
  if (!tokens_.Carries(done)) return WithoutToken(done);
  machine_.OnDone(done);
  cv_.Signal();
  return "";
}

std::string CoordinatorThread::OnFailed(const ControlMessage& failed) {
  std::vector<LogLine> log;
  {
    absl::MutexLock lock(&mu_);
    if (!tokens_.Carries(failed)) return WithoutToken(failed);
    log = machine_.OnFailed(failed);
    cv_.Signal();
  }
  WriteLog(log);
  return "";
}

void CoordinatorThread::Wake() {
  absl::MutexLock lock(&mu_);
  tick_now_ = true;
  cv_.SignalAll();
}

void CoordinatorThread::Loop() {
  while (!stopping_->load()) {
    {
      absl::MutexLock lock(&mu_);
      if (!tick_now_) cv_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
      tick_now_ = false;
    }
    if (stopping_->load()) break;
    const std::vector<MemberEntry> live = membership_->Live();
    RoundCoordinator::Decisions d;
    {
      absl::MutexLock lock(&mu_);
      tokens_.Prune(ById(live));
      d = machine_.Tick(live, absl::Now());
      Stamp(&d);
    }
    Send(d);
  }
}

void CoordinatorThread::ConfirmLoop() {
  auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !asks_.empty() || stopping_->load();
  };
  while (!stopping_->load()) {
    std::vector<Outgoing> asks;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&due), absl::Milliseconds(50));
      asks.swap(asks_);
    }
    if (!asks.empty()) Confirm(asks);
  }
}

void CoordinatorThread::Confirm(const std::vector<Outgoing>& asks) {
  const std::vector<absl::StatusOr<ControlAck>> acks =
      client_->SendControls(asks);
  const std::vector<MemberEntry> live = membership_->Live();
  std::vector<LogLine> log;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < asks.size(); ++i) {
      const absl::StatusOr<ControlAck>& ack = acks[i];
      std::optional<uint64_t> proof;
      if (ack.ok() && ack->accepted()) proof = ack->proof();
      std::optional<ControlMessage> ready = tokens_.OnProof(asks[i], proof);
      if (!ready.has_value()) continue;
      std::string refused = machine_.OnReady(*ready, live, absl::Now());
      if (!refused.empty()) {
        // Its sender heard nothing of it (its call was answered before);
        // it sends READY again in 2 s, as after any READY lost.
        log.push_back({LogLevel::kInfo,
                       absl::StrCat("READY from ", ready->from(), " for round ",
                                    ready->round(), " refused: ", refused)});
      }
      tick_now_ = true;
      cv_.Signal();
    }
  }
  WriteLog(log);
}

void CoordinatorThread::Stamp(RoundCoordinator::Decisions* d) {
  for (auto& [to, m] : d->messages) m.set_token(tokens_.TokenOf(to));
  if (d->plans.empty()) return;
  const uint64_t secret = NewRoundSecret();
  for (auto& [to, plan] : d->plans) {
    plan.set_token(tokens_.TokenOf(to));
    plan.set_plan_secret(secret);
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
