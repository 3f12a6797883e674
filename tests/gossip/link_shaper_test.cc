// The link emulator: bytes over time match the configured rate, latency is
// added once per message, unlimited links never wait, deadlines hold, and
// the flag specs parse (and bad ones are refused naming the flag and token).
// Rate and latency checks use real time; the lower bounds are strict, the
// upper ones leave slack for a busy 2-core machine.
#include "gossip/link_shaper.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace starling {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

double SecondsSince(absl::Time start) {
  return absl::ToDoubleSeconds(absl::Now() - start);
}

TEST(LinkShaperTest, BytesOverTimeMatchTheRate) {
  LinkShaperOptions o;
  o.bytes_per_second = 2e6;  // 2 MB/s = 16 Mbit/s
  LinkShaper link(o);
  const int64_t chunk = 64 << 10;
  const int64_t total = 32 * chunk;  // 2 MiB
  const absl::Time start = absl::Now();
  for (int64_t sent = 0; sent < total; sent += chunk) {
    ASSERT_TRUE(link.Acquire(chunk, absl::InfiniteFuture()).ok());
  }
  // The full bucket goes at once; the rest at the rate.
  const double expected = (total - link.burst_bytes()) / o.bytes_per_second;
  const double elapsed = SecondsSince(start);
  EXPECT_GE(elapsed, expected * 0.9);
  EXPECT_LE(elapsed, expected * 1.1 + 0.05);
}

TEST(LinkShaperTest, ConcurrentSendersShareTheRate) {
  LinkShaperOptions o;
  o.bytes_per_second = 2e6;
  o.burst_bytes = 16 << 10;
  LinkShaper link(o);
  const int64_t chunk = 32 << 10;
  const int64_t per_thread = 16 * chunk;  // 512 KiB each, 1 MiB in all
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int64_t sent = 0; sent < per_thread; sent += chunk) {
        EXPECT_TRUE(link.Acquire(chunk, absl::InfiniteFuture()).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  const double expected =
      (2 * per_thread - link.burst_bytes()) / o.bytes_per_second;
  const double elapsed = SecondsSince(start);
  EXPECT_GE(elapsed, expected * 0.9);
  EXPECT_LE(elapsed, expected * 1.1 + 0.05);
}

TEST(LinkShaperTest, MoreThanTheBurstAtOnceWaitsInProportion) {
  LinkShaperOptions o;
  o.bytes_per_second = 1e6;
  o.burst_bytes = 10000;
  LinkShaper link(o);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(link.Acquire(310000, absl::InfiniteFuture()).ok());
  const double elapsed = SecondsSince(start);
  EXPECT_GE(elapsed, 0.3 * 0.9);
  EXPECT_LE(elapsed, 0.3 * 1.1 + 0.05);
}

TEST(LinkShaperTest, LatencyIsAddedOncePerMessage) {
  // 5 messages of 8 chunks each on a link with latency and no rate limit:
  // 5 latencies, not 40.
  LinkShaperOptions o;
  o.latency = absl::Milliseconds(40);
  LinkShaper link(o);
  const absl::Time start = absl::Now();
  for (int m = 0; m < 5; ++m) {
    ASSERT_TRUE(link.StartMessage(absl::InfiniteFuture()).ok());
    for (int c = 0; c < 8; ++c) {
      ASSERT_TRUE(link.Acquire(1 << 20, absl::InfiniteFuture()).ok());
    }
  }
  const double elapsed = SecondsSince(start);
  EXPECT_GE(elapsed, 5 * 0.040 * 0.9);
  EXPECT_LE(elapsed, 5 * 0.040 * 1.1 + 0.1);  // well below 40 latencies
  EXPECT_EQ(link.latency(), absl::Milliseconds(40));
}

TEST(LinkShaperTest, LatencyAndRateAdd) {
  LinkShaperOptions o;
  o.bytes_per_second = 1e6;
  o.burst_bytes = 1;
  o.latency = absl::Milliseconds(50);
  LinkShaper link(o);
  const absl::Time start = absl::Now();
  for (int m = 0; m < 2; ++m) {
    ASSERT_TRUE(link.StartMessage(absl::InfiniteFuture()).ok());
    for (int c = 0; c < 4; ++c) {
      ASSERT_TRUE(link.Acquire(25000, absl::InfiniteFuture()).ok());
    }
  }
  // 2 × 50 ms latency + 200 kB at 1 MB/s.
  const double expected = 2 * 0.05 + 0.2;
  const double elapsed = SecondsSince(start);
  EXPECT_GE(elapsed, expected * 0.9);
  EXPECT_LE(elapsed, expected * 1.1 + 0.1);
}

TEST(LinkShaperTest, UnlimitedIsImmediate) {
  LinkShaper link(LinkShaperOptions{});
  const absl::Time start = absl::Now();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(link.StartMessage(absl::InfiniteFuture()).ok());
    ASSERT_TRUE(link.Acquire(int64_t{1} << 30, absl::InfiniteFuture()).ok());
  }
  EXPECT_LT(SecondsSince(start), 0.5);
  // Even with a deadline already past: nothing to wait for.
  EXPECT_TRUE(link.Acquire(1 << 20, absl::InfinitePast()).ok());
  EXPECT_TRUE(link.StartMessage(absl::InfinitePast()).ok());
}

