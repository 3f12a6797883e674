#include "gossip/round_member.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "gossip/crash_point.h"
#include "gossip/ring_allreduce.h"

namespace starling {

using peer::v1::ControlAck;
using peer::v1::ControlMessage;
using peer::v1::MemberEntry;

namespace {

// Round messages (COMMIT, ABORT, STALE, PLAN) a member holds for its
// training thread, which takes them when it is in a round.
constexpr size_t kMaxInboxMessages = 4096;

}  // namespace

RoundMember::RoundMember(Options options, const Membership* membership,
                         SwarmClient* client, GrpcTransport* transport,
                         const std::atomic<bool>* stopping)
    : options_(std::move(options)),
      membership_(membership),
      client_(client),
      transport_(transport),
      stopping_(stopping),
      token_(NewRoundSecret()) {}

std::string RoundMember::CoordinatorId() const {
  return CoordinatorOf(membership_->Live(), options_.node_id);
}

std::string RoundMember::InboxFull() const {
  return absl::StrCat(options_.node_id, " holds ", kMaxInboxMessages,
                      " round messages its training thread has not taken yet");
}

Mailbox* RoundMember::CallOffLocked() {
  if (running_.mailbox == nullptr || running_.called_off) return nullptr;
  running_.called_off = true;
  ++cancels_in_flight_;
  return running_.mailbox;
}

void RoundMember::CallOff(Mailbox* mailbox, const absl::Status& why) {
  if (mailbox == nullptr) return;
  mailbox->Cancel(why);
  absl::MutexLock lock(&mu_);
  --cancels_in_flight_;
}

ControlAck RoundMember::OnPlan(const ControlMessage& plan) {
  const std::string coordinator = CoordinatorId();
  Mailbox* superseded = nullptr;
  int running_attempt = -1;
  {
    absl::MutexLock lock(&mu_);
    if (messages_.size() >= kMaxInboxMessages) return RefuseRound(InboxFull());
    if (plan.round() != round_) {
      return RefuseRound(absl::StrCat(options_.node_id,
                                      " is not waiting for round ",
                                      plan.round(), " (at ", round_, ")"));
    }
    if (plan.from() != coordinator) {
      ControlAck ack =
          RefuseRound(absl::StrCat(options_.node_id, " follows coordinator ",
                                   coordinator, ", not ", plan.from()));
      ack.set_follows(coordinator);
      return ack;
    }
    if (running_.mailbox != nullptr && plan.attempt() > running_.attempt) {
      running_attempt = running_.attempt;
      superseded = CallOffLocked();
    }
    messages_.push_back(plan);
  }
  CallOff(superseded, absl::AbortedError(absl::StrCat(
                          "attempt ", running_attempt, " superseded")));
  const auto self =
      std::find(plan.members().begin(), plan.members().end(), options_.node_id);
  if (self != plan.members().end() &&
      plan.addresses_size() == plan.members_size()) {
    transport_->ExpectAttempt(
        {plan.addresses().begin(), plan.addresses().end()},
        static_cast<int>(self - plan.members().begin()), AttemptMailbox(plan),
        {plan.members().begin(), plan.members().end()});
  }
  return AcceptRound();
}

MailboxOptions RoundMember::AttemptMailbox(const ControlMessage& plan) const {
  MailboxOptions mo = options_.mailbox;
  mo.first_round = plan.round() * kAttemptsPerRound + plan.attempt();
  mo.plan = PlanDigest(plan);
  return mo;
}

ControlAck RoundMember::Prove(const ControlMessage& confirm) const {
  ControlAck ack = AcceptRound();
  ack.set_proof(RoundTokenProof(confirm.nonce(), token_));
  return ack;
}

ControlAck RoundMember::OnDecision(const ControlMessage& m) {
  Mailbox* aborted = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (messages_.size() >= kMaxInboxMessages) return RefuseRound(InboxFull());
    if (m.round() != round_) {
      return RefuseRound(absl::StrCat(options_.node_id, " is not in round ",
                                      m.round(), " (at ", round_, ")"));
    }
    if (m.kind() == ControlMessage::ABORT && m.round() == round_ &&
        m.attempt() == running_.attempt && m.from() == running_.coordinator) {
      aborted = CallOffLocked();
    }
    messages_.push_back(m);
  }
  CallOff(aborted, absl::AbortedError(absl::StrCat(
                       "round ", m.round(), " attempt ", m.attempt(),
                       " called off by the coordinator")));
  return AcceptRound();
}

