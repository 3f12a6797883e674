// Integration tests of members that peers cannot dial at their --listen
// address, on real `starling node` processes over loopback: a member behind
// a port forward (--advertise), dialed back at its join.
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
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
  // n0 dialed n1 back at its join, through the forward; nobody checked
  // the founder n0.
  const auto n0 = ReadJson(g.Out("n0") + "/summary.json");
  const auto n1 = ReadJson(g.Out("n1") + "/summary.json");
  EXPECT_EQ(Field(n1, "reachability").string_value(), "reachable");
  EXPECT_EQ(Field(n0, "reachability").string_value(), "unknown");
  const auto& seen = Field(n0, "members_reachability").struct_value();
  EXPECT_EQ(Field(seen, "n1").string_value(), "reachable");
  EXPECT_EQ(Field(seen, "n0").string_value(), "unknown");
}

}  // namespace
}  // namespace starling
