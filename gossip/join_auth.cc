#include "gossip/join_auth.h"

#include <grpcpp/grpcpp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/logging.h"

namespace starling {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr size_t kNonceBytes = 16;

}  // namespace

std::string PeerHost(absl::string_view peer) {
  // "ipv4:HOST:PORT", "ipv6:[HOST]:PORT", "unix:PATH".
  const size_t colon = peer.find(':');
  if (colon == absl::string_view::npos) return std::string(peer);
  absl::string_view rest = peer.substr(colon + 1);
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close != absl::string_view::npos) {
      return std::string(rest.substr(1, close - 1));
    }
  }
  const size_t last = rest.rfind(':');
  if (peer.substr(0, colon) == "unix" || last == absl::string_view::npos) {
    return std::string(rest);
  }
  return std::string(rest.substr(0, last));
}

JoinAuth::JoinAuth(std::string token, const JoinAuthOptions& options)
    : token_(std::move(token)), options_(options), log_(options.log_period) {}

absl::StatusOr<std::shared_ptr<JoinAuth>> JoinAuth::FromToken(
    std::string token, const JoinAuthOptions& options) {
  if (token.size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the join token has ", token.size(), " bytes; at least ",
        kMinTokenBytes,
        " are needed (make one with: openssl rand -hex 32 > token)"));
  }
  return std::shared_ptr<JoinAuth>(new JoinAuth(std::move(token), options));
}

absl::StatusOr<std::shared_ptr<JoinAuth>> JoinAuth::FromFile(
    const std::string& path, const JoinAuthOptions& options) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--join_token_file=", path, ": ", text.status().message()));
  }
  std::string token(absl::StripTrailingAsciiWhitespace(*text));
  auto auth = FromToken(std::move(token), options);
  if (!auth.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--join_token_file=", path, ": ", auth.status().message()));
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    LogEvent(LogLevel::kWarning, "join_token",
             absl::StrCat("--join_token_file=", path,
                          " can be read by other users; chmod 600 it"));
  }
  return auth;
}

std::string JoinAuth::Mac(absl::string_view method, int64_t unix_ms,
                          absl::string_view nonce) const {
  const std::string msg =
      absl::StrCat("starling-join-v1\n", method, "\n", unix_ms, "\n", nonce);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token_.data(), static_cast<int>(token_.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac,
       &len);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(mac), len));
}

std::string JoinAuth::Stamp(absl::string_view method, absl::Time now) const {
  unsigned char raw[kNonceBytes];
  if (RAND_bytes(raw, sizeof(raw)) != 1) {
    // No randomness: a stamp that no server admits beats a guessable one.
    return "v1.0.0.0";
  }
  const std::string nonce = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)));
  const int64_t ms = absl::ToUnixMillis(now);
  return absl::StrCat("v1.", ms, ".", nonce, ".", Mac(method, ms, nonce));
}

void JoinAuth::Sign(grpc::ClientContext* ctx, absl::string_view method) const {
  ctx->AddMetadata(kAuthHeader, Stamp(method, absl::Now()));
}

absl::Status JoinAuth::Verify(absl::string_view header,
                              absl::string_view method, absl::Time now) {
  auto refuse = [this](absl::string_view why) {
    absl::MutexLock lock(&mu_);
    ++refused_;
    return absl::UnauthenticatedError(why);
  };
  if (header.empty()) {
    return refuse(absl::StrCat("no join token proof (", kAuthHeader,
                               " header); this swarm needs --join_token_file"));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(header, '.');
  int64_t ms = 0;
  if (parts.size() != 4 || parts[0] != "v1" ||
      !absl::SimpleAtoi(parts[1], &ms) || parts[2].size() != 2 * kNonceBytes ||
      parts[3].size() != 64) {
    return refuse(absl::StrCat("malformed ", kAuthHeader, " header"));
  }
  const std::string want = Mac(method, ms, parts[2]);
  if (CRYPTO_memcmp(want.data(), parts[3].data(), want.size()) != 0) {
    return refuse("wrong join token (the HMAC does not match)");
  }
  const absl::Time stamped = absl::FromUnixMillis(ms);
  if (stamped < now - options_.window || stamped > now + options_.window) {
    return refuse(absl::StrCat("request stamped ",
                               absl::FormatDuration(stamped - now),
                               " from this node's clock (more than ",
                               absl::FormatDuration(options_.window),
                               " apart: a replay, or clocks out of sync)"));
  }
  absl::MutexLock lock(&mu_);
  // Forget nonces that have aged out of the window (their stamps are
  // refused above), and the oldest ones when there are too many (stamps at
  // or before those are refused as too old).
  auto forget_oldest = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    floor_ms_ = std::max(floor_ms_, by_time_.begin()->first);
    nonces_.erase(by_time_.begin()->second);
    by_time_.erase(by_time_.begin());
  };
  const int64_t expired = absl::ToUnixMillis(now - 2 * options_.window);
  while (!by_time_.empty() && by_time_.begin()->first < expired) {
    forget_oldest();
  }
  if (ms <= floor_ms_) {
    ++refused_;
    return absl::UnauthenticatedError(
        "request older than the nonces this node still remembers");
  }
  std::string nonce(parts[2]);
  if (nonces_.contains(nonce)) {
    ++refused_;
    return absl::UnauthenticatedError(
        "replayed request (its nonce was used before)");
  }
  while (!by_time_.empty() &&
         static_cast<int64_t>(by_time_.size()) >= options_.max_nonces) {
    forget_oldest();
  }
  nonces_.insert(nonce);
  by_time_.emplace(ms, std::move(nonce));
  return absl::OkStatus();
}

bool JoinAuth::ShouldLog(const std::string& host, absl::Time now,
                         int64_t* unlogged) {
  return log_.ShouldLog(host, now, unlogged);
}

grpc::Status JoinAuth::Admit(grpc::ServerContextBase* ctx,
                             absl::string_view method) {
  absl::string_view header;
  const auto& md = ctx->client_metadata();
  if (auto it = md.find(kAuthHeader); it != md.end()) {
    header = absl::string_view(it->second.data(), it->second.size());
  }
  const absl::Time now = absl::Now();
  absl::Status s = Verify(header, method, now);
  if (s.ok()) return grpc::Status::OK;
  const std::string host = PeerHost(ctx->peer());
  log_.Warn(host, now, "unauthenticated",
            absl::StrCat("refused an unauthenticated ", method, " call from ",
                         host, ": ", s.message()));
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      std::string(s.message()));
}

int64_t JoinAuth::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

}  // namespace starling
