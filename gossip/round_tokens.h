// The coordinator's side of the round tokens (see RoundTokenProof in
// round_protocol.h): which token each member's READY proved, so that only
// READYs, DONEs and FAILEDs that carry it count, and the coordinator's
// messages to the member carry it back. A state machine with no I/O and no
// clock, fed by the coordinator thread.
//
// A READY whose token this member has not proved yet is held (one per
// member, the latest) while the coordinator asks the member, at the address
// in its table, to prove its token (CONFIRM with a fresh nonce). The
// member's answer is kept: later READYs with the same token are taken at
// once, and READYs with another token are refused without a new question
// until the member's incarnation changes (it restarted) or kReaskAfter has
// passed since the last question (answered or not). So a caller that forges
// READYs under a member's id costs that member at most one CONFIRM every
// kReaskAfter, and never moves the coordinator, gets anyone a STALE or takes
// anyone's place in a plan. Not thread-safe: its owner serializes every call (a
// mutex).
#ifndef STARLING_GOSSIP_ROUND_TOKENS_H_
#define STARLING_GOSSIP_ROUND_TOKENS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "gossip/round_protocol.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

// How long a member's proof answers for READYs with other tokens.
constexpr absl::Duration kReaskAfter = absl::Seconds(2);

class RoundTokens {
 public:
  // `self_id` and `run_id` for the CONFIRMs it asks; `nonce` draws their
  // nonces (NewRoundSecret; a test's own).
  RoundTokens(std::string self_id, std::string run_id,
              std::function<uint64_t()> nonce);

  enum class Verdict {
    kTaken,    // carries the member's proved token: hand it on
    kAsk,      // held; send `ask` (a CONFIRM) to the member
    kHeld,     // held; a question to the member is on its way
    kRefused,  // `reason`
  };
  struct Decision {
    Verdict verdict = Verdict::kRefused;
    Outgoing ask;        // kAsk
    std::string reason;  // kRefused
  };
  // A READY (its sender a member whose table incarnation is `incarnation`)
  // at `now`.
  Decision OnReady(const peer::v1::ControlMessage& ready, int64_t incarnation,
                   absl::Time now);
  // The member's answer to `ask` (as OnReady made it): its proof, or
  // nullopt when it refused or could not be reached. The READY held for it
  // when that READY's token is the one proved (to hand on now), else
  // nullopt.
  std::optional<peer::v1::ControlMessage> OnProof(
      const Outgoing& ask, std::optional<uint64_t> proof);

  // Whether DONE or FAILED `m` carries its sender's proved token.
  bool Carries(const peer::v1::ControlMessage& m) const;
  // The proved token of member `id` (0: none), for the messages to it.
  uint64_t TokenOf(const std::string& id) const;
  // Forgets the members that are not in `live`.
  void Prune(const LiveTable& live);

 private:
  struct Member {
    uint64_t token = 0;  // proved
    // The last answer: the nonce asked and the proof, and the member's
    // incarnation when asked.
    uint64_t nonce = 0;
    std::optional<uint64_t> proof;
    int64_t incarnation = -1;
    bool asking = false;
    absl::Time asked_at = absl::InfinitePast();
    std::optional<peer::v1::ControlMessage> held;
  };

  const std::string self_id_;
  const std::string run_id_;
  const std::function<uint64_t()> nonce_;
  std::map<std::string, Member> members_;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_ROUND_TOKENS_H_
