// Integration tests of members that peers cannot dial at their --listen
// address, on real `starling node` processes over loopback: a member behind
// a port forward (--advertise), dialed back at its join; members that
// advertise a port where nothing listens (as a member behind NAT is, to
// anyone outside), who train through relays (--relay).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/node_group.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"
#include "tests/harness/tcp_forward.h"
#include "tests/harness/wait.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::NodeGroup;
using ::starling::testing::ReadJson;
using ::starling::testing::TcpForward;
using ::starling::testing::TinyTextFlags;

// A loopback port bound but not listening, held for the test's life: a
// connection to it is refused, as NAT refuses (or drops) one from outside.
class ClosedPort {
 public:
  ClosedPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~ClosedPort() { ::close(fd_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

std::string CommonFlags(const std::string& run_id) {
  return absl::StrCat(TinyTextFlags(60000),
                      " --steps=20 --inner_steps=5 --shard_mode=contiguous"
                      " --threads=1 --eval_every=0 --suspect_timeout=2"
                      " --round_deadline=20 --insecure --run_id=",
                      run_id);
}

// n1 listens on a port of its own and advertises a forwarded one, as a
// node behind a router's port forward does. The two train together, and
// n0 reaches n1 only through the forward (whose connections are counted).
TEST(NatTest, MemberBehindAPortForwardIsDialedThere) {
  NodeGroup g("advertise", CommonFlags("advertise"));
  TcpForward forward;
  ASSERT_GT(forward.port(), 0);
  g.Start("n0", "--min_members=2 --shard=0/2");
  g.Start("n1",
          absl::StrCat("--min_members=2 --shard=1/2 --advertise=",
                       forward.address()),
          "n0");
  // "listening on BOUND, advertised as FORWARD": Address() is the bound one.
  const std::string bound = g.Address("n1");
  ASSERT_FALSE(bound.empty());
  EXPECT_NE(bound, forward.address());
  EXPECT_NE(g.LogText("n1").find("advertised as " + forward.address()),
            std::string::npos)
      << g.LogText("n1");
  forward.SetTarget(bound);
  ASSERT_EQ(g.Wait("n0"), 0) << g.LogText("n0");
  ASSERT_EQ(g.Wait("n1"), 0) << g.LogText("n1");
  EXPECT_EQ(g.FinalHash("n0"), g.FinalHash("n1"));
  EXPECT_EQ(g.RoundHashes("n0"), g.RoundHashes("n1"));
  EXPECT_GT(forward.connections(), 0);
  EXPECT_GT(forward.bytes(), 0);
  // n0 dialed n1 back at its join, through the forward; n1 reached the
  // founder n0 at its address, and told it so.
  const auto n0 = ReadJson(g.Out("n0") + "/summary.json");
  const auto n1 = ReadJson(g.Out("n1") + "/summary.json");
  EXPECT_EQ(Field(n1, "reachability").string_value(), "reachable");
  EXPECT_EQ(Field(n0, "reachability").string_value(), "reachable");
  const auto& seen = Field(n0, "members_reachability").struct_value();
  EXPECT_EQ(Field(seen, "n1").string_value(), "reachable");
  EXPECT_EQ(Field(seen, "n0").string_value(), "reachable");
}

// Members of every round, from node `id`'s round events.
std::vector<int> RoundSizes(const NodeGroup& g, const std::string& id) {
  std::vector<int> sizes;
  for (const auto& ev : g.Events(id, "round")) {
    sizes.push_back(Field(ev, "members").list_value().values_size());
  }
  return sizes;
}

// n2 and n3 advertise ports where nothing listens: the dial-back at their
// join finds them unreachable, each attaches to a reachable member, and
// all four train every round together, with the peers' traffic to n2 and
// n3 (ring segments, round messages, gossip) going through the relays.
TEST(NatTest, MembersNobodyCanDialTrainThroughRelays) {
  NodeGroup g("relay", CommonFlags("relay"));
  ClosedPort c2, c3;
  ASSERT_GT(c2.port(), 0);
  ASSERT_GT(c3.port(), 0);
  g.Start("n0", "--min_members=4 --shard=0/4");
  g.Start("n1", "--min_members=4 --shard=1/4", "n0");
  // One after the other, as members come in practice: each sees who
  // relays through whom, and the load spreads.
  ASSERT_TRUE(testing::WaitForText(g.Log("n1"), "back at", absl::Seconds(60)))
      << g.LogText("n1");
  g.Start("n2", "--min_members=4 --shard=2/4 --advertise=" + c2.address(),
          "n0");
  ASSERT_TRUE(
      testing::WaitForText(g.Log("n2"), "attached to relay", absl::Seconds(60)))
      << g.LogText("n2");
  g.Start("n3", "--min_members=4 --shard=3/4 --advertise=" + c3.address(),
          "n0");
  for (const char* id : {"n0", "n1", "n2", "n3"}) {
    ASSERT_EQ(g.Wait(id), 0) << g.LogText(id);
  }
  for (const char* id : {"n1", "n2", "n3"}) {
    EXPECT_EQ(g.FinalHash(id), g.FinalHash("n0")) << id;
    EXPECT_EQ(g.RoundHashes(id), g.RoundHashes("n0")) << id;
  }
  const std::vector<int> sizes = RoundSizes(g, "n2");
  ASSERT_EQ(sizes.size(), 4u);
  for (int n : sizes) EXPECT_EQ(n, 4);
  const std::set<std::string> publics = {g.Address("n0"), g.Address("n1")};
  std::set<std::string> relays;
  for (const char* id : {"n2", "n3"}) {
    const auto s = ReadJson(g.Out(id) + "/summary.json");
    EXPECT_EQ(Field(s, "reachability").string_value(), "unreachable") << id;
    const std::string relay = Field(s, "relay").string_value();
    EXPECT_EQ(publics.count(relay), 1u) << id << " relay " << relay;
    relays.insert(relay);
    EXPECT_GT(Field(s, "relayed_bytes").number_value(), 0) << id;
    EXPECT_EQ(Field(s, "relays_lost").number_value(), 0) << id;
  }
  // The relays spread: each public member carries one NATed member.
  EXPECT_EQ(relays.size(), 2u);
  double forwarded = 0;
  std::set<std::string> carried;
  for (const char* id : {"n0", "n1"}) {
    const auto s = ReadJson(g.Out(id) + "/summary.json");
    forwarded += Field(s, "relay_forwarded_bytes").number_value();
    for (const auto& [member, bytes] :
         Field(s, "relay_forwarded_by_member").struct_value().fields()) {
      if (bytes.number_value() > 0) carried.insert(member);
    }
    EXPECT_GT(Field(s, "bytes_via_relays").number_value(), 0) << id;
  }
  EXPECT_GT(forwarded, 0);
  EXPECT_EQ(carried, (std::set<std::string>{"n2", "n3"}));
}

// The relay of n2 is killed mid-run: n2 moves to the other reachable
// member and the survivors finish together, with equal hashes.
TEST(NatTest, AMemberWhoseRelayDiesMovesToAnother) {
  NodeGroup g("relay-dies", CommonFlags("relay-dies"));
  ClosedPort c2;
  ASSERT_GT(c2.port(), 0);
  const std::string many = " --steps=400 --inner_steps=5";
  g.Start("n0", "--min_members=3 --shard=0/3" + many);
  g.Start("n1", "--min_members=3 --shard=1/3" + many, "n0");
  g.Start("n2",
          absl::StrCat("--min_members=3 --shard=2/3 --advertise=", c2.address(),
                       " --relay=auto", many),
          "n0");
  ASSERT_TRUE(testing::WaitForText(g.Log("n2"), "attached to relay ",
                                   absl::Seconds(60)))
      << g.LogText("n2");
  ASSERT_TRUE(g.WaitForEvent("n2", "\"round\"", absl::Seconds(60)))
      << g.LogText("n2");
  const std::string log = g.LogText("n2");
  const size_t at = log.find("attached to relay ") + 18;
  const std::string first = log.substr(at, log.find(": ", at) - at);
  const std::string victim = first == g.Address("n0") ? "n0" : "n1";
  const std::string survivor = victim == "n0" ? "n1" : "n0";
  g.Signal(victim, SIGKILL);
  g.Wait(victim);
  ASSERT_EQ(g.Wait("n2", absl::Minutes(4)), 0) << g.LogText("n2");
  ASSERT_EQ(g.Wait(survivor, absl::Minutes(4)), 0) << g.LogText(survivor);
  EXPECT_EQ(g.FinalHash("n2"), g.FinalHash(survivor));
  const auto s = ReadJson(g.Out("n2") + "/summary.json");
  EXPECT_EQ(Field(s, "relay").string_value(), g.Address(survivor));
  EXPECT_GE(Field(s, "relays_lost").number_value(), 1);
  // After the kill, rounds went on with n2 in them.
  int with_n2_after = 0;
  for (const auto& ev : g.Events(survivor, "round")) {
    const auto& members = Field(ev, "members").list_value().values();
    bool has_n2 = false, has_victim = false;
    for (const auto& m : members) {
      has_n2 |= m.string_value() == "n2";
      has_victim |= m.string_value() == victim;
    }
    if (has_n2 && !has_victim) ++with_n2_after;
  }
  EXPECT_GT(with_n2_after, 0);
}

// Every round hash `id` logged equals `reference`'s for that round; how
// many there were.
int SameRoundHashes(const NodeGroup& g, const std::string& id,
                    const std::string& reference) {
  const std::map<int, std::string> mine = g.RoundHashes(id);
  const std::map<int, std::string> theirs = g.RoundHashes(reference);
  int shared = 0;
  for (const auto& [round, hash] : mine) {
    auto it = theirs.find(round);
    if (it == theirs.end()) continue;
    EXPECT_EQ(hash, it->second) << id << " round " << round;
    ++shared;
  }
  return shared;
}

// n0 (a relay with --test_relay_fault=`fault`) and n1, reachable, and n2,
// reachable only through n0.
void StartBehindAFaultyRelay(NodeGroup& g, const ClosedPort& c2,
                             const std::string& fault) {
  g.Start("n0", "--min_members=3 --shard=0/3 --test_relay_fault=" + fault);
  g.Start("n1", "--min_members=3 --shard=1/3", "n0");
  ASSERT_TRUE(testing::WaitForText(g.Log("n1"), "back at", absl::Seconds(60)))
      << g.LogText("n1");
  g.Start("n2",
          absl::StrCat("--min_members=3 --shard=2/3 --advertise=", c2.address(),
                       " --relay=", g.Address("n0")),
          "n0");
}

// n0 relays n2 but cuts every connection it carries after 64 KB, as a relay
// that drops what it forwards would: the attempts those connections carry
// fail and are rerun, and no member's model is ever corrupted.
TEST(NatTest, ARelayThatDropsWhatItForwardsCostsAttemptsNotTheModel) {
  NodeGroup g("relay-cuts", CommonFlags("relay-cuts"));
  ClosedPort c2;
  ASSERT_GT(c2.port(), 0);
  StartBehindAFaultyRelay(g, c2, "cut:65536");
  ASSERT_EQ(g.Wait("n0", absl::Minutes(4)), 0) << g.LogText("n0");
  ASSERT_EQ(g.Wait("n1", absl::Minutes(4)), 0) << g.LogText("n1");
  g.Wait("n2", absl::Minutes(4));  // it may end apart: its links broke
  EXPECT_NE(g.LogText("n0").find("cut a connection to n2"), std::string::npos)
      << g.LogText("n0");
  EXPECT_EQ(g.FinalHash("n0"), g.FinalHash("n1"));
  EXPECT_EQ(SameRoundHashes(g, "n1", "n0"), 4);
  SameRoundHashes(g, "n2", "n0");
}

// n0 relays n2 but holds every frame it forwards 20 ms, as a slow relay
// would: rounds take longer, and every one has all three members and ends
// on equal models.
TEST(NatTest, ARelayThatDelaysWhatItForwardsSlowsRoundsNotTheModel) {
  NodeGroup g("relay-delays", CommonFlags("relay-delays"));
  ClosedPort c2;
  ASSERT_GT(c2.port(), 0);
  StartBehindAFaultyRelay(g, c2, "delay:20");
  for (const char* id : {"n0", "n1", "n2"}) {
    ASSERT_EQ(g.Wait(id, absl::Minutes(4)), 0) << g.LogText(id);
  }
  EXPECT_EQ(SameRoundHashes(g, "n1", "n0"), 4);
  EXPECT_EQ(SameRoundHashes(g, "n2", "n0"), 4);
  for (int n : RoundSizes(g, "n0")) EXPECT_EQ(n, 3);
}

// Runs `cmd` by the shell in `dir`; whether it succeeded.
bool ShIn(const std::string& dir, const std::string& cmd) {
  return std::system(absl::StrCat("cd ", dir, " && (", cmd, ") >/dev/null 2>&1")
                         .c_str()) == 0;
}

// With mutual TLS and a join token, n2 (behind NAT, advertising a name
// that does not even resolve) holds a certificate for that name only: its
// peers reach it through the relay's loopback tunnel and still check its
// certificate against its advertised name, end to end.
TEST(NatTest, WithTlsARelayedMemberIsCheckedAgainstItsAdvertisedName) {
  if (std::system("command -v openssl >/dev/null") != 0) {
    GTEST_SKIP() << "needs openssl on PATH to make certificates";
  }
  const std::string dir = testing::TempDir() + "/tls-relay-certs";
  ASSERT_TRUE(ShIn("/", "mkdir -p " + dir));
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1";
  ASSERT_TRUE(ShIn(dir, absl::StrCat("openssl req -x509 ", ec,
                                     " -nodes -days 2 -subj /CN=ca"
                                     " -keyout ca.key -out ca.pem")));
  for (const auto& [id, san] : std::vector<std::pair<std::string, std::string>>{
           {"n0", "IP:127.0.0.1"},
           {"n1", "IP:127.0.0.1"},
           {"n2", "DNS:n2.invalid"}}) {
    ASSERT_TRUE(ShIn(dir, absl::StrCat("openssl req ", ec, " -nodes -subj /CN=",
                                       id, " -keyout ", id, ".key -out ", id,
                                       ".csr && echo "
                                       "subjectAltName=",
                                       san, " > ", id,
                                       ".ext && openssl x509 -req -days 2 "
                                       "-in ",
                                       id,
                                       ".csr -CA ca.pem -CAkey ca.key "
                                       "-CAcreateserial -extfile ",
                                       id, ".ext -out ", id, ".pem")))
        << id;
  }
  ASSERT_TRUE(ShIn(dir, "openssl rand -hex 32 > swarm.token"));
  const std::string common = absl::StrCat(
      TinyTextFlags(60000),
      " --steps=20 --inner_steps=5 --shard_mode=contiguous --threads=1"
      " --eval_every=0 --suspect_timeout=2 --round_deadline=20"
      " --run_id=tls-relay --min_members=3 --tls_require_client_cert"
      " --tls_ca=",
      dir, "/ca.pem --join_token_file=", dir, "/swarm.token");
  const auto tls = [&](const std::string& id) {
    return absl::StrCat(" --tls_cert=", dir, "/", id, ".pem --tls_key=", dir,
                        "/", id, ".key");
  };
  NodeGroup g("tls-relay", common);
  g.Start("n0", "--shard=0/3" + tls("n0"));
  g.Start("n1", "--shard=1/3" + tls("n1"), "n0");
  g.Start(
      "n2",
      "--shard=2/3 --listen=0.0.0.0:0 --advertise=n2.invalid:7000" + tls("n2"),
      "n0");
  for (const char* id : {"n0", "n1", "n2"}) {
    ASSERT_EQ(g.Wait(id, absl::Minutes(4)), 0) << g.LogText(id);
  }
  EXPECT_EQ(SameRoundHashes(g, "n2", "n0"), 4);
  for (int n : RoundSizes(g, "n0")) EXPECT_EQ(n, 3);
  const auto s2 = ReadJson(g.Out("n2") + "/summary.json");
  EXPECT_EQ(Field(s2, "reachability").string_value(), "unreachable");
  EXPECT_FALSE(Field(s2, "relay").string_value().empty());
}

// A member of another run names a member of this one as its relay: the
// relay refuses it (another swarm's run id), forwards nothing, and this
// run trains undisturbed.
TEST(NatTest, ARelayRefusesAMemberOfAnotherRun) {
  NodeGroup a("relay-run-a", CommonFlags("relay-run-a"));
  NodeGroup b("relay-run-b", CommonFlags("relay-run-b"));
  ClosedPort c1;
  ASSERT_GT(c1.port(), 0);
  // Long enough to be there when b1 asks.
  a.Start("n0", "--min_members=2 --shard=0/2 --steps=400");
  a.Start("n1", "--min_members=2 --shard=1/2 --steps=400", "n0");
  b.Start("b0", "--min_members=2 --shard=0/2 --steps=100000");
  b.Start("b1",
          absl::StrCat("--min_members=2 --shard=1/2 --steps=100000"
                       " --advertise=",
                       c1.address(), " --relay=", a.Address("n0")),
          "b0");
  EXPECT_TRUE(testing::WaitForText(b.Log("b1"), "this relay serves run",
                                   absl::Seconds(60)))
      << b.LogText("b1");
  ASSERT_EQ(a.Wait("n0", absl::Minutes(4)), 0) << a.LogText("n0");
  ASSERT_EQ(a.Wait("n1", absl::Minutes(4)), 0) << a.LogText("n1");
  EXPECT_EQ(a.FinalHash("n0"), a.FinalHash("n1"));
  const auto s0 = ReadJson(a.Out("n0") + "/summary.json");
  EXPECT_EQ(Field(s0, "relay_forwarded_bytes").number_value(), 0);
}

}  // namespace
}  // namespace starling
