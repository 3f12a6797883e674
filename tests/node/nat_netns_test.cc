// A real-network test of members behind NAT: network namespaces joined by
// veth pairs, a router namespace that masquerades (nftables) what its
// private side sends out and forwards one public port to a member inside.
//   pub (10.52.0.1) --- wan (10.52.0.2) rt lan (192.168.52.1) --- nat
//   (192.168.52.2, default route via the router)
// A member inside dials out through the router; nobody outside can dial
// its own address. With --advertise naming the forwarded port it is
// dialed back at its join and trains with the public member; without, the
// dial-back finds it unreachable and it says so.
// A second lab puts two routers on a bridge in the public namespace, each
// masquerading its own private network with one member inside and no
// forward: two public members and two members behind NAT train one run
// together, the NATed ones through relays (--relay=auto), also when a
// NATed member is killed and restarted and when a relay is killed.
// Needs root, ip (iproute2) and nft (nftables); skips with a message
// otherwise. Its namespaces (named after the test's pid) are deleted when
// it ends, passed or failed.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::Process;
using ::starling::testing::ReadJson;
using ::starling::testing::TempDir;
using ::starling::testing::TinyTextFlags;

constexpr char kPublic[] = "10.52.0.1";
constexpr char kRouterWan[] = "10.52.0.2";
constexpr char kNated[] = "192.168.52.2";

// The three namespaces; deleted (with the processes still in them) on
// destruction. Not thread-safe.
class NatLab {
 public:
  NatLab()
      : prefix_(absl::StrCat("stnat-", ::getpid(), "-")),
        netns_mounted_before_(
            std::system("mountpoint -q /run/netns 2>/dev/null") == 0) {}
  ~NatLab() {
    for (const std::string& ns : made_) {
      Sh(absl::StrCat("for p in $(ip netns pids ", ns,
                      "); do kill -9 $p; done; ip netns del ", ns));
    }
    // `ip netns add` mounted /run/netns: left mounted, it pins the root it
    // lives in (a chroot that runs this test cannot be deleted).
    if (!netns_mounted_before_ && !made_.empty()) {
      Sh("[ -z \"$(ls -A /run/netns)\" ] && umount /run/netns");
    }
  }
  NatLab(const NatLab&) = delete;
  NatLab& operator=(const NatLab&) = delete;

  std::string Ns(const std::string& role) const { return prefix_ + role; }

  // Makes the namespaces, links, routes and the router's nftables rules
  // (masquerade out of wan; wan's tcp `forward_port` to the NATed member's
  // same port). The first command that fails, with its output.
  std::string Create(int forward_port) {
    const std::string pub = Ns("pub"), rt = Ns("rt"), nat = Ns("nat");
    for (const std::string& ns : {pub, rt, nat}) {
      if (!Sh("ip netns add " + ns)) return last_;
      made_.push_back(ns);
      if (!Sh(absl::StrCat("ip -n ", ns, " link set lo up"))) return last_;
    }
    const std::vector<std::string> steps = {
        absl::StrCat("ip -n ", pub,
                     " link add eth0 type veth peer name wan "
                     "netns ",
                     rt),
        absl::StrCat("ip -n ", nat,
                     " link add eth0 type veth peer name lan "
                     "netns ",
                     rt),
        absl::StrCat("ip -n ", pub, " addr add ", kPublic, "/24 dev eth0"),
        absl::StrCat("ip -n ", rt, " addr add ", kRouterWan, "/24 dev wan"),
        absl::StrCat("ip -n ", rt, " addr add 192.168.52.1/24 dev lan"),
        absl::StrCat("ip -n ", nat, " addr add ", kNated, "/24 dev eth0"),
        absl::StrCat("ip -n ", pub, " link set eth0 up"),
        absl::StrCat("ip -n ", rt, " link set wan up"),
        absl::StrCat("ip -n ", rt, " link set lan up"),
        absl::StrCat("ip -n ", nat, " link set eth0 up"),
        absl::StrCat("ip -n ", nat, " route add default via 192.168.52.1"),
        absl::StrCat("ip netns exec ", rt, " sysctl -qw net.ipv4.ip_forward=1"),
        absl::StrCat("ip netns exec ", rt, " nft add table ip nat"),
        absl::StrCat("ip netns exec ", rt,
                     " nft 'add chain ip nat pre "
                     "{ type nat hook prerouting priority -100 ; }'"),
        absl::StrCat("ip netns exec ", rt,
                     " nft 'add chain ip nat post "
                     "{ type nat hook postrouting priority 100 ; }'"),
        absl::StrCat("ip netns exec ", rt,
                     " nft add rule ip nat post oifname wan masquerade"),
        absl::StrCat("ip netns exec ", rt,
                     " nft add rule ip nat pre iifname "
                     "wan tcp dport ",
                     forward_port, " dnat to ", kNated, ":", forward_port),
    };
    for (const std::string& s : steps) {
      if (!Sh(s)) return last_;
    }
    return "";
  }

