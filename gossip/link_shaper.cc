#include "gossip/link_shaper.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/status.h"

namespace starling {
namespace {

constexpr int64_t kMinBurst = 64 << 10;
constexpr double kBytesPerMegabit = 1e6 / 8;

bool ValidHostPort(absl::string_view a) {
  size_t colon = a.rfind(':');
  int port = 0;
  return colon != absl::string_view::npos && colon > 0 &&
         absl::SimpleAtoi(a.substr(colon + 1), &port) && port > 0 &&
         port < 65536;
}

std::string FormatNumber(double v) { return absl::StrFormat("%.10g", v); }

// Sleeps `d` through `sleep` (a plain sleep when null); false when called
// off.
bool SleepOrCancel(absl::Duration d, const LinkShaper::Sleep& sleep) {
  if (sleep) return sleep(d);
  absl::SleepFor(d);
  return true;
}

}  // namespace

LinkShaperOptions ShaperOptionsFor(const LinkParams& params) {
  LinkShaperOptions o;
  o.bytes_per_second = params.bandwidth_mbps * kBytesPerMegabit;
  o.latency = absl::Microseconds(params.latency_ms * 1000);
  return o;
}

LinkShaper::LinkShaper(const LinkShaperOptions& options)
    : rate_(std::max(0.0, options.bytes_per_second)),
      latency_(std::max(absl::ZeroDuration(), options.latency)),
      burst_(options.burst_bytes > 0
                 ? options.burst_bytes
                 : std::max<int64_t>(kMinBurst,
                                     static_cast<int64_t>(rate_ * 0.01))),
      tokens_(static_cast<double>(burst_)),
      last_(absl::Now()) {}

absl::Status LinkShaper::StartMessage(absl::Time deadline, const Sleep& sleep) {
  if (latency_ <= absl::ZeroDuration()) return absl::OkStatus();
  if (absl::Now() + latency_ > deadline) {
    return absl::DeadlineExceededError(absl::StrCat(
        "link emulator: the link's latency of ", absl::FormatDuration(latency_),
        " ends past the deadline"));
  }
  if (!SleepOrCancel(latency_, sleep)) {
    return absl::CancelledError("link emulator: called off in the latency");
  }
  return absl::OkStatus();
}

absl::Duration LinkShaper::MessageTime(int64_t bytes) const {
  absl::Duration t = latency_;
  if (rate_ > 0 && bytes > 0)
    t += absl::Seconds(static_cast<double>(bytes) / rate_);
  return t;
}

std::string FormatKib(int64_t bytes) {
  return absl::StrFormat("%.1f KiB", static_cast<double>(bytes) / 1024);
}

std::string FormatLinkRate(const LinkShaper& link) {
  return link.bytes_per_second() > 0
             ? absl::StrFormat("%.6g Mbit/s",
                               link.bytes_per_second() / kBytesPerMegabit)
             : std::string("unlimited bandwidth");
}

absl::StatusOr<int64_t> ShapedChunkBytes(const LinkShaper& link,
                                         absl::string_view address,
                                         int64_t payload_bytes,
                                         int64_t chunk_bytes,
                                         const StreamLimits& limits) {
  // A receiver takes at most one chunk per 256 bytes of a tensor message.
  constexpr int64_t kMinShapedChunk = 4096;
  auto tenths = [](absl::Duration d) {
    return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(100)));
  };
  const double rate = link.bytes_per_second();
  int64_t chunk = std::max<int64_t>(1, chunk_bytes);
  std::string limit;
  if (rate > 0) {
    chunk = std::min(
        chunk, std::max(kMinShapedChunk,
                        static_cast<int64_t>(
                            rate * absl::ToDoubleSeconds(limits.idle) / 4)));
    const absl::Duration per_chunk = absl::Seconds(
        static_cast<double>(std::min(chunk, payload_bytes)) / rate);
    if (per_chunk >= limits.idle) {
      limit = absl::StrCat("a ", FormatKib(chunk), " chunk takes ",
                           tenths(per_chunk),
                           ", and a receiver cancels a stream that carries no "
                           "chunk for --stream_idle_timeout (",
                           absl::FormatDuration(limits.idle), ")");
    }
  }
  const absl::Duration need = link.MessageTime(payload_bytes);
  if (limit.empty() && need > limits.stream) {
    limit = absl::StrCat("a receiver cancels its stream after ",
                         absl::FormatDuration(limits.stream), " (",
                         limits.stream_flag, ")");
  } else if (limit.empty() && need > limits.sender) {
    limit = absl::StrCat("a sender gives up on it after ",
                         absl::FormatDuration(limits.sender), " (",
                         limits.sender_flag, ")");
  }
  if (limit.empty()) return chunk;
  return absl::FailedPreconditionError(absl::StrCat(
      "the emulated link to ", address, " (", FormatLinkRate(link), ", ",
      link.latency() > absl::ZeroDuration()
          ? absl::StrCat(absl::FormatDuration(link.latency()), " latency")
          : "no latency",
      ") is too slow for this run: a ", FormatKib(payload_bytes),
      " message takes ", tenths(need), " on it, and ", limit,
      "; raise --link_bandwidth_mbps, send fewer bytes (--compression) or "
      "raise that limit"));
}

