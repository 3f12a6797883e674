#include "gossip/round_coordinator.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "gossip/relay_plan.h"

namespace starling {

using peer::v1::ControlMessage;
using peer::v1::MemberEntry;

RoundCoordinator::RoundCoordinator(RoundCoordinatorOptions options)
    : options_(std::move(options)) {}

std::string RoundCoordinator::OnReady(const ControlMessage& ready,
                                      const std::vector<MemberEntry>& live,
                                      absl::Time now) {
  if (ready.round() <= committed_ ||
      LineageAhead({round_, lineage_, member_rounds_},
                   {ready.round(), ready.lineage(), ready.member_rounds()})) {
    replies_.emplace_back(ready.from(),
                          RoundMessage(options_.run_id, options_.self_id,
                                       ControlMessage::STALE, ready.round()));
    return "";
  }
  if (std::string alone = AloneAhead(ready, live); !alone.empty()) {
    return alone;
  }
  if (ready.round() > round_ || ready.lineage() != lineage_) {
    MoveTo(ready, now);
  }
  TakeReady(ready, now);
  return "";
}

void RoundCoordinator::MoveTo(const ControlMessage& ready, absl::Time now) {
  // A newer round (or a better lineage of this one): whoever is ready on
  // the old one is behind.
  for (const std::string& id : ready_) {
    replies_.emplace_back(id, RoundMessage(options_.run_id, options_.self_id,
                                           ControlMessage::STALE, round_));
  }
  if (running_) {
    for (const std::string& id : plan_) {
      replies_.emplace_back(id, Message(ControlMessage::ABORT));
    }
  }
  round_ = ready.round();
  lineage_ = ready.lineage();
  member_rounds_ = ready.member_rounds();
  ready_.clear();
  excluded_.clear();
  banned_.clear();
  running_ = false;
  replan_now_ = false;
  hold_after_abort_ = false;
  attempt_ = 0;
  out_of_attempts_ = false;
  aborted_ = 0;
  next_plan_at_ = absl::InfinitePast();
  first_ready_ = now;
}

void RoundCoordinator::TakeReady(const ControlMessage& ready, absl::Time now) {
  attempt_ = std::max(attempt_, ready.last_attempt());
  // A banned member sits this round out; it catches up once the round
  // commits.
  if (banned_.count(ready.from())) return;
  if (ready_.empty()) first_ready_ = now;
  excluded_.erase(ready.from());
  ready_.insert(ready.from());
}

std::string RoundCoordinator::AloneAhead(
    const ControlMessage& ready, const std::vector<MemberEntry>& live) const {
  // A READY for the round after this coordinator's (or an earlier one) is
  // the usual progression. One further ahead is real when members went on
  // under another coordinator while this one was away, and then this node
  // or another member is there too (this node, once it has caught up).
  // Taken on one member's word, it would move the coordinator to any round
  // that member names: every honest READY would then hear STALE and find
  // nobody ahead to catch up from, for good.
  // This node's own progress needs nobody to vouch for it (one that
  // resumes alone from its checkpoint at round 5, say).
  if (ready.round() <= round_ + 1 || ready.from() == options_.self_id) {
    return "";
  }
  int64_t self_round = -1;
  for (const MemberEntry& e : live) {
    if (e.id() == options_.self_id) self_round = e.round();
    if (e.id() != ready.from() && e.round() >= ready.round()) return "";
  }
  return absl::StrCat(options_.self_id, " is at round ", self_round,
                      " and no member but ", QuoteForLog(ready.from()),
                      " is at round ", ready.round(), " yet");
}

void RoundCoordinator::OnDone(const ControlMessage& done) {
  // DONE of the running attempt counts only from its members.
  const bool in_plan =
      std::find(plan_.begin(), plan_.end(), done.from()) != plan_.end();
  if (running_ && in_plan && done.round() == round_ &&
      done.attempt() == attempt_) {
    done_.insert(done.from());
  }
}

std::vector<LogLine> RoundCoordinator::OnFailed(const ControlMessage& failed) {
  const bool in_plan =
      std::find(plan_.begin(), plan_.end(), failed.from()) != plan_.end();
  if (running_ && in_plan && failed.round() == round_ &&
      failed.attempt() == attempt_) {
    abort_ = true;
    abort_reason_ =
        absl::StrCat(failed.from(), " failed: ", failed.unreachable());
  }
  const std::string& culprit = failed.culprit();
  if (failed.round() != round_ || culprit.empty() || culprit == failed.from() ||
      banned_.count(culprit)) {
    return {};
  }
  // One of the two is faulty (or lying): neither takes part in the rest of
  // this round, so a hostile member can neither stall the round by
  // resending bad data nor exclude others for free. This holds even when
  // the attempt it failed was already called off (the culprit's own
  // failure often arrives first).
  std::vector<LogLine> log = {
      {LogLevel::kWarning,
       absl::StrCat("round ", round_, ": ", failed.from(),
                    " refused invalid data from ", culprit,
                    "; both sit out the rest of round ", round_)}};
  Ban(culprit);
  Ban(failed.from());
  return log;
}

void RoundCoordinator::Ban(const std::string& id) {
  banned_.insert(id);
  excluded_.insert(id);
  ready_.erase(id);
  if (running_ && std::find(plan_.begin(), plan_.end(), id) != plan_.end()) {
    abort_ = true;
    abort_reason_ = absl::StrCat(id, " sits out round ", round_);
  }
}

void RoundCoordinator::OnPlanRefused(const ControlMessage& plan,
                                     const std::string& to,
                                     const std::string& follows) {
  if (!running_ || round_ != plan.round() || attempt_ != plan.attempt()) {
    return;
  }
  if (!abort_) abort_reason_ = absl::StrCat(to, " refused the plan");
  abort_ = true;
  ready_.erase(to);
  if (!follows.empty()) {
    // Alive, but it takes another member for the coordinator: the views
    // differ for a gossip interval or two (this node was suspected while
    // it was stopped, say). Running the round without it could make two
    // models of one round if its coordinator runs the round too. Wait for
    // its READY (sent when it takes this node for the coordinator), for a
    // member seen past the round, or for the deadline.
    hold_after_abort_ = true;
  } else {
    // Unreachable or not ready: left out of this round; it resends READY
    // if it still wants in.
    excluded_.insert(to);
  }
}

ControlMessage RoundCoordinator::Message(ControlMessage::Kind kind) const {
  return RoundMessage(options_.run_id, options_.self_id, kind, round_,
                      attempt_);
}

RoundCoordinator::Decisions RoundCoordinator::Tick(
    const std::vector<MemberEntry>& live_members, absl::Time now) {
  Decisions d;
  const LiveTable live = ById(live_members);
  const bool coordinating =
      CoordinatorOf(live_members, options_.self_id) == options_.self_id;
  if (running_) CheckAttempt(live, now, &d);
  ForgetUnvouched(live, coordinating, now, &d);
  CatchUpAhead(live, coordinating, &d);
  MaybePlan(live, now, &d);
  // Replies the events called for go first.
  d.messages.insert(d.messages.begin(), replies_.begin(), replies_.end());
  replies_.clear();
  return d;
}

void RoundCoordinator::CheckAttempt(const LiveTable& live, absl::Time now,
                                    Decisions* d) {
  for (size_t i = 0; i < plan_.size(); ++i) {
    const std::string& id = plan_[i];
    std::string why = GoneSincePlan(id, Find(live, id), plan_incarnations_[i]);
    if (!why.empty()) {
      abort_ = true;
      abort_reason_ = std::move(why);
      excluded_.insert(id);
    }
  }
  if (!abort_ && now - plan_started_ > options_.attempt_timeout) {
    abort_ = true;
    abort_reason_ = "it ran past --round_timeout";
  }
  if (abort_) {
    Abort(now, d);
  } else if (done_.size() == plan_.size()) {
    Commit(d);
  }
}

void RoundCoordinator::Abort(absl::Time now, Decisions* d) {
  d->log.push_back(
      {LogLevel::kWarning, absl::StrCat("round ", round_, " attempt ", attempt_,
                                        " aborted: ", abort_reason_)});
  for (const std::string& id : plan_) {
    d->messages.emplace_back(id, Message(ControlMessage::ABORT));
  }
  for (const std::string& id : excluded_) ready_.erase(id);
  running_ = false;
  abort_ = false;
  replan_now_ = !hold_after_abort_;
  hold_after_abort_ = false;
  if (++aborted_ >= 2) {
    next_plan_at_ =
        now + std::min(absl::Milliseconds(100) *
                           (int64_t{1} << std::min(aborted_ - 2, 6)),
                       absl::Seconds(5));
  }
}

void RoundCoordinator::Commit(Decisions* d) {
  d->commit = true;
  for (const std::string& id : plan_) {
    d->messages.emplace_back(id, Message(ControlMessage::COMMIT));
  }
  const std::set<std::string> in_plan(plan_.begin(), plan_.end());
  for (const std::string& id : ready_) {
    if (!in_plan.count(id)) {
      d->messages.emplace_back(id, Message(ControlMessage::STALE));
    }
  }
  committed_ = round_;
  ready_.clear();
  running_ = false;
  plan_.clear();
}

bool RoundCoordinator::Vouched(const LiveTable& live) const {
  int others = 0;
  for (const auto& [id, e] : live) {
    if (e.round() < round_) continue;
    if (id == options_.self_id || ++others >= 2) return true;
  }
  return false;
}

void RoundCoordinator::ForgetUnvouched(const LiveTable& live, bool coordinating,
                                       absl::Time now, Decisions* d) {
  // A round that neither this node nor two other members have reached
  // (AloneAhead's rule): a READY took this coordinator there on the word
  // of gossiped rounds that have changed since (a false entry, say).
  // After kUnvouchedGrace of that it forgets the round and the READYs
  // for it; members that really are there resend theirs every 2 s.
  if (running_ || round_ <= committed_ || !coordinating || Vouched(live)) {
    unvouched_since_ = absl::InfiniteFuture();
    return;
  }
  if (unvouched_since_ == absl::InfiniteFuture()) {
    unvouched_since_ = now;
    return;
  }
  if (now - unvouched_since_ <= kUnvouchedGrace) return;
  d->log.push_back(
      {LogLevel::kWarning,
       absl::StrCat("round ", round_, ": neither this node nor two ",
                    "other members are at it any more (", ready_.size(),
                    " ready for it); back to round ", committed_ + 1)});
  round_ = committed_;
  lineage_.clear();
  member_rounds_ = 0;
  ready_.clear();
  excluded_.clear();
  banned_.clear();
  unvouched_since_ = absl::InfiniteFuture();
}

void RoundCoordinator::CatchUpAhead(const LiveTable& live, bool coordinating,
                                    Decisions* d) {
  // A live member (this node or another) has moved past the round the
  // others are ready for: an earlier coordinator committed it and died
  // before telling them all, or this node was cut off (stopped, starved)
  // while the rest went on. The ready ones must catch up with that commit,
  // not run the round again among themselves (two different models for one
  // round). Only the coordinator decides this: any other node's ready set
  // is left over from a time it was taken for the coordinator.
  if (running_ || ready_.empty() || round_ <= committed_ || !coordinating) {
    return;
  }
  const MemberEntry* ahead = nullptr;
  for (const auto& [id, e] : live) {
    if (e.state() == peer::v1::MEMBER_ALIVE && !e.joining() &&
        e.round() > round_) {
      ahead = &e;
      break;
    }
  }
  if (ahead == nullptr) return;
  d->log.push_back(
      {LogLevel::kInfo,
       absl::StrCat("round ", round_, " was committed without its ready ",
                    "members (", ready_.size(), "): ", ahead->id(),
                    " is at round ", ahead->round(), "; they catch up")});
  for (const std::string& id : ready_) {
    d->messages.emplace_back(id, Message(ControlMessage::STALE));
  }
  committed_ = round_;
  ready_.clear();
}

void RoundCoordinator::MaybePlan(const LiveTable& live, absl::Time now,
                                 Decisions* d) {
  if (running_ || ready_.empty() || round_ <= committed_) return;
  for (auto it = ready_.begin(); it != ready_.end();) {
    it = (!live.count(*it) || excluded_.count(*it)) ? ready_.erase(it)
                                                    : std::next(it);
  }
  int waiting = 0;
  for (const auto& [id, e] : live) {
    // Every member not ahead of this round: those behind in this node's
    // table may only be slow to gossip, and those truly behind turn to
    // joining (not waited for) once they learn it. Joiners too: one that
    // fetched this round's state takes part in it (bounded by the deadline
    // like everyone).
    if (!ready_.count(id) && !excluded_.count(id) &&
        e.state() == peer::v1::MEMBER_ALIVE && e.round() <= round_) {
      ++waiting;
    }
  }
  const bool due = now - first_ready_ >= options_.round_deadline;
  const bool plan_now = !ready_.empty() &&
                        (waiting == 0 || due || replan_now_) &&
                        now >= next_plan_at_;
  if (!plan_now) return;
  if (attempt_ + 1 >= kAttemptsPerRound) {
    if (!out_of_attempts_) {
      out_of_attempts_ = true;
      d->log.push_back(
          {LogLevel::kError,
           absl::StrCat("round ", round_, ": every attempt number up to ",
                        attempt_, " is taken; this coordinator plans no ",
                        "more attempts of it")});
    }
    return;
  }
  ++attempt_;
  // A member behind a relay goes right after its relay, which then sends
  // it its segments itself instead of forwarding another's (relay_plan.h);
  // with no relayed member this is the sorted order.
  std::map<std::string, std::string> id_at, relay_of;
  for (const auto& [id, e] : live) id_at[e.address()] = id;
  for (const auto& [id, e] : live) {
    if (auto r = id_at.find(e.relay());
        !e.relay().empty() && r != id_at.end()) {
      relay_of[id] = r->second;
    }
  }
  plan_ = RelayRingOrder({ready_.begin(), ready_.end()}, relay_of);
  plan_addresses_.clear();
  plan_incarnations_.clear();
  for (const std::string& id : plan_) {
    plan_addresses_.push_back(live.at(id).address());
    plan_incarnations_.push_back(live.at(id).incarnation());
  }
  done_.clear();
  running_ = true;
  plan_started_ = now;
  replan_now_ = false;
  ControlMessage p = Message(ControlMessage::PLAN);
  p.set_lineage(lineage_);
  for (size_t i = 0; i < plan_.size(); ++i) {
    p.add_members(plan_[i]);
    p.add_addresses(plan_addresses_[i]);
    p.add_incarnations(plan_incarnations_[i]);
  }
  for (const std::string& id : plan_) d->plans.emplace_back(id, p);
}

}  // namespace starling
