#include "core/data.h"

#include <stdio.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/image_data.h"
#include "core/status.h"

namespace starling {
namespace {

constexpr int64_t kTextChunk = 1 << 16;  // iid text shards deal 64 KiB chunks

std::string ShardName(const ShardSpec& s) {
  return absl::StrCat(s.index, "/", s.count);
}

// Byte- or token-level language-model data, tokens of type Tok. One region
// spans all tokens; with two regions (drift) each half of the tokens is a
// region with its own train/val split and shards. A separate validation set
// (--val_data) follows the training tokens, and the split falls between
// them.
template <typename Tok>
class TokenDataset : public Dataset {
 public:
  struct Segment {
    int64_t begin;
    int64_t end;
  };
  // Tokens [begin, end): train [begin, split), validation [split, end).
  struct Region {
    int64_t begin = 0;
    int64_t split = 0;
    int64_t end = 0;
    int64_t train_size = 0;
    std::vector<Segment> segments;
    std::vector<int64_t> cum_starts;  // inclusive prefix sums of window starts
  };

  // `byte_text`: the tokens are bytes of text; its drift region B then also
  // swaps the case of every ASCII letter ("iN THE BEGINNING"), text the
  // model has never seen in that form: the loss jumps at the drift and
  // recovers as the swarm learns it.
  // `val_tokens` > 0: the last that many tokens are the validation set
  // (--val_data), not a --val_fraction of the text.
  static absl::StatusOr<std::unique_ptr<Dataset>> Create(
      std::vector<Tok> tokens, int64_t vocab, const DataOptions& opts,
      const std::string& name, bool byte_text = false, int64_t val_tokens = 0) {
    auto ds = std::unique_ptr<TokenDataset>(new TokenDataset());
    ds->name_ = name;
    ds->tokens_ = std::move(tokens);
    ds->val_tokens_ = val_tokens;
    if (opts.two_regions && byte_text) {
      for (size_t i = ds->tokens_.size() / 2; i < ds->tokens_.size(); ++i) {
        Tok& t = ds->tokens_[i];
        if ((t >= 'a' && t <= 'z') || (t >= 'A' && t <= 'Z')) t ^= 0x20;
      }
    }
    ds->vocab_ = vocab;
    ds->context_ = opts.context;
    if (opts.shard.mode == ShardMode::kNonIid) {
      return absl::InvalidArgumentError(
          "--shard_mode=noniid splits by label and needs --data=fmnist; use "
          "iid or contiguous for text");
    }
    const int64_t n = static_cast<int64_t>(ds->tokens_.size());
    const int count = opts.two_regions ? 2 : 1;
    for (int r = 0; r < count; ++r) {
      const std::string where =
          opts.two_regions
              ? absl::StrCat(
                    " (drift region ", r == 0 ? "A" : "B", ", half of the text",
                    r == 1 && byte_text ? ", letter case swapped" : "", ")")
              : "";
      STARLING_ASSIGN_OR_RETURN(Region region,
                                MakeRegion(n * r / count, n * (r + 1) / count,
                                           val_tokens, opts, name + where));
      ds->regions_.push_back(std::move(region));
    }
    return std::unique_ptr<Dataset>(std::move(ds));
  }

  TaskKind kind() const override { return TaskKind::kLanguageModel; }
  int64_t num_classes() const override { return vocab_; }
  std::vector<int64_t> example_shape() const override { return {context_}; }
  std::string Describe() const override {
    const Region& a = regions_[0];
    if (regions_.size() == 1) {
      return absl::StrCat(name_, " (", tokens_.size(), " tokens, vocab ",
                          vocab_, ", train ", a.split, ", val ",
                          a.end - a.split,
                          val_tokens_ > 0 ? " from --val_data" : "", ")");
    }
    const Region& b = regions_[1];
    return absl::StrCat(name_, " (", tokens_.size(), " tokens, vocab ", vocab_,
                        ", two drift regions: A train ", a.split - a.begin,
                        " val ", a.end - a.split, ", B train ",
                        b.split - b.begin, " val ", b.end - b.split, ")");
  }
  int64_t targets_per_example() const override { return context_; }
  int regions() const override { return static_cast<int>(regions_.size()); }
  int64_t train_size(int region) const override {
    return regions_[region].train_size;
  }

