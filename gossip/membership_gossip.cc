#include "gossip/membership_gossip.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/peer_limits.h"
#include "gossip/round_protocol.h"

namespace starling {

using peer::v1::GossipRequest;
using peer::v1::GossipResponse;
using peer::v1::JoinRequest;
using peer::v1::JoinResponse;
using peer::v1::MemberEntry;

namespace {

std::vector<MemberEntry> ToVector(
    const google::protobuf::RepeatedPtrField<MemberEntry>& r) {
  return std::vector<MemberEntry>(r.begin(), r.end());
}

// "12s", "1m05s": durations as a person reads them in a log line.
std::string Seconds(absl::Duration d) {
  const int64_t s = absl::ToInt64Seconds(d + absl::Milliseconds(500));
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60)
                 : absl::StrCat(s, "s");
}

// Whether member `e` counts toward WaitForMembers' n (see there).
bool CountsAsReady(const MemberEntry& e, const std::string& self) {
  const bool counted = IsLive(e) || e.state() == peer::v1::MEMBER_LEFT;
  return e.id() == self || (counted && !e.joining());
}

// Logs `line()` every kWaitReportEvery on a thread of its own, from its
// construction to its destruction: a wait that says what it waits for.
class WaitReporter {
 public:
  explicit WaitReporter(std::function<std::string()> line)
      : line_(std::move(line)), thread_([this] {
          while (!done_.WaitForNotificationWithTimeout(kWaitReportEvery)) {
            LogEvent(LogLevel::kInfo, "waiting", line_());
          }
        }) {}
  ~WaitReporter() {
    done_.Notify();
    thread_.join();
  }

 private:
  const std::function<std::string()> line_;
  absl::Notification done_;
  std::thread thread_;  // last: starts once the fields above are set
};

}  // namespace

std::string JoinWaitLine(const std::vector<std::string>& seeds,
                         absl::Duration waited, int attempts,
                         const std::string& last_error, absl::Duration left) {
  return absl::StrCat(
      "joining the swarm through --peers=", absl::StrJoin(seeds, ","), ": ",
      attempts, " attempts in ", Seconds(waited), "; last error: ", last_error,
      "; giving up in ", Seconds(left), " (--connect_timeout)");
}

std::string MembersWaitLine(const std::vector<MemberEntry>& table,
                            const std::string& self, int n,
                            absl::Duration waited, absl::Duration left) {
  std::vector<std::string> ready, not_ready;
  for (const MemberEntry& e : table) {
    if (CountsAsReady(e, self)) {
      ready.push_back(e.id());
    } else {
      not_ready.push_back(absl::StrCat(e.id(), " ",
                                       e.joining() && IsLive(e)
                                           ? "still joining"
                                           : MemberStateName(e.state()),
                                       " at ", e.address()));
    }
  }
  return absl::StrCat(
      "waiting for ", n, " members (--min_members) for ", Seconds(waited), ": ",
      ready.size(), " ready (", absl::StrJoin(ready, ", "), ")",
      not_ready.empty()
          ? ""
          : absl::StrCat("; not ready: ", absl::StrJoin(not_ready, ", ")),
      "; giving up in ", Seconds(left), " (--connect_timeout)");
}

std::vector<std::string> GossipTargets(
    const std::vector<MemberEntry>& table, const std::string& self,
    const std::vector<std::string>& seeds,
    const std::function<bool(const std::string&)>& is_self_seed,
    std::mt19937_64& rng) {
  std::vector<std::string> live, others;
  for (const MemberEntry& e : table) {
    if (e.id() == self) continue;
    if (e.state() == peer::v1::MEMBER_ALIVE) {
      live.push_back(e.address());
    } else if (e.state() != peer::v1::MEMBER_LEFT) {
      others.push_back(e.address());
    }
  }
  std::shuffle(live.begin(), live.end(), rng);
  std::vector<std::string> targets(
      live.begin(), live.begin() + std::min<size_t>(2, live.size()));
  std::uniform_int_distribution<int> coin(0, 9);
  if (!others.empty() && (live.empty() || coin(rng) < 5)) {
    std::shuffle(others.begin(), others.end(), rng);
    targets.insert(
        targets.end(), others.begin(),
        others.begin() + std::min<size_t>(live.empty() ? 3 : 1, others.size()));
  }
  if (!seeds.empty() && coin(rng) < (live.empty() ? 3 : 1)) {
    const std::string& seed = seeds[rng() % seeds.size()];
    if (!is_self_seed(seed) &&
        std::find(live.begin(), live.end(), seed) == live.end()) {
      targets.push_back(seed);
    }
  }
  return targets;
}

