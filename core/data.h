// Datasets for the inner trainer: byte-level text (a file or the built-in KJV
// corpus), token files of uint16 or uint32 (`starling tokenize` writes them),
// and idx image sets (Fashion-MNIST, or any other: core/image_data.h). Each
// dataset is loaded once, split deterministically into train and validation
// (or given a separate validation set, --val_data), and sharded per node
// (--shard=K/N: iid, contiguous, or non-iid by label for images).
// For drift scenarios a dataset can hold two regions (A and B, each with its
// own train/val split and shards); the caller picks the region per call.
// A Dataset is immutable after Load: concurrent reads are safe. A Sampler is
// per-trainer mutable state (not thread-safe) and goes into checkpoints.
#ifndef STARLING_CORE_DATA_H_
#define STARLING_CORE_DATA_H_

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace starling {

enum class TaskKind {
  kLanguageModel,   // x: int64 [B, T]; y: int64 [B, T] (next token)
  kClassification,  // x: float [B, C, H, W] (e.g. 1x28x28); y: int64 [B]
};

struct Batch {
  torch::Tensor x;
  torch::Tensor y;
};

enum class ShardMode { kIid, kContiguous, kNonIid };

struct ShardSpec {
  int index = 0;  // K, 0-based
  int count = 1;  // N
  ShardMode mode = ShardMode::kIid;
};

// Parses "K/N" (0 <= K < N) and "iid" | "contiguous" | "noniid".
// InvalidArgument naming the flag on bad values.
absl::StatusOr<ShardSpec> ParseShard(const std::string& shard,
                                     const std::string& mode);

// Indices 0..n-1 dealt to shard `spec` (iid: a seeded permutation dealt
// round-robin; contiguous and noniid: the K-th block). Sorted ascending.
// Text deals chunks with it, images examples.
std::vector<int64_t> ShardIndices(int64_t n, const ShardSpec& spec,
                                  uint64_t seed);

struct DataOptions {
  // "kjv", "text:PATH", "tokens:PATH", "fmnist", "fmnist:DIR" or
  // "idx:IMAGES,LABELS".
  std::string spec = "kjv";
  // A separate validation set of the same kind (text: or kjv for text,
  // tokens: for tokens, any image spec for images); empty = hold out the
  // tail --val_fraction of the data (Fashion-MNIST: its test set). With it
  // the whole of `spec` is training data.
  std::string val_spec;
  int context = 64;            // language models: window length
  double val_fraction = 0.05;  // text/tokens/idx: the tail held out
  int vocab = 0;               // tokens: 0 = max token + 1
  // tokens: the file's element type, "uint16" or "uint32" (little-endian).
  std::string token_dtype = "uint16";
  std::string cache_dir;  // where kjv.txt is cached; "" = default
  ShardSpec shard;
  uint64_t split_seed =
      0;  // fixes the iid shard assignment (same on all nodes)
  // Two regions for concept drift: text is cut in two halves by position
  // (region 0 = first half, 1 = second), each split into train/val and
  // sharded on its own; Fashion-MNIST keeps its images and region 1 permutes
  // the labels by a fixed derangement of 0..9.
  bool two_regions = false;
};

// A node's data-drift schedule, from --drift: "" = one region (off), "never"
// = two regions staying on region 0, "STEP" = region 0 until STEP inner
// steps are done, region 1 from then on.
struct DriftSchedule {
  bool two_regions = false;
  int64_t step = -1;  // steps done when the data switches; -1 = never

  // The region of the step that starts after `steps_done` steps (and of an
  // evaluation then).
  int RegionAt(int64_t steps_done) const {
    return step >= 0 && steps_done >= step ? 1 : 0;
  }
};

// InvalidArgument naming --drift unless `drift` is "", "never" or an
// integer >= 0.
absl::StatusOr<DriftSchedule> ParseDrift(const std::string& drift);

// Mutable sampling position, saved in checkpoints: the RNG for random text
// windows, and (epoch, cursor) for epoch-shuffled images.
struct Sampler {
  explicit Sampler(uint64_t seed = 0) : rng(seed), seed(seed) {}
  std::mt19937_64 rng;
  uint64_t seed;
  int64_t epoch = 0;
  int64_t cursor = 0;
  // Cache of the current epoch's order; rebuilt from (seed, epoch), not saved.
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual TaskKind kind() const = 0;
  // Vocabulary size (language models) or number of classes.
  virtual int64_t num_classes() const = 0;
  // Shape of one input example, e.g. {64} or {1, 28, 28}.
  virtual std::vector<int64_t> example_shape() const = 0;
  // Human-readable description for logs and summaries.
  virtual std::string Describe() const = 0;
  // Predicted positions per example (text: context; images: 1).
  virtual int64_t targets_per_example() const = 0;
  // 1, or 2 with DataOptions::two_regions. The methods below take a region
  // in [0, regions()); the overloads without one use region 0.
  virtual int regions() const = 0;

  // Examples in this node's training shard (text: bytes/tokens).
  virtual int64_t train_size(int region) const = 0;
  int64_t train_size() const { return train_size(0); }

  // Draws the next training batch from this node's shard of `region`. The
  // sampler's position advances the same way in either region.
  virtual Batch NextTrain(int batch_size, Sampler& sampler,
                          int region) const = 0;
  Batch NextTrain(int batch_size, Sampler& sampler) const {
    return NextTrain(batch_size, sampler, 0);
  }

  // Validation examples [begin, begin+count) of the region's full held-out
  // set (the same on every node).
  virtual int64_t val_examples(int region) const = 0;
  virtual Batch ValBatch(int64_t begin, int64_t count, int region) const = 0;
  int64_t val_examples() const { return val_examples(0); }
  Batch ValBatch(int64_t begin, int64_t count) const {
    return ValBatch(begin, count, 0);
  }
};

// Loads and validates the data set. NotFound / InvalidArgument naming the file
// and what was expected when it is missing or malformed; FailedPrecondition
// when `bible` is needed and not installed. Every error message starts with
// the flag at fault ("--data=SPEC: ...", or --context, --val_fraction, ...).
absl::StatusOr<std::unique_ptr<Dataset>> LoadDataset(const DataOptions& opts);

// The default cache directory: $STARLING_CACHE_DIR, else
// $XDG_CACHE_HOME/starling, else $HOME/.cache/starling.
std::string DefaultCacheDir();

// Returns the path of the cached KJV text, creating it from
// `bible -f "Gen1:1-Rev22:21"` on first use.
absl::StatusOr<std::string> EnsureKjvCorpus(const std::string& cache_dir);

// Parsers exposed for tests. `name` appears in error messages.
// Little-endian uint16 tokens.
absl::StatusOr<std::vector<uint16_t>> ParseTokenFile(const std::string& bytes,
                                                     const std::string& name);
// Little-endian uint32 tokens.
absl::StatusOr<std::vector<uint32_t>> ParseTokenFile32(const std::string& bytes,
                                                       const std::string& name);
struct IdxArray {
  std::vector<int32_t> dims;
  int type = 0x08;   // 0x08: unsigned bytes; 0x0C: big-endian int32
  std::string data;  // the payload, as in the file
};
// Parses a (gunzipped) idx file of unsigned bytes (0x08) or big-endian
// int32 (0x0C) with 1 to 4 dimensions.
absl::StatusOr<IdxArray> ParseIdxAny(const std::string& bytes,
                                     const std::string& name);
// Parses a (gunzipped) idx file of unsigned bytes with `expected_rank`
// dimensions.
absl::StatusOr<IdxArray> ParseIdx(const std::string& bytes, int expected_rank,
                                  const std::string& name);
// Reads a whole .gz file. InvalidArgument when it is not valid gzip.
absl::StatusOr<std::string> ReadGzipFile(const std::string& path);
// Reads a whole file, gunzipping it when it starts with gzip's magic.
absl::StatusOr<std::string> ReadMaybeGzipFile(const std::string& path);

}  // namespace starling

#endif  // STARLING_CORE_DATA_H_