  // Two routers on a bridge in "pub" (10.52.0.1): router K (wan
  // 10.52.0.(K+1)) masquerades the private network 192.168.(51+K).0/24 of
  // namespace "natK" (member at 192.168.(51+K).2), with no forward. The
  // first command that fails, with its output.
  std::string CreateTwoRouters() {
    for (const std::string& role : {"pub", "rt1", "rt2", "nat1", "nat2"}) {
      if (!Sh("ip netns add " + Ns(role))) return last_;
      made_.push_back(Ns(role));
      if (!Sh(absl::StrCat("ip -n ", Ns(role), " link set lo up"))) {
        return last_;
      }
    }
    const std::string pub = Ns("pub");
    std::vector<std::string> steps = {
        absl::StrCat("ip -n ", pub, " link add br0 type bridge"),
        absl::StrCat("ip -n ", pub, " addr add ", kPublic, "/24 dev br0"),
        absl::StrCat("ip -n ", pub, " link set br0 up"),
    };
    for (int k : {1, 2}) {
      const std::string rt = Ns(absl::StrCat("rt", k));
      const std::string nat = Ns(absl::StrCat("nat", k));
      const std::string lan = absl::StrCat("192.168.", 51 + k);
      for (const std::string& step : std::vector<std::string>{
               absl::StrCat("ip -n ", pub, " link add up", k,
                            " type veth peer name wan netns ", rt),
               absl::StrCat("ip -n ", pub, " link set up", k, " master br0"),
               absl::StrCat("ip -n ", pub, " link set up", k, " up"),
               absl::StrCat("ip -n ", nat,
                            " link add eth0 type veth peer name lan netns ",
                            rt),
               absl::StrCat("ip -n ", rt, " addr add 10.52.0.", k + 1,
                            "/24 dev wan"),
               absl::StrCat("ip -n ", rt, " addr add ", lan, ".1/24 dev lan"),
               absl::StrCat("ip -n ", nat, " addr add ", lan, ".2/24 dev eth0"),
               absl::StrCat("ip -n ", rt, " link set wan up"),
               absl::StrCat("ip -n ", rt, " link set lan up"),
               absl::StrCat("ip -n ", nat, " link set eth0 up"),
               absl::StrCat("ip -n ", nat, " route add default via ", lan,
                            ".1"),
               absl::StrCat("ip netns exec ", rt,
                            " sysctl -qw net.ipv4.ip_forward=1"),
               absl::StrCat("ip netns exec ", rt, " nft add table ip nat"),
               absl::StrCat("ip netns exec ", rt,
                            " nft 'add chain ip nat post "
                            "{ type nat hook postrouting priority 100 ; }'"),
               absl::StrCat("ip netns exec ", rt,
                            " nft add rule ip nat post oifname wan "
                            "masquerade"),
           }) {
        steps.push_back(step);
      }
    }
    for (const std::string& step : steps) {
      if (!Sh(step)) return last_;
    }
    return "";
  }

  // `starling ARGS` in namespace `role`, its output to `log`.
  Process Spawn(const std::string& role, const std::string& args,
                const std::string& log) const {
    Process::Options options;
    options.wrapper = absl::StrCat(
        "ip netns exec ", Ns(role),
        " env -u http_proxy -u https_proxy -u grpc_proxy -u HTTP_PROXY"
        " -u HTTPS_PROXY");
    options.stdout_to_log = true;
    return Process::Start(args, log, options);
  }

 private:
  // Runs `cmd` by the shell; false (the command and its output in last_)
  // when it fails.
  bool Sh(const std::string& cmd) {
    const std::string out = scratch_ + "/cmd.out";
    const int rc = std::system((cmd + " >" + out + " 2>&1").c_str());
    if (rc == 0) return true;
    last_ =
        absl::StrCat(cmd, " (status ", rc, "): ", ReadFile(out).value_or(""));
    return false;
  }

  const std::string prefix_;
  const bool netns_mounted_before_;
  const std::string scratch_ = TempDir();  // commands' output
  std::vector<std::string> made_;
  std::string last_;
};