MembershipGossip::MembershipGossip(Options options, Membership* membership,
                                   SwarmClient* client, Hooks hooks,
                                   const std::atomic<bool>* stopping)
    : options_(std::move(options)),
      membership_(membership),
      client_(client),
      hooks_(std::move(hooks)),
      stopping_(stopping) {}

void MembershipGossip::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void MembershipGossip::Join() {
  if (thread_.joinable()) thread_.join();
}

bool MembershipGossip::IsSelfSeed(const std::string& seed) const {
  if (seed == options_.address) return true;
  absl::MutexLock lock(&mu_);
  return self_seeds_.count(seed) > 0;
}

bool MembershipGossip::HasSelfSeed() const {
  for (const std::string& seed : options_.seeds) {
    if (IsSelfSeed(seed)) return true;
  }
  return false;
}

JoinRequest MembershipGossip::Hello() const {
  JoinRequest req;
  peer::v1::HandshakeRequest* hello = req.mutable_hello();
  hello->set_protocol_version(kProtocolVersion);
  hello->set_run_id(options_.identity.run_id);
  hello->set_algo(options_.identity.algo);
  hello->set_world(0);
  hello->set_compression(options_.identity.compression);
  hello->set_aggregate(options_.identity.aggregate);
  *hello->mutable_model() = options_.identity.model;
  hello->set_address(options_.address);
  return req;
}

absl::Status MembershipGossip::JoinSwarm(absl::Time deadline) {
  if (options_.seeds.empty()) {
    joined_ = true;  // the first member
    return absl::OkStatus();
  }
  JoinRequest req = Hello();
  absl::Duration backoff = absl::Milliseconds(100);
  Tries tries;
  const absl::Time start = absl::Now();
  // Instead of a silent wait until --connect_timeout: whom it tries and why
  // that fails (connection refused, a certificate that names another
  // host...).
  WaitReporter reporter([&] {
    std::string last_error;
    int attempts;
    {
      absl::MutexLock lock(&tries.mu);
      last_error = tries.last_error;
      attempts = tries.attempts;
    }
    return JoinWaitLine(options_.seeds, absl::Now() - start, attempts,
                        last_error, deadline - absl::Now());
  });
  while (!stopping_->load()) {
    for (const std::string& seed : options_.seeds) {
      if (IsSelfSeed(seed)) continue;
      if (std::optional<absl::Status> done =
              TryJoin(seed, deadline, &req, &tries)) {
        return *done;
      }
    }
    if (joined_.load()) {
      // Nobody had joined yet and this node has the smallest id: it
      // admitted the others and founds the swarm.
      STARLING_LOG(INFO) << options_.node_id << " founds the swarm";
      return absl::OkStatus();
    }
    if (HasSelfSeed() && absl::Now() - start >= options_.found_after) {
      // This node is a seed itself and no other seed answered: it founds
      // the swarm alone. The gossip loop keeps calling the seeds, so swarms
      // founded apart merge (the better lineage wins) once they meet.
      joined_ = true;
      STARLING_LOG(INFO) << options_.node_id
                         << " is one of the seeds and no other answered in "
                         << absl::FormatDuration(options_.found_after)
                         << ": it founds the swarm";
      return absl::OkStatus();
    }
    if (absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  absl::MutexLock lock(&tries.mu);
  return absl::UnavailableError(absl::StrCat(
      "cannot reach any of --peers=", absl::StrJoin(options_.seeds, ","),
      " after ", tries.attempts, " attempts (last error: ", tries.last_error,
      ")"));
}

std::optional<absl::Status> MembershipGossip::TryJoin(const std::string& seed,
                                                      absl::Time deadline,
                                                      JoinRequest* req,
                                                      Tries* tries) {
  for (const MemberEntry& e : membership_->Snapshot()) {
    if (e.id() == options_.node_id) *req->mutable_self() = e;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(5))));
  client_->credentials().Sign(&ctx, "Join");
  req->set_dialed(seed);
  JoinResponse resp;
  grpc::Status s = client_->StubFor(seed)->Join(&ctx, *req, &resp);
  {
    absl::MutexLock lock(&tries->mu);
    ++tries->attempts;
    if (!s.ok()) {
      tries->last_error =
          absl::StrCat(seed, ": ",
                       absl::StatusCodeToString(
                           static_cast<absl::StatusCode>(s.error_code())),
                       ": ", s.error_message());
    }
  }
  if (s.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
    // The seed is this node under another name (its DNS name).
    STARLING_LOG(INFO) << "seed " << seed << " is this node";
    absl::MutexLock lock(&mu_);
    self_seeds_.insert(seed);
    return std::nullopt;
  }
  client_->rpc_errors().Record(s.error_code());
  if (s.ok()) {
    std::vector<MembershipChange> changes;
    (void)membership_->Merge(ToVector(resp.members()), absl::Now(), &changes);
    hooks_.report(changes);
    STARLING_LOG(INFO) << options_.node_id << " joined through " << seed << " ("
                       << resp.members_size() << " members known)";
    RecordDialBack(seed, resp.dial_back());
    joined_ = true;
    return absl::OkStatus();
  }
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
      s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer ", seed, " refused this node: ", s.error_message()));
  }
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(absl::StrCat(
        "peer ", seed, " refused this node's credentials: ", s.error_message(),
        " (check --join_token_file)"));
  }
  // The seed may have tried to join this node first, been refused and
  // gone: say why instead of timing out.
  absl::MutexLock lock(&mu_);
  if (auto it = refused_.find(seed); it != refused_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this node refused peer ", seed, ": ", it->second));
  }
  return std::nullopt;
}

