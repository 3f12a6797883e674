// Unit tests of the `starling sim` fault plan parser and the poisoned-peer
// plans (node/faults.h).
#include "node/faults.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<std::string>& Four() {
  static const auto* ids = new std::vector<std::string>{"n0", "n1", "n2", "n3"};
  return *ids;
}

absl::StatusOr<FaultPlan> Parse(const FaultFlags& flags) {
  return ParseFaultPlan(flags, Four());
}

// The error message for `flags`, which must be InvalidArgument.
std::string Error(const FaultFlags& flags) {
  absl::StatusOr<FaultPlan> plan = Parse(flags);
  EXPECT_FALSE(plan.ok());
  if (plan.ok()) return "";
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  return std::string(plan.status().message());
}

FaultFlags Kill(std::string spec) {
  FaultFlags f;
  f.kill = std::move(spec);
  return f;
}

FaultFlags Partition(std::string spec) {
  FaultFlags f;
  f.partition = std::move(spec);
  return f;
}

TEST(FaultPlanTest, NoFlagsIsAnEmptyPlan) {
  absl::StatusOr<FaultPlan> plan = Parse({});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->empty());
  EXPECT_TRUE(plan->joiners.empty());
}

TEST(FaultPlanTest, EveryKindSortedByTime) {
  FaultFlags f;
  f.kill = "n2@30s,n3@1.5s";
  f.restart = "n2@1m";
  f.join = "n5@45s";
  f.leave = "n1@50s";
  f.partition = "n0,n1|n2,n3@20s-40s";
  absl::StatusOr<FaultPlan> plan = Parse(f);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->joiners, ElementsAre("n5"));
  std::vector<std::string> got;
  for (const FaultEvent& e : plan->events) {
    got.push_back(absl::StrCat(FaultKindName(e.kind), " ", e.node, "@",
                               absl::FormatDuration(e.at)));
  }
  EXPECT_THAT(got, ElementsAre("kill n3@1.5s", "partition_start @20s",
                               "kill n2@30s", "partition_end @40s",
                               "join n5@45s", "leave n1@50s", "restart n2@1m"));
  const FaultEvent& p = plan->events[1];
  EXPECT_EQ(p.until, absl::Seconds(40));
  EXPECT_THAT(p.groups,
              ElementsAre(ElementsAre("n0", "n1"), ElementsAre("n2", "n3")));
  EXPECT_EQ(PartitionLine(p.groups), "n0,n1|n2,n3");
  EXPECT_EQ(PartitionLine(plan->events[3].groups), "n0,n1|n2,n3");
}

TEST(FaultPlanTest, TimeUnitsAndWhitespace) {
  absl::StatusOr<FaultPlan> plan = Parse(Kill(" n0@500ms , n1@2m,n2@0s "));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->events.size(), 3u);
  EXPECT_EQ(plan->events[0].at, absl::ZeroDuration());
  EXPECT_EQ(plan->events[1].at, absl::Milliseconds(500));
  EXPECT_EQ(plan->events[2].at, absl::Minutes(2));
}

TEST(FaultPlanTest, SameTimeHealsThenStopsThenStarts) {
  FaultFlags f;
  f.kill = "n2@30s";
  f.restart = "n2@30s";
  f.partition = "n0|n1@10s-30s;n2|n3@30s-35s";
  absl::StatusOr<FaultPlan> plan = Parse(f);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<FaultKind> kinds;
  for (const FaultEvent& e : plan->events) kinds.push_back(e.kind);
  EXPECT_THAT(
      kinds, ElementsAre(FaultKind::kPartitionStart, FaultKind::kPartitionEnd,
                         FaultKind::kKill, FaultKind::kRestart,
                         FaultKind::kPartitionStart, FaultKind::kPartitionEnd));
}

TEST(FaultPlanTest, JoinersMayBeKilledLeftAndPartitionedAfterJoining) {
  FaultFlags f;
  f.join = "n4@10s,n7@20s";
  f.kill = "n4@15s";
  f.restart = "n4@25s";
  f.leave = "n7@30s";
  f.partition = "n0,n1,n2,n3|n4,n7@40s-50s";
  absl::StatusOr<FaultPlan> plan = Parse(f);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->joiners, ElementsAre("n4", "n7"));
  EXPECT_EQ(plan->events.size(), 7u);
}

