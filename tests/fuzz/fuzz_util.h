// Helpers shared by the fuzz targets and the seed generator (make_seeds.cc):
// a cursor that reads little-endian fields from the front of a fuzz input
// (zeros once the input runs out, so every input is a valid program), the
// matching writer, so that seeds are written in exactly the layout the
// targets read, an invariant check that aborts (libFuzzer reports it as a
// crash), a per-process scratch directory for targets that need files, and
// the join-token MAC, so that inputs can carry correctly signed headers.
#ifndef STARLING_TESTS_FUZZ_FUZZ_UTIL_H_
#define STARLING_TESTS_FUZZ_FUZZ_UTIL_H_

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

// Aborts with a message when an invariant does not hold.
#define FUZZ_CHECK(cond, ...)                                         \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, \
                   __LINE__, #cond);                                  \
      std::fprintf(stderr, "  " __VA_ARGS__);                         \
      std::fprintf(stderr, "\n");                                     \
      std::abort();                                                   \
    }                                                                 \
  } while (0)

namespace starling {
namespace fuzz {

// Codec specs the targets pick from by an input byte (index modulo the
// count); make_seeds writes the same indexes.
inline constexpr const char* kCodecSpecs[] = {"fp32", "fp16", "bf16",
                                              "int8", "int4", "topk:0.1"};
inline constexpr const char* kPolicyMain[] = {
    "fp32",     "fp16",      "bf16",      "int8",          "int4:32",
    "topk:0.1", "int8+zstd", "fp16+zstd", "topk:0.05+int8"};
inline constexpr const char* kPolicySmall[] = {"bf16", "fp32", "fp16", "int8"};
// Push codecs: index 0 is raw fp32, i > 0 is kPushCodecs[i - 1].
inline constexpr const char* kPushCodecs[] = {"int8", "fp16", "topk:0.1+int8",
                                              "int4", "bf16+zstd"};
template <typename T, size_t N>
constexpr size_t Count(T (&)[N]) {
  return N;
}

// The run id of the targets that check one.
inline constexpr char kRunId[] = "fuzz-run";
// The join token of join_auth_fuzz.
inline constexpr char kJoinToken[] = "fuzz-token-0123456789abcdef";
// The RPC names join_auth_fuzz signs and checks, by (opcode >> 4) % 4.
inline constexpr const char* kJoinMethods[] = {"Join", "Gossip", "Push",
                                               "FetchState"};
// The clock join_auth_fuzz and membership_fuzz start at, in Unix ms.
inline constexpr int64_t kStartMs = 1700000000000;

class Reader {
 public:
  Reader(const uint8_t* data, size_t size)
      : p_(reinterpret_cast<const char*>(data)), n_(size) {}
  explicit Reader(absl::string_view s) : p_(s.data()), n_(s.size()) {}

  // The next sizeof(T) bytes as a T; missing bytes read as zero.
  template <typename T>
  T Get() {
    static_assert(std::is_trivially_copyable_v<T>);
    char b[sizeof(T)] = {};
    const size_t take = std::min(sizeof(T), n_);
    if (take > 0) std::memcpy(b, p_, take);
    Skip(take);
    T v;
    std::memcpy(&v, b, sizeof(T));
    return v;
  }
  // Up to `n` bytes.
  absl::string_view Bytes(size_t n) {
    const size_t take = std::min(n, n_);
    absl::string_view v(p_, take);
    Skip(take);
    return v;
  }
  // A u32 length, then up to that many (and at most `max`) bytes.
  absl::string_view LenBytes(size_t max = SIZE_MAX) {
    const uint32_t len = Get<uint32_t>();
    return Bytes(std::min<size_t>(len, max));
  }
  absl::string_view Rest() { return Bytes(n_); }
  bool empty() const { return n_ == 0; }
  size_t remaining() const { return n_; }

 private:
  void Skip(size_t k) {
    p_ += k;
    n_ -= k;
  }
  const char* p_;
  size_t n_;
};

class Writer {
 public:
  template <typename T>
  Writer& Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  Writer& Bytes(absl::string_view b) {
    out_.append(b.data(), b.size());
    return *this;
  }
  Writer& LenBytes(absl::string_view b) {
    Put<uint32_t>(static_cast<uint32_t>(b.size()));
    return Bytes(b);
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

// A directory of this process's own under $TMPDIR (or /tmp), removed at
// exit. Targets write only there.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "starling-fuzz-XXXXXX")
            .string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    auto* d = new std::string(tmpl);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return d;
  }();
  return *dir;
}

// Whether two float vectors hold the same bits.
inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

// Every element of an accumulator that fuzz targets start from: small
// values, and every 16th one 3e38, so that a large decoded value overflows.
inline float AccumulatorBase(size_t i) {
  return i % 16 == 15 ? 3e38f : -0.25f * static_cast<float>(i % 11);
}

// A successful decode `out` and what the accumulating decode of the same
// payload did to `base` (status `sa`, result `acc`): every decoded value is
// finite, and either the accumulation added exactly those values and every
// sum is finite, or it failed because some sum overflows.
inline void CheckAccumulated(const std::vector<float>& out,
                             const std::vector<float>& base,
                             const std::vector<float>& acc,
                             const absl::Status& sa) {
  bool overflows = false;
  for (size_t i = 0; i < out.size(); ++i) {
    FUZZ_CHECK(std::isfinite(out[i]), "decoded value %zu is %f", i, out[i]);
    const float want = base[i] + out[i];
    overflows |= !std::isfinite(want);
    if (!sa.ok()) continue;
    // == rather than the bits: an element top-k does not touch keeps a -0.
    FUZZ_CHECK(acc[i] == want, "accumulated %zu: %a, expected %a + %a", i,
               acc[i], base[i], out[i]);
  }
  FUZZ_CHECK(sa.ok() == !overflows,
             "accumulating decode: %s, though the sums %s overflow",
             sa.ToString().c_str(), overflows ? "do" : "do not");
  FUZZ_CHECK(
      sa.ok() || sa.message().find("overflows") != absl::string_view::npos,
      "accumulating decode failed for another reason than overflow: %s",
      sa.ToString().c_str());
}

// The HMAC of an x-starling-auth v1 stamp ("v1.MS.NONCE.MAC"), as
// JoinAuth::Stamp computes it, in lowercase hex.
inline std::string JoinMac(absl::string_view token, absl::string_view method,
                           int64_t ms, absl::string_view nonce) {
  const std::string msg =
      absl::StrCat("starling-join-v1\n", method, "\n", ms, "\n", nonce);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac,
       &len);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(mac), len));
}

}  // namespace fuzz
}  // namespace starling

#endif  // STARLING_TESTS_FUZZ_FUZZ_UTIL_H_
