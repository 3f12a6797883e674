#include "core/image_data.h"

#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/status.h"

namespace starling {
namespace {

constexpr char kFmnistDefaultDir[] = "/usr/share/datasets/fashion-mnist";
// Fashion-MNIST's pixel mean and standard deviation (of x/255), which
// fmnist and fmnist:DIR normalize with whatever the images are; an idx: set
// is normalized with its own training images' per-channel figures.
constexpr float kFmnistMean = 0.2860f;
constexpr float kFmnistStd = 0.3530f;
// Drift region B of a 10-class set (Fashion-MNIST): class c is labelled
// kDriftLabels[c]. A fixed derangement of 0..9 (no class keeps its label),
// the same on every node and every run. Other class counts shift by one.
constexpr int64_t kDriftLabels[10] = {3, 7, 0, 9, 1, 8, 2, 5, 4, 6};
constexpr int kMaxChannels = 4;

// DIR/PREFIX-KIND-idxR-ubyte[.gz] for R in `ranks`: the first that exists,
// else the first candidate (whose NotFound then names it).
std::string FindIdxFile(const std::string& dir, const std::string& stem,
                        std::initializer_list<int> ranks) {
  std::vector<std::string> candidates;
  for (int r : ranks) {
    for (const char* ext : {".gz", ""}) {
      candidates.push_back(
          absl::StrCat(dir, "/", stem, "-idx", r, "-ubyte", ext));
    }
  }
  for (const std::string& c : candidates) {
    if (FileExists(c)) return c;
  }
  return candidates.front();
}

// An image set in DIR named as Fashion-MNIST's files are: PREFIX is
// "train" or "t10k".
absl::StatusOr<ImageSet> LoadFmnistFiles(const std::string& dir,
                                         const std::string& prefix) {
  return LoadIdxImages(FindIdxFile(dir, prefix + "-images", {3, 4}),
                       FindIdxFile(dir, prefix + "-labels", {1}));
}

// Where an image spec's data is: Fashion-MNIST's directory, or the two idx
// files of an idx: spec.
struct ImageSpec {
  bool fmnist = false;
  std::string dir;             // fmnist
  std::string images, labels;  // idx
};

absl::StatusOr<ImageSpec> ParseImageSpec(const std::string& spec) {
  ImageSpec out;
  if (spec == "fmnist" || absl::StartsWith(spec, "fmnist:")) {
    out.fmnist = true;
    out.dir = spec == "fmnist" ? kFmnistDefaultDir : spec.substr(7);
    return out;
  }
  std::vector<std::string> files = absl::StrSplit(spec.substr(4), ',');
  if (files.size() != 2 || files[0].empty() || files[1].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec,
        ": expected idx:IMAGES,LABELS (an idx3 or idx4 image file and "
        "its idx1 label file, each optionally gzipped)"));
  }
  out.images = files[0];
  out.labels = files[1];
  return out;
}

// A spec's images as its validation set: Fashion-MNIST's test files, or
// the idx files named.
absl::StatusOr<ImageSet> LoadValidationImages(const std::string& val_spec) {
  STARLING_ASSIGN_OR_RETURN(ImageSpec v, ParseImageSpec(val_spec));
  if (v.fmnist) return LoadFmnistFiles(v.dir, "t10k");
  return LoadIdxImages(v.images, v.labels);
}

// Per-channel mean and standard deviation of x/255 over `images` (uint8
// [N, C, H, W]), summed in order in double precision: the same figures on
// every node, whatever its thread count.
void ChannelStats(const torch::Tensor& images, std::vector<float>* mean,
                  std::vector<float>* std_dev) {
  const int64_t n = images.size(0), c = images.size(1);
  const int64_t plane = images.size(2) * images.size(3);
  const uint8_t* p = images.data_ptr<uint8_t>();
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* q = p + (i * c + ch) * plane;
      for (int64_t k = 0; k < plane; ++k) {
        const double v = q[k] / 255.0;
        sum += v;
        sq += v * v;
      }
    }
    const double count = static_cast<double>(n * plane);
    const double m = sum / count;
    const double var = std::max(0.0, sq / count - m * m);
    mean->push_back(static_cast<float>(m));
    // A constant channel would divide by 0.
    std_dev->push_back(static_cast<float>(var > 1e-12 ? std::sqrt(var) : 1.0));
  }
}

std::string ShapeText(const torch::Tensor& images) {
  return absl::StrCat(images.size(1), "x", images.size(2), "x", images.size(3));
}