TEST(LinkShaperTest, DeadlinesAreRespectedWithoutSleeping) {
  LinkShaperOptions o;
  o.bytes_per_second = 1e6;
  o.burst_bytes = 1000;
  o.latency = absl::Seconds(5);
  LinkShaper link(o);
  const absl::Time start = absl::Now();
  // 10 MB at 1 MB/s needs 10 s; the deadline is in 1 s.
  absl::Status s = link.Acquire(10000000, absl::Now() + absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("link emulator"));
  s = link.StartMessage(absl::Now() + absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(SecondsSince(start), 0.5);
  // A refused Acquire took no tokens: the bucket still holds its burst.
  const absl::Time again = absl::Now();
  EXPECT_TRUE(link.Acquire(1000, absl::Now() + absl::Milliseconds(1)).ok());
  EXPECT_LT(SecondsSince(again), 0.5);
}

TEST(LinkShaperTest, ASenderCalledOffStopsWaitingAndGivesItsTokensBack) {
  LinkShaperOptions o;
  o.bytes_per_second = 1e6;
  o.burst_bytes = 1000;
  o.latency = absl::Seconds(5);
  LinkShaper link(o);
  std::vector<absl::Duration> asked;
  auto called_off = [&](absl::Duration d) {
    asked.push_back(d);
    return false;
  };
  absl::Status s = link.StartMessage(absl::InfiniteFuture(), called_off);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], absl::Seconds(5));
  // 5 MB at 1 MB/s: about 5 s of waiting, called off.
  s = link.Acquire(5000000, absl::InfiniteFuture(), called_off);
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("called off"));
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_GT(asked[1], absl::Seconds(4));
  // Those bytes never went, so the link owes nothing for them: the next
  // sender waits for its own bytes only.
  absl::Duration next = absl::InfiniteDuration();
  ASSERT_TRUE(link.Acquire(2000, absl::InfiniteFuture(),
                           [&](absl::Duration d) {
                             next = d;
                             return true;
                           })
                  .ok());
  EXPECT_LT(next, absl::Milliseconds(100));
}

TEST(LinkShaperTest, DefaultBurstIsTenMillisecondsOrSixtyFourKiB) {
  LinkShaperOptions o;
  o.bytes_per_second = 1e6;
  EXPECT_EQ(LinkShaper(o).burst_bytes(), 64 << 10);
  o.bytes_per_second = 1e9;
  EXPECT_EQ(LinkShaper(o).burst_bytes(), 10000000);
}

