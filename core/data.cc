#include "core/data.h"

#include <stdio.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/status.h"

namespace starling {
namespace {

constexpr int64_t kTextChunk = 1 << 16;  // iid text shards deal 64 KiB chunks
constexpr float kFmnistMean = 0.2860f;
constexpr float kFmnistStd = 0.3530f;
// Drift region B of Fashion-MNIST: class c is labelled kDriftLabels[c]. A
// fixed derangement of 0..9 (no class keeps its label), the same on every
// node and every run.
constexpr int64_t kDriftLabels[10] = {3, 7, 0, 9, 1, 8, 2, 5, 4, 6};

// Indices 0..n-1 dealt to shard `spec` (iid: a seeded permutation dealt
// round-robin; contiguous: the K-th block). Sorted ascending.
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

std::string ShardName(const ShardSpec& s) {
  return absl::StrCat(s.index, "/", s.count);
}

// Byte- or token-level language-model data. One region spans all tokens;
// with two regions (drift) each half of the tokens is a region with its own
// train/val split and shards.
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
  static absl::StatusOr<std::unique_ptr<Dataset>> Create(
      std::vector<uint16_t> tokens, int64_t vocab, const DataOptions& opts,
      const std::string& name, bool byte_text = false) {
    auto ds = std::unique_ptr<TokenDataset>(new TokenDataset());
    ds->name_ = name;
    ds->tokens_ = std::move(tokens);
    if (opts.two_regions && byte_text) {
      for (size_t i = ds->tokens_.size() / 2; i < ds->tokens_.size(); ++i) {
        uint16_t& t = ds->tokens_[i];
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
      STARLING_ASSIGN_OR_RETURN(
          Region region,
          MakeRegion(n * r / count, n * (r + 1) / count, opts, name + where));
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
                          a.end - a.split, ")");
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

  // Splits tokens [begin, end) into train and validation and takes this
  // node's shard of the training part.
  static absl::StatusOr<Region> MakeRegion(int64_t begin, int64_t end,
                                           const DataOptions& opts,
                                           const std::string& name) {
    Region reg;
    reg.begin = begin;
    reg.end = end;
    const int64_t n = end - begin;
    reg.split = begin + static_cast<int64_t>(static_cast<double>(n) *
                                             (1.0 - opts.val_fraction));
    if (end - reg.split < opts.context + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " is too small: ", n, " tokens leave ", end - reg.split,
          " for validation, fewer than --context+1 = ", opts.context + 1));
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
      const uint16_t* src = tokens_.data() + starts[i];
      for (int64_t t = 0; t < context_; ++t) {
        xp[i * context_ + t] = src[t];
        yp[i * context_ + t] = src[t + 1];
      }
    }
    return {x, y};
  }

  std::string name_;
  std::vector<uint16_t> tokens_;
  int64_t vocab_ = 256;
  int64_t context_ = 64;
  std::vector<Region> regions_;
};

// Fashion-MNIST: 60k training images (sharded) and the 10k test images as
// the validation set.
class FashionMnist : public Dataset {
 public:
  static absl::StatusOr<std::unique_ptr<Dataset>> Create(
      const std::string& dir, const DataOptions& opts) {
    auto ds = std::unique_ptr<FashionMnist>(new FashionMnist());
    ds->dir_ = dir;
    ds->regions_ = opts.two_regions ? 2 : 1;
    STARLING_RETURN_IF_ERROR(
        Load(dir, "train", &ds->train_images_, &ds->train_labels_));
    STARLING_RETURN_IF_ERROR(
        Load(dir, "t10k", &ds->val_images_, &ds->val_labels_));
    const int64_t n = ds->train_images_.size(0);
    if (opts.shard.mode == ShardMode::kNonIid) {
      // Sort by label (stable), then deal contiguous blocks: each node sees
      // about 10/N classes.
      std::vector<int64_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      const int64_t* lab = ds->train_labels_.data_ptr<int64_t>();
      std::stable_sort(order.begin(), order.end(),
                       [lab](int64_t a, int64_t b) { return lab[a] < lab[b]; });
      for (int64_t i : ShardIndices(n, opts.shard, opts.split_seed)) {
        ds->shard_.push_back(order[i]);
      }
    } else {
      ds->shard_ = ShardIndices(n, opts.shard, opts.split_seed);
    }
    if (ds->shard_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", ShardName(opts.shard), " of Fashion-MNIST is empty"));
    }
    return std::unique_ptr<Dataset>(std::move(ds));
  }

  TaskKind kind() const override { return TaskKind::kClassification; }
  int64_t num_classes() const override { return 10; }
  std::vector<int64_t> example_shape() const override { return {1, 28, 28}; }
  std::string Describe() const override {
    return absl::StrCat("Fashion-MNIST from ", dir_, " (train shard ",
                        shard_.size(), " of ", train_images_.size(0), ", test ",
                        val_images_.size(0),
                        regions_ == 2 ? ", two drift regions: B permutes the "
                                        "labels"
                                      : "",
                        ")");
  }
  int64_t targets_per_example() const override { return 1; }
  int regions() const override { return regions_; }
  int64_t train_size(int) const override {
    return static_cast<int64_t>(shard_.size());
  }

