// The coordinator's round tokens (RoundTokens) on a fake clock, with the
// members' answers computed here: a READY counts once its member proved its
// token; READYs forged under a member's id are refused, cost that member at
// most one question every kReaskAfter, and never displace its token; a
// member that restarted proves its new token at once.
#include "gossip/round_tokens.h"

#include <memory>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "tests/gossip/test_members.h"

namespace starling {
namespace {

using peer::v1::ControlMessage;
using K = peer::v1::ControlMessage;
using Verdict = RoundTokens::Verdict;

constexpr uint64_t kToken = 0x5eed;  // n1's real token

ControlMessage Ready(uint64_t token, const std::string& from = "n1") {
  ControlMessage m = RoundMessage("run", from, K::READY, 4);
  m.set_token(token);
  return m;
}

// Nonces 1, 2, 3, ...
RoundTokens Tokens() {
  auto next = std::make_shared<uint64_t>(0);
  return RoundTokens("n0", "run", [next] { return ++*next; });
}

// n1's answer to `ask`: the proof of its token `token`.
std::optional<uint64_t> Answer(const Outgoing& ask, uint64_t token = kToken) {
  return RoundTokenProof(ask.second.nonce(), token);
}

TEST(RoundTokensTest, AReadyCountsOnceItsMemberProvedItsToken) {
  RoundTokens t = Tokens();
  RoundTokens::Decision d = t.OnReady(Ready(kToken), 1, T(0));
  ASSERT_EQ(d.verdict, Verdict::kAsk);
  EXPECT_EQ(d.ask.first, "n1");
  EXPECT_EQ(d.ask.second.kind(), K::CONFIRM);
  EXPECT_EQ(d.ask.second.from(), "n0");
  EXPECT_EQ(d.ask.second.nonce(), 1u);
  EXPECT_EQ(t.TokenOf("n1"), 0u);
  std::optional<ControlMessage> taken = t.OnProof(d.ask, Answer(d.ask));
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->token(), kToken);
  EXPECT_EQ(t.TokenOf("n1"), kToken);
  // Its next READYs (every round) need no question.
  EXPECT_EQ(t.OnReady(Ready(kToken), 1, T(1)).verdict, Verdict::kTaken);
  EXPECT_EQ(t.OnReady(Ready(kToken), 1, T(100)).verdict, Verdict::kTaken);

  // DONE and FAILED count with that token only.
  ControlMessage done = RoundMessage("run", "n1", K::DONE, 4, 1);
  EXPECT_FALSE(t.Carries(done));
  done.set_token(kToken + 1);
  EXPECT_FALSE(t.Carries(done));
  done.set_token(kToken);
  EXPECT_TRUE(t.Carries(done));
  done.set_from("n2");
  EXPECT_FALSE(t.Carries(done));