  Batch NextTrain(int batch_size, Sampler& sampler, int region) const override {
    const Region& reg = regions_[region];
    std::uniform_int_distribution<int64_t> pick(0, reg.cum_starts.back() - 1);
    std::vector<int64_t> starts(batch_size);
    for (int b = 0; b < batch_size; ++b) {
      int64_t u = pick(sampler.rng);
      size_t seg =
          std::upper_bound(reg.cum_starts.begin(), reg.cum_starts.end(), u) -
          reg.cum_starts.begin();
      int64_t before = seg == 0 ? 0 : reg.cum_starts[seg - 1];
      starts[b] = reg.segments[seg].begin + (u - before);
    }
    return Windows(starts);
  }

  int64_t val_examples(int region) const override {
    const Region& reg = regions_[region];
    return (reg.end - reg.split - 1) / context_;
  }
  Batch ValBatch(int64_t begin, int64_t count, int region) const override {
    std::vector<int64_t> starts(count);
    for (int64_t i = 0; i < count; ++i) {
      starts[i] = regions_[region].split + (begin + i) * context_;
    }
    return Windows(starts);
  }

 private:
  TokenDataset() = default;

  // Splits tokens [begin, end) into train and validation (the last
  // `val_tokens` when > 0, else --val_fraction) and takes this node's shard
  // of the training part.
  static absl::StatusOr<Region> MakeRegion(int64_t begin, int64_t end,
                                           int64_t val_tokens,
                                           const DataOptions& opts,
                                           const std::string& name) {
    Region reg;
    reg.begin = begin;
    reg.end = end;
    const int64_t n = end - begin;
    reg.split = val_tokens > 0
                    ? end - val_tokens
                    : begin + static_cast<int64_t>(static_cast<double>(n) *
                                                   (1.0 - opts.val_fraction));
    if (end - reg.split < opts.context + 1) {
      return absl::InvalidArgumentError(
          val_tokens > 0
              ? absl::StrCat(
                    "the validation set --val_data=", opts.val_spec,
                    " is too small: ", val_tokens,
                    " tokens, fewer than --context+1 = ", opts.context + 1)
              : absl::StrCat(name, " is too small: ", n, " tokens leave ",
                             end - reg.split,
                             " for validation, fewer than --context+1 = ",
                             opts.context + 1));
    }
    const int64_t train = reg.split - begin;
    if (opts.shard.mode == ShardMode::kContiguous) {
      reg.segments.push_back(
          {begin + train * opts.shard.index / opts.shard.count,
           begin + train * (opts.shard.index + 1) / opts.shard.count});
    } else {
      int64_t chunks = (train + kTextChunk - 1) / kTextChunk;
      for (int64_t c : ShardIndices(chunks, opts.shard, opts.split_seed)) {
        int64_t b = begin + c * kTextChunk;
        int64_t e = std::min(reg.split, b + kTextChunk);
        if (!reg.segments.empty() && reg.segments.back().end == b) {
          reg.segments.back().end = e;
        } else {
          reg.segments.push_back({b, e});
        }
      }
    }
    int64_t total = 0;
    for (const Segment& s : reg.segments) {
      reg.train_size += s.end - s.begin;
      total += std::max<int64_t>(0, s.end - s.begin - opts.context);
      reg.cum_starts.push_back(total);
    }
    if (total == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", ShardName(opts.shard), " of ", name,
          " has no training window of --context=", opts.context, " tokens"));
    }
    return reg;
  }

  Batch Windows(const std::vector<int64_t>& starts) const {
    const int64_t b = static_cast<int64_t>(starts.size());
    torch::Tensor x = torch::empty({b, context_}, torch::kLong);
    torch::Tensor y = torch::empty({b, context_}, torch::kLong);
    int64_t* xp = x.data_ptr<int64_t>();
    int64_t* yp = y.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i) {
      const Tok* src = tokens_.data() + starts[i];
      for (int64_t t = 0; t < context_; ++t) {
        xp[i * context_ + t] = src[t];
        yp[i * context_ + t] = src[t + 1];
      }
    }
    return {x, y};
  }

  std::string name_;
  std::vector<Tok> tokens_;
  int64_t val_tokens_ = 0;  // > 0: the tail is --val_data's
  int64_t vocab_ = 256;
  int64_t context_ = 64;
  std::vector<Region> regions_;
};

