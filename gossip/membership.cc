#include "gossip/membership.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "core/status.h"

namespace starling {
namespace {

using peer::v1::MemberEntry;
using peer::v1::MemberState;

bool IsTerminal(MemberState s) {
  return s == peer::v1::MEMBER_DEAD || s == peer::v1::MEMBER_LEFT;
}

// ALIVE < SUSPECT < DEAD = LEFT.
int Severity(MemberState s) {
  switch (s) {
    case peer::v1::MEMBER_ALIVE:
      return 0;
    case peer::v1::MEMBER_SUSPECT:
      return 1;
    default:
      return 2;
  }
}

// Whether `e` carries newer progress than `row` at the same incarnation.
bool Fresher(const MemberEntry& e, const MemberEntry& row) {
  if (e.heartbeat() != row.heartbeat()) return e.heartbeat() > row.heartbeat();
  return e.round() > row.round();
}

void CopyProgress(const MemberEntry& from, MemberEntry* to) {
  to->set_heartbeat(from.heartbeat());
  to->set_round(from.round());
  to->set_lineage(from.lineage());
  to->set_member_rounds(from.member_rounds());
  to->set_joining(from.joining());
  to->set_early_sync(from.early_sync());
  to->set_reachability(from.reachability());
  to->set_relay(from.relay());
}

// Printable ASCII, no spaces, at most `max` bytes; `what` names the field.
absl::Status CheckToken(absl::string_view what, absl::string_view text,
                        size_t max) {
  if (text.empty())
    return absl::InvalidArgumentError(absl::StrCat("empty ", what));
  if (text.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " of ", text.size(), " bytes (at most ", max, ")"));
  }
  for (char c : text) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", QuoteForLog(text),
                       " holds a space, a control or a non-ASCII byte"));
    }
  }
  return absl::OkStatus();
}

// How far ahead of this node's clock an incarnation may be. A member's
// incarnation is its wall clock in milliseconds when it started, plus one
// per refutation, so a real one is never far ahead. A forged one is: and
// one at INT64_MAX - 1 left its member no higher incarnation to refute it
// with (Validate refuses INT64_MAX), evicting it for good, restarts too.
constexpr int64_t kMaxIncarnationLeadMs = int64_t{24} * 3600 * 1000;

absl::Status Validate(const MemberEntry& e, absl::Time now) {
  STARLING_RETURN_IF_ERROR(CheckNodeId(e.id()));
  STARLING_RETURN_IF_ERROR(CheckToken("address", e.address(), 512));
  STARLING_RETURN_IF_ERROR(CheckLineage(e.lineage()));
  if (e.state() == peer::v1::MEMBER_STATE_UNSPECIFIED ||
      !peer::v1::MemberState_IsValid(e.state())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unspecified or unknown state ", e.state()));
  }
  if (!peer::v1::Reachability_IsValid(e.reachability())) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown reachability ", e.reachability()));
  }
  if (!e.relay().empty()) {
    STARLING_RETURN_IF_ERROR(CheckToken("relay", e.relay(), 512));
  }
  if (e.incarnation() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad incarnation ", e.incarnation()));
  }
  const int64_t now_ms = absl::ToUnixMillis(now);
  if (e.incarnation() > kMaxIncarnationLeadMs &&
      e.incarnation() - kMaxIncarnationLeadMs > now_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "incarnation ", e.incarnation(),
        " is more than a day ahead of this node's clock (", now_ms,
        " ms since 1970; an incarnation is its member's start time in ms)"));
  }
  if (e.heartbeat() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative heartbeat ", e.heartbeat()));
  }
  if (e.round() < 0 || e.round() > kMaxRound) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", e.round(), " is out of range [0, ", kMaxRound, "]"));
  }
  if (e.member_rounds() < 0 || e.member_rounds() > kMaxMemberRounds) {
    return absl::InvalidArgumentError(
        absl::StrCat("member_rounds ", e.member_rounds(),
                     " is out of range [0, ", kMaxMemberRounds, "]"));
  }
  // A member asks for the sync of the round after its own.
  if (e.early_sync() < 0 || e.early_sync() > kMaxRound + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("early_sync ", e.early_sync(), " is out of range [0, ",
                     kMaxRound + 1, "]"));
  }
  return absl::OkStatus();
}