std::string NodeArgs(const std::string& dir, const std::string& id,
                     const std::string& run_id, const std::string& flags) {
  return absl::StrCat("node ", TinyTextFlags(60000),
                      " --steps=20 --inner_steps=5 --eval_every=0 --threads=1"
                      " --shard_mode=contiguous --connect_timeout=30"
                      " --suspect_timeout=2 --insecure --run_id=",
                      run_id, " --node_id=", id, " --out=", dir, "/", id, " ",
                      flags);
}

// Why the labs cannot run here; "" when they can.
std::string LabUnavailable() {
  if (::geteuid() != 0) {
    return absl::StrCat("needs root to make network namespaces (uid ",
                        ::geteuid(), ")");
  }
  if (std::system("command -v ip >/dev/null && command -v nft >/dev/null") !=
      0) {
    return "needs ip (iproute2) and nft (nftables) on PATH";
  }
  return "";
}

TEST(NatNetnsTest, AForwardedPortIsDialedBackAndTrainsAnUnforwardedOneIsNot) {
  if (std::string why = LabUnavailable(); !why.empty()) GTEST_SKIP() << why;
  NatLab lab;
  if (std::string error = lab.Create(7000); !error.empty()) {
    GTEST_SKIP() << "cannot make the NAT lab here: " << error;
  }
  const std::string dir = TempDir() + "/nat-netns";
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string seed = absl::StrCat(" --peers=", kPublic, ":7000");
  // A member behind the router's forwarded port 7000, advertising it.
  Process p0 = lab.Spawn("pub",
                         NodeArgs(dir, "n0", "fwd",
                                  absl::StrCat("--listen=", kPublic,
                                               ":7000 --min_members=2"
                                               " --shard=0/2")),
                         dir + "/n0.log");
  Process p1 = lab.Spawn(
      "nat",
      NodeArgs(
          dir, "n1", "fwd",
          absl::StrCat("--listen=", kNated, ":7000 --advertise=", kRouterWan,
                       ":7000 --min_members=2 --shard=1/2", seed)),
      dir + "/n1.log");
  ASSERT_EQ(p0.Wait(absl::Minutes(4)), 0) << p0.LogText();
  ASSERT_EQ(p1.Wait(absl::Minutes(4)), 0) << p1.LogText();
  const auto s0 = ReadJson(dir + "/n0/summary.json");
  const auto s1 = ReadJson(dir + "/n1/summary.json");
  EXPECT_EQ(
      Field(Field(s0, "final").struct_value(), "model_hash").string_value(),
      Field(Field(s1, "final").struct_value(), "model_hash").string_value());
  EXPECT_EQ(Field(s1, "reachability").string_value(), "reachable");
  EXPECT_EQ(Field(Field(s0, "members_reachability").struct_value(), "n1")
                .string_value(),
            "reachable");

  // A member behind the router without a forward (port 7001 is not
  // forwarded): the public member cannot dial it back, and it says so.
  Process q0 = lab.Spawn(
      "pub",
      NodeArgs(dir, "m0", "nofwd",
               absl::StrCat("--listen=", kPublic, ":7001 --steps=100000")),
      dir + "/m0.log");
  Process q1 = lab.Spawn("nat",
                         NodeArgs(dir, "m1", "nofwd",
                                  absl::StrCat("--listen=", kNated,
                                               ":7001 --steps=100000"
                                               " --peers=",
                                               kPublic, ":7001")),
                         dir + "/m1.log");
  EXPECT_TRUE(testing::WaitForText(
      dir + "/m1.log",
      absl::StrCat("could not dial m1 back at ", kNated, ":7001"),
      absl::Seconds(60)))
      << q1.LogText();
}

// The members of each round in node `id`'s events under `dir`.
std::vector<std::set<std::string>> RoundMembersOf(const std::string& dir,
                                                  const std::string& id) {
  std::vector<std::set<std::string>> out;
  for (const auto& ev :
       testing::ReadEvents(dir + "/" + id + "/events.jsonl", "round")) {
    out.push_back(testing::Members(ev));
  }
  return out;
}