absl::StatusOr<std::string> RunCommand(const std::string& cmd) {
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    return absl::InternalError(absl::StrCat("cannot run: ", cmd));
  }
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int status = ::pclose(pipe);
  if (status != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("`", cmd, "` failed with status ", WEXITSTATUS(status)));
  }
  return out;
}

}  // namespace

absl::StatusOr<DriftSchedule> ParseDrift(const std::string& drift) {
  DriftSchedule d;
  if (drift.empty()) return d;
  d.two_regions = true;
  if (drift == "never") return d;
  if (!absl::SimpleAtoi(drift, &d.step) || d.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--drift=", drift,
        ": expected an inner step >= 0 (the node switches to the second data "
        "region once it has done that many steps), 'never' (two regions, "
        "staying on the first) or empty (one region)"));
  }
  return d;
}

std::vector<int64_t> ShardIndices(int64_t n, const ShardSpec& spec,
                                  uint64_t seed) {
  std::vector<int64_t> out;
  if (spec.mode == ShardMode::kContiguous || spec.mode == ShardMode::kNonIid) {
    int64_t begin = n * spec.index / spec.count;
    int64_t end = n * (spec.index + 1) / spec.count;
    for (int64_t i = begin; i < end; ++i) out.push_back(i);
    return out;
  }
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed ^ 0x5eed5eed5eedULL);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t j = spec.index; j < n; j += spec.count) out.push_back(perm[j]);
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<ShardSpec> ParseShard(const std::string& shard,
                                     const std::string& mode) {
  ShardSpec spec;
  std::vector<std::string> parts = absl::StrSplit(shard, '/');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &spec.index) ||
      !absl::SimpleAtoi(parts[1], &spec.count) || spec.count < 1 ||
      spec.index < 0 || spec.index >= spec.count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard=", shard, ": expected K/N with 0 <= K < N, e.g. --shard=0/1"));
  }
  if (mode == "iid") {
    spec.mode = ShardMode::kIid;
  } else if (mode == "contiguous") {
    spec.mode = ShardMode::kContiguous;
  } else if (mode == "noniid") {
    spec.mode = ShardMode::kNonIid;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard_mode=", mode, ": expected iid, contiguous or noniid"));
  }
  return spec;
}

std::string DefaultCacheDir() {
  if (const char* d = std::getenv("STARLING_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) {
    return absl::StrCat(d, "/starling");
  }
  if (const char* h = std::getenv("HOME"); h && *h) {
    return absl::StrCat(h, "/.cache/starling");
  }
  return "/tmp/starling-cache";
}

absl::StatusOr<std::string> EnsureKjvCorpus(const std::string& cache_dir) {
  const std::string dir = cache_dir.empty() ? DefaultCacheDir() : cache_dir;
  const std::string path = absl::StrCat(dir, "/kjv.txt");
  if (FileExists(path)) return path;
  if (std::system("command -v bible >/dev/null 2>&1") != 0) {
    return absl::FailedPreconditionError(
        "--data=kjv needs the `bible` program from the Debian package "
        "bible-kjv (run scripts/setup.sh, or apt-get install bible-kjv)");
  }
  STARLING_ASSIGN_OR_RETURN(
      std::string text,
      RunCommand("bible -f \"Gen1:1-Rev22:21\" </dev/null 2>/dev/null"));
  if (text.size() < (1 << 20)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "`bible -f \"Gen1:1-Rev22:21\"` printed only ", text.size(),
        " bytes; expected about 4.4 MB (is bible-kjv-text installed?)"));
  }
  STARLING_RETURN_IF_ERROR(MakeDirs(dir));
  STARLING_RETURN_IF_ERROR(WriteFileAtomic(path, text));
  return path;
}