void Record(std::vector<MembershipChange>* changes, const std::string& id,
            MemberState from, MemberState to, int64_t incarnation) {
  if (changes == nullptr) return;
  MembershipChange c;
  c.id = id;
  c.from = from;
  c.to = to;
  c.incarnation = incarnation;
  changes->push_back(std::move(c));
}

}  // namespace

absl::Status CheckNodeId(absl::string_view id) {
  STARLING_RETURN_IF_ERROR(CheckToken("id", id, 128));
  if (id.find_first_of(",|@") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("id ", QuoteForLog(id), " holds ',', '|' or '@'"));
  }
  return absl::OkStatus();
}

absl::Status CheckLineage(absl::string_view lineage) {
  if (lineage.empty()) return absl::OkStatus();
  return CheckToken("lineage", lineage, 128);
}

const char* MemberStateName(peer::v1::MemberState s) {
  switch (s) {
    case peer::v1::MEMBER_ALIVE:
      return "alive";
    case peer::v1::MEMBER_SUSPECT:
      return "suspect";
    case peer::v1::MEMBER_DEAD:
      return "dead";
    case peer::v1::MEMBER_LEFT:
      return "left";
    default:
      return "unknown";
  }
}

Membership::Membership(const MembershipOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Create(
    const MembershipOptions& options, absl::Time now) {
  if (options.self_id.empty()) {
    return absl::InvalidArgumentError("membership: empty self_id");
  }
  if (options.self_address.empty()) {
    return absl::InvalidArgumentError("membership: empty self_address");
  }
  if (options.incarnation < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("membership: negative incarnation ", options.incarnation));
  }
  if (options.max_members == 0) {
    return absl::InvalidArgumentError("membership: max_members is 0");
  }
  MembershipOptions o = options;
  if (o.incarnation == 0) o.incarnation = absl::ToUnixMillis(now);
  std::unique_ptr<Membership> m(new Membership(o));
  Row self;
  self.entry.set_id(o.self_id);
  self.entry.set_address(o.self_address);
  self.entry.set_incarnation(o.incarnation);
  self.entry.set_state(peer::v1::MEMBER_ALIVE);
  self.last_rise = now;
  {
    absl::MutexLock lock(&m->mu_);
    m->rows_.push_back(std::move(self));
  }
  return m;
}

Membership::Row* Membership::FindLocked(const std::string& id) {
  auto it = std::lower_bound(
      rows_.begin(), rows_.end(), id,
      [](const Row& r, const std::string& k) { return r.entry.id() < k; });
  return it != rows_.end() && it->entry.id() == id ? &*it : nullptr;
}

const Membership::Row* Membership::FindLocked(const std::string& id) const {
  auto it = std::lower_bound(
      rows_.begin(), rows_.end(), id,
      [](const Row& r, const std::string& k) { return r.entry.id() < k; });
  return it != rows_.end() && it->entry.id() == id ? &*it : nullptr;
}

Membership::Row& Membership::SelfLocked() {
  return *FindLocked(options_.self_id);  // always present
}

void Membership::Beat() {
  absl::MutexLock lock(&mu_);
  MemberEntry& self = SelfLocked().entry;
  self.set_heartbeat(self.heartbeat() + 1);
}

void Membership::SetProgress(int64_t round, const std::string& lineage,
                             int64_t member_rounds, bool joining) {
  absl::MutexLock lock(&mu_);
  MemberEntry& self = SelfLocked().entry;
  if (self.round() == round && self.lineage() == lineage &&
      self.member_rounds() == member_rounds && self.joining() == joining) {
    return;
  }
  self.set_round(round);
  self.set_lineage(lineage);
  self.set_member_rounds(member_rounds);
  self.set_joining(joining);
  // News: fresher than any copy of the row out there, even before the next
  // Beat() (GossipToEveryone sends it at once).
  self.set_heartbeat(self.heartbeat() + 1);
}

void Membership::SetReachability(peer::v1::Reachability r) {
  absl::MutexLock lock(&mu_);
  MemberEntry& self = SelfLocked().entry;
  if (self.reachability() == r) return;
  self.set_reachability(r);
  self.set_heartbeat(self.heartbeat() + 1);  // news, as in SetProgress
}

