#include "node/round_exchange.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/run_output.h"

namespace starling {
namespace {

// A failed attempt that blames a rank names that member too, keeping the
// blame for the round's coordinator.
absl::Status NameBlamed(const absl::Status& s,
                        const std::vector<std::string>& members) {
  const int bad = BlamedRank(s);
  if (bad < 0 || bad >= static_cast<int>(members.size())) return s;
  return BlameRank(absl::Status(s.code(), absl::StrCat(s.message(), " (member ",
                                                       members[bad], ")")),
                   bad);
}

}  // namespace

void RoundExchange::Launch(Swarm& swarm, const Swarm::Lineage& at, bool async,
                           const std::atomic<bool>& abandon) {
  async_ = async;
  Swarm::Reduce reduce = [this](Transport& t, int64_t sequence,
                                const std::vector<std::string>& members) {
    return Reduce(t, sequence, members);
  };
  sync_start_ = absl::Now();
  auto body = [this, &swarm, &abandon, at, reduce]() {
    // An async protocol leaves the watchdog to the training thread, which
    // goes on training.
    const absl::Duration bound =
        settings_.round_deadline + settings_.rpc_timeout;
    if (!async_) FeedWatchdog(bound);
    absl::StatusOr<Swarm::RoundResult> r = swarm.SyncRound(at, reduce, [&] {
      if (!async_) FeedWatchdog(bound);  // the loop is alive while it waits
      if (StopSignalCount() >= 2 || abandon.load()) return true;
      const SwarmView v = swarm.Judge();
      return v.waking || (settings_.leave_when_cut_off &&
                          v.standing == SwarmStanding::kCutOff);
    });
    sync_end_ = absl::Now();
    return r;
  };
  result_ = std::async(async ? std::launch::async : std::launch::deferred,
                       std::move(body));
}

absl::StatusOr<Swarm::RoundResult> RoundExchange::Wait() {
  if (async_) {
    const absl::Duration bound =
        settings_.round_deadline + settings_.rpc_timeout;
    FeedWatchdog(bound);
    while (result_.wait_for(std::chrono::milliseconds(200)) !=
           std::future_status::ready) {
      FeedWatchdog(bound);
    }
  }
  return result_.get();
}

void RoundExchange::FeedWatchdog(absl::Duration bound) const {
  if (settings_.watchdog != nullptr) settings_.watchdog->Waiting(bound);
}

absl::Status RoundExchange::Reduce(Transport& t, int64_t sequence,
                                   const std::vector<std::string>& members) {
  ++attempts_run_;
  if (!async_) FeedWatchdog(settings_.rpc_timeout * 2);
  // Fresh memory per attempt: a failed attempt's send may still hold the
  // last one.
  work_ = std::make_shared<std::vector<float>>(round_.contribution());
  attempt_stats_ = RingStats();
  const bool flush = round_.work().flush;
  RingOptions o;
  o.step_timeout = settings_.rpc_timeout;
  o.tensor = flush ? kResidualFlush : kPseudoGrad;
  o.round = sequence;
  o.codec = flush ? settings_.flush_codec : settings_.ring_codec;
  o.stats = &attempt_stats_;
  rank_ = t.rank();
  world_ = t.world();
  if (settings_.robust) return GatherAndCombine(t, std::move(o), members);
  o.data_owner = work_;
  if (settings_.sparse_gather && !flush) {
    o.tensor = kPseudoGradSparse;
    return NameBlamed(AllGatherSum(t, absl::MakeSpan(*work_), o), members);
  }
  return NameBlamed(RingAllReduceSum(t, absl::MakeSpan(*work_), o), members);
}

absl::Status RoundExchange::GatherAndCombine(
    Transport& t, RingOptions o, const std::vector<std::string>& members) {
  // Every member gets every member's pack, checks each and combines the
  // accepted ones by the same rule: the same bytes everywhere.
  o.tensor = kPseudoGradWhole;
  o.codec = nullptr;
  std::vector<std::vector<float>> packs;
  std::vector<std::string> refused;
  STARLING_RETURN_IF_ERROR(
      AllGatherWhole(t, round_.contribution(), o, &packs, &refused));
  std::vector<absl::Span<const float>> spans(packs.begin(), packs.end());
  verdicts_.assign(packs.size(), PackVerdict());
  for (size_t i = 0; i < packs.size(); ++i) verdicts_[i].reason = refused[i];
  members_ = members;
  absl::StatusOr<AggregateStats> st = AggregatePacks(
      settings_.aggregate, settings_.norm_bound, settings_.n_params,
      /*extras=*/1 + static_cast<int>(settings_.n_buffers), spans, &verdicts_,
      absl::MakeSpan(*work_));
  for (size_t i = 0; i < verdicts_.size(); ++i) {
    if (verdicts_[i].accepted) continue;
    const std::string who =
        i < members.size() ? members[i] : absl::StrCat("rank ", i);
    LogEvent(LogLevel::kWarning, "contribution_dropped",
             absl::StrCat("round ", number_, ": dropped the contribution of ",
                          who, ": ", verdicts_[i].reason),
             {{"peer", who}});
  }
  if (!st.ok()) return st.status();
  if (st->fell_back_to_median) {
    LogEvent(LogLevel::kWarning, "aggregate",
             absl::StrCat("round ", number_, ": only ", st->accepted,
                          " contributions passed, too few for ",
                          AggregateName(settings_.aggregate),
                          "; used their median"));
  }
  return absl::OkStatus();
}

}  // namespace starling