TEST(FaultPlanTest, MalformedEntries) {
  EXPECT_THAT(Error(Kill("n2")),
              AllOf(HasSubstr("--kill=n2"), HasSubstr("in 'n2'"),
                    HasSubstr("want ID@TIME")));
  EXPECT_THAT(Error(Kill("n2@30s@40s")), HasSubstr("want ID@TIME"));
  EXPECT_THAT(Error(Kill("n2@30s,")), HasSubstr("empty entry"));
  EXPECT_THAT(Error(Kill("@30s")), HasSubstr("bad node id ''"));
  EXPECT_THAT(Error(Kill("n/2@30s")), HasSubstr("bad node id 'n/2'"));
  FaultFlags leave;
  leave.leave = "n1@soon";
  EXPECT_THAT(Error(leave), AllOf(HasSubstr("--leave=n1@soon"),
                                  HasSubstr("bad time 'soon'")));
}

TEST(FaultPlanTest, TimesNeedAUnitAndMustBeFiniteAndNonNegative) {
  EXPECT_THAT(Error(Kill("n2@30")),
              AllOf(HasSubstr("--kill=n2@30"), HasSubstr("bad time '30'"),
                    HasSubstr("with a unit")));
  EXPECT_THAT(Error(Kill("n2@0")), HasSubstr("bad time '0'"));
  EXPECT_THAT(Error(Kill("n2@inf")), HasSubstr("bad time 'inf'"));
  EXPECT_THAT(Error(Kill("n2@-1s")), HasSubstr("'-1s' is negative"));
  EXPECT_THAT(Error(Kill("n2@3x")), HasSubstr("bad time '3x'"));
}

TEST(FaultPlanTest, UnknownNodes) {
  EXPECT_THAT(Error(Kill("n9@30s")),
              AllOf(HasSubstr("--kill=n9@30s"), HasSubstr("unknown node n9"),
                    HasSubstr("n0, n1, n2, n3")));
  FaultFlags restart;
  restart.restart = "n4@30s";
  EXPECT_THAT(Error(restart), AllOf(HasSubstr("--restart=n4@30s"),
                                    HasSubstr("unknown node n4")));
  FaultFlags leave;
  leave.leave = "n1@5s,x@6s";
  leave.join = "n6@1s";
  EXPECT_THAT(Error(leave),
              AllOf(HasSubstr("--leave=n1@5s,x@6s"), HasSubstr("in 'x@6s'"),
                    HasSubstr("unknown node x"), HasSubstr("joiners: n6")));
  EXPECT_THAT(Error(Partition("n0,n1|n2,n8@20s-40s")),
              AllOf(HasSubstr("--partition="), HasSubstr("unknown node n8")));
}

TEST(FaultPlanTest, JoinIdsMustBeNew) {
  FaultFlags f;
  f.join = "n3@45s";
  EXPECT_THAT(Error(f),
              AllOf(HasSubstr("--join=n3@45s"),
                    HasSubstr("node n3 already exists"), HasSubstr("e.g. n4")));
  f.join = "n5@45s,n5@50s";
  EXPECT_THAT(Error(f),
              AllOf(HasSubstr("in 'n5@50s'"), HasSubstr("n5 joins twice")));
}

TEST(FaultPlanTest, JoinerActsOnlyAfterJoining) {
  FaultFlags f;
  f.join = "n5@45s";
  f.kill = "n5@10s";
  EXPECT_THAT(Error(f), AllOf(HasSubstr("--kill=n5@10s"),
                              HasSubstr("n5 joins only at 45s")));
}

TEST(FaultPlanTest, BadPartitions) {
  EXPECT_THAT(Error(Partition("n0,n1|n1,n2@20s-40s")),
              AllOf(HasSubstr("--partition=n0,n1|n1,n2@20s-40s"),
                    HasSubstr("node n1 is in two groups")));
  EXPECT_THAT(Error(Partition("n0,n1|n2,n3@40s-20s")),
              HasSubstr("the end must be after the start"));
  EXPECT_THAT(Error(Partition("n0,n1|n2,n3@20s-20s")),
              HasSubstr("the end must be after the start"));
  EXPECT_THAT(Error(Partition("n0,n1,n2@20s-40s")),
              HasSubstr("at least two groups"));
  EXPECT_THAT(Error(Partition("n0||n2@20s-40s")), HasSubstr("empty group"));
  EXPECT_THAT(Error(Partition("n0|n2@20s")),
              HasSubstr("want a time span START-END"));
  EXPECT_THAT(Error(Partition("n0|n2")), HasSubstr("want GROUP|GROUP@"));
  EXPECT_THAT(Error(Partition("n0|n2@20-40s")), HasSubstr("bad time '20'"));
  EXPECT_THAT(Error(Partition("n0|n1@20s-40s;")), HasSubstr("empty entry"));
  EXPECT_THAT(Error(Partition("n0|n1@20s-40s;n2|n3@30s-50s")),
              AllOf(HasSubstr("in 'n2|n3@30s-50s'"),
                    HasSubstr("overlaps in time with 'n0|n1@20s-40s'")));
}

