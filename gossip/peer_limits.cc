#include "gossip/peer_limits.h"

#include <grpcpp/server_context.h>

#include <algorithm>
#include <atomic>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "gossip/join_auth.h"

namespace starling {

bool PerHostLogLimiter::ShouldLog(const std::string& host, absl::Time now,
                                  int64_t* unlogged) {
  absl::MutexLock lock(&mu_);
  if (hosts_.size() >= kMaxHosts && !hosts_.contains(host)) {
    absl::erase_if(hosts_, [&](const auto& entry) {
      return now - entry.second.last >= period_ && entry.second.unlogged == 0;
    });
  }
  static const std::string* const kOverflow = new std::string("(others)");
  State& s =
      hosts_[hosts_.size() >= kMaxHosts && !hosts_.contains(host) ? *kOverflow
                                                                  : host];
  if (now - s.last < period_) {
    ++s.unlogged;
    return false;
  }
  *unlogged = s.unlogged;
  s.unlogged = 0;
  s.last = now;
  return true;
}

void PerHostLogLimiter::Warn(const std::string& host, absl::Time now,
                             absl::string_view event, std::string message) {
  int64_t unlogged = 0;
  if (!ShouldLog(host, now, &unlogged)) return;
  if (unlogged > 0) {
    absl::StrAppend(&message, " (and ", unlogged, " more",
                    host.empty() ? "" : " from that host",
                    " since the last such line)");
  }
  LogEvent(LogLevel::kWarning, event, message,
           host.empty() ? LogFields{} : LogFields{{"peer", host}});
}

void LogRefusal(absl::string_view event, const std::string& peer,
                std::string message) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* limiters =
      new absl::flat_hash_map<std::string, std::unique_ptr<PerHostLogLimiter>>;
  PerHostLogLimiter* limiter;
  {
    absl::MutexLock lock(&mu);
    std::unique_ptr<PerHostLogLimiter>& l = (*limiters)[event];
    if (l == nullptr) l = std::make_unique<PerHostLogLimiter>(absl::Minutes(1));
    limiter = l.get();  // kept for the process's life
  }
  limiter->Warn(peer, absl::Now(), event, std::move(message));
}

PeerRateLimiter::PeerRateLimiter(double per_second, double burst)
    : per_second_(per_second), burst_(std::max(1.0, burst)) {}

absl::Status PeerRateLimiter::Take(const std::string& host, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto [it, fresh] = buckets_.try_emplace(host);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = burst_;
  } else if (now > b.last) {
    b.tokens = std::min(
        burst_, b.tokens + absl::ToDoubleSeconds(now - b.last) * per_second_);
  }
  b.last = std::max(b.last, now);
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return absl::OkStatus();
  }
  ++refused_;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "rate limit: %s made more than %g calls per second (bursts of %g; "
      "--peer_rate_limit)",
      host, per_second_, burst_));
}

int64_t PeerRateLimiter::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

struct StreamDeadlines::Entry {
  grpc::CallbackServerContext* ctx;
  std::string what;
  std::string host;
  absl::Time deadline;
  absl::Duration total;
  std::atomic<int64_t> last_ns;  // last progress, absl::ToUnixNanos
  // Guarded by the owner's mu_: a cancellation was sent, and how many are
  // being sent right now (the stream's OnDone waits for them).
  bool cancel_sent = false;
  int cancelling = 0;
};

StreamDeadlines::StreamDeadlines(absl::Duration idle, int max_per_host,
                                 absl::Duration tick)
    : idle_(idle),
      max_per_host_(std::max(0, max_per_host)),
      tick_(tick),
      thread_([this] { Run(); }) {}

StreamDeadlines::~StreamDeadlines() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::StatusOr<std::unique_ptr<StreamDeadlines::Watched>>
StreamDeadlines::Watch(grpc::CallbackServerContext* ctx, std::string what,
                       absl::Duration total) {
  auto e = std::make_shared<Entry>();
  const absl::Time now = absl::Now();
  e->ctx = ctx;
  e->what = std::move(what);
  e->host = PeerHost(ctx->peer());
  e->total = total;
  e->deadline = now + total;
  e->last_ns.store(absl::ToUnixNanos(now));
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    int& open = per_host_[e->host];
    if (max_per_host_ > 0 && open >= max_per_host_) {
      ++refused_;
      refused = absl::ResourceExhaustedError(absl::StrCat(
          "stream limit: ", e->host, " already has ", open,
          " streams open here (--peer_max_streams=", max_per_host_, ")"));
    } else {
      ++open;
      entries_[e.get()] = e;
    }
  }
  if (!refused.ok()) {
    refusal_log_.Warn(
        e->host, now, "stream_refused",
        absl::StrCat("refused a ", e->what, " stream: ", refused.message()));
    return refused;
  }
  return std::unique_ptr<Watched>(new Watched(this, std::move(e)));
}

int64_t StreamDeadlines::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

int64_t StreamDeadlines::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

void StreamDeadlines::Watched::Progress() {
  entry_->last_ns.store(absl::ToUnixNanos(absl::Now()),
                        std::memory_order_relaxed);
}

StreamDeadlines::Watched::~Watched() { owner_->Forget(entry_.get()); }

void StreamDeadlines::Forget(Entry* e) {
  absl::MutexLock lock(&mu_);
  entries_.erase(e);
  if (auto it = per_host_.find(e->host); it != per_host_.end()) {
    if (--it->second <= 0) per_host_.erase(it);
  }
  // A cancellation in flight still uses e->ctx; unless this is that
  // cancellation, run inline by gRPC.
  if (std::this_thread::get_id() == thread_.get_id()) return;
  mu_.Await(absl::Condition(
      +[](Entry* e) { return e->cancelling == 0; }, e));
}

void StreamDeadlines::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), tick_);
    if (stop_) return;
    const absl::Time now = absl::Now();
    std::vector<std::pair<std::shared_ptr<Entry>, std::string>> expired;
    for (auto& [ptr, e] : entries_) {
      if (e->cancel_sent) continue;
      const absl::Time last =
          absl::FromUnixNanos(e->last_ns.load(std::memory_order_relaxed));
      std::string why;
      if (now > e->deadline) {
        why = absl::StrCat("ran past its ", absl::FormatDuration(e->total),
                           " deadline");
      } else if (now - last > idle_) {
        why =
            absl::StrCat("carried no message for ", absl::FormatDuration(idle_),
                         " (--stream_idle_timeout)");
      } else {
        continue;
      }
      e->cancel_sent = true;
      ++e->cancelling;
      ++cancelled_;
      expired.emplace_back(e, std::move(why));
    }
    if (expired.empty()) continue;
    // TryCancel without the lock: the stream's reactor may end meanwhile,
    // and its OnDone (Forget) waits for `cancelling` to drop.
    mu_.Unlock();
    for (auto& [e, why] : expired) {
      log_.Warn(e->host, now, "stream_cancelled",
                absl::StrCat("cancelled a ", e->what, " stream from ", e->host,
                             ": it ", why));
      e->ctx->TryCancel();
    }
    mu_.Lock();
    for (auto& [e, why] : expired) --e->cancelling;
  }
}

}  // namespace starling
