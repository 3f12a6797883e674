// The vocabulary of the elastic round protocol (see gossip/swarm.h), shared
// by its two sides, the coordinator (round_coordinator.h) and the member
// (round_member.h): the ranges a round message's numbers must be in, who
// coordinates in a node's view, how lineages order, a plan's digest and
// when a planned member is gone. Pure functions of their inputs: no I/O, no
// clock, no state.
#ifndef STARLING_GOSSIP_ROUND_PROTOCOL_H_
#define STARLING_GOSSIP_ROUND_PROTOCOL_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/logging.h"
#include "gossip/grpc_transport.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

// A round's attempts number 1 to kAttemptsPerRound - 1 (grpc_transport.h),
// so that the mailbox sequence of (round, attempt), round *
// kAttemptsPerRound + attempt, never reaches the next round's. Only a round
// stuck for weeks (retries back off to 5 s) could run out; its coordinator
// then stops planning it and says so.
// The highest attempt a READY may say its sender has seen: the coordinator
// plans above it, and a member claiming the last attempt numbers would
// leave it none.
constexpr int kMaxClaimedAttempt = kAttemptsPerRound / 2;

// The live members of a node's table (Membership::Live()) by id.
using LiveTable = std::map<std::string, peer::v1::MemberEntry>;
LiveTable ById(const std::vector<peer::v1::MemberEntry>& live);

// A round message to send: the member id it goes to, and the message.
using Outgoing = std::pair<std::string, peer::v1::ControlMessage>;

// A log line a decision asks for: the state machines decide, their threads
// write it once no lock is held.
struct LogLine {
  LogLevel level = LogLevel::kInfo;
  std::string text;
};
// Writes `lines` in order (for the threads that drive the state machines).
void WriteLog(const std::vector<LogLine>& lines);

// Where a θ_global stands among lineages: the next round run on it, its
// hash ("": none yet) and its weight (MemberEntry.member_rounds).
struct LineageView {
  int64_t round = 0;
  absl::string_view lineage;
  int64_t member_rounds = 0;
};
// True when `a` is ahead of `b`: at a later round; or, at the same round on
// another θ_global, heavier; or, as heavy, of the smaller hash (see
// Swarm::Ahead).
bool LineageAhead(const LineageView& a, const LineageView& b);

// Whether `e` is ALIVE or SUSPECT (not yet declared DEAD, nor LEFT).
bool IsLive(const peer::v1::MemberEntry& e);

// The coordinator in a node's view: the ALIVE, non-joining member with the
// smallest id in `live` (sorted by id, as Membership::Live() is), or `self`
// when there is none.
std::string CoordinatorOf(const std::vector<peer::v1::MemberEntry>& live,
                          const std::string& self);

// A round message from `from` of `kind` for `round` (and `attempt`: 0
// leaves it unset) in run `run_id`.
peer::v1::ControlMessage RoundMessage(const std::string& run_id,
                                      const std::string& from,
                                      peer::v1::ControlMessage::Kind kind,
                                      int64_t round, int attempt = 0);

// A round message's ack: taken, or refused saying why.
peer::v1::ControlAck AcceptRound();
peer::v1::ControlAck RefuseRound(std::string reason);

// Why a round message's numbers (or its lineage) are out of the range the
// protocol produces, or "" when they are in it. A peer's number out of
// range would overflow the arithmetic on rounds and attempts (see
// kAttemptsPerRound).
std::string OutOfRange(const peer::v1::ControlMessage& m);

// The digest of a PLAN: its coordinator, round, attempt, members, their
// incarnations and its plan_secret, as every member of it computes alike
// (MailboxOptions.plan). With the secret in it, only the plan's members
// can send chunks that a member takes for the plan's.
uint64_t PlanDigest(const peer::v1::ControlMessage& plan);

// Round tokens (ControlMessage.token): a member draws one for its life and
// puts it only in the READY, DONE and FAILED it sends to coordinators, over
// calls it makes to their gossiped addresses, so nobody else sees it
// (without TLS, nobody off the path). The coordinator's PLAN, COMMIT, ABORT
// and STALE carry it back, which is how the member knows them from forged
// ones; its DONE and FAILED carry it, which is how the coordinator knows
// them. A READY's token is taken once the member proved it: the coordinator
// sends CONFIRM with a fresh nonce to the member's address, and the member
// answers RoundTokenProof(nonce, token), from which a caller that sent its
// own CONFIRM learns nothing it could forge with.
// A random nonzero 64-bit number (from OpenSSL's RAND_bytes): a token, a
// nonce or a plan secret.
uint64_t NewRoundSecret();
// The first 8 bytes, little-endian, of SHA-256 of a fixed label, `nonce`
// and `token`.
uint64_t RoundTokenProof(uint64_t nonce, uint64_t token);

// Why member `id` of an attempt can no longer take part in it, as this
// node's table shows it (`now`: its entry, nullptr when absent; `planned`:
// its incarnation in the PLAN, -1 when unknown); "" while it can. A higher
// incarnation is a restart faster than the failure detector (or a refuted
// suspicion): the old life will never report, the new one is not planned.
std::string GoneSincePlan(const std::string& id,
                          const peer::v1::MemberEntry* now, int64_t planned);

// The entry of `id` in `live`, or nullptr.
const peer::v1::MemberEntry* Find(const LiveTable& live, const std::string& id);

}  // namespace starling

#endif  // STARLING_GOSSIP_ROUND_PROTOCOL_H_