// Images with their labels: the training shard of this node and the whole
// validation set (the same on every node).
class ImageDataset : public Dataset {
 public:
  static absl::StatusOr<std::unique_ptr<Dataset>> Create(
      const DataOptions& opts) {
    STARLING_ASSIGN_OR_RETURN(ImageSpec spec, ParseImageSpec(opts.spec));
    auto ds = std::unique_ptr<ImageDataset>(new ImageDataset());
    ds->regions_ = opts.two_regions ? 2 : 1;
    STARLING_RETURN_IF_ERROR(ds->LoadSets(spec, opts));
    STARLING_RETURN_IF_ERROR(ds->CheckSets());
    if (spec.fmnist) {
      ds->mean_ = {kFmnistMean};
      ds->std_ = {kFmnistStd};
    } else {
      ChannelStats(ds->train_images_, &ds->mean_, &ds->std_);
    }
    STARLING_RETURN_IF_ERROR(ds->Shard(opts));
    ds->drift_map_ = DriftMap(ds->classes_);
    return std::unique_ptr<Dataset>(std::move(ds));
  }

  TaskKind kind() const override { return TaskKind::kClassification; }
  int64_t num_classes() const override { return classes_; }
  std::vector<int64_t> example_shape() const override {
    return {train_images_.size(1), train_images_.size(2),
            train_images_.size(3)};
  }
  std::string Describe() const override {
    return absl::StrCat(
        name_, " (train shard ", shard_.size(), " of ", train_images_.size(0),
        ", ", val_name_, " ", val_images_.size(0),
        ShapeText(train_images_) == "1x28x28" && classes_ == 10
            ? ""
            : absl::StrCat(", images ", ShapeText(train_images_), ", ",
                           classes_, " classes"),
        regions_ == 2 ? ", two drift regions: B permutes the labels" : "", ")");
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
  ImageDataset() = default;

  // The training and validation images: Fashion-MNIST's train and test
  // files, an idx: set split by --val_fraction, or --val_data's.
  absl::Status LoadSets(const ImageSpec& spec, const DataOptions& opts) {
    ImageSet train;
    if (spec.fmnist) {
      name_ = absl::StrCat("Fashion-MNIST from ", spec.dir);
      STARLING_ASSIGN_OR_RETURN(train, LoadFmnistFiles(spec.dir, "train"));
    } else {
      name_ = absl::StrCat("idx images ", spec.images);
      STARLING_ASSIGN_OR_RETURN(train, LoadIdxImages(spec.images, spec.labels));
    }
    train_images_ = train.images;
    train_labels_ = train.labels;
    if (!opts.val_spec.empty()) {
      val_name_ = absl::StrCat("validation (--val_data=", opts.val_spec, ")");
      STARLING_ASSIGN_OR_RETURN(ImageSet val,
                                LoadValidationImages(opts.val_spec));
      val_images_ = val.images;
      val_labels_ = val.labels;
      val_source_ = val.source;
      return absl::OkStatus();
    }
    if (spec.fmnist) {
      val_name_ = "test";
      STARLING_ASSIGN_OR_RETURN(ImageSet val,
                                LoadFmnistFiles(spec.dir, "t10k"));
      val_images_ = val.images;
      val_labels_ = val.labels;
      val_source_ = val.source;
      return absl::OkStatus();
    }
    // The tail --val_fraction of the examples.
    const int64_t n = train_images_.size(0);
    const int64_t split =
        static_cast<int64_t>(static_cast<double>(n) * (1 - opts.val_fraction));
    if (split < 1 || split >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          train.source, ": ", n,
          " images cannot be split by --val_fraction=", opts.val_fraction,
          " into training and validation; give more "
          "images, another --val_fraction, or --val_data"));
    }
    val_name_ = "val (the last --val_fraction)";
    val_source_ = train.source;
    val_images_ = train_images_.narrow(0, split, n - split);
    val_labels_ = train_labels_.narrow(0, split, n - split);
    train_images_ = train_images_.narrow(0, 0, split);
    train_labels_ = train_labels_.narrow(0, 0, split);
    return absl::OkStatus();
  }

  // Train and validation images of one shape; the classes.
  absl::Status CheckSets() {
    if (ShapeText(train_images_) != ShapeText(val_images_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the validation images (", val_source_, ") are ",
          ShapeText(val_images_), " (CxHxW) but the training images are ",
          ShapeText(train_images_)));
    }
    classes_ = 1 + std::max(train_labels_.max().item<int64_t>(),
                            val_labels_.max().item<int64_t>());
    return absl::OkStatus();
  }

  absl::Status Shard(const DataOptions& opts) {
    const int64_t n = train_images_.size(0);
    if (opts.shard.mode == ShardMode::kNonIid) {
      // Sort by label (stable), then deal contiguous blocks: each node sees
      // about classes/N classes.
      std::vector<int64_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      const int64_t* lab = train_labels_.data_ptr<int64_t>();
      std::stable_sort(order.begin(), order.end(),
                       [lab](int64_t a, int64_t b) { return lab[a] < lab[b]; });
      for (int64_t i : ShardIndices(n, opts.shard, opts.split_seed)) {
        shard_.push_back(order[i]);
      }
    } else {
      shard_ = ShardIndices(n, opts.shard, opts.split_seed);
    }
    if (shard_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", opts.shard.index, "/", opts.shard.count,
                       " of ", name_, " is empty"));
    }
    return absl::OkStatus();
  }

  // Region B's label of each class.
  static torch::Tensor DriftMap(int64_t classes) {
    std::vector<int64_t> map(static_cast<size_t>(classes));
    for (int64_t c = 0; c < classes; ++c) {
      map[c] = classes == 10 ? kDriftLabels[c] : (c + 1) % classes;
    }
    return torch::tensor(map, torch::kLong);
  }

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

  // x/255 normalized; region 1 relabels class c as drift_map_[c].
  Batch Make(const torch::Tensor& images, const torch::Tensor& labels,
             int region) const {
    torch::Tensor x = images.to(torch::kFloat32).div_(255.0f);
    if (mean_.size() == 1) {
      x.sub_(mean_[0]).div_(std_[0]);
    } else {
      const int64_t c = static_cast<int64_t>(mean_.size());
      x.sub_(torch::tensor(mean_).view({1, c, 1, 1}))
          .div_(torch::tensor(std_).view({1, c, 1, 1}));
    }
    if (region == 0) return {x, labels.clone()};
    return {x, drift_map_.index_select(0, labels)};
  }

  std::string name_, val_name_, val_source_;
  int regions_ = 1;
  int64_t classes_ = 0;
  std::vector<float> mean_, std_;  // per channel, or one for all
  torch::Tensor train_images_, train_labels_, val_images_, val_labels_;
  torch::Tensor drift_map_;
  std::vector<int64_t> shard_;
};