void RoundMember::CallOffIfGone(bool interrupted) {
  const LiveTable live = ById(membership_->Live());
  std::string what;
  Mailbox* mailbox = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (running_.mailbox == nullptr || running_.called_off) return;
    const std::string why =
        CallOffReason(running_.members, running_.incarnations,
                      running_.coordinator, live, interrupted);
    if (why.empty()) return;
    what = absl::StrCat("round ", round_, " attempt ", running_.attempt,
                        " called off here: ", why);
    mailbox = CallOffLocked();
  }
  STARLING_LOG(WARNING) << what;
  CallOff(mailbox, absl::AbortedError(what));
}

absl::StatusOr<Swarm::RoundResult> RoundMember::Run(
    const Swarm::Lineage& at, const Swarm::Reduce& reduce,
    const std::function<bool()>& stop) {
  const int64_t round = at.round;
  EnterRound(round);
  SetCrashRound(round);
  CrashPoint("ready");
  RoundMemberState state(round, options_.node_id);
  SendReady(at, &state);
  while (true) {
    std::optional<ControlMessage> m = Take();
    if (m.has_value() && m->round() == round) {
      if (Ending end = OnMessage(*m, reduce, stop, &state)) return *end;
      continue;
    }
    if (stopping_->load()) {
      return absl::CancelledError("the swarm is shutting down");
    }
    // Waiting for a plan, or with its part done for the coordinator's
    // decision: either way `stop` leaves the round at once. After DONE the
    // others may still commit the attempt without this node, which keeps
    // its state from before the round.
    if (stop && stop()) {
      if (state.done_attempt() >= 0) {
        STARLING_LOG(WARNING)
            << "round " << round << ": stopping with attempt "
            << state.done_attempt() << " done but not yet committed by "
            << state.done_coordinator();
      }
      return *LeaveRound(Swarm::Outcome::kStopped, state);
    }
    absl::StatusOr<MemberEntry> done_coordinator;
    if (state.done_attempt() >= 0) {
      done_coordinator = membership_->Get(state.done_coordinator());
    }
    std::vector<LogLine> log;
    const bool resend = state.ShouldSendReady(
        CoordinatorId(), done_coordinator.ok() ? &*done_coordinator : nullptr,
        absl::Now(), &log);
    WriteLog(log);
    if (resend) SendReady(at, &state);
  }
}

void RoundMember::EnterRound(int64_t round) {
  absl::MutexLock lock(&mu_);
  round_ = round;
  // Messages of earlier rounds are moot now.
  std::deque<ControlMessage> keep;
  for (ControlMessage& m : messages_) {
    if (m.round() == round) keep.push_back(std::move(m));
  }
  messages_.swap(keep);
}

RoundMember::Ending RoundMember::LeaveRound(Swarm::Outcome outcome,
                                            const RoundMemberState& state) {
  Swarm::RoundResult res;
  res.outcome = outcome;
  if (outcome == Swarm::Outcome::kCommitted) {
    res.members = state.done_members();
    res.attempt = state.done_attempt();
  }
  absl::MutexLock lock(&mu_);
  round_ = -1;
  // What is left of the round's messages is moot: a backlog of them must
  // not follow the node into its next try of the round.
  messages_.clear();
  return res;
}

void RoundMember::SendReady(const Swarm::Lineage& at, RoundMemberState* state) {
  state->ReadySent(CoordinatorId(), absl::Now());
  ControlMessage m = RoundMessage(options_.run_id, options_.node_id,
                                  ControlMessage::READY, at.round);
  m.set_lineage(at.lineage);
  m.set_member_rounds(at.member_rounds);
  m.set_last_attempt(state->last_attempt());
  m.set_token(token_);
  m.add_addresses(options_.address);
  absl::StatusOr<ControlAck> ack = client_->SendControl(state->sent_to(), m);
  if (!ack.ok()) {
    STARLING_LOG(INFO) << "READY to " << state->sent_to() << ": "
                       << ack.status();
  }
}

std::optional<ControlMessage> RoundMember::Take() {
  absl::MutexLock lock(&mu_);
  auto nonempty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !messages_.empty();
  };
  mu_.AwaitWithTimeout(absl::Condition(&nonempty), absl::Milliseconds(100));
  if (messages_.empty()) return std::nullopt;
  ControlMessage m = std::move(messages_.front());
  messages_.pop_front();
  return m;
}