void MembershipGossip::RecordDialBack(const std::string& seed,
                                      peer::v1::Reachability verdict) {
  if (verdict == peer::v1::REACHABILITY_UNKNOWN) return;  // not checked
  membership_->SetReachability(verdict);
  if (verdict == peer::v1::REACHABILITY_REACHABLE) {
    STARLING_LOG(INFO) << seed << " dialed " << options_.node_id << " back at "
                       << options_.address << ": reachable";
    return;
  }
  LogEvent(LogLevel::kWarning, "unreachable",
           absl::StrCat(seed, " could not dial ", options_.node_id, " back at ",
                        options_.address,
                        ": peers cannot reach this node there (behind NAT "
                        "or a firewall?); give --advertise an address that "
                        "forwards to --listen"));
}

absl::Status MembershipGossip::WaitForMembers(int n, absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::Time next_report = start + kWaitReportEvery;
  while (true) {
    // Counted: this node, and every member that is ready (its JoinSwarm
    // returned: not joining) and live or already LEFT. Not a member still
    // joining: the others could count it, train and leave while it is in
    // JoinSwarm, and it would then wait for them in vain. Not a member that
    // left while joining or died. Counting a ready member that left keeps
    // the barrier one-way: one that saw the others, trained and left before
    // they saw it ready still lets them start.
    int ready = 0;
    const std::vector<MemberEntry> table = membership_->Snapshot();
    for (const MemberEntry& e : table) {
      if (CountsAsReady(e, options_.node_id)) ++ready;
    }
    if (ready >= n) {
      GossipToEveryone();
      return absl::OkStatus();
    }
    if (const absl::Time now = absl::Now(); now >= next_report) {
      LogEvent(LogLevel::kInfo, "waiting",
               MembersWaitLine(table, options_.node_id, n, now - start,
                               deadline - now));
      next_report = now + kWaitReportEvery;
    }
    if (absl::Now() >= deadline || stopping_->load()) {
      // Every member this node knows of, with its state and address: a
      // member declared dead, or one whose address is this node's own (two
      // servers sharing a port), tells what went wrong.
      std::vector<std::string> alive, others;
      for (const MemberEntry& e : membership_->Snapshot()) {
        std::string line =
            absl::StrCat(e.id(), " ", MemberStateName(e.state()),
                         e.joining() && e.id() != options_.node_id && IsLive(e)
                             ? " (still joining)"
                             : "",
                         " at ", e.address());
        (IsLive(e) ? alive : others).push_back(std::move(line));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "waited for ", n, " members but only ", ready,
          " are ready (alive or suspect: ", absl::StrJoin(alive, ", "),
          "); also known: ",
          others.empty() ? "none" : absl::StrJoin(others, ", ")));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status MembershipGossip::OnJoin(const JoinRequest& req,
                                      JoinResponse* resp) {
  if (absl::Status s = CheckNodeId(req.self().id()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "joiner at ", QuoteForLog(req.hello().address()), ": ", s.message()));
  }
  PeerIdentity mine = options_.identity;
  mine.world = 0;
  std::string why = HandshakeMismatch(req.hello(), mine, options_.address);
  if (!why.empty()) {
    // One line a minute for all of them: the address is the caller's
    // claim, so it cannot key a per-peer limit.
    LogRefusal("joiner_refused", "",
               absl::StrCat("refused joiner ", req.self().id(), " at ",
                            QuoteForLog(req.hello().address()), ": ", why));
    // Kept only for this node's seeds (JoinThrough reads it), so a caller
    // claiming endless addresses grows nothing.
    const std::string& at = req.hello().address();
    if (std::find(options_.seeds.begin(), options_.seeds.end(), at) !=
        options_.seeds.end()) {
      absl::MutexLock lock(&mu_);
      refused_[at] = why;
    }
    return absl::FailedPreconditionError(why);
  }
  // A node that is still looking for the swarm itself admits only joiners
  // with larger ids: nodes that all start (or resume) together form one
  // swarm around the smallest id, and two that look for each other do not
  // pair up in both directions.
  if (!joined_.load() && req.self().id() < options_.node_id) {
    return absl::UnavailableError(
        absl::StrCat(options_.node_id, " has not joined the swarm itself yet"));
  }
  if (req.self().id() == options_.node_id &&
      req.hello().address() == options_.address) {
    return absl::AlreadyExistsError("this is the node itself");
  }
  if (req.self().id() == options_.node_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("node id '", req.self().id(), "' is this node's own"));
  }
  std::vector<MembershipChange> changes;
  STARLING_RETURN_IF_ERROR(
      membership_->Merge({req.self()}, absl::Now(), &changes));
  hooks_.report(changes);
  joined_ = true;
  // The joiner reached this node at its advertised address: so can others.
  // Only a verdict nobody gave yet is filled in (the founder's): a
  // dial-back's is this node's own.
  if (req.dialed() == options_.address) {
    absl::StatusOr<MemberEntry> own = membership_->Get(options_.node_id);
    if (own.ok() && own->reachability() == peer::v1::REACHABILITY_UNKNOWN) {
      membership_->SetReachability(peer::v1::REACHABILITY_REACHABLE);
    }
  }
  // The dial-back: can this node reach the joiner where it says the others
  // should dial it? One connection attempt, with no lock held.
  const std::string& joiner = req.self().address();
  resp->set_dial_back(
      DialBackVerdict(options_.probe ? options_.probe(joiner)
                                     : ProbeAddress(joiner, kDialBackTimeout)));
  for (const MemberEntry& e : membership_->Snapshot()) {
    *resp->add_members() = e;
  }
  return absl::OkStatus();
}

