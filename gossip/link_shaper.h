// Link emulation for the transport: a LinkShaper is one emulated link (a
// token bucket for bandwidth plus a fixed latency per message), and a
// LinkEmulator hands out one shaper per destination address, built from the
// --link_bandwidth_mbps / --link_latency_ms flags. Senders call StartMessage
// once before a message's first chunk and Acquire(serialized chunk bytes)
// before each chunk write, so the stream really is slow and gRPC's flow
// control sees a slow writer. Only tensor messages (GrpcTransport::Send) and
// gossip pushes (Swarm::Push) are shaped; control RPCs (handshakes,
// membership gossip, joins, state transfer) are not. No gRPC dependency.
// LinkShaper and LinkEmulator are thread-safe; the parse functions are pure.
#ifndef STARLING_GOSSIP_LINK_SHAPER_H_
#define STARLING_GOSSIP_LINK_SHAPER_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace starling {

// What one link looks like from its sender.
struct LinkParams {
  double bandwidth_mbps = 0;  // megabits (1e6 bits) per second; 0: unlimited
  double latency_ms = 0;      // added once per message; 0: none
  bool shaped() const { return bandwidth_mbps > 0 || latency_ms > 0; }
};

struct LinkShaperOptions {
  double bytes_per_second = 0;  // 0: unlimited
  absl::Duration latency = absl::ZeroDuration();
  // The bucket's size: how many bytes may go at once after an idle spell.
  // 0: max(64 KiB, 10 ms at the rate).
  int64_t burst_bytes = 0;
};

// Options for a link with `params`.
LinkShaperOptions ShaperOptionsFor(const LinkParams& params);

// One emulated link. The bucket starts full. Acquire takes more bytes than
// the bucket holds by going into debt: the caller sleeps until the debt
// would be paid, so concurrent senders on one link share its rate.
class LinkShaper {
 public:
  explicit LinkShaper(const LinkShaperOptions& options);

  // How StartMessage and Acquire wait: sleeps for the duration and returns
  // true, or returns false as soon as the sender is called off. Null: a
  // plain sleep.
  using Sleep = std::function<bool(absl::Duration)>;

  // Sleeps the link's latency: call once per message, before its first
  // chunk. DeadlineExceeded (without sleeping) when the latency would end
  // after `deadline`; Cancelled when `sleep` is called off.
  absl::Status StartMessage(absl::Time deadline, const Sleep& sleep = nullptr);

  // Sleeps until `bytes` more bytes fit the link's rate, then returns OK;
  // at once when the link is unlimited. DeadlineExceeded (without sleeping
  // or taking the tokens) when that would be after `deadline`; Cancelled
  // (giving the tokens back) when `sleep` is called off.
  absl::Status Acquire(int64_t bytes, absl::Time deadline,
                       const Sleep& sleep = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // The time a message of `bytes` takes on this link once its burst is
  // spent, as it is after a run's first messages: its latency plus the
  // bytes at the link's rate. Zero when unshaped.
  absl::Duration MessageTime(int64_t bytes) const;

  double bytes_per_second() const { return rate_; }
  absl::Duration latency() const { return latency_; }
  int64_t burst_bytes() const { return burst_; }

 private:
  const double rate_;
  const absl::Duration latency_;
  const int64_t burst_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);  // may be negative: debt
  absl::Time last_ ABSL_GUARDED_BY(mu_);
};

// What a receiver allows one incoming message, and how long its sender
// waits for it: the limits a slow link must fit. A sender takes the
// receivers' limits to be its own flags (members of a run share them).
struct StreamLimits {
  // A receiver cancels a stream that carries no chunk for this long
  // (--stream_idle_timeout).
  absl::Duration idle = absl::Seconds(60);
  // A receiver cancels a message's stream after this long; stream_flag
  // names what sets it, for errors.
  absl::Duration stream = absl::InfiniteDuration();
  std::string stream_flag;
  // A sender gives up on a message after this long (sender_flag: its flag).
  absl::Duration sender = absl::InfiniteDuration();
  std::string sender_flag;
};

