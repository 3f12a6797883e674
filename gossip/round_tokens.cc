#include "gossip/round_tokens.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/logging.h"

namespace starling {

using peer::v1::ControlMessage;

RoundTokens::RoundTokens(std::string self_id, std::string run_id,
                         std::function<uint64_t()> nonce)
    : self_id_(std::move(self_id)),
      run_id_(std::move(run_id)),
      nonce_(std::move(nonce)) {}

RoundTokens::Decision RoundTokens::OnReady(const ControlMessage& ready,
                                           int64_t incarnation,
                                           absl::Time now) {
  Decision d;
  const std::string& id = ready.from();
  if (ready.token() == 0) {
    d.reason = absl::StrCat("a READY from ", QuoteForLog(id),
                            " carries no round token");
    return d;
  }
  Member& m = members_[id];
  if (ready.token() == m.token ||
      (m.proof.has_value() &&
       RoundTokenProof(m.nonce, ready.token()) == *m.proof)) {
    m.token = ready.token();
    d.verdict = Verdict::kTaken;
    return d;
  }
  // Not the token the member proved last: a member that restarted (a new
  // token), or someone else under its id. Only the member can tell.
  const bool may_ask =
      incarnation != m.incarnation || now - m.asked_at >= kReaskAfter;
  if (!m.asking && !may_ask) {
    d.reason = absl::StrCat("a READY from ", QuoteForLog(id),
                            " does not carry the round token it proved");
    return d;
  }
  m.held = ready;
  if (m.asking) {
    d.verdict = Verdict::kHeld;
    return d;
  }
  m.asking = true;
  m.asked_at = now;
  m.incarnation = incarnation;
  m.nonce = nonce_();
  ControlMessage ask =
      RoundMessage(run_id_, self_id_, ControlMessage::CONFIRM, ready.round());
  ask.set_nonce(m.nonce);
  d.verdict = Verdict::kAsk;
  d.ask = {id, std::move(ask)};
  return d;
}

std::optional<ControlMessage> RoundTokens::OnProof(
    const Outgoing& ask, std::optional<uint64_t> proof) {
  auto it = members_.find(ask.first);
  if (it == members_.end() || it->second.nonce != ask.second.nonce()) {
    return std::nullopt;  // forgotten, or an older question
  }
  Member& m = it->second;
  m.asking = false;
  std::optional<ControlMessage> held = std::move(m.held);
  m.held.reset();
  if (!proof.has_value()) return std::nullopt;  // it resends its READY
  m.proof = proof;
  if (!held.has_value() || RoundTokenProof(m.nonce, held->token()) != *proof) {
    return std::nullopt;
  }
  m.token = held->token();
  return held;
}

bool RoundTokens::Carries(const ControlMessage& m) const {
  return m.token() != 0 && TokenOf(m.from()) == m.token();
}

uint64_t RoundTokens::TokenOf(const std::string& id) const {
  auto it = members_.find(id);
  return it == members_.end() ? 0 : it->second.token;
}

void RoundTokens::Prune(const LiveTable& live) {
  for (auto it = members_.begin(); it != members_.end();) {
    it = live.count(it->first) ? std::next(it) : members_.erase(it);
  }
}

}  // namespace starling