TEST(NatSpecTest, ParsesIdsAndKeepsOneStartingNodeReachable) {
  auto nat = ParseNatSpec("n2, n3", Four(), 4);
  ASSERT_TRUE(nat.ok()) << nat.status();
  EXPECT_EQ(*nat, (std::set<std::string>{"n2", "n3"}));
  EXPECT_TRUE(ParseNatSpec("", Four(), 4)->empty());
  for (const char* bad : {"n9", "n2,n2", "n2,", "bad id", "n0,n1,n2,n3"}) {
    auto r = ParseNatSpec(bad, Four(), 4);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--nat=")) << bad;
  }
  EXPECT_THAT(
      std::string(ParseNatSpec("n0,n1,n2,n3", Four(), 4).status().message()),
      HasSubstr("at least one must stay reachable"));
  // A joiner may be behind NAT; the starting nodes are n0..n{initial-1}.
  EXPECT_TRUE(ParseNatSpec("n1,n2,n3", Four(), 1).ok());
  EXPECT_FALSE(ParseNatSpec("n0", Four(), 1).ok());
}

TEST(SlowSpecTest, ParsesFactorsPerNode) {
  auto slow = ParseSlowSpec("n2:4x, n0:1.5", Four());
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->size(), 2u);
  EXPECT_DOUBLE_EQ(slow->at("n2"), 4.0);
  EXPECT_DOUBLE_EQ(slow->at("n0"), 1.5);
  auto none = ParseSlowSpec("", Four());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(SlowSpecTest, RejectsBadSpecsNamingTheFlag) {
  for (const char* bad :
       {"n2", "n2:", "n2:fast", "n2:0.5x", "n2:-3x", "n2:infx", "n9:4x",
        "n2:4x,n2:2x", "n2:4x,", "bad id:4x", "n2@4x", "n2:4:5"}) {
    auto r = ParseSlowSpec(bad, Four());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--slow=")) << bad;
  }
  EXPECT_THAT(std::string(ParseSlowSpec("n9:4x", Four()).status().message()),
              AllOf(HasSubstr("unknown node n9"), HasSubstr("n0, n1")));
  EXPECT_THAT(std::string(ParseSlowSpec("n1:0.5x", Four()).status().message()),
              HasSubstr("below 1"));
  EXPECT_THAT(
      std::string(ParseSlowSpec("n1:1e308x", Four()).status().message()),
      HasSubstr("is over 1000"));
}

TEST(DriftSpecTest, ParsesGroupsAndSteps) {
  auto drift = ParseDriftSpec("n0,n1@400", Four());
  ASSERT_TRUE(drift.ok()) << drift.status();
  EXPECT_EQ(drift->size(), 2u);
  EXPECT_EQ(drift->at("n0"), 400);
  EXPECT_EQ(drift->at("n1"), 400);
  drift = ParseDriftSpec("n0@0; n3@25", Four());
  ASSERT_TRUE(drift.ok()) << drift.status();
  EXPECT_EQ(drift->at("n0"), 0);
  EXPECT_EQ(drift->at("n3"), 25);
  EXPECT_EQ(drift->count("n1"), 0u);
  // Joiners may drift too when the caller lists them.
  std::vector<std::string> with_joiner = Four();
  with_joiner.push_back("n5");
  EXPECT_TRUE(ParseDriftSpec("n5@10", with_joiner).ok());
  EXPECT_TRUE(ParseDriftSpec("", Four())->empty());
}