// The chunk size for a message of `payload_bytes` to `address` over `link`:
// at most `chunk_bytes`, and on a rate-limited link no more than a quarter
// of limits.idle at its rate (at least 4 KiB), so every chunk arrives
// before the receiver's idle limit. FailedPrecondition naming the link, the
// message, the time it needs (MessageTime) and the limit when the link
// cannot carry it within `limits` at all: no retry can help then.
absl::StatusOr<int64_t> ShapedChunkBytes(const LinkShaper& link,
                                         absl::string_view address,
                                         int64_t payload_bytes,
                                         int64_t chunk_bytes,
                                         const StreamLimits& limits);

// "12.3 KiB", for messages about links.
std::string FormatKib(int64_t bytes);

// "0.05 Mbit/s", or "unlimited bandwidth".
std::string FormatLinkRate(const LinkShaper& link);

// The largest --link_latency_ms accepted: a minute per message is already
// far beyond any real link, and a typo such as 1e9 would otherwise stall
// every exchange until the round's deadlines give up.
inline constexpr double kMaxLinkLatencyMs = 60000;

// One emulator flag's value: DEFAULT[,KEY=VALUE...]. The default is the
// entry without '=' (at most one; absent: unset), KEY is as given (checked
// by the caller) and every VALUE a finite number in [0, max_value].
struct LinkValueSpec {
  struct Entry {
    std::string key;
    double value = 0;
    std::string token;  // as given, for error messages
  };
  std::optional<double> default_value;
  std::vector<Entry> entries;  // in the given order
};

// Parses `value` of --`flag`. "" is an empty spec. InvalidArgument naming
// the flag, its value and the bad token for an empty token, a bad number, a
// negative, non-finite or over `max_value` value, an empty key, and a
// second default.
absl::StatusOr<LinkValueSpec> ParseLinkValueSpec(
    absl::string_view flag, absl::string_view value,
    double max_value = std::numeric_limits<double>::max());

struct LinkEmulatorOptions {
  LinkParams defaults;                      // every link not listed below
  std::map<std::string, LinkParams> links;  // by destination host:port
  int64_t burst_bytes = 0;                  // see LinkShaperOptions
  // Whether any link is shaped.
  bool shaped() const;
};

// The node flags: --link_bandwidth_mbps and --link_latency_ms, each
// DEFAULT[,HOST:PORT=VALUE...]. A link listed in only one flag takes the
// other flag's default. InvalidArgument naming the flag and the bad token
// (see ParseLinkValueSpec; also a key that is not host:port, or one listed
// twice).
absl::StatusOr<LinkEmulatorOptions> ParseLinkFlags(
    const std::string& bandwidth_mbps, const std::string& latency_ms);

// The flags' values ("DEFAULT,HOST:PORT=VALUE,...") that ParseLinkFlags
// reads back into `options` (burst aside).
std::pair<std::string, std::string> FormatLinkFlags(
    const LinkEmulatorOptions& options);

// Shapers by destination address, made on first use.
class LinkEmulator {
 public:
  explicit LinkEmulator(LinkEmulatorOptions options);

  // The shaper of the link to `address`, or null when that link is not
  // shaped. Shapers live as long as the emulator.
  LinkShaper* For(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  // ShapedChunkBytes for a message to `address` over `link` (its shaper).
  // The first error is kept for Error(): the emulated links stay as they
  // are for the whole run, so every later message would fail alike.
  absl::StatusOr<int64_t> ChunkBytes(const LinkShaper& link,
                                     const std::string& address,
                                     int64_t payload_bytes, int64_t chunk_bytes,
                                     const StreamLimits& limits)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Not OK once ChunkBytes found a link too slow for the run.
  absl::Status Error() const ABSL_LOCKS_EXCLUDED(mu_);

  const LinkEmulatorOptions& options() const { return options_; }

 private:
  const LinkEmulatorOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<LinkShaper>> shapers_
      ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_LINK_SHAPER_H_