// The labels of an idx1 file as int64, each >= 0.
absl::StatusOr<torch::Tensor> LabelsOf(const IdxArray& lab,
                                       const std::string& path) {
  const int64_t n = lab.dims[0];
  torch::Tensor labels = torch::empty({n}, torch::kLong);
  int64_t* out = labels.data_ptr<int64_t>();
  const auto* p = reinterpret_cast<const uint8_t*>(lab.data.data());
  for (int64_t i = 0; i < n; ++i) {
    if (lab.type == 0x08) {
      out[i] = p[i];
      continue;
    }
    const uint8_t* q = p + 4 * i;
    const int32_t v =
        static_cast<int32_t>((uint32_t{q[0]} << 24) | (uint32_t{q[1]} << 16) |
                             (uint32_t{q[2]} << 8) | q[3]);
    if (v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": label ", v, " at index ", i, " is negative"));
    }
    out[i] = v;
  }
  return labels;
}

}  // namespace

bool IsImageSpec(const std::string& spec) {
  return spec == "fmnist" || absl::StartsWith(spec, "fmnist:") ||
         absl::StartsWith(spec, "idx:");
}

absl::StatusOr<ImageSet> LoadIdxImages(const std::string& images_path,
                                       const std::string& labels_path) {
  STARLING_ASSIGN_OR_RETURN(std::string ibytes, ReadMaybeGzipFile(images_path));
  STARLING_ASSIGN_OR_RETURN(std::string lbytes, ReadMaybeGzipFile(labels_path));
  STARLING_ASSIGN_OR_RETURN(IdxArray img, ParseIdxAny(ibytes, images_path));
  STARLING_ASSIGN_OR_RETURN(IdxArray lab, ParseIdxAny(lbytes, labels_path));
  const int rank = static_cast<int>(img.dims.size());
  if (img.type != 0x08 || (rank != 3 && rank != 4)) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path,
                     ": expected images of unsigned bytes, idx3 (N x H x W, "
                     "grayscale) or idx4 (N x H x W x C, channels last); "
                     "the file holds ",
                     rank, " dimensions (", absl::StrJoin(img.dims, " x "),
                     ") of type 0x", absl::Hex(img.type)));
  }
  const int64_t channels = rank == 4 ? img.dims[3] : 1;
  if (channels > kMaxChannels) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, ": ", channels, " channels (the last of ",
                     absl::StrJoin(img.dims, " x "),
                     "); idx4 images are N x H x W x C "
                     "with C from 1 to ",
                     kMaxChannels,
                     " (channels last: write a PyTorch "
                     "N x C x H x W tensor as x.permute(0, 2, 3, 1))"));
  }
  if (lab.dims.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(labels_path,
                     ": expected labels in an idx1 file (one dimension); it "
                     "has ",
                     lab.dims.size()));
  }
  if (img.dims[0] != lab.dims[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, " has ", img.dims[0], " images but ",
                     labels_path, " has ", lab.dims[0], " labels"));
  }
  ImageSet set;
  set.source = absl::StrCat(images_path, ", ", labels_path);
  STARLING_ASSIGN_OR_RETURN(set.labels, LabelsOf(lab, labels_path));
  const int64_t n = img.dims[0], h = img.dims[1], w = img.dims[2];
  torch::Tensor raw = torch::empty({n, h, w, channels}, torch::kUInt8);
  std::memcpy(raw.data_ptr<uint8_t>(), img.data.data(), img.data.size());
  set.images = raw.permute({0, 3, 1, 2}).contiguous();
  return set;
}