// 2 public members (n0, n1) and 2 behind their own NAT routers (n2, n3),
// no port forwarded: the dial-back finds n2 and n3 unreachable, each
// attaches to a public member, and the four train every round together.
// Then n3 is killed and started again, and rejoins through a relay; then
// the relay of n2 is killed, and n2 moves to the other public member. The
// members' models agree at every round they share.
TEST(NatNetnsTest, TwoMembersBehindNatTrainWithTwoPublicOnesThroughRelays) {
  if (std::string why = LabUnavailable(); !why.empty()) GTEST_SKIP() << why;
  NatLab lab;
  if (std::string error = lab.CreateTwoRouters(); !error.empty()) {
    GTEST_SKIP() << "cannot make the NAT lab here: " << error;
  }
  const std::string dir = TempDir() + "/nat-relay";
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string seeds =
      absl::StrCat(" --peers=", kPublic, ":7000,", kPublic, ":7001");
  // Long enough to outlast the test, which stops it.
  const std::string run = " --steps=1000000 --inner_steps=5 --min_members=4";
  const auto start = [&](const std::string& id, const std::string& role,
                         const std::string& listen, const std::string& more) {
    return lab.Spawn(role,
                     NodeArgs(dir, id, "relay",
                              absl::StrCat("--listen=", listen, run, more)),
                     absl::StrCat(dir, "/", id, ".log"));
  };
  Process n0 = start("n0", "pub", absl::StrCat(kPublic, ":7000"), "");
  Process n1 = start("n1", "pub", absl::StrCat(kPublic, ":7001"),
                     absl::StrCat(" --peers=", kPublic, ":7000"));
  Process n2 = start("n2", "nat1", "192.168.52.2:7000", seeds);
  Process n3 = start("n3", "nat2", "192.168.53.2:7000", seeds);
  const auto rounds_of_four = [&] {
    int four = 0;
    for (const auto& m : RoundMembersOf(dir, "n0")) four += m.size() == 4;
    return four;
  };
  ASSERT_TRUE(
      testing::WaitFor([&] { return rounds_of_four() >= 5; }, absl::Minutes(3)))
      << n0.LogText() << n2.LogText() << n3.LogText();
  // From the start, every round had all four.
  for (const auto& m : RoundMembersOf(dir, "n0")) EXPECT_EQ(m.size(), 4u);
  EXPECT_NE(n2.LogText().find("attached to relay 10.52.0.1:700"),
            std::string::npos)
      << n2.LogText();

  // n3 dies and comes back: it rejoins through a relay.
  n3.Signal(SIGKILL);
  n3.Wait();
  const int before = rounds_of_four();
  Process n3b = start("n3", "nat2", "192.168.53.2:7000", seeds);
  ASSERT_TRUE(testing::WaitFor([&] { return rounds_of_four() >= before + 3; },
                               absl::Minutes(3)))
      << n3b.LogText();

  // The relay of n2 dies: n2 moves to the other public member, and the
  // next rounds have n2 (the survivors' rounds go on without the dead one).
  const std::string log2 = n2.LogText();
  const bool on_n0 = log2.find(absl::StrCat("attached to relay ", kPublic,
                                            ":7000")) != std::string::npos;
  Process& relay = on_n0 ? n0 : n1;
  Process& other = on_n0 ? n1 : n0;
  const std::string other_id = on_n0 ? "n1" : "n0";
  relay.Signal(SIGKILL);
  relay.Wait();
  const size_t rounds_then = RoundMembersOf(dir, other_id).size();
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        const auto all = RoundMembersOf(dir, other_id);
        for (size_t r = rounds_then; r < all.size(); ++r) {
          if (all[r].count("n2") && all[r].size() == 3) return true;
        }
        return false;
      },
      absl::Minutes(2)))
      << n2.LogText();
  EXPECT_NE(n2.LogText().find("lost relay"), std::string::npos);
  EXPECT_NE(n2.LogText().find(absl::StrCat("attached to relay ", kPublic,
                                           on_n0 ? ":7001" : ":7000")),
            std::string::npos)
      << n2.LogText();
  // The members hold equal models at every round they share.
  const auto hashes = [&](const std::string& id) {
    return testing::RoundHashes(dir + "/" + id + "/events.jsonl");
  };
  for (const std::string& id : {std::string("n2"), std::string("n3")}) {
    int shared = 0;
    const auto theirs = hashes(id);
    for (const auto& [round, hash] : hashes(other_id)) {
      if (auto it = theirs.find(round); it != theirs.end()) {
        EXPECT_EQ(it->second, hash) << id << " round " << round;
        ++shared;
      }
    }
    EXPECT_GT(shared, 3) << id;
  }
  EXPECT_TRUE(n2.Running() && n3b.Running() && other.Running());
}

}  // namespace
}  // namespace starling
