#include "gossip/round_protocol.h"

#include <openssl/rand.h>
#include <openssl/sha.h>

#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/flat_params.h"
#include "gossip/membership.h"

namespace starling {

using peer::v1::ControlMessage;
using peer::v1::MemberEntry;

static_assert(kMaxRound <=
                  std::numeric_limits<int64_t>::max() / kAttemptsPerRound - 1,
              "round * kAttemptsPerRound + attempt must fit an int64");

LiveTable ById(const std::vector<MemberEntry>& live) {
  LiveTable table;
  for (const MemberEntry& e : live) table[e.id()] = e;
  return table;
}

void WriteLog(const std::vector<LogLine>& lines) {
  for (const LogLine& line : lines) {
    LogMessage(line.level, __FILE__, __LINE__).stream() << line.text;
  }
}

bool LineageAhead(const LineageView& a, const LineageView& b) {
  if (a.round != b.round) return a.round > b.round;
  // One θ_global is one lineage, whatever weight a member claims for it;
  // and a member with none yet (starting) is on no other.
  if (a.lineage.empty() || b.lineage.empty() || a.lineage == b.lineage) {
    return false;
  }
  if (a.member_rounds != b.member_rounds) {
    return a.member_rounds > b.member_rounds;
  }
  return a.lineage < b.lineage;
}

bool IsLive(const MemberEntry& e) {
  return e.state() == peer::v1::MEMBER_ALIVE ||
         e.state() == peer::v1::MEMBER_SUSPECT;
}

std::string CoordinatorOf(const std::vector<MemberEntry>& live,
                          const std::string& self) {
  for (const MemberEntry& e : live) {
    if (e.state() == peer::v1::MEMBER_ALIVE && !e.joining()) return e.id();
  }
  return self;
}

ControlMessage RoundMessage(const std::string& run_id, const std::string& from,
                            ControlMessage::Kind kind, int64_t round,
                            int attempt) {
  ControlMessage m;
  m.set_run_id(run_id);
  m.set_from(from);
  m.set_kind(kind);
  m.set_round(round);
  m.set_attempt(attempt);
  return m;
}

peer::v1::ControlAck AcceptRound() {
  peer::v1::ControlAck ack;
  ack.set_accepted(true);
  return ack;
}

peer::v1::ControlAck RefuseRound(std::string reason) {
  peer::v1::ControlAck ack;
  ack.set_accepted(false);
  ack.set_reason(std::move(reason));
  return ack;
}

std::string OutOfRange(const ControlMessage& m) {
  if (m.round() < 0 || m.round() > kMaxRound) {
    return absl::StrCat("round ", m.round(), " is out of range [0, ", kMaxRound,
                        "]");
  }
  if (m.attempt() < 0 || m.attempt() >= kAttemptsPerRound) {
    return absl::StrCat("attempt ", m.attempt(), " is out of range [0, ",
                        kAttemptsPerRound - 1, "]");
  }
  if (m.last_attempt() < 0 || m.last_attempt() > kMaxClaimedAttempt) {
    return absl::StrCat("last_attempt ", m.last_attempt(),
                        " is out of range [0, ", kMaxClaimedAttempt, "]");
  }
  // The coordinator puts a READY's lineage into every plan of the round.
  if (absl::Status s = CheckLineage(m.lineage()); !s.ok()) {
    return std::string(s.message());
  }
  if (m.member_rounds() < 0 || m.member_rounds() > kMaxMemberRounds) {
    return absl::StrCat("member_rounds ", m.member_rounds(),
                        " is out of range [0, ", kMaxMemberRounds, "]");
  }
  return "";
}

uint64_t PlanDigest(const ControlMessage& plan) {
  std::string text =
      absl::StrCat(plan.from(), "\n", plan.round(), "\n", plan.attempt());
  for (int i = 0; i < plan.members_size(); ++i) {
    absl::StrAppend(&text, "\n", plan.members(i), "@",
                    i < plan.incarnations_size() ? plan.incarnations(i) : -1);
  }
  absl::StrAppend(&text, "\n", plan.plan_secret());
  return HashBytes(text.data(), text.size());
}

uint64_t NewRoundSecret() {
  uint64_t x = 0;
  while (x == 0) {
    unsigned char raw[8];
    // RAND_bytes fails only when OpenSSL cannot seed itself at all; the
    // fallback is still unpredictable to a peer.
    if (RAND_bytes(raw, sizeof(raw)) != 1) {
      std::random_device device;
      x = (uint64_t{device()} << 32) ^ device();
      continue;
    }
    for (int i = 7; i >= 0; --i) x = (x << 8) | raw[i];
  }
  return x;
}

uint64_t RoundTokenProof(uint64_t nonce, uint64_t token) {
  constexpr char kLabel[] = "starling round token proof";
  unsigned char in[sizeof(kLabel) + 16];
  std::memcpy(in, kLabel, sizeof(kLabel));
  for (int i = 0; i < 8; ++i) {
    in[sizeof(kLabel) + i] = static_cast<unsigned char>(nonce >> (8 * i));
    in[sizeof(kLabel) + 8 + i] = static_cast<unsigned char>(token >> (8 * i));
  }
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(in, sizeof(in), out);
  uint64_t proof = 0;
  for (int i = 7; i >= 0; --i) proof = (proof << 8) | out[i];
  return proof;
}

std::string GoneSincePlan(const std::string& id, const MemberEntry* now,
                          int64_t planned) {
  if (now == nullptr || now->state() != peer::v1::MEMBER_ALIVE) {
    return absl::StrCat(id, " is no longer alive");
  }
  if (planned >= 0 && now->incarnation() > planned) {
    return absl::StrCat(id, " came back at a new incarnation (it restarted)");
  }
  return "";
}

const MemberEntry* Find(const LiveTable& live, const std::string& id) {
  auto it = live.find(id);
  return it == live.end() ? nullptr : &it->second;
}

}  // namespace starling
