// DilocoLoop's end of the run (node/diloco_loop.h): stay until the members
// behind have caught up, linger for one that may come back, then leave,
// checkpoint and report, or say that this node ended apart from the swarm.
// The class's other members are in diloco_loop.cc.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/diloco_loop.h"
#include "node/elastic_swarm.h"
#include "node/swarm_end_report.h"

namespace starling {

bool DilocoLoop::StayUntilCaughtUp() {
  // A member that missed the last rounds (stopped, starved) catches up from
  // a member's served state; once every member on this lineage has left it
  // could only run those rounds alone, to another final model. So stay,
  // serving, while a live member is behind (at an earlier round, or on a
  // worse lineage at this one): until it has caught up, is declared dead
  // (2 × --suspect_timeout), or for as long as a round may wait for it plus
  // a transfer. And a member that sees a better lineage than its own (the
  // other side of a partition that healed as both sides finished, or the
  // swarm, after this node ran the last round apart) fetches its state
  // first, as it would before a round. A signal ends the wait.
  // Then linger: a member declared dead may be a process stopped through
  // the last rounds (a laptop asleep, a paused VM) that will wake to find
  // nobody. While one behind this node may still come back
  // (Swarm::MayComeBack), stay up to --linger_seconds; a swarm that
  // finishes together, or whose dead members have exited, leaves at once.
  const absl::Time start = absl::Now();
  Linger linger;
  linger.end = start + config_.net.linger;
  const absl::Time until =
      std::max(start + config_.net.round_deadline + config_.net.round_timeout,
               linger.end);
  const std::string& id = config_.net.node_id;
  std::string waited_for;
  while (StopSignal() == 0) {
    session_.LogMemberChanges();  // the others leaving, as they catch up
    const Swarm::Lineage best = swarm_->Best();
    if (Swarm::Ahead(best, Here()) && !best.donors.empty()) {
      if (absl::Now() >= until) {
        LogEvent(LogLevel::kWarning, "straggler",
                 absl::StrCat(id, " leaves on its own model (round ",
                              run_.state.round,
                              "): it could not fetch the state of round ",
                              best.round, " of the others' lineage"));
        return false;
      }
      if (CatchUpOrPause(best) && trainer_.state().step() < total_) {
        return true;
      }
      continue;
    }
    const std::vector<std::string> behind = BehindMembers();
    const std::string names = absl::StrJoin(behind, ", ");
    // Nobody behind, in a view that has settled: this node has not refuted
    // its death for 3 s. After a heal, a member of the other side still dead
    // here may be about to refute its own, which takes a gossip exchange
    // each way (each up to a second with a hung member).
    const bool settled =
        absl::Now() - session_.changes().LastRefuted() >= absl::Seconds(3);
    if (absl::Now() >= until) {
      if (!behind.empty()) {
        LogEvent(
            LogLevel::kWarning, "straggler",
            absl::StrCat(id, " leaves with ", names, " still behind round ",
                         run_.state.round, ", model ", lineage_.substr(0, 8)));
      }
      return false;
    }
    if (behind.empty() && settled && !LingerOn(linger)) return false;
    // Gossip of the others' last commit takes an interval or two; said only
    // when the wait is longer than that.
    if (!behind.empty() && names != waited_for &&
        absl::Now() - start >= absl::Seconds(1)) {
      LogEvent(LogLevel::kInfo, "straggler",
               absl::StrCat(id, " is done and stays, serving round ",
                            run_.state.round, ", until ", names,
                            behind.size() == 1 ? " catches up" : " catch up"));
      waited_for = names;
    }
    run_.ops.watchdog->Waiting(absl::Seconds(5));
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

bool DilocoLoop::LingerOn(Linger& l) {
  const absl::Time now = absl::Now();
  if (now < l.end && now >= l.next_probe) {
    // At most once a second: each probe opens a connection per member.
    l.next_probe = now + absl::Seconds(1);
    l.waiting_for.clear();
    for (const peer::v1::MemberEntry& e :
         swarm_->MayComeBack(Here(), absl::Milliseconds(500))) {
      l.waiting_for.push_back(e.id());
    }
  }
  const std::string names = absl::StrJoin(l.waiting_for, ", ");
  if (now >= l.end || l.waiting_for.empty()) {
    if (l.said && !l.waiting_for.empty()) {
      LogEvent(
          LogLevel::kWarning, "linger",
          absl::StrCat(config_.net.node_id, " leaves after lingering ",
                       absl::FormatDuration(config_.net.linger), "; ", names,
                       " may still come back and find the swarm "
                       "gone"));
    }
    return false;
  }
  if (!l.said) {
    l.said = true;
    session_.events().Write(
        "linger", JsonObject()
                      .Add("round", run_.state.round)
                      .Add("waiting_for", names)
                      .Add("seconds", absl::ToDoubleSeconds(l.end - now)));
    LogEvent(LogLevel::kInfo, "linger",
             absl::StrCat(config_.net.node_id,
                          " is done and lingers, serving "
                          "round ",
                          run_.state.round, ", for up to ",
                          absl::FormatDuration(
                              absl::Trunc(l.end - now, absl::Seconds(1))),
                          ": ", names,
                          " is declared dead but may come back (stopped or "
                          "asleep) and catch up"));
  }
  return true;
}

std::vector<std::string> DilocoLoop::BehindMembers() const {
  std::vector<std::string> behind;
  for (const peer::v1::MemberEntry& e : swarm_->Behind(Here())) {
    behind.push_back(e.round() < run_.state.round
                         ? absl::StrCat(e.id(), " (round ", e.round(), ")")
                         : absl::StrCat(e.id(), " (round ", e.round(),
                                        ", model ", e.lineage().substr(0, 8),
                                        ")"));
  }
  return behind;
}

int DilocoLoop::End(bool left) {
  // Where this node stands, judged before its goodbye: after its last round
  // it is apart when the swarm went on past it and left, or when it was
  // cut off and no member it knows holds its model (before its last round
  // being cut off is enough: ApartFromSwarm).
  const SwarmView view = apart_ ? *apart_ : swarm_->Judge();
  const bool apart =
      apart_.has_value() ||
      (!left && (view.standing == SwarmStanding::kSwarmFinished ||
                 (view.standing == SwarmStanding::kCutOff &&
                  !(view.HoldsFurthest() && view.holders.size() > 1))));
  // Goodbye first, so that nobody waits for this node, then the checkpoint.
  swarm_->Leave();
  const NodeState& state = run_.state;
  const bool stop_apart = apart && !config_.diloco.train_alone;
  if (left && !stop_apart) {
    session_.events().Write(
        "leave",
        JsonObject()
            .Add("round", state.round)
            .Add("step", static_cast<int64_t>(trainer_.state().step())));
  }
  SessionEnd end;
  end.stopped = left && !stop_apart;
  end.next_round = state.round;
  end.world = last_world_;
  end.totals.compression = run_.codecs.ring->Name();
  if (run_.codecs.error_feedback) end.totals.compression += " + error feedback";
  end.totals.bytes_before_compression =
      state.prior.before_compression + state.pseudo_gradient_bytes.raw_bytes;
  end.totals.bytes_after_compression =
      state.prior.after_compression + state.pseudo_gradient_bytes.wire_bytes;
  end.end_fields.Add("round", state.round);
  end.summary.Add("algo", "diloco")
      .Add("rank", static_cast<int64_t>(last_rank_))
      .Add("world", static_cast<int64_t>(last_world_))
      .Add("inner_steps_per_round", static_cast<int64_t>(config_.inner_steps))
      .Add("aggregate", AggregateName(config_.diloco.aggregate))
      .Add("norm_bound", config_.diloco.norm_bound)
      .Add("contributions_dropped", state.contributions_dropped);
  end.final_fields = SwarmFinalFields(view, apart, trained_alone_);
  end.done = absl::StrCat(" in ", state.round, " rounds");
  if (trained_alone_ || apart) {
    absl::StrAppend(&end.done, " (",
                    trained_alone_ ? "trained alone after the swarm was gone"
                                   : "ended apart from the swarm",
                    ": not the swarm's model)");
  }
  if (stop_apart) {
    session_.events().Write(
        "apart", JsonObject()
                     .Add("standing", SwarmStandingName(view.standing))
                     .Add("round", state.round)
                     .Add("step", static_cast<int64_t>(trainer_.state().step()))
                     .Merge(end.final_fields));
    end.apart = EndedApartMessage(
        view, ApartAt{config_.net.node_id, state.round,
                      static_cast<int64_t>(trainer_.state().step()),
                      swarm_->LastPause()});
  }
  end.stopped_by = absl::StrCat(config_.net.node_id, " left the swarm on");
  end.stopped_at = absl::StrCat(" (round ", state.round, ")");
  end.shutdown = [this] { swarm_->Shutdown(); };
  return session_.Finish(std::move(end));
}

bool DilocoLoop::ApartFromSwarm() {
  SwarmView v = swarm_->Judge();
  if (v.standing == SwarmStanding::kInSwarm) {
    apart_.reset();
    return false;
  }
  if (!config_.diloco.train_alone) {
    apart_ = std::move(v);
    return true;
  }
  if (!trained_alone_) {
    trained_alone_ = true;
    session_.events().Write("train_alone",
                            JsonObject()
                                .Add("standing", SwarmStandingName(v.standing))
                                .Add("round", run_.state.round)
                                .Add("swarm_final_round", v.furthest.round));
    LogEvent(
        LogLevel::kWarning, "train_alone",
        absl::StrCat(config_.net.node_id, " finds the swarm gone (",
                     SwarmStandingName(v.standing),
                     ", the swarm last "
                     "seen at round ",
                     v.furthest.round,
                     ") and, with --train_alone, trains on alone from "
                     "round ",
                     run_.state.round, ": its model will not be the swarm's"));
  }
  return false;
}

}  // namespace starling