void Membership::SetRelay(const std::string& relay) {
  absl::MutexLock lock(&mu_);
  MemberEntry& self = SelfLocked().entry;
  if (self.relay() == relay) return;
  self.set_relay(relay);
  self.set_heartbeat(self.heartbeat() + 1);  // news, as in SetProgress
}

void Membership::RequestEarlySync(int64_t round) {
  absl::MutexLock lock(&mu_);
  SelfLocked().entry.set_early_sync(round + 1);
}

void Membership::Leave() {
  absl::MutexLock lock(&mu_);
  MemberEntry& self = SelfLocked().entry;
  self.set_state(peer::v1::MEMBER_LEFT);
  // A fresher heartbeat, so that the LEFT entry also carries this node's
  // last progress (round, joining) to peers that have not heard it yet.
  self.set_heartbeat(self.heartbeat() + 1);
}

absl::Status Membership::Merge(const std::vector<MemberEntry>& entries,
                               absl::Time now,
                               std::vector<MembershipChange>* changes) {
  absl::Status first;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < entries.size(); ++i) {
    const MemberEntry& e = entries[i];
    absl::Status s = Validate(e, now);
    if (!s.ok()) {
      if (first.ok()) {
        first = absl::InvalidArgumentError(
            absl::StrCat("membership: entry ", i, " (id ", QuoteForLog(e.id()),
                         "): ", s.message()));
      }
      continue;
    }
    s = MergeOneLocked(e, now, changes);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::Status Membership::AddLocked(const MemberEntry& e, absl::Time now,
                                   std::vector<MembershipChange>* changes) {
  auto evicted = std::find_if(evicted_.begin(), evicted_.end(),
                              [&](const std::pair<std::string, int64_t>& t) {
                                return t.first == e.id();
                              });
  if (evicted != evicted_.end()) {
    if (e.incarnation() <= evicted->second) return absl::OkStatus();  // stale
    evicted_.erase(evicted);  // a new life of that member
  }
  if (rows_.size() >= options_.max_members) {
    // Full: a tombstone of a stranger guards nothing here, and a live
    // newcomer takes the place of the oldest tombstone, if there is one.
    if (IsTerminal(e.state())) return absl::OkStatus();
    auto oldest = rows_.end();
    for (auto r = rows_.begin(); r != rows_.end(); ++r) {
      if (IsTerminal(r->entry.state()) && r->entry.id() != options_.self_id &&
          (oldest == rows_.end() || r->last_rise < oldest->last_rise)) {
        oldest = r;
      }
    }
    if (oldest == rows_.end()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("membership: the table is full (", rows_.size(),
                       " members, none dead or left); ", QuoteForLog(e.id()),
                       " is not admitted"));
    }
    if (evicted_.size() >= options_.max_members) evicted_.pop_front();
    evicted_.emplace_back(oldest->entry.id(), oldest->entry.incarnation());
    rows_.erase(oldest);
  }
  Row row;
  row.entry = e;
  row.last_rise = now;
  rows_.insert(std::lower_bound(rows_.begin(), rows_.end(), e.id(),
                                [](const Row& r, const std::string& k) {
                                  return r.entry.id() < k;
                                }),
               std::move(row));
  Record(changes, e.id(), peer::v1::MEMBER_STATE_UNSPECIFIED, e.state(),
         e.incarnation());
  return absl::OkStatus();
}