  Batch NextTrain(int batch_size, Sampler& sampler, int region) const override {
    std::vector<int64_t> idx(batch_size);
    for (int b = 0; b < batch_size; ++b) {
      if (sampler.cursor >= static_cast<int64_t>(shard_.size())) {
        ++sampler.epoch;
        sampler.cursor = 0;
      }
      idx[b] = EpochOrder(sampler)[sampler.cursor++];
    }
    torch::Tensor index = torch::tensor(idx, torch::kLong);
    return Make(train_images_.index_select(0, index),
                train_labels_.index_select(0, index), region);
  }

  int64_t val_examples(int) const override { return val_images_.size(0); }
  Batch ValBatch(int64_t begin, int64_t count, int region) const override {
    return Make(val_images_.narrow(0, begin, count),
                val_labels_.narrow(0, begin, count), region);
  }

 private:
  FashionMnist() = default;

  // The shuffled order of this shard for the sampler's epoch, cached in the
  // sampler and recomputed from (seed, epoch) after a resume.
  const std::vector<int64_t>& EpochOrder(Sampler& s) const {
    if (s.order_epoch != s.epoch || s.order.size() != shard_.size()) {
      s.order = shard_;
      std::mt19937_64 rng(s.seed * 0x9E3779B97F4A7C15ULL +
                          static_cast<uint64_t>(s.epoch));
      std::shuffle(s.order.begin(), s.order.end(), rng);
      s.order_epoch = s.epoch;
    }
    return s.order;
  }

  // Region 1 relabels class c as kDriftLabels[c].
  static Batch Make(const torch::Tensor& images, const torch::Tensor& labels,
                    int region) {
    torch::Tensor x = images.to(torch::kFloat32).div_(255.0f);
    x.sub_(kFmnistMean).div_(kFmnistStd);
    if (region == 0) return {x.unsqueeze(1), labels.clone()};
    torch::Tensor map = torch::tensor(
        std::vector<int64_t>(std::begin(kDriftLabels), std::end(kDriftLabels)),
        torch::kLong);
    return {x.unsqueeze(1), map.index_select(0, labels)};
  }

  static absl::Status Load(const std::string& dir, const std::string& prefix,
                           torch::Tensor* images, torch::Tensor* labels) {
    std::string ipath = absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
    std::string lpath = absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
    STARLING_ASSIGN_OR_RETURN(std::string ibytes, ReadGzipFile(ipath));
    STARLING_ASSIGN_OR_RETURN(std::string lbytes, ReadGzipFile(lpath));
    STARLING_ASSIGN_OR_RETURN(IdxArray img, ParseIdx(ibytes, 3, ipath));
    STARLING_ASSIGN_OR_RETURN(IdxArray lab, ParseIdx(lbytes, 1, lpath));
    if (img.dims[1] != 28 || img.dims[2] != 28) {
      return absl::InvalidArgumentError(
          absl::StrCat(ipath, ": images are ", img.dims[1], "x", img.dims[2],
                       "; expected 28x28"));
    }
    if (img.dims[0] != lab.dims[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat(ipath, " has ", img.dims[0], " images but ", lpath,
                       " has ", lab.dims[0], " labels"));
    }
    for (size_t i = 0; i < lab.data.size(); ++i) {
      if (static_cast<uint8_t>(lab.data[i]) > 9) {
        return absl::InvalidArgumentError(
            absl::StrCat(lpath, ": label ", static_cast<int>(lab.data[i]),
                         " at index ", i, " is outside 0..9"));
      }
    }
    *images = torch::empty({img.dims[0], 28, 28}, torch::kUInt8);
    std::memcpy(images->data_ptr<uint8_t>(), img.data.data(), img.data.size());
    *labels = torch::empty({lab.dims[0]}, torch::kUInt8);
    std::memcpy(labels->data_ptr<uint8_t>(), lab.data.data(), lab.data.size());
    *labels = labels->to(torch::kLong);
    return absl::OkStatus();
  }

  std::string dir_;
  int regions_ = 1;
  torch::Tensor train_images_, train_labels_, val_images_, val_labels_;
  std::vector<int64_t> shard_;
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

absl::StatusOr<std::string> ReadGzipFile(const std::string& path) {
  STARLING_ASSIGN_OR_RETURN(std::string raw, ReadFile(path));
  if (raw.size() < 2 || static_cast<uint8_t>(raw[0]) != 0x1f ||
      static_cast<uint8_t>(raw[1]) != 0x8b) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a gzip file (expected an .idx.gz file)"));
  }
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  if (inflateInit2(&zs, 15 + 16) != Z_OK) {
    return absl::InternalError("zlib inflateInit2 failed");
  }
  zs.next_in = reinterpret_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(raw.size());
  std::string out;
  char buf[1 << 16];
  int rc;
  do {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - zs.avail_out);
  } while (rc == Z_OK);
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a corrupt or truncated gzip file (zlib: ",
                     zs.msg ? zs.msg : "unexpected end of data", ")"));
  }
  return out;
}