absl::Status MembershipGossip::OnGossip(const GossipRequest& req,
                                        GossipResponse* resp) {
  if (req.run_id() != options_.identity.run_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gossip for run ", QuoteForLog(req.run_id()), "; this node is in run ",
        QuoteForLog(options_.identity.run_id)));
  }
  if (req.from() == options_.node_id) {
    return absl::AlreadyExistsError("this is the node itself");
  }
  std::vector<MembershipChange> changes;
  absl::Status s =
      membership_->Merge(ToVector(req.members()), absl::Now(), &changes);
  if (absl::IsResourceExhausted(s)) {
    // This node's table is full of live members: not the caller's fault,
    // and it still gets this node's view.
    if (!warned_table_full_.exchange(true)) {
      STARLING_LOG(WARNING) << s.message();
    }
    s = absl::OkStatus();
  }
  hooks_.report(changes);
  if (!changes.empty()) hooks_.table_changed();
  for (const MemberEntry& e : membership_->Snapshot()) {
    *resp->add_members() = e;
  }
  return s;
}

void MembershipGossip::GossipTo(const std::vector<std::string>& addresses,
                                absl::Duration timeout,
                                std::vector<MembershipChange>* changes) {
  GossipRequest req;
  req.set_run_id(options_.identity.run_id);
  req.set_from(options_.node_id);
  for (const MemberEntry& e : membership_->Snapshot()) *req.add_members() = e;
  struct Call {
    std::string address;
    std::shared_ptr<peer::v1::Swarm::Stub> stub;
    grpc::ClientContext ctx;
    GossipResponse resp;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (const std::string& address : addresses) {
    if (address == options_.address || client_->Blocked(address)) continue;
    calls.push_back(std::make_unique<Call>());
    calls.back()->address = address;
  }
  absl::BlockingCounter pending(static_cast<int>(calls.size()));
  for (const std::unique_ptr<Call>& call : calls) {
    Call& c = *call;
    c.ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    client_->credentials().Sign(&c.ctx, "Gossip");
    c.stub = client_->StubFor(c.address);
    client_->CountControlBytes(static_cast<int64_t>(req.ByteSizeLong()));
    c.stub->async()->Gossip(&c.ctx, &req, &c.resp,
                            [&pending, &c](grpc::Status s) {
                              c.status = std::move(s);
                              pending.DecrementCount();
                            });
  }
  pending.Wait();
  bool answered = false;
  for (const std::unique_ptr<Call>& c : calls) {
    if (c->status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      absl::MutexLock lock(&mu_);
      self_seeds_.insert(c->address);  // this node under another name
    } else {
      client_->rpc_errors().Record(c->status.error_code());
    }
    if (c->status.ok()) {
      answered = true;
      (void)membership_->Merge(ToVector(c->resp.members()), absl::Now(),
                               changes);
    }
  }
  if (answered) BackInTouch();
}

void MembershipGossip::NotePause(absl::Duration paused) {
  std::vector<std::string> with;
  for (const MemberEntry& e : membership_->Live()) {
    if (e.id() != options_.node_id) with.push_back(e.id());
  }
  {
    absl::MutexLock lock(&mu_);
    last_pause_ = paused;
    // A pause noticed while nobody was live leaves the last one's members:
    // those are the ones that may have gone on without this node.
    if (!with.empty()) paused_with_ = with;
  }
  STARLING_LOG(WARNING) << options_.node_id << " was paused for "
                        << absl::FormatDuration(
                               absl::Trunc(paused, absl::Milliseconds(100)))
                        << " (stopped or starved): the others may have "
                           "gone on without it";
}

void MembershipGossip::BackInTouch() {
  absl::MutexLock lock(&mu_);
  paused_with_.clear();
}

std::vector<std::string> MembershipGossip::PausedWith() const {
  absl::MutexLock lock(&mu_);
  return paused_with_;
}

absl::Duration MembershipGossip::LastPause() const {
  absl::MutexLock lock(&mu_);
  return last_pause_;
}

void MembershipGossip::GossipToEveryone() {
  std::vector<std::string> live;
  for (const MemberEntry& e : membership_->Snapshot()) {
    if (e.id() != options_.node_id && IsLive(e)) live.push_back(e.address());
  }
  GossipTo(live, absl::Seconds(1), /*changes=*/nullptr);
}

void MembershipGossip::Leave() {
  membership_->Leave();
  GossipToEveryone();
}

void MembershipGossip::Loop() {
  std::mt19937_64 rng(std::hash<std::string>()(options_.node_id) ^
                      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  // Each call waits at most this long, and all run at once: a hung peer
  // (stopped, or behind a black hole) must not hold up the heartbeats that
  // tell the others this node is alive.
  const absl::Duration call_timeout =
      std::min(absl::Seconds(1), options_.suspect_after / 4);
  absl::Time last_tick = absl::InfinitePast();
  absl::Duration last_calls = absl::ZeroDuration();
  const auto is_self_seed = [this](const std::string& seed) {
    return IsSelfSeed(seed);
  };
  while (!stopping_->load()) {
    client_->ReadPartitionFile();
    membership_->Beat();
    // The time since the last tick beyond the sleep and the calls was a
    // pause of this process: nobody's silence then counts against them.
    const absl::Time now = absl::Now();
    if (last_tick != absl::InfinitePast()) {
      const absl::Duration paused = now - last_tick - options_.gossip_interval -
                                    std::min(last_calls, call_timeout);
      membership_->ForgivePause(paused, now);
      // Long enough for the others to suspect this node: they may declare
      // it dead and go on without it (gossip/swarm_end.h).
      if (paused >= options_.suspect_after) NotePause(paused);
    }
    last_tick = now;
    std::vector<MembershipChange> changes;
    membership_->Tick(now, &changes);
    const std::vector<std::string> targets =
        GossipTargets(membership_->Snapshot(), options_.node_id, options_.seeds,
                      is_self_seed, rng);
    const absl::Time calls_start = absl::Now();
    GossipTo(targets, call_timeout, &changes);
    last_calls = absl::Now() - calls_start;
    hooks_.report(changes);
    if (!changes.empty()) hooks_.table_changed();
    hooks_.after_tick();
    absl::SleepFor(options_.gossip_interval);
  }
}

}  // namespace starling
