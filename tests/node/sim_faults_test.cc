// Unit tests of `starling sim`'s fault injection over time
// (node/sim_faults.h): which events are due when, and how each is recorded
// for summary.json and the report. No processes.
#include "node/sim_faults.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

FaultPlan Plan(const FaultFlags& flags) {
  absl::StatusOr<FaultPlan> plan =
      ParseFaultPlan(flags, {"n0", "n1", "n2", "n3"});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.value_or(FaultPlan());
}

TEST(SimFaultsTest, EventsComeDueInTimeOrder) {
  FaultFlags flags;
  flags.kill = "n2@30s";
  flags.restart = "n2@60s";
  flags.partition = "n0,n1|n2,n3@10s-20s";
  FaultSchedule schedule(Plan(flags).events);
  EXPECT_EQ(schedule.UntilNext(absl::Seconds(4)), absl::Seconds(6));
  EXPECT_FALSE(schedule.TakeDue(9.9).has_value());
  std::optional<FaultEvent> ev = schedule.TakeDue(25);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, FaultKind::kPartitionStart);
  ev = schedule.TakeDue(25);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, FaultKind::kPartitionEnd);
  EXPECT_FALSE(schedule.TakeDue(25).has_value());
  EXPECT_EQ(schedule.UntilNext(absl::Seconds(31)), absl::ZeroDuration());
  EXPECT_TRUE(schedule.StartsPending());
  ASSERT_TRUE(schedule.TakeDue(31).has_value());  // the kill
  std::vector<FaultEvent> rest = schedule.TakeRest();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].kind, FaultKind::kRestart);
  EXPECT_FALSE(schedule.StartsPending());
  EXPECT_EQ(schedule.UntilNext(absl::Seconds(31)), absl::InfiniteDuration());
}

TEST(SimFaultsTest, OnlyARestartOrAJoinKeepsTheSimWaiting) {
  FaultFlags flags;
  flags.leave = "n1@50s";
  FaultSchedule schedule(Plan(flags).events);
  EXPECT_FALSE(schedule.StartsPending());
  flags.join = "n4@60s";
  EXPECT_TRUE(FaultSchedule(Plan(flags).events).StartsPending());
}

TEST(SimFaultsTest, TheLogRecordsWhatWasDoneAndWhatWasSkipped) {
  FaultFlags flags;
  flags.kill = "n2@30s";
  flags.partition = "n0,n1|n2,n3@10s-20s";
  const FaultPlan plan = Plan(flags);
  FaultLog log;
  log.Record(plan.events[0], 10.25, "");
  log.Record(plan.events[2], 31.5, "not running");
  log.Record(plan.events[1], -1, "every node had stopped");
  EXPECT_EQ(
      log.json.Dump(),
      R"([{"kind":"partition_start","groups":"n0,n1|n2,n3",)"
      R"("planned_seconds":10,"at_seconds":10.25},)"
      R"({"kind":"kill","node":"n2","planned_seconds":30,"at_seconds":31.5,)"
      R"("skipped":"not running"},)"
      R"({"kind":"partition_end","groups":"n0,n1|n2,n3",)"
      R"("planned_seconds":20,"skipped":"every node had stopped"}])");
  ASSERT_EQ(log.marks.size(), 3u);
  EXPECT_DOUBLE_EQ(log.marks[0].wall_seconds, 10.25);
  EXPECT_EQ(log.marks[1].node, "n2");
  EXPECT_EQ(log.marks[1].skipped, "not running");
  // Never due: marked at its planned time.
  EXPECT_DOUBLE_EQ(log.marks[2].wall_seconds, 20);
  EXPECT_EQ(log.marks[2].kind, "partition_end");
  EXPECT_EQ(FaultTarget(plan.events[2]), "n2");
}

}  // namespace
}  // namespace starling