// What a message needs once the bucket's burst is spent: the transport
// refuses a link whose messages can never arrive within the run's limits.
TEST(LinkShaperTest, MessageTimeIsTheLatencyPlusTheBytesAtTheRate) {
  LinkShaperOptions o;
  o.bytes_per_second = 1000;
  o.latency = absl::Milliseconds(50);
  LinkShaper link(o);
  EXPECT_EQ(link.MessageTime(2000), absl::Milliseconds(2050));
  EXPECT_EQ(link.MessageTime(0), absl::Milliseconds(50));
  // Below the burst too: only the run's first messages ride on it.
  EXPECT_GT(link.burst_bytes(), 2000);
  EXPECT_EQ(LinkShaper(LinkShaperOptions()).MessageTime(1 << 30),
            absl::ZeroDuration());
}

// A receiver cancels a stream that carries no chunk for its idle time: a
// slow link's chunks are cut to arrive well within it, and a link that
// cannot carry a message within the receiver's or the sender's limits at
// all is an error naming the link, the message and the limit.
TEST(LinkShaperTest, ChunksFitTheIdleLimitAndATooSlowLinkIsNamed) {
  StreamLimits limits;
  limits.idle = absl::Seconds(60);
  limits.stream = absl::Seconds(120);
  limits.stream_flag = "--round_deadline plus a minute";
  limits.sender = absl::Seconds(300);
  limits.sender_flag = "--round_timeout";
  auto chunk = [&](double mbps, int64_t payload) {
    return ShapedChunkBytes(LinkShaper(ShaperOptionsFor({mbps, 0})),
                            "127.0.0.1:7001", payload, 1 << 20, limits);
  };
  // 100 Mbit/s: --chunk_bytes as given.
  EXPECT_EQ(chunk(100, 64 << 20).value_or(-1), 1 << 20);
  // 0.08 Mbit/s = 10 kB/s: a quarter of 60 s is 150 kB.
  EXPECT_EQ(chunk(0.08, 1 << 20).value_or(-1), 150000);
  // 0.0008 Mbit/s = 100 B/s: never under 4 KiB (41 s per chunk).
  EXPECT_EQ(chunk(0.0008, 10000).value_or(-1), 4096);

  struct Case {
    double mbps;
    int64_t payload;
    std::string limit;
  };
  for (const Case& c : std::vector<Case>{
           {0.0004, 10000, "--stream_idle_timeout (1m)"},      // 4 KiB: 82 s
           {0.08, 2 << 20, "--round_deadline plus a minute"},  // 210 s
           {0.08, 3500000, ""},                                // 350 s
       }) {
    StreamLimits l = limits;
    if (c.limit.empty()) l.stream = absl::InfiniteDuration();
    absl::StatusOr<int64_t> r =
        ShapedChunkBytes(LinkShaper(ShaperOptionsFor({c.mbps, 0})),
                         "127.0.0.1:7001", c.payload, 1 << 20, l);
    ASSERT_FALSE(r.ok()) << c.mbps;
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
    EXPECT_THAT(r.status().message(),
                AllOf(HasSubstr("127.0.0.1:7001"), HasSubstr("too slow"),
                      HasSubstr(c.limit.empty() ? "--round_timeout" : c.limit),
                      HasSubstr("--link_bandwidth_mbps")));
  }
  // Within every limit: no error, however slow.
  limits.stream = limits.sender = absl::InfiniteDuration();
  EXPECT_TRUE(chunk(0.08, 64 << 20).ok());
}

TEST(LinkShaperTest, MegabitsAreMillionsOfBits) {
  LinkShaperOptions o = ShaperOptionsFor({100, 50});
  EXPECT_DOUBLE_EQ(o.bytes_per_second, 12.5e6);
  EXPECT_EQ(o.latency, absl::Milliseconds(50));
}