absl::Status LinkShaper::Acquire(int64_t bytes, absl::Time deadline,
                                 const Sleep& sleep) {
  if (rate_ <= 0 || bytes <= 0) return absl::OkStatus();
  absl::Duration wait;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now > last_) {
      tokens_ = std::min(static_cast<double>(burst_),
                         tokens_ + rate_ * absl::ToDoubleSeconds(now - last_));
      last_ = now;
    }
    const double after = tokens_ - static_cast<double>(bytes);
    wait = after >= 0 ? absl::ZeroDuration() : absl::Seconds(-after / rate_);
    if (now + wait > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "link emulator: ", bytes, " bytes at ",
          FormatNumber(rate_ / kBytesPerMegabit), " Mbit/s would need ",
          absl::FormatDuration(wait), ", past the deadline"));
    }
    tokens_ = after;  // the debt is paid while this caller sleeps
  }
  if (wait > absl::ZeroDuration() && !SleepOrCancel(wait, sleep)) {
    absl::MutexLock lock(&mu_);  // these bytes will not go: give them back
    tokens_ = std::min(static_cast<double>(burst_),
                       tokens_ + static_cast<double>(bytes));
    return absl::CancelledError(absl::StrCat(
        "link emulator: called off waiting to send ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LinkValueSpec> ParseLinkValueSpec(absl::string_view flag,
                                                 absl::string_view value,
                                                 double max_value) {
  LinkValueSpec spec;
  if (absl::StripAsciiWhitespace(value).empty()) return spec;
  auto error = [&](absl::string_view token, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", value, ": in '", token, "': ", why));
  };
  for (absl::string_view raw : absl::StrSplit(value, ',')) {
    absl::string_view token = absl::StripAsciiWhitespace(raw);
    if (token.empty()) return error(token, "empty entry (stray comma?)");
    absl::string_view key;
    absl::string_view number = token;
    const size_t eq = token.rfind('=');
    if (eq != absl::string_view::npos) {
      key = absl::StripAsciiWhitespace(token.substr(0, eq));
      number = absl::StripAsciiWhitespace(token.substr(eq + 1));
      if (key.empty()) return error(token, "empty name before '='");
    }
    double v = 0;
    if (!absl::SimpleAtod(number, &v) || !std::isfinite(v)) {
      return error(token, absl::StrCat("bad number '", number, "'"));
    }
    if (v < 0) {
      return error(token, absl::StrCat("value ", number, " is negative"));
    }
    if (v > max_value) {
      return error(token, absl::StrCat("value ", number, " is over the limit ",
                                       FormatNumber(max_value)));
    }
    if (eq == absl::string_view::npos) {
      if (spec.default_value.has_value()) {
        return error(token, "a second default (only one entry may lack NAME=)");
      }
      spec.default_value = v;
    } else {
      spec.entries.push_back({std::string(key), v, std::string(token)});
    }
  }
  return spec;
}

bool LinkEmulatorOptions::shaped() const {
  if (defaults.shaped()) return true;
  for (const auto& [address, p] : links) {
    if (p.shaped()) return true;
  }
  return false;
}

absl::StatusOr<LinkEmulatorOptions> ParseLinkFlags(
    const std::string& bandwidth_mbps, const std::string& latency_ms) {
  LinkEmulatorOptions o;
  struct Flag {
    const char* name;
    const std::string& value;
    double LinkParams::*field;
    double max;
  };
  const Flag flags[] = {
      {"link_bandwidth_mbps", bandwidth_mbps, &LinkParams::bandwidth_mbps,
       std::numeric_limits<double>::max()},
      {"link_latency_ms", latency_ms, &LinkParams::latency_ms,
       kMaxLinkLatencyMs}};
  std::vector<LinkValueSpec> specs;
  for (const Flag& f : flags) {
    STARLING_ASSIGN_OR_RETURN(LinkValueSpec spec,
                              ParseLinkValueSpec(f.name, f.value, f.max));
    if (spec.default_value) o.defaults.*f.field = *spec.default_value;
    specs.push_back(std::move(spec));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    std::map<std::string, bool> seen;
    for (const LinkValueSpec::Entry& e : specs[i].entries) {
      const std::string& address = e.key;
      auto error = [&](absl::string_view why) {
        return absl::InvalidArgumentError(absl::StrCat("--", flags[i].name, "=",
                                                       flags[i].value, ": in '",
                                                       e.token, "': ", why));
      };
      if (!ValidHostPort(address)) {
        return error(absl::StrCat("'", address,
                                  "' is not HOST:PORT (the peer's address)"));
      }
      if (seen[address]) {
        return error(absl::StrCat(address, " is listed twice"));
      }
      seen[address] = true;
      o.links.emplace(address, o.defaults);
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    for (const LinkValueSpec::Entry& e : specs[i].entries) {
      o.links[e.key].*flags[i].field = e.value;
    }
  }
  return o;
}

std::pair<std::string, std::string> FormatLinkFlags(
    const LinkEmulatorOptions& options) {
  std::vector<std::string> bw = {FormatNumber(options.defaults.bandwidth_mbps)};
  std::vector<std::string> lat = {FormatNumber(options.defaults.latency_ms)};
  for (const auto& [address, p] : options.links) {
    bw.push_back(absl::StrCat(address, "=", FormatNumber(p.bandwidth_mbps)));
    lat.push_back(absl::StrCat(address, "=", FormatNumber(p.latency_ms)));
  }
  return {absl::StrJoin(bw, ","), absl::StrJoin(lat, ",")};
}

LinkEmulator::LinkEmulator(LinkEmulatorOptions options)
    : options_(std::move(options)) {}

LinkShaper* LinkEmulator::For(const std::string& address) {
  auto it = options_.links.find(address);
  const LinkParams& p =
      it == options_.links.end() ? options_.defaults : it->second;
  if (!p.shaped()) return nullptr;
  absl::MutexLock lock(&mu_);
  std::unique_ptr<LinkShaper>& s = shapers_[address];
  if (s == nullptr) {
    LinkShaperOptions so = ShaperOptionsFor(p);
    so.burst_bytes = options_.burst_bytes;
    s = std::make_unique<LinkShaper>(so);
  }
  return s.get();
}

absl::StatusOr<int64_t> LinkEmulator::ChunkBytes(const LinkShaper& link,
                                                 const std::string& address,
                                                 int64_t payload_bytes,
                                                 int64_t chunk_bytes,
                                                 const StreamLimits& limits) {
  absl::StatusOr<int64_t> chunk =
      ShapedChunkBytes(link, address, payload_bytes, chunk_bytes, limits);
  if (!chunk.ok()) {
    absl::MutexLock lock(&mu_);
    if (error_.ok()) error_ = chunk.status();
  }
  return chunk;
}

absl::Status LinkEmulator::Error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

}  // namespace starling
