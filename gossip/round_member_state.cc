#include "gossip/round_member_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace starling {

using peer::v1::ControlMessage;
using peer::v1::MemberEntry;

std::string CallOffReason(const std::vector<std::string>& members,
                          const std::vector<int64_t>& incarnations,
                          const std::string& coordinator, const LiveTable& live,
                          bool interrupted) {
  std::string why = interrupted ? "this node is stopping" : "";
  for (size_t i = 0; i < members.size() && why.empty(); ++i) {
    why = GoneSincePlan(
        members[i], Find(live, members[i]),
        incarnations.size() == members.size() ? incarnations[i] : -1);
  }
  if (why.empty())
    why = GoneSincePlan(coordinator, Find(live, coordinator), -1);
  return why;
}

RoundMemberState::RoundMemberState(int64_t round, std::string self_id)
    : round_(round), self_id_(std::move(self_id)) {}

void RoundMemberState::ReadySent(const std::string& coordinator,
                                 absl::Time now) {
  sent_to_ = coordinator;
  sent_at_ = now;
}

int RoundMemberState::Start(const ControlMessage& plan) {
  last_attempt_ = plan.attempt();
  done_attempt_ = -1;
  auto it = std::find(plan.members().begin(), plan.members().end(), self_id_);
  if (it == plan.members().end()) return -1;
  return static_cast<int>(it - plan.members().begin());
}

void RoundMemberState::Done(const ControlMessage& plan) {
  done_attempt_ = plan.attempt();
  done_members_.assign(plan.members().begin(), plan.members().end());
  done_coordinator_ = plan.from();
}

RoundMemberState::Verdict RoundMemberState::OnDecision(
    const ControlMessage& m, std::vector<LogLine>* log) {
  const bool of_done =
      m.attempt() == done_attempt_ && m.from() == done_coordinator_;
  switch (m.kind()) {
    case ControlMessage::COMMIT:
      return of_done ? Verdict::kCommitted : Verdict::kWait;
    case ControlMessage::ABORT:
      if (of_done) done_attempt_ = -1;
      return Verdict::kWait;
    case ControlMessage::STALE:
      if (m.from() == sent_to_) return Verdict::kStale;
      log->push_back(
          {LogLevel::kInfo,
           absl::StrCat("round ", round_, ": ignoring STALE from ", m.from(),
                        " (READY went to ", sent_to_, ")")});
      return Verdict::kWait;
    default:
      return Verdict::kWait;
  }
}

bool RoundMemberState::ShouldSendReady(const std::string& coordinator,
                                       const MemberEntry* done_coordinator,
                                       absl::Time now,
                                       std::vector<LogLine>* log) {
  // The coordinator went past this round and its COMMIT or ABORT for this
  // node's attempt never came (lost while this node was stopped, say): ask
  // again, and hear STALE. A COMMIT merely late by then is ignored; the
  // catch-up fetches the same model.
  if (done_attempt_ >= 0) {
    const MemberEntry* e = done_coordinator;
    if (e == nullptr || e->state() != peer::v1::MEMBER_ALIVE ||
        e->round() <= round_) {
      coordinator_past_ = absl::InfiniteFuture();
    } else if (coordinator_past_ == absl::InfiniteFuture()) {
      coordinator_past_ = now;
    } else if (now - coordinator_past_ > absl::Seconds(2)) {
      log->push_back({LogLevel::kInfo,
                      absl::StrCat("round ", round_, ": ", done_coordinator_,
                                   " is at round ", e->round(),
                                   " without a word about attempt ",
                                   done_attempt_, "; asking again")});
      done_attempt_ = -1;
      coordinator_past_ = absl::InfiniteFuture();
      return true;
    }
  }
  // Resend READY when the coordinator changed (it died or a partition
  // healed) and, while waiting for a plan, every two seconds in case it
  // was lost.
  if (coordinator != sent_to_ ||
      (done_attempt_ < 0 && now - sent_at_ > absl::Seconds(2))) {
    if (done_attempt_ >= 0 && coordinator != sent_to_ &&
        coordinator != done_coordinator_) {
      done_attempt_ = -1;  // the old coordinator is gone: start over
    }
    return true;
  }
  return false;
}

}  // namespace starling