TEST(LinkSpecTest, ParsesDefaultsAndPerPeerValues) {
  auto o = ParseLinkFlags("100, 127.0.0.1:7001=10", "127.0.0.1:7002=20");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_DOUBLE_EQ(o->defaults.bandwidth_mbps, 100);
  EXPECT_DOUBLE_EQ(o->defaults.latency_ms, 0);
  ASSERT_EQ(o->links.size(), 2u);
  // A peer named in one flag takes the other flag's default.
  EXPECT_DOUBLE_EQ(o->links.at("127.0.0.1:7001").bandwidth_mbps, 10);
  EXPECT_DOUBLE_EQ(o->links.at("127.0.0.1:7001").latency_ms, 0);
  EXPECT_DOUBLE_EQ(o->links.at("127.0.0.1:7002").bandwidth_mbps, 100);
  EXPECT_DOUBLE_EQ(o->links.at("127.0.0.1:7002").latency_ms, 20);
  EXPECT_TRUE(o->shaped());

  auto none = ParseLinkFlags("", "");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->shaped());
  EXPECT_TRUE(none->links.empty());

  // FormatLinkFlags round-trips.
  auto [bw, lat] = FormatLinkFlags(*o);
  auto back = ParseLinkFlags(bw, lat);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(FormatLinkFlags(*back), FormatLinkFlags(*o));
}

TEST(LinkSpecTest, RejectsBadSpecsNamingTheFlagAndToken) {
  struct Case {
    const char* bandwidth;
    const char* latency;
    const char* mention;
  };
  for (const Case& c : std::vector<Case>{
           {"fast", "", "--link_bandwidth_mbps=fast: in 'fast'"},
           {"-5", "", "in '-5': value -5 is negative"},
           {"inf", "", "bad number 'inf'"},
           {"nan", "", "bad number 'nan'"},
           {"10,", "", "empty entry"},
           {"10,20", "", "in '20': a second default"},
           {"=5", "", "empty name"},
           {"", "10,n1=5", "--link_latency_ms=10,n1=5: in 'n1=5'"},
           {"", "127.0.0.1:99999=5", "is not HOST:PORT"},
           {"", "127.0.0.1:7001=x", "bad number 'x'"},
           {"", "1e9", "in '1e9': value 1e9 is over the limit 60000"},
           {"", "10,127.0.0.1:7001=60001", "value 60001 is over the limit"},
           {"127.0.0.1:7001=5,127.0.0.1:7001=6", "", "listed twice"},
       }) {
    auto r = ParseLinkFlags(c.bandwidth, c.latency);
    ASSERT_FALSE(r.ok()) << c.bandwidth << " " << c.latency;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.mention))
        << r.status();
  }
}

TEST(LinkEmulatorTest, OneShaperPerShapedDestination) {
  auto o = ParseLinkFlags("0,127.0.0.1:7001=8", "127.0.0.1:7002=5");
  ASSERT_TRUE(o.ok()) << o.status();
  LinkEmulator links(*o);
  LinkShaper* a = links.For("127.0.0.1:7001");
  LinkShaper* b = links.For("127.0.0.1:7002");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(links.For("127.0.0.1:7001"), a);
  EXPECT_DOUBLE_EQ(a->bytes_per_second(), 1e6);
  EXPECT_EQ(a->latency(), absl::ZeroDuration());
  EXPECT_DOUBLE_EQ(b->bytes_per_second(), 0);
  EXPECT_EQ(b->latency(), absl::Milliseconds(5));
  // Unlisted peers take the defaults: unlimited, no latency.
  EXPECT_EQ(links.For("127.0.0.1:7003"), nullptr);

  auto d = ParseLinkFlags("100", "50");
  ASSERT_TRUE(d.ok());
  LinkEmulator all(*d);
  LinkShaper* x = all.For("10.0.0.1:1");
  LinkShaper* y = all.For("10.0.0.2:1");
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  EXPECT_NE(x, y);  // each link its own bucket
  EXPECT_DOUBLE_EQ(x->bytes_per_second(), 12.5e6);
}

}  // namespace
}  // namespace starling
