#include "node/sim_faults.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file_util.h"

namespace starling {
namespace {

bool IsPartition(const FaultEvent& ev) {
  return ev.kind == FaultKind::kPartitionStart ||
         ev.kind == FaultKind::kPartitionEnd;
}

}  // namespace

std::optional<FaultEvent> FaultSchedule::TakeDue(double elapsed) {
  if (next_ >= events_.size() ||
      absl::ToDoubleSeconds(events_[next_].at) > elapsed) {
    return std::nullopt;
  }
  return events_[next_++];
}

absl::Duration FaultSchedule::UntilNext(absl::Duration elapsed) const {
  if (next_ >= events_.size()) return absl::InfiniteDuration();
  return std::max(absl::ZeroDuration(), events_[next_].at - elapsed);
}

bool FaultSchedule::StartsPending() const {
  for (size_t k = next_; k < events_.size(); ++k) {
    const FaultKind kind = events_[k].kind;
    if (kind == FaultKind::kRestart || kind == FaultKind::kJoin) return true;
  }
  return false;
}

std::vector<FaultEvent> FaultSchedule::TakeRest() {
  std::vector<FaultEvent> rest(events_.begin() + next_, events_.end());
  next_ = events_.size();
  return rest;
}

std::string FaultTarget(const FaultEvent& ev) {
  return IsPartition(ev) ? PartitionLine(ev.groups) : ev.node;
}

void FaultLog::Record(const FaultEvent& ev, double t,
                      const std::string& skipped) {
  const double planned = absl::ToDoubleSeconds(ev.at);
  JsonObject o;
  o.Add("kind", FaultKindName(ev.kind))
      .Add(IsPartition(ev) ? "groups" : "node", FaultTarget(ev))
      .Add("planned_seconds", planned);
  if (t >= 0) o.Add("at_seconds", t);
  if (!skipped.empty()) o.Add("skipped", skipped);
  json.Push(o);
  marks.push_back({t >= 0 ? t : planned, std::string(FaultKindName(ev.kind)),
                   FaultTarget(ev), skipped});
}

FaultDriver::FaultDriver(NodeProcessGroup* group, SimProgress* progress,
                         ProgressPrinter* printer, std::string partition_file,
                         bool elastic)
    : group_(group),
      progress_(progress),
      printer_(printer),
      partition_file_(std::move(partition_file)),
      elastic_(elastic) {}

void FaultDriver::CarryOut(const FaultEvent& ev, double t) {
  const int i = IsPartition(ev) ? -1 : group_->IndexOf(ev.node);
  const std::string skipped = Apply(ev, i);
  log_.Record(ev, t, skipped);
  std::string note;
  if (!skipped.empty()) {
    note = absl::StrCat(" skipped (", skipped, ")");
  } else if (elastic_ && i >= 0 && i < group_->launch().initial &&
             (ev.kind == FaultKind::kKill || ev.kind == FaultKind::kLeave)) {
    note = NoteBeforeFormed();
  }
  printer_->Say(absl::StrFormat("starling sim: %.1fs: %s %s%s", t,
                                FaultKindName(ev.kind), FaultTarget(ev), note));
}

std::string FaultDriver::Apply(const FaultEvent& ev, int i) {
  switch (ev.kind) {
    case FaultKind::kKill:
      if (!group_->Kill(i)) return "not running";
      log_.killed.push_back(ev.node);
      progress_->SetCounted(i, false);
      return "";
    case FaultKind::kLeave:
      if (!group_->Leave(i)) return "not running";
      log_.left.push_back(ev.node);
      progress_->SetCounted(i, false);
      return "";
    case FaultKind::kRestart:
    case FaultKind::kJoin:
      return StartAgain(ev, i);
    case FaultKind::kPartitionStart:
    case FaultKind::kPartitionEnd:
      if (absl::Status s = WriteFileAtomic(partition_file_,
                                           ev.kind == FaultKind::kPartitionStart
                                               ? FaultTarget(ev) + "\n"
                                               : std::string());
          !s.ok()) {
        return std::string(s.message());
      }
      return "";
  }
  return "";
}

std::string FaultDriver::StartAgain(const FaultEvent& ev, int i) {
  if (group_->running(i)) return "still running";
  if (absl::Status s = group_->Start(i, ev.kind == FaultKind::kRestart);
      !s.ok()) {
    return std::string(s.message());
  }
  log_.killed.erase(
      std::remove(log_.killed.begin(), log_.killed.end(), ev.node),
      log_.killed.end());
  // A joiner counts once it has a round; a restarted node at once.
  progress_->SetCounted(
      i, ev.kind == FaultKind::kRestart || progress_->HasRound(i));
  return "";
}

std::string FaultDriver::NoteBeforeFormed() {
  progress_->Poll();
  if (progress_->formed()) return "";
  const absl::CommandLineFlag* timeout =
      absl::FindCommandLineFlag("connect_timeout");
  return absl::StrCat(
      " before the swarm formed: the others wait for all ",
      group_->launch().initial,
      " starting nodes (--min_members) and fail after --connect_timeout=",
      timeout != nullptr ? timeout->CurrentValue() : "?",
      " s unless it comes back");
}

}  // namespace starling