  // A READY without a token is refused outright.
  d = t.OnReady(Ready(0), 1, T(101));
  EXPECT_EQ(d.verdict, Verdict::kRefused);
  EXPECT_EQ(d.reason, "a READY from \"n1\" carries no round token");
}

TEST(RoundTokensTest, ForgedReadiesAreRefusedAndCostOneQuestionPerInterval) {
  RoundTokens t = Tokens();
  RoundTokens::Decision first = t.OnReady(Ready(kToken), 1, T(0));
  ASSERT_TRUE(t.OnProof(first.ask, Answer(first.ask)).has_value());
  // A burst of forged READYs under n1's id within kReaskAfter of the last
  // question: refused, and nobody is asked.
  for (int i = 0; i < 1000; ++i) {
    RoundTokens::Decision d = t.OnReady(Ready(1000 + i), 1, T(1));
    ASSERT_EQ(d.verdict, Verdict::kRefused) << i;
    EXPECT_EQ(d.reason,
              "a READY from \"n1\" does not carry the round token it proved");
  }
  // After kReaskAfter one of them asks n1 again (it might have a new
  // token); n1's answer proves its old one, so the forged READY stays out.
  RoundTokens::Decision d = t.OnReady(Ready(77), 1, T(2));
  ASSERT_EQ(d.verdict, Verdict::kAsk);
  EXPECT_EQ(t.OnReady(Ready(78), 1, T(2.1)).verdict, Verdict::kHeld);
  EXPECT_FALSE(t.OnProof(d.ask, Answer(d.ask)).has_value());
  EXPECT_EQ(t.TokenOf("n1"), kToken);
  EXPECT_EQ(t.OnReady(Ready(79), 1, T(2.2)).verdict, Verdict::kRefused);
  // n1's own READY still counts at once.
  EXPECT_EQ(t.OnReady(Ready(kToken), 1, T(2.3)).verdict, Verdict::kTaken);
}

TEST(RoundTokensTest, AForgedReadyThatDisplacesAHeldOneCostsOneResend) {
  RoundTokens t = Tokens();
  // The forger's READY comes first and asks; n1's own is held in its
  // place, then the forger's displaces it again.
  RoundTokens::Decision d = t.OnReady(Ready(99), 1, T(0));
  ASSERT_EQ(d.verdict, Verdict::kAsk);
  EXPECT_EQ(t.OnReady(Ready(kToken), 1, T(0)).verdict, Verdict::kHeld);
  EXPECT_EQ(t.OnReady(Ready(98), 1, T(0)).verdict, Verdict::kHeld);
  EXPECT_FALSE(t.OnProof(d.ask, Answer(d.ask)).has_value());
  EXPECT_EQ(t.TokenOf("n1"), 0u);
  // n1 sends READY again (every 2 s while no plan comes): the proof it gave
  // takes it without another question.
  EXPECT_EQ(t.OnReady(Ready(kToken), 1, T(2)).verdict, Verdict::kTaken);
  EXPECT_EQ(t.TokenOf("n1"), kToken);
}

TEST(RoundTokensTest, AMemberThatRestartedProvesItsNewTokenAtOnce) {
  RoundTokens t = Tokens();
  RoundTokens::Decision d = t.OnReady(Ready(kToken), 1, T(0));
  ASSERT_TRUE(t.OnProof(d.ask, Answer(d.ask)).has_value());
  // Same incarnation, new token, within kReaskAfter: refused.
  EXPECT_EQ(t.OnReady(Ready(kToken + 1), 1, T(0.5)).verdict, Verdict::kRefused);
  // Its table entry shows a new incarnation: asked at once.
  d = t.OnReady(Ready(kToken + 1), 2, T(0.6));
  ASSERT_EQ(d.verdict, Verdict::kAsk);
  ASSERT_TRUE(t.OnProof(d.ask, Answer(d.ask, kToken + 1)).has_value());
  EXPECT_EQ(t.TokenOf("n1"), kToken + 1);
}

TEST(RoundTokensTest, AnUnansweredQuestionIsNotAskedAgainAtOnce) {
  RoundTokens t = Tokens();
  RoundTokens::Decision d = t.OnReady(Ready(kToken), 1, T(0));
  ASSERT_EQ(d.verdict, Verdict::kAsk);
  // A stale answer (another nonce) changes nothing.
  Outgoing other = d.ask;
  other.second.set_nonce(12345);
  EXPECT_FALSE(t.OnProof(other, Answer(other)).has_value());
  EXPECT_EQ(t.OnReady(Ready(kToken), 1, T(0.1)).verdict, Verdict::kHeld);
  // n1 cannot be reached: the held READY is dropped, and READYs under its
  // id ask again only after kReaskAfter (a forger cannot make this node
  // call an address that does not answer more often than that).
  EXPECT_FALSE(t.OnProof(d.ask, std::nullopt).has_value());
  EXPECT_EQ(t.OnReady(Ready(kToken), 1, T(1)).verdict, Verdict::kRefused);
  d = t.OnReady(Ready(kToken), 1, T(2));
  ASSERT_EQ(d.verdict, Verdict::kAsk);
  EXPECT_TRUE(t.OnProof(d.ask, Answer(d.ask)).has_value());
}

TEST(RoundTokensTest, MembersGoneFromTheTableAreForgotten) {
  RoundTokens t = Tokens();
  RoundTokens::Decision d = t.OnReady(Ready(kToken), 1, T(0));
  ASSERT_TRUE(t.OnProof(d.ask, Answer(d.ask)).has_value());
  t.Prune(ById({TestMember("n0", peer::v1::MEMBER_ALIVE, 1, 4)}));
  EXPECT_EQ(t.TokenOf("n1"), 0u);
}

TEST(RoundTokenProofTest, DependsOnNonceAndToken) {
  EXPECT_EQ(RoundTokenProof(1, 2), RoundTokenProof(1, 2));
  EXPECT_NE(RoundTokenProof(1, 2), RoundTokenProof(2, 2));
  EXPECT_NE(RoundTokenProof(1, 2), RoundTokenProof(1, 3));
  EXPECT_NE(NewRoundSecret(), 0u);
  EXPECT_NE(NewRoundSecret(), NewRoundSecret());
}

}  // namespace
}  // namespace starling