absl::StatusOr<std::unique_ptr<Dataset>> LoadImageDataset(
    const DataOptions& opts) {
  if (!opts.val_spec.empty() && !IsImageSpec(opts.val_spec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--val_data=", opts.val_spec, ": --data=", opts.spec,
        " holds images, so the validation set must too (fmnist, fmnist:DIR "
        "or idx:IMAGES,LABELS)"));
  }
  absl::StatusOr<std::unique_ptr<Dataset>> ds = ImageDataset::Create(opts);
  if (absl::IsNotFound(ds.status()) && opts.spec == "fmnist") {
    return absl::NotFoundError(absl::StrCat(
        ds.status().message(),
        " (install the Debian package dataset-fashion-mnist, or pass "
        "--data=fmnist:DIR)"));
  }
  return ds;
}

absl::StatusOr<std::string> ReadGzipFile(const std::string& path) {
  STARLING_ASSIGN_OR_RETURN(std::string raw, ReadFile(path));
  if (raw.size() < 2 || static_cast<uint8_t>(raw[0]) != 0x1f ||
      static_cast<uint8_t>(raw[1]) != 0x8b) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a gzip file (expected an .idx.gz file)"));
  }
  return ReadMaybeGzipFile(path);
}

absl::StatusOr<std::string> ReadMaybeGzipFile(const std::string& path) {
  STARLING_ASSIGN_OR_RETURN(std::string raw, ReadFile(path));
  if (raw.size() < 2 || static_cast<uint8_t>(raw[0]) != 0x1f ||
      static_cast<uint8_t>(raw[1]) != 0x8b) {
    return raw;
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

absl::StatusOr<IdxArray> ParseIdxAny(const std::string& bytes,
                                     const std::string& name) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a valid idx file: ", why));
  };
  if (bytes.size() < 4) return bad("shorter than the 4-byte magic");
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (p[0] != 0 || p[1] != 0) return bad("magic must start with two 0 bytes");
  if (p[2] != 0x08 && p[2] != 0x0C) {
    return bad(absl::StrCat("element type 0x", absl::Hex(p[2]),
                            "; expected 0x08 (unsigned byte) or 0x0c (int32)"));
  }
  const int rank = p[3];
  if (rank < 1 || rank > 4) {
    return bad(absl::StrCat(rank, " dimensions; expected 1 to 4"));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header) return bad("truncated header");
  IdxArray out;
  out.type = p[2];
  uint64_t total = out.type == 0x08 ? 1 : 4;
  for (int d = 0; d < rank; ++d) {
    const uint8_t* q = p + 4 + 4 * d;
    int64_t dim = (int64_t{q[0]} << 24) | (q[1] << 16) | (q[2] << 8) | q[3];
    if (dim <= 0 || dim > (1 << 28)) {
      return bad(absl::StrCat("dimension ", d, " is ", dim));
    }
    out.dims.push_back(static_cast<int32_t>(dim));
    total *= static_cast<uint64_t>(dim);
    if (total > bytes.size()) {  // also keeps `total` from overflowing
      return bad(absl::StrCat("header promises more than the ",
                              bytes.size() - header,
                              " bytes of data the file has"));
    }
  }
  if (bytes.size() - header != total) {
    return bad(absl::StrCat("header promises ", total,
                            " bytes of data, file has ",
                            bytes.size() - header));
  }
  out.data = bytes.substr(header);
  return out;
}

absl::StatusOr<IdxArray> ParseIdx(const std::string& bytes, int expected_rank,
                                  const std::string& name) {
  STARLING_ASSIGN_OR_RETURN(IdxArray out, ParseIdxAny(bytes, name));
  if (out.type != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a valid idx file: element type 0x",
                     absl::Hex(out.type), "; expected 0x08 (unsigned byte)"));
  }
  if (static_cast<int>(out.dims.size()) != expected_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not a valid idx file: ", out.dims.size(),
                     " dimensions; expected ", expected_rank));
  }
  return out;
}

}  // namespace starling