absl::Status Membership::MergeOneLocked(
    const MemberEntry& e, absl::Time now,
    std::vector<MembershipChange>* changes) {
  Row* found = FindLocked(e.id());
  if (found == nullptr) return AddLocked(e, now, changes);
  Row& row = *found;
  MemberEntry& cur = row.entry;

  if (e.id() == options_.self_id) {
    // Gossip never edits this node's row; it can only make it refute a
    // rumour (or an entry from an earlier life with a higher incarnation).
    if (cur.state() == peer::v1::MEMBER_LEFT) return absl::OkStatus();
    const bool refute = e.incarnation() > cur.incarnation() ||
                        (e.incarnation() == cur.incarnation() &&
                         e.state() != peer::v1::MEMBER_ALIVE);
    if (!refute) return absl::OkStatus();
    // Validate keeps incarnations far from INT64_MAX.
    cur.set_incarnation(e.incarnation() + 1);
    Record(changes, e.id(), e.state(), peer::v1::MEMBER_ALIVE,
           cur.incarnation());
    return absl::OkStatus();
  }

  if (e.incarnation() < cur.incarnation()) return absl::OkStatus();  // stale
  if (e.incarnation() > cur.incarnation()) {
    const MemberState from = cur.state();
    cur = e;
    row.last_rise = now;
    row.suspected_locally = false;
    Record(changes, e.id(), from, e.state(), e.incarnation());
    return absl::OkStatus();
  }

  // Same incarnation. Tombstones are final.
  if (IsTerminal(cur.state())) return absl::OkStatus();
  const bool fresher = Fresher(e, cur);
  if (fresher) {
    CopyProgress(e, &cur);
    row.last_rise = now;
  }
  const MemberState from = cur.state();
  if (Severity(e.state()) > Severity(from)) {
    cur.set_state(e.state());
    row.suspected_locally = false;
    row.last_rise = now;  // the next stage's timer starts now
    Record(changes, e.id(), from, e.state(), cur.incarnation());
  } else if (from == peer::v1::MEMBER_SUSPECT) {
    if (e.state() == peer::v1::MEMBER_SUSPECT) {
      // Others suspect it too: only a new incarnation refutes that now.
      row.suspected_locally = false;
    } else if (row.suspected_locally && fresher) {
      // Our own detector was wrong: its heartbeat rose.
      cur.set_state(peer::v1::MEMBER_ALIVE);
      row.suspected_locally = false;
      Record(changes, e.id(), from, peer::v1::MEMBER_ALIVE, cur.incarnation());
    }
  }
  return absl::OkStatus();
}

void Membership::Tick(absl::Time now, std::vector<MembershipChange>* changes) {
  absl::MutexLock lock(&mu_);
  for (Row& row : rows_) {
    MemberEntry& e = row.entry;
    if (e.id() == options_.self_id) continue;
    if (now - row.last_rise < options_.suspect_after) continue;
    if (e.state() == peer::v1::MEMBER_ALIVE) {
      e.set_state(peer::v1::MEMBER_SUSPECT);
      row.suspected_locally = true;
      row.last_rise = now;
      Record(changes, e.id(), peer::v1::MEMBER_ALIVE, peer::v1::MEMBER_SUSPECT,
             e.incarnation());
    } else if (e.state() == peer::v1::MEMBER_SUSPECT) {
      e.set_state(peer::v1::MEMBER_DEAD);
      row.suspected_locally = false;
      row.last_rise = now;
      Record(changes, e.id(), peer::v1::MEMBER_SUSPECT, peer::v1::MEMBER_DEAD,
             e.incarnation());
    }
  }
}

void Membership::ForgivePause(absl::Duration paused, absl::Time now) {
  if (paused <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  for (Row& row : rows_) {
    if (row.entry.id() == options_.self_id) continue;
    row.last_rise = std::min(row.last_rise + paused, now);
  }
}

std::vector<MemberEntry> Membership::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<MemberEntry> out;
  out.reserve(rows_.size());
  for (const Row& row : rows_) out.push_back(row.entry);
  return out;
}

absl::StatusOr<std::pair<std::string, std::string>> Membership::RelayedAt(
    const std::string& address) const {
  absl::MutexLock lock(&mu_);
  for (const Row& row : rows_) {
    const MemberEntry& e = row.entry;
    if (e.address() == address && e.id() != options_.self_id &&
        e.reachability() == peer::v1::REACHABILITY_UNREACHABLE &&
        !e.relay().empty()) {
      return std::make_pair(e.id(), e.relay());
    }
  }
  return absl::NotFoundError(absl::StrCat("no relayed member at ", address));
}

std::vector<MemberEntry> Membership::Live() const {
  absl::MutexLock lock(&mu_);
  std::vector<MemberEntry> out;
  for (const Row& row : rows_) {
    if (!IsTerminal(row.entry.state())) out.push_back(row.entry);
  }
  return out;
}

absl::StatusOr<MemberEntry> Membership::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  const Row* row = FindLocked(id);
  if (row == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("membership: no member \"", id, "\""));
  }
  return row->entry;
}

}  // namespace starling