RoundMember::Ending RoundMember::OnMessage(const ControlMessage& m,
                                           const Swarm::Reduce& reduce,
                                           const std::function<bool()>& stop,
                                           RoundMemberState* state) {
  if (m.kind() == ControlMessage::PLAN) {
    if (!state->IsNew(m)) return std::nullopt;
    // Told to leave at once: no new attempt (its plan is left to fail as
    // any member's departure fails it). Checked here too, since plans that
    // keep coming would otherwise never let Run reach its own check.
    if (stop && stop()) {
      STARLING_LOG(INFO) << "round " << state->round()
                         << ": not taking part in attempt " << m.attempt()
                         << ": this node is stopping";
      return LeaveRound(Swarm::Outcome::kStopped, *state);
    }
    const int rank = state->Start(m);
    if (rank < 0) return std::nullopt;
    return RunAttempt(m, rank, reduce, state);
  }
  std::vector<LogLine> log;
  const RoundMemberState::Verdict verdict = state->OnDecision(m, &log);
  WriteLog(log);
  switch (verdict) {
    case RoundMemberState::Verdict::kCommitted:
      return LeaveRound(Swarm::Outcome::kCommitted, *state);
    case RoundMemberState::Verdict::kStale:
      return LeaveRound(Swarm::Outcome::kStale, *state);
    case RoundMemberState::Verdict::kWait:
      return std::nullopt;
  }
  return std::nullopt;
}

RoundMember::Ending RoundMember::RunAttempt(const ControlMessage& plan,
                                            int rank,
                                            const Swarm::Reduce& reduce,
                                            RoundMemberState* state) {
  const int64_t round = state->round();
  const std::vector<std::string> members(plan.members().begin(),
                                         plan.members().end());
  const std::vector<std::string> addresses(plan.addresses().begin(),
                                           plan.addresses().end());
  const MailboxOptions mo = AttemptMailbox(plan);
  transport_->InstallRound(addresses, rank, mo, members);
  BeginAttempt(plan);
  const absl::Status s = reduce(*transport_, mo.first_round, members);
  const bool called_off = EndAttempt();
  ControlMessage r = RoundMessage(options_.run_id, options_.node_id,
                                  ControlMessage::DONE, round, plan.attempt());
  r.set_token(token_);
  if (s.ok()) {
    CrashPoint("done");
    state->Done(plan);
    (void)client_->SendControl(plan.from(), r);
    return std::nullopt;
  }
  if (called_off) return std::nullopt;
  STARLING_LOG(WARNING) << "round " << round << " attempt " << plan.attempt()
                        << " failed: " << s;
  r.set_kind(ControlMessage::FAILED);
  r.set_unreachable(std::string(s.message()));
  if (int bad = BlamedRank(s);
      bad >= 0 && bad < static_cast<int>(members.size()) && bad != rank) {
    r.set_culprit(members[bad]);
  }
  (void)client_->SendControl(plan.from(), r);
  // An emulated link that cannot carry this run's messages fails every
  // attempt alike: stop instead of retrying forever.
  if (absl::Status link = options_.link_error(); !link.ok()) {
    absl::MutexLock lock(&mu_);
    round_ = -1;
    return link;
  }
  return std::nullopt;
}

void RoundMember::BeginAttempt(const ControlMessage& plan) {
  Mailbox* const mailbox = &transport_->mailbox();
  Mailbox* aborted = nullptr;
  {
    absl::MutexLock lock(&mu_);
    running_.attempt = plan.attempt();
    running_.mailbox = mailbox;
    running_.members.assign(plan.members().begin(), plan.members().end());
    running_.incarnations.assign(plan.incarnations().begin(),
                                 plan.incarnations().end());
    running_.coordinator = plan.from();
    running_.called_off = false;
    // An ABORT may have arrived before the mailbox existed.
    for (const ControlMessage& q : messages_) {
      if (q.kind() == ControlMessage::ABORT && q.attempt() == plan.attempt() &&
          q.round() == plan.round()) {
        aborted = CallOffLocked();
      }
    }
  }
  CallOff(aborted, absl::AbortedError("called off"));
}

bool RoundMember::EndAttempt() {
  absl::MutexLock lock(&mu_);
  // The mailbox lives until the next attempt is installed (on this thread):
  // no cancel of it may still be running then.
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return cancels_in_flight_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
  const bool called_off = running_.called_off;
  running_ = Running();
  return called_off;
}

}  // namespace starling