absl::StatusOr<IdxArray> ParseIdx(const std::string& bytes, int expected_rank,
                                  const std::string& name) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a valid idx file: ", why));
  };
  if (bytes.size() < 4) return bad("shorter than the 4-byte magic");
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (p[0] != 0 || p[1] != 0) return bad("magic must start with two 0 bytes");
  if (p[2] != 0x08) {
    return bad(absl::StrCat("element type 0x", absl::Hex(p[2]),
                            "; expected 0x08 (unsigned byte)"));
  }
  if (p[3] != expected_rank) {
    return bad(absl::StrCat(static_cast<int>(p[3]), " dimensions; expected ",
                            expected_rank));
  }
  size_t header = 4 + 4 * static_cast<size_t>(expected_rank);
  if (bytes.size() < header) return bad("truncated header");
  IdxArray out;
  uint64_t total = 1;
  for (int d = 0; d < expected_rank; ++d) {
    const uint8_t* q = p + 4 + 4 * d;
    int64_t dim = (int64_t{q[0]} << 24) | (q[1] << 16) | (q[2] << 8) | q[3];
    if (dim <= 0 || dim > (1 << 28)) {
      return bad(absl::StrCat("dimension ", d, " is ", dim));
    }
    out.dims.push_back(static_cast<int32_t>(dim));
    total *= static_cast<uint64_t>(dim);
  }
  if (bytes.size() - header != total) {
    return bad(absl::StrCat("header promises ", total,
                            " bytes of data, file has ",
                            bytes.size() - header));
  }
  out.data = bytes.substr(header);
  return out;
}

absl::StatusOr<std::vector<uint16_t>> ParseTokenFile(const std::string& bytes,
                                                     const std::string& name) {
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", name, " is empty"));
  }
  if (bytes.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", name, " has an odd size (", bytes.size(),
                     " bytes); expected little-endian uint16 tokens"));
  }
  std::vector<uint16_t> tokens(bytes.size() / 2);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
  }
  return tokens;
}

namespace {

absl::StatusOr<std::unique_ptr<Dataset>> LoadNamedDataset(
    const DataOptions& opts) {
  if (opts.context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--context=", opts.context, ": must be >= 1"));
  }
  if (!(opts.val_fraction > 0.0 && opts.val_fraction < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--val_fraction=", opts.val_fraction, ": must be in (0, 1)"));
  }
  const std::string& spec = opts.spec;
  if (opts.vocab < 0 ||
      (opts.vocab != 0 && !absl::StartsWith(spec, "tokens:"))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--vocab=", opts.vocab,
        opts.vocab < 0
            ? ": must be >= 0 (0 = largest token + 1)"
            : absl::StrCat(": applies to --data=tokens:PATH only; --data=",
                           spec, " has its own vocabulary")));
  }
  auto bytes_to_tokens = [](const std::string& s) {
    std::vector<uint16_t> t(s.size());
    for (size_t i = 0; i < s.size(); ++i) t[i] = static_cast<uint8_t>(s[i]);
    return t;
  };
  if (spec == "kjv") {
    STARLING_ASSIGN_OR_RETURN(std::string path,
                              EnsureKjvCorpus(opts.cache_dir));
    STARLING_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    return TokenDataset::Create(bytes_to_tokens(text), 256, opts,
                                absl::StrCat("kjv (", path, ")"),
                                /*byte_text=*/true);
  }
  if (absl::StartsWith(spec, "text:")) {
    std::string path = spec.substr(5);
    STARLING_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    if (text.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("text file ", path, " is empty"));
    }
    return TokenDataset::Create(bytes_to_tokens(text), 256, opts,
                                absl::StrCat("text ", path),
                                /*byte_text=*/true);
  }
  if (absl::StartsWith(spec, "tokens:")) {
    std::string path = spec.substr(7);
    STARLING_ASSIGN_OR_RETURN(std::string raw, ReadFile(path));
    STARLING_ASSIGN_OR_RETURN(std::vector<uint16_t> tokens,
                              ParseTokenFile(raw, path));
    int64_t max_token = *std::max_element(tokens.begin(), tokens.end());
    int64_t vocab = opts.vocab > 0 ? opts.vocab : max_token + 1;
    if (max_token >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token file ", path, " contains token ", max_token,
                       ", outside --vocab=", opts.vocab));
    }
    return TokenDataset::Create(std::move(tokens), vocab, opts,
                                absl::StrCat("tokens ", path));
  }
  if (spec == "fmnist" || absl::StartsWith(spec, "fmnist:")) {
    std::string dir =
        spec == "fmnist" ? "/usr/share/datasets/fashion-mnist" : spec.substr(7);
    absl::StatusOr<std::unique_ptr<Dataset>> ds =
        FashionMnist::Create(dir, opts);
    if (absl::IsNotFound(ds.status()) && spec == "fmnist") {
      return absl::NotFoundError(absl::StrCat(
          ds.status().message(),
          " (install the Debian package dataset-fashion-mnist, or pass "
          "--data=fmnist:DIR)"));
    }
    return ds;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--data=", spec,
      ": unknown data set; expected kjv, text:PATH, tokens:PATH, fmnist or "
      "fmnist:DIR"));
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