TEST(DriftSpecTest, RejectsBadSpecsNamingTheFlag) {
  for (const char* bad :
       {"n0", "400", "n0@", "n0@abc", "n0@-5", "n0@1.5", "n0@4@5", "n9@400",
        "n0,@400", "n0,n0@400", "n0@4;n0@8", "n0@4;", "@400"}) {
    auto r = ParseDriftSpec(bad, Four());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--drift="))
        << bad;
  }
  EXPECT_THAT(std::string(ParseDriftSpec("n0,n7@4", Four()).status().message()),
              HasSubstr("unknown node n7"));
}

TEST(SimLinksTest, NoFlagsShapeNothing) {
  auto links = ParseSimLinks("", "", Four());
  ASSERT_TRUE(links.ok()) << links.status();
  EXPECT_FALSE(links->shaped());
  EXPECT_TRUE(links->links.empty());
}

TEST(SimLinksTest, DefaultsNodesAndPairs) {
  // Every link 100 Mbit/s; n3's links 10; n2's 50 (n2-n3: the smaller, 10);
  // n0-n1 1000 both ways, over everything else.
  auto links = ParseSimLinks("100, n3=10, n2=50, n0-n1=1000",
                             "5,n2=40,n3=20,n1-n0=1", Four());
  ASSERT_TRUE(links.ok()) << links.status();
  ASSERT_TRUE(links->shaped());
  auto at = [&](const char* from, const char* to) {
    return links->links.at(from).at(to);
  };
  EXPECT_DOUBLE_EQ(at("n0", "n2").bandwidth_mbps, 50);
  EXPECT_DOUBLE_EQ(at("n2", "n0").bandwidth_mbps, 50);
  EXPECT_DOUBLE_EQ(at("n1", "n3").bandwidth_mbps, 10);
  EXPECT_DOUBLE_EQ(at("n2", "n3").bandwidth_mbps, 10);
  EXPECT_DOUBLE_EQ(at("n3", "n2").bandwidth_mbps, 10);
  EXPECT_DOUBLE_EQ(at("n0", "n1").bandwidth_mbps, 1000);
  EXPECT_DOUBLE_EQ(at("n1", "n0").bandwidth_mbps, 1000);
  // Latency: the larger of two node values wins; pairs override.
  EXPECT_DOUBLE_EQ(at("n2", "n3").latency_ms, 40);
  EXPECT_DOUBLE_EQ(at("n3", "n0").latency_ms, 20);
  EXPECT_DOUBLE_EQ(at("n0", "n1").latency_ms, 1);
  EXPECT_DOUBLE_EQ(at("n1", "n0").latency_ms, 1);
  EXPECT_DOUBLE_EQ(at("n1", "n0").latency_ms, 1);
  EXPECT_EQ(links->links.at("n0").count("n0"), 0u);

  // A node at 0 (unlimited) takes the other end's value.
  auto zero = ParseSimLinks("n0=0,n1=8", "", Four());
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_DOUBLE_EQ(zero->links.at("n0").at("n1").bandwidth_mbps, 8);
  EXPECT_DOUBLE_EQ(zero->links.at("n0").at("n2").bandwidth_mbps, 0);
}

TEST(SimLinksTest, NodeFlagsNameEachPeerByAddress) {
  auto links = ParseSimLinks("100,n1=10", "50", {"n0", "n1", "n2"});
  ASSERT_TRUE(links.ok()) << links.status();
  std::map<std::string, std::string> addresses = {{"n0", "127.0.0.1:7000"},
                                                  {"n1", "127.0.0.1:7001"},
                                                  {"n2", "127.0.0.1:7002"}};
  auto [bandwidth, latency] = NodeLinkFlags(*links, "n0", addresses);
  auto parsed = ParseLinkFlags(bandwidth, latency);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << " " << bandwidth;
  EXPECT_DOUBLE_EQ(parsed->defaults.bandwidth_mbps, 100);
  EXPECT_EQ(parsed->links.size(), 2u);
  EXPECT_DOUBLE_EQ(parsed->links.at("127.0.0.1:7001").bandwidth_mbps, 10);
  EXPECT_DOUBLE_EQ(parsed->links.at("127.0.0.1:7002").bandwidth_mbps, 100);
  EXPECT_DOUBLE_EQ(parsed->links.at("127.0.0.1:7002").latency_ms, 50);
  EXPECT_EQ(parsed->links.count("127.0.0.1:7000"), 0u);
}