namespace {

// Little-endian tokens of `sizeof(Tok)` bytes each.
template <typename Tok>
absl::StatusOr<std::vector<Tok>> ParseTokens(const std::string& bytes,
                                             const std::string& name) {
  constexpr size_t kSize = sizeof(Tok);
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", name, " is empty"));
  }
  if (bytes.size() % kSize != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", name, " has ",
                     kSize == 2 ? "an odd size" : "a size not a multiple of 4",
                     " (", bytes.size(), " bytes); expected little-endian uint",
                     8 * kSize, " tokens (--token_dtype)"));
  }
  std::vector<Tok> tokens(bytes.size() / kSize);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  for (size_t i = 0; i < tokens.size(); ++i) {
    Tok t = 0;
    for (size_t k = 0; k < kSize; ++k) {
      t |= static_cast<Tok>(static_cast<Tok>(p[kSize * i + k]) << (8 * k));
    }
    tokens[i] = t;
  }
  return tokens;
}

}  // namespace

absl::StatusOr<std::vector<uint16_t>> ParseTokenFile(const std::string& bytes,
                                                     const std::string& name) {
  return ParseTokens<uint16_t>(bytes, name);
}

absl::StatusOr<std::vector<uint32_t>> ParseTokenFile32(
    const std::string& bytes, const std::string& name) {
  return ParseTokens<uint32_t>(bytes, name);
}

namespace {

std::vector<uint16_t> BytesToTokens(const std::string& s) {
  std::vector<uint16_t> t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = static_cast<uint8_t>(s[i]);
  return t;
}

// The bytes of --data=kjv or text:PATH (or --val_data's), and a name.
absl::StatusOr<std::pair<std::string, std::string>> ReadText(
    const std::string& spec, const std::string& cache_dir) {
  std::string path;
  if (spec == "kjv") {
    STARLING_ASSIGN_OR_RETURN(path, EnsureKjvCorpus(cache_dir));
  } else {
    path = spec.substr(5);
  }
  STARLING_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  if (text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("text file ", path, " is empty"));
  }
  return std::make_pair(std::move(text), spec == "kjv"
                                             ? absl::StrCat("kjv (", path, ")")
                                             : "text " + path);
}

bool IsTextSpec(const std::string& spec) {
  return spec == "kjv" || absl::StartsWith(spec, "text:");
}

// Byte-level text, with --val_data's text (if any) after it.
absl::StatusOr<std::unique_ptr<Dataset>> LoadText(const DataOptions& opts) {
  STARLING_ASSIGN_OR_RETURN(auto text, ReadText(opts.spec, opts.cache_dir));
  int64_t val_tokens = 0;
  if (!opts.val_spec.empty()) {
    if (!IsTextSpec(opts.val_spec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--val_data=", opts.val_spec, ": --data=", opts.spec,
          " is text, so the validation set must be too (text:PATH or kjv)"));
    }
    absl::StatusOr<std::pair<std::string, std::string>> val =
        ReadText(opts.val_spec, opts.cache_dir);
    if (!val.ok()) {
      return absl::Status(val.status().code(),
                          absl::StrCat("--val_data=", opts.val_spec, ": ",
                                       val.status().message()));
    }
    val_tokens = static_cast<int64_t>(val->first.size());
    text.first += val->first;
  }
  return TokenDataset<uint16_t>::Create(BytesToTokens(text.first), 256, opts,
                                        text.second, /*byte_text=*/true,
                                        val_tokens);
}

