// The join token's proofs: what a server admits (a fresh, correctly keyed
// stamp for the method called, once) and every way it refuses; the token
// file's checks; the once-a-minute refusal log; the per-host rate limit.
#include "gossip/join_auth.h"

#include <string>

#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace starling {
namespace {

constexpr char kToken[] = "0123456789abcdef-swarm";

std::shared_ptr<JoinAuth> Make(const std::string& token = kToken,
                               JoinAuthOptions o = {}) {
  auto a = JoinAuth::FromToken(token, o);
  EXPECT_TRUE(a.ok()) << a.status();
  return *a;
}

void ExpectRefused(const absl::Status& s, const std::string& why) {
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_NE(s.message().find(why), std::string::npos) << s;
}

const absl::Time kNow = absl::FromUnixSeconds(1800000000);

TEST(JoinAuthTest, AFreshStampIsAdmittedOnceAndNeverReplayed) {
  auto server = Make();
  auto client = Make();
  const std::string stamp = client->Stamp("Join", kNow);
  EXPECT_EQ(stamp.find(kToken), std::string::npos);  // never in clear
  EXPECT_TRUE(server->Verify(stamp, "Join", kNow).ok());
  ExpectRefused(server->Verify(stamp, "Join", kNow + absl::Seconds(1)),
                "replayed");
  // Two stamps of the same call differ (fresh nonces) and both pass.
  EXPECT_NE(client->Stamp("Join", kNow), client->Stamp("Join", kNow));
  EXPECT_TRUE(server->Verify(client->Stamp("Join", kNow), "Join", kNow).ok());
  EXPECT_EQ(server->refused(), 1);
}

TEST(JoinAuthTest, RefusesWrongTokensMethodsAndMalformedHeaders) {
  auto server = Make();
  ExpectRefused(
      server->Verify(Make("another-token-of-16+")->Stamp("Join", kNow), "Join",
                     kNow),
      "wrong join token");
  // A proof for one method does not open another.
  ExpectRefused(server->Verify(Make()->Stamp("Join", kNow), "Push", kNow),
                "wrong join token");
  ExpectRefused(server->Verify("", "Join", kNow), "--join_token_file");
  ExpectRefused(server->Verify("v1.1.2.3", "Join", kNow), "malformed");
  std::string stamp = Make()->Stamp("Join", kNow);
  stamp[stamp.size() - 1] = stamp.back() == '0' ? '1' : '0';  // one bit off
  ExpectRefused(server->Verify(stamp, "Join", kNow), "wrong join token");
  // The timestamp is under the HMAC: moving it breaks the proof.
  std::string moved = Make()->Stamp("Join", kNow);
  moved.replace(3, 1, moved[3] == '1' ? "2" : "1");
  ExpectRefused(server->Verify(moved, "Join", kNow), "wrong join token");
}

TEST(JoinAuthTest, StampsOutsideTheWindowAreRefused) {
  JoinAuthOptions o;
  o.window = absl::Minutes(2);
  auto server = Make(kToken, o);
  auto client = Make();
  EXPECT_TRUE(server
                  ->Verify(client->Stamp("Gossip", kNow - absl::Seconds(90)),
                           "Gossip", kNow)
                  .ok());
  ExpectRefused(server->Verify(client->Stamp("Gossip", kNow - absl::Minutes(3)),
                               "Gossip", kNow),
                "clocks out of sync");
  ExpectRefused(server->Verify(client->Stamp("Gossip", kNow + absl::Minutes(3)),
                               "Gossip", kNow),
                "clocks out of sync");
}

// With room for 3 nonces, the oldest are forgotten, but a replay of one
// is still refused: stamps at or before a forgotten one are too old.
TEST(JoinAuthTest, ForgettingNoncesNeverReopensReplays) {
  JoinAuthOptions o;
  o.max_nonces = 3;
  auto server = Make(kToken, o);
  auto client = Make();
  std::vector<std::string> stamps;
  for (int i = 0; i < 5; ++i) {
    stamps.push_back(client->Stamp("Control", kNow + absl::Milliseconds(i)));
    EXPECT_TRUE(server->Verify(stamps.back(), "Control", kNow).ok()) << i;
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(
        absl::IsUnauthenticated(server->Verify(stamps[i], "Control", kNow)))
        << i;
  }
  ExpectRefused(server->Verify(stamps[0], "Control", kNow), "older than");
}

TEST(JoinAuthTest, RefusalsAreLoggedOncePerHostPerPeriod) {
  auto a = Make();
  int64_t unlogged = -1;
  EXPECT_TRUE(a->ShouldLog("10.0.0.7", kNow, &unlogged));
  EXPECT_EQ(unlogged, 0);
  for (int i = 1; i <= 50; ++i) {
    EXPECT_FALSE(a->ShouldLog("10.0.0.7", kNow + absl::Seconds(i), &unlogged));
  }
  EXPECT_TRUE(a->ShouldLog("10.0.0.8", kNow, &unlogged));  // another host
  EXPECT_TRUE(a->ShouldLog("10.0.0.7", kNow + absl::Seconds(61), &unlogged));
  EXPECT_EQ(unlogged, 50);
}

TEST(JoinAuthTest, TokenFileIsCheckedAndTrimmed) {
  const std::string dir = ::starling::testing::TempDir();
  auto missing = JoinAuth::FromFile(dir + "/nope");
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_NE(
      missing.status().message().find("--join_token_file=" + dir + "/nope"),
      std::string::npos)
      << missing.status();
  ASSERT_TRUE(WriteFileAtomic(dir + "/short", "abc\n").ok());
  auto short_token = JoinAuth::FromFile(dir + "/short");
  EXPECT_NE(short_token.status().message().find("at least 16"),
            std::string::npos)
      << short_token.status();
  ASSERT_TRUE(WriteFileAtomic(dir + "/token", std::string(kToken) + "\n").ok());
  auto from_file = JoinAuth::FromFile(dir + "/token");
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_TRUE(
      (*from_file)->Verify(Make()->Stamp("Join", kNow), "Join", kNow).ok());
}

TEST(JoinAuthTest, PeerHostDropsTheSchemeAndPort) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.7:4242"), "10.0.0.7");
  EXPECT_EQ(PeerHost("ipv6:[::1]:4242"), "::1");
  EXPECT_EQ(PeerHost("unix:/tmp/sock"), "/tmp/sock");
  EXPECT_EQ(PeerHost("odd"), "odd");
}

TEST(PeerRateLimiterTest, BurstThenRateAndEachHostApart) {
  PeerRateLimiter limit(/*per_second=*/10, /*burst=*/20);
  int ok = 0;
  for (int i = 0; i < 50; ++i) ok += limit.Take("10.0.0.1", kNow).ok();
  EXPECT_EQ(ok, 20);  // the burst
  absl::Status s = limit.Take("10.0.0.1", kNow);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("10.0.0.1"), std::string::npos) << s;
  EXPECT_TRUE(limit.Take("10.0.0.2", kNow).ok());  // another host
  // One second later: 10 more.
  ok = 0;
  for (int i = 0; i < 50; ++i) {
    ok += limit.Take("10.0.0.1", kNow + absl::Seconds(1)).ok();
  }
  EXPECT_EQ(ok, 10);
  EXPECT_EQ(limit.refused(), 30 + 1 + 40);
}

}  // namespace
}  // namespace starling