TEST(SimLinksTest, IdsWithDashesSplitAtTheKnownPair) {
  auto links = ParseSimLinks("a-b-c=5", "", {"a", "a-b", "c", "b-c"});
  EXPECT_FALSE(links.ok());  // a-b + c or a + b-c: ambiguous
  EXPECT_THAT(std::string(links.status().message()), HasSubstr("ambiguous"));
  links = ParseSimLinks("a-b-c=5", "", {"a-b", "c", "d"});
  ASSERT_TRUE(links.ok()) << links.status();
  EXPECT_DOUBLE_EQ(links->links.at("c").at("a-b").bandwidth_mbps, 5);
  EXPECT_DOUBLE_EQ(links->links.at("c").at("d").bandwidth_mbps, 0);
}

TEST(SimLinksTest, RejectsBadSpecsNamingTheFlagAndEntry) {
  struct Case {
    const char* bandwidth;
    const char* latency;
    const char* mention;
  };
  for (const Case& c : std::vector<Case>{
           {"fast", "", "--link_bandwidth_mbps=fast: in 'fast'"},
           {"n9=5", "", "unknown node or pair 'n9'"},
           {"n0-n9=5", "", "unknown node or pair 'n0-n9'"},
           {"n0-n0=5", "", "needs two nodes"},
           {"n0=5,n0=6", "", "node n0 is named twice"},
           {"n0-n1=5,n1-n0=6", "", "pair n0-n1 is named twice"},
           {"", "n1=-3", "--link_latency_ms=n1=-3: in 'n1=-3'"},
           {"", "50,n0-n1=1e9", "in 'n0-n1=1e9': value 1e9 is over the limit"},
           {"", "1,2", "a second default"},
           {"1,,n1=2", "", "empty entry"},
       }) {
    auto r = ParseSimLinks(c.bandwidth, c.latency, Four());
    ASSERT_FALSE(r.ok()) << c.bandwidth << " " << c.latency;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.mention))
        << r.status();
  }
}

TEST(PoisonTest, PlansParseAndBadOnesAreNamed) {
  auto plan = ParsePoisonPlan("nan@2-4+x1000@5-7+noise@8-8");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[1].mode, PoisonMode::kScale);
  EXPECT_EQ((*plan)[1].scale, 1000);
  EXPECT_EQ(PoisonFor(*plan, 1), nullptr);
  EXPECT_EQ(PoisonFor(*plan, 4)->mode, PoisonMode::kNaN);
  EXPECT_EQ(PoisonFor(*plan, 8)->mode, PoisonMode::kNoise);
  EXPECT_EQ(PoisonFor(*plan, 9), nullptr);
  EXPECT_TRUE(ParsePoisonPlan("")->empty());
  for (const char* bad : {"nan", "nan@4-2", "zero@1-2", "x@1-2",
                          "nan@1-3+noise@3-4", "nan@-1-2"}) {
    auto p = ParsePoisonPlan(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << bad;
    EXPECT_NE(p.status().message().find("--test_poison="), std::string::npos)
        << p.status();
  }
  const std::vector<std::string> ids = {"n0", "n1"};
  auto spec = ParsePoisonSpec("n1:nan@0-1+x10@2-3", ids);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->at("n1"), "nan@0-1+x10@2-3");
  for (const char* bad :
       {"n9:nan@0-1", "n1", "n1:nan@0-1,n1:noise@3-4", "n0:bad@1-2"}) {
    auto s = ParsePoisonSpec(bad, ids);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << bad;
    EXPECT_NE(s.status().message().find("--poison="), std::string::npos)
        << s.status();
  }
}

TEST(PoisonTest, EachModeDoesWhatItSays) {
  std::vector<float> v = {3, -4, 0, 0};
  PoisonWindow w;
  w.mode = PoisonMode::kScale;
  w.scale = 1000;
  EXPECT_EQ(ApplyPoison(w, 1, v.data(), 4), "x1000");
  EXPECT_EQ(v[1], -4000);
  w.mode = PoisonMode::kNoise;
  std::vector<float> n(10000, 2.0f);
  EXPECT_EQ(ApplyPoison(w, 7, n.data(), 10000), "noise");
  double sum2 = 0;
  for (float x : n) sum2 += x * x;
  EXPECT_NEAR(std::sqrt(sum2 / 10000), 2.0, 0.1);  // the RMS is kept
  w.mode = PoisonMode::kNaN;
  EXPECT_EQ(ApplyPoison(w, 1, v.data(), 4), "nan");
  EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[3]));
}

}  // namespace
}  // namespace starling