// A token file of Tok, with --val_data's (if any) after it; the vocabulary
// is --vocab, or the largest token of either + 1.
template <typename Tok>
absl::StatusOr<std::unique_ptr<Dataset>> LoadTokens(const DataOptions& opts) {
  const std::string path = opts.spec.substr(7);
  STARLING_ASSIGN_OR_RETURN(std::string raw, ReadFile(path));
  STARLING_ASSIGN_OR_RETURN(std::vector<Tok> tokens,
                            ParseTokens<Tok>(raw, path));
  int64_t val_tokens = 0;
  if (!opts.val_spec.empty()) {
    if (!absl::StartsWith(opts.val_spec, "tokens:")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--val_data=", opts.val_spec, ": --data=", opts.spec,
          " is a token file, so the validation set must be one too "
          "(tokens:PATH, of the same --token_dtype and vocabulary)"));
    }
    const std::string val_path = opts.val_spec.substr(7);
    absl::StatusOr<std::string> val_raw = ReadFile(val_path);
    absl::StatusOr<std::vector<Tok>> val =
        val_raw.ok() ? ParseTokens<Tok>(*val_raw, val_path)
                     : absl::StatusOr<std::vector<Tok>>(val_raw.status());
    if (!val.ok()) {
      return absl::Status(val.status().code(),
                          absl::StrCat("--val_data=", opts.val_spec, ": ",
                                       val.status().message()));
    }
    val_tokens = static_cast<int64_t>(val->size());
    tokens.insert(tokens.end(), val->begin(), val->end());
  }
  const int64_t max_token = *std::max_element(tokens.begin(), tokens.end());
  const int64_t vocab = opts.vocab > 0 ? opts.vocab : max_token + 1;
  if (max_token >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, val_tokens > 0 ? " (or --val_data's)" : "",
        " contains token ", max_token, ", outside --vocab=", opts.vocab));
  }
  return TokenDataset<Tok>::Create(std::move(tokens), vocab, opts,
                                   absl::StrCat("tokens ", path), false,
                                   val_tokens);
}

// The checks of the flags that only some data sets take.
absl::Status CheckDataFlags(const DataOptions& opts) {
  if (opts.context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--context=", opts.context, ": must be >= 1"));
  }
  if (!(opts.val_fraction > 0.0 && opts.val_fraction < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--val_fraction=", opts.val_fraction, ": must be in (0, 1)"));
  }
  const std::string& spec = opts.spec;
  const bool tokens = absl::StartsWith(spec, "tokens:");
  if (opts.vocab < 0 || (opts.vocab != 0 && !tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab=", opts.vocab,
        opts.vocab < 0
            ? ": must be >= 0 (0 = largest token + 1)"
            : absl::StrCat(": applies to --data=tokens:PATH only; --data=",
                           spec, " has its own vocabulary")));
  }
  if (opts.token_dtype != "uint16" && opts.token_dtype != "uint32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--token_dtype=", opts.token_dtype, ": expected uint16 or uint32"));
  }
  if (opts.token_dtype != "uint16" && !tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token_dtype=", opts.token_dtype,
                     ": applies to --data=tokens:PATH only; --data=", spec,
                     " is not a token file"));
  }
  if (!opts.val_spec.empty() && opts.two_regions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--val_data=", opts.val_spec,
        ": cannot be combined with --drift, whose two data regions each "
        "hold out their own validation set"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> LoadNamedDataset(
    const DataOptions& opts) {
  STARLING_RETURN_IF_ERROR(CheckDataFlags(opts));
  const std::string& spec = opts.spec;
  if (IsTextSpec(spec)) return LoadText(opts);
  if (absl::StartsWith(spec, "tokens:")) {
    return opts.token_dtype == "uint32" ? LoadTokens<uint32_t>(opts)
                                        : LoadTokens<uint16_t>(opts);
  }
  if (IsImageSpec(spec)) return LoadImageDataset(opts);
  return absl::InvalidArgumentError(absl::StrCat(
      "--data=", spec,
      ": unknown data set; expected kjv, text:PATH, tokens:PATH, fmnist, "
      "fmnist:DIR or idx:IMAGES,LABELS"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> LoadDataset(const DataOptions& opts) {
  absl::StatusOr<std::unique_ptr<Dataset>> ds = LoadNamedDataset(opts);
  // Name the flag, unless the message already names one (--context,
  // --val_fraction, --data, --shard, --vocab ...).
  if (ds.ok() || absl::StartsWith(ds.status().message(), "--")) return ds;
  return absl::Status(
      ds.status().code(),
      absl::StrCat("--data=", opts.spec, ": ", ds.status().message()));
}

}  // namespace starling
