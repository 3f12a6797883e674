#include "core/data.h"

#include <torch/torch.h>

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace starling {
namespace {

using ::starling::testing::IdxBytes;
using ::starling::testing::TempDir;
using ::starling::testing::WriteGzip;

std::string WriteText(const std::string& text) {
  std::string path = TempDir() + "/text.txt";
  EXPECT_TRUE(WriteFileAtomic(path, text).ok());
  return path;
}

TEST(ShardTest, ParsesAndRejects) {
  auto s = ParseShard("2/4", "contiguous");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->index, 2);
  EXPECT_EQ(s->count, 4);
  EXPECT_EQ(s->mode, ShardMode::kContiguous);
  for (const char* bad : {"4/4", "-1/2", "1", "a/b", "1/0", ""}) {
    auto r = ParseShard(bad, "iid");
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_NE(r.status().message().find("--shard"), std::string::npos);
  }
  EXPECT_TRUE(absl::IsInvalidArgument(ParseShard("0/1", "random").status()));
}

TEST(TextDataTest, SplitAndWindowsAreNextTokenPairs) {
  std::string text = testing::SampleText(100000);
  DataOptions o;
  o.spec = "text:" + WriteText(text);
  o.context = 32;
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->kind(), TaskKind::kLanguageModel);
  EXPECT_EQ((*ds)->num_classes(), 256);
  const int64_t split = 95000;
  EXPECT_EQ((*ds)->train_size(), split);
  EXPECT_EQ((*ds)->val_examples(), (100000 - split - 1) / 32);
  Batch v = (*ds)->ValBatch(0, 2);
  ASSERT_EQ(v.x.sizes(), (std::vector<int64_t>{2, 32}));
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(v.x[0][t].item<int64_t>(), static_cast<uint8_t>(text[split + t]));
    EXPECT_EQ(v.y[1][t].item<int64_t>(),
              static_cast<uint8_t>(text[split + 32 + t + 1]));
  }
  Sampler sampler(7);
  Batch b = (*ds)->NextTrain(64, sampler);
  // y is x shifted by one, and every window lies in the training part.
  EXPECT_TRUE(b.x.narrow(1, 1, 31).equal(b.y.narrow(1, 0, 31)));
}

TEST(TextDataTest, SameSeedSameBatches) {
  DataOptions o;
  o.spec = "text:" + WriteText(testing::SampleText(50000));
  o.context = 16;
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok());
  Sampler a(3), b(3), c(4);
  for (int i = 0; i < 5; ++i) {
    Batch ba = (*ds)->NextTrain(8, a), bb = (*ds)->NextTrain(8, b);
    EXPECT_TRUE(ba.x.equal(bb.x));
    EXPECT_FALSE(ba.x.equal((*ds)->NextTrain(8, c).x));
  }
}

// Windows drawn by shard K of N only start in that shard's part of the
// text. Token i of the file is i >> 10, so a window's first token tells
// roughly where it starts.
TEST(TextDataTest, ShardsAreDisjointAndCoverTheTrainingText) {
  const int64_t n = 400000;
  std::string raw;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t t = static_cast<uint16_t>(i >> 10);
    raw += static_cast<char>(t & 0xff);
    raw += static_cast<char>(t >> 8);
  }
  std::string path = TempDir() + "/tok.bin";
  ASSERT_TRUE(WriteFileAtomic(path, raw).ok());
  const int64_t split = 380000;
  for (const char* mode : {"iid", "contiguous"}) {
    std::vector<std::set<int64_t>> chunks(3);  // 64 KiB-token chunks seen
    int64_t total = 0;
    for (int k = 0; k < 3; ++k) {
      DataOptions o;
      o.spec = "tokens:" + path;
      o.context = 8;
      o.shard = *ParseShard(absl::StrCat(k, "/3"), mode);
      auto ds = LoadDataset(o);
      ASSERT_TRUE(ds.ok()) << ds.status();
      total += (*ds)->train_size();
      Sampler s(k);
      for (int i = 0; i < 40; ++i) {
        Batch b = (*ds)->NextTrain(64, s);
        for (int64_t r = 0; r < 64; ++r) {
          int64_t first = b.x[r][0].item<int64_t>();
          ASSERT_LE(first, (split - 1) >> 10) << "window in validation data";
          if (std::string(mode) == "contiguous") {
            EXPECT_GE(first, (split * k / 3) >> 10);
            EXPECT_LE(first, (split * (k + 1) / 3) >> 10);
          }
          chunks[k].insert(first >> 6);
        }
      }
    }
    EXPECT_EQ(total, split) << mode;
    if (std::string(mode) == "iid") {
      for (int a = 0; a < 3; ++a) {
        EXPECT_GE(chunks[a].size(), 1u);
        for (int b = a + 1; b < 3; ++b) {
          for (int64_t c : chunks[a]) EXPECT_EQ(chunks[b].count(c), 0u) << c;
        }
      }
    }
  }
}

TEST(DriftTest, ParsesAndRejects) {
  auto off = ParseDrift("");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->two_regions);
  EXPECT_EQ(off->RegionAt(1000000), 0);
  auto never = ParseDrift("never");
  ASSERT_TRUE(never.ok());
  EXPECT_TRUE(never->two_regions);
  EXPECT_EQ(never->RegionAt(1000000), 0);
  auto at = ParseDrift("400");
  ASSERT_TRUE(at.ok());
  EXPECT_TRUE(at->two_regions);
  EXPECT_EQ(at->RegionAt(399), 0);
  EXPECT_EQ(at->RegionAt(400), 1);
  EXPECT_EQ(ParseDrift("0")->RegionAt(0), 1);
  for (const char* bad : {"abc", "-1", "4x", "1.5", "never!", "n0@4"}) {
    auto r = ParseDrift(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_NE(r.status().message().find("--drift"), std::string::npos)
        << r.status();
  }
}

// With two regions, region 0 draws its training and validation windows only
// from the first half of the text and region 1 only from the second; each
// node's shard is taken inside the region. Token i of the file is i >> 3, so
// a window's first token tells where it starts (to within 8 tokens).
// Byte text: drift region B is the second half with its letters' case
// swapped, text the model has not seen in that form.
TEST(TextDataTest, DriftRegionBOfByteTextSwapsLetterCase) {
  std::string text(100000, 'a');
  text += std::string(100000, 'b');
  std::string path = TempDir() + "/ab.txt";
  ASSERT_TRUE(WriteFileAtomic(path, text).ok());
  DataOptions o;
  o.spec = "text:" + path;
  o.context = 8;
  o.two_regions = true;
  o.shard = *ParseShard("0/1", "iid");
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  Sampler s(1);
  for (int region : {0, 1}) {
    Batch b = (*ds)->NextTrain(32, s, region);
    const int64_t want = region == 0 ? 'a' : 'B';
    EXPECT_EQ(b.x.min().item<int64_t>(), want) << region;
    EXPECT_EQ(b.x.max().item<int64_t>(), want) << region;
  }
  // One region: the text as it is.
  o.two_regions = false;
  auto plain = LoadDataset(o);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->NextTrain(256, s, 0).x.min().item<int64_t>(), 'a');
  EXPECT_EQ((*plain)->NextTrain(4096, s, 0).x.max().item<int64_t>(), 'b');
}

TEST(TextDataTest, DriftRegionsAreTheTwoHalvesEachWithItsValidation) {
  const int64_t n = 400000, half = n / 2;
  const int64_t split_a = 190000, split_b = half + 190000;  // 5% held out
  std::string raw;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t t = static_cast<uint16_t>(i >> 3);
    raw += static_cast<char>(t & 0xff);
    raw += static_cast<char>(t >> 8);
  }
  std::string path = TempDir() + "/tok.bin";
  ASSERT_TRUE(WriteFileAtomic(path, raw).ok());
  for (const char* mode : {"iid", "contiguous"}) {
    int64_t total[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      DataOptions o;
      o.spec = "tokens:" + path;
      o.context = 8;
      o.two_regions = true;
      o.shard = *ParseShard(absl::StrCat(k, "/2"), mode);
      auto ds = LoadDataset(o);
      ASSERT_TRUE(ds.ok()) << ds.status();
      ASSERT_EQ((*ds)->regions(), 2);
      total[0] += (*ds)->train_size(0);
      total[1] += (*ds)->train_size(1);
      Sampler s(k);
      for (int i = 0; i < 20; ++i) {
        for (int region : {0, 1}) {
          Batch b = (*ds)->NextTrain(64, s, region);
          const int64_t lo = region == 0 ? 0 : half;
          const int64_t hi = region == 0 ? split_a : split_b;
          const int64_t first_min = b.x.select(1, 0).min().item<int64_t>();
          const int64_t first_max = b.x.select(1, 0).max().item<int64_t>();
          ASSERT_GE(first_min, lo >> 3) << mode << " region " << region;
          ASSERT_LE(first_max, (hi - 8) >> 3) << mode << " region " << region;
          if (std::string(mode) == "contiguous") {
            const int64_t train = hi - lo;
            EXPECT_GE(first_min, (lo + train * k / 2) >> 3);
            EXPECT_LE(first_max, (lo + train * (k + 1) / 2) >> 3);
          }
        }
      }
      // Validation windows start at each region's held-out tail.
      for (int region : {0, 1}) {
        const int64_t split = region == 0 ? split_a : split_b;
        const int64_t end = region == 0 ? half : n;
        EXPECT_EQ((*ds)->val_examples(region), (end - split - 1) / 8);
        Batch v = (*ds)->ValBatch(0, 1, region);
        EXPECT_EQ(v.x[0][0].item<int64_t>(), split >> 3);
        const int64_t last = (*ds)->val_examples(region) - 1;
        Batch w = (*ds)->ValBatch(last, 1, region);
        EXPECT_GE(w.x[0][0].item<int64_t>(), split >> 3);
        EXPECT_LE(w.y[0][7].item<int64_t>(), (end - 1) >> 3);
      }
    }
    EXPECT_EQ(total[0], split_a) << mode;
    EXPECT_EQ(total[1], split_b - half) << mode;
  }
}

TEST(TextDataTest, OneRegionUnlessAskedAndTooSmallRegionsAreRejected) {
  DataOptions o;
  o.spec = "text:" + WriteText(testing::SampleText(4000));
  o.context = 64;
  auto one = LoadDataset(o);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->regions(), 1);
  // 4000 bytes hold out 200, enough for one region's validation window but
  // not for two halves' (100 each).
  o.context = 120;
  ASSERT_TRUE(LoadDataset(o).ok());
  o.two_regions = true;
  auto two = LoadDataset(o);
  EXPECT_TRUE(absl::IsInvalidArgument(two.status()));
  EXPECT_NE(two.status().message().find("drift region"), std::string::npos)
      << two.status();
}

TEST(TokenFileTest, ParsesLittleEndianAndRejectsBadFiles) {
  auto t = ParseTokenFile(std::string("\x01\x00\x00\x01", 4), "f");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, (std::vector<uint16_t>{1, 256}));
  auto odd = ParseTokenFile("abc", "odd.bin");
  EXPECT_TRUE(absl::IsInvalidArgument(odd.status()));
  EXPECT_NE(odd.status().message().find("odd.bin"), std::string::npos);
  EXPECT_NE(odd.status().message().find("uint16"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseTokenFile("", "e").status()));
}

TEST(TokenFileTest, VocabIsCheckedAndInferred) {
  std::string raw;
  for (int i = 0; i < 5000; ++i) {
    uint16_t t = static_cast<uint16_t>(i % 1000);
    raw += static_cast<char>(t & 0xff);
    raw += static_cast<char>(t >> 8);
  }
  std::string path = TempDir() + "/t.bin";
  ASSERT_TRUE(WriteFileAtomic(path, raw).ok());
  DataOptions o;
  o.spec = "tokens:" + path;
  o.context = 8;
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_classes(), 1000);
  o.vocab = 500;
  auto bad = LoadDataset(o);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("999"), std::string::npos);
  o.vocab = -1;
  bad = LoadDataset(o);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_EQ(bad.status().message().find("--vocab=-1: must be >= 0"), 0u)
      << bad.status();
  // Byte text has its own vocabulary (256): --vocab there is a mistake, not
  // something to ignore.
  o.spec = "text:" + path;
  o.vocab = 1000;
  bad = LoadDataset(o);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_EQ(bad.status().message().find(
                "--vocab=1000: applies to --data=tokens:PATH only"),
            0u)
      << bad.status();
  o.vocab = 0;
  EXPECT_TRUE(LoadDataset(o).ok());
}

TEST(DataSpecTest, MissingAndUnknownInputsNameThemselves) {
  DataOptions o;
  o.spec = "text:/nonexistent/file.txt";
  auto r = LoadDataset(o);
  EXPECT_TRUE(absl::IsNotFound(r.status()));
  // The flag first, then the file (once each).
  EXPECT_TRUE(absl::StartsWith(r.status().message(),
                               "--data=text:/nonexistent/file.txt: "))
      << r.status();
  EXPECT_NE(r.status().message().find("/nonexistent/file.txt", 10),
            std::string::npos);
  for (const char* spec :
       {"tokens:/nonexistent/t.bin", "fmnist:/nonexistent"}) {
    o.spec = spec;
    r = LoadDataset(o);
    EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
    EXPECT_TRUE(absl::StartsWith(r.status().message(),
                                 absl::StrCat("--data=", spec, ": ")))
        << r.status();
  }
  o.spec = "imagenet";
  r = LoadDataset(o);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_EQ(r.status().message().find("--data=imagenet: unknown data set"), 0u)
      << r.status();
  o.spec = "text:" + WriteText("tiny");
  r = LoadDataset(o);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "--data=text:"))
      << r.status();
  DataOptions no_context = o;
  no_context.context = 0;
  r = LoadDataset(no_context);
  EXPECT_EQ(r.status().message().find("--context=0"), 0u) << r.status();
  o.spec = "text:" + WriteText(testing::SampleText(10000));
  o.shard = *ParseShard("0/2", "noniid");
  EXPECT_TRUE(absl::IsInvalidArgument(LoadDataset(o).status()));
}

TEST(IdxTest, RejectsMalformedFiles) {
  std::string good = IdxBytes({2, 28, 28}, std::string(2 * 784, '\0'));
  ASSERT_TRUE(ParseIdx(good, 3, "g").ok());
  std::string bad_magic = good;
  bad_magic[0] = 1;
  std::string bad_type = good;
  bad_type[2] = 0x0d;
  std::string short_payload = good.substr(0, good.size() - 1);
  std::string long_payload = good + "x";
  for (const auto& [bytes, why] :
       std::vector<std::pair<std::string, std::string>>{
           {bad_magic, "magic"},
           {bad_type, "element type"},
           {short_payload, "promises"},
           {long_payload, "promises"},
           {"ab", "shorter"},
           {good.substr(0, 10), "truncated header"}}) {
    auto r = ParseIdx(bytes, 3, "file.idx");
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << why;
    EXPECT_NE(r.status().message().find("file.idx"), std::string::npos);
    EXPECT_NE(r.status().message().find(why), std::string::npos)
        << r.status().message();
  }
  EXPECT_TRUE(absl::IsInvalidArgument(ParseIdx(good, 1, "rank").status()));
}

TEST(GzipTest, RejectsNonGzipCorruptAndTruncated) {
  std::string dir = TempDir();
  std::string plain = dir + "/plain.gz";
  ASSERT_TRUE(WriteFileAtomic(plain, "not gzip at all").ok());
  auto r = ReadGzipFile(plain);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("not a gzip"), std::string::npos);

  std::string gz = dir + "/data.gz";
  WriteGzip(gz, testing::SampleText(200000));
  std::string bytes = *ReadFile(gz);
  ASSERT_TRUE(ReadGzipFile(gz).ok());
  ASSERT_TRUE(WriteFileAtomic(gz, bytes.substr(0, bytes.size() / 2)).ok());
  r = ReadGzipFile(gz);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("corrupt or truncated"),
            std::string::npos);
  std::string flipped = bytes;
  for (size_t i = 100; i < 200; ++i) flipped[i] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(gz, flipped).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ReadGzipFile(gz).status()));
}

TEST(FmnistTest, TinyDirectoryLoadsWithShardsAndNonIid) {
  std::string dir = TempDir();
  testing::WriteTinyFmnist(dir, 200, 50);
  DataOptions o;
  o.spec = "fmnist:" + dir;
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->kind(), TaskKind::kClassification);
  EXPECT_EQ((*ds)->train_size(), 200);
  EXPECT_EQ((*ds)->val_examples(), 50);
  Sampler s(1);
  Batch b = (*ds)->NextTrain(16, s);
  EXPECT_EQ(b.x.sizes(), (std::vector<int64_t>{16, 1, 28, 28}));
  EXPECT_EQ(b.x.dtype(), torch::kFloat32);
  EXPECT_EQ(b.y.sizes(), (std::vector<int64_t>{16}));

  // One epoch visits every shard example exactly once.
  o.shard = *ParseShard("1/4", "iid");
  ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->train_size(), 50);
  Sampler e(2);
  torch::Tensor xs = (*ds)->NextTrain(50, e).x.reshape({50, -1});
  EXPECT_EQ(std::get<0>(torch::unique_dim(xs, 0)).size(0), 50);
  EXPECT_EQ(e.epoch, 0);
  (*ds)->NextTrain(1, e);
  EXPECT_EQ(e.epoch, 1);

  // Non-iid by label: shard 0 of 5 sees only labels 0 and 1.
  o.shard = *ParseShard("0/5", "noniid");
  ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok());
  Sampler n(3);
  torch::Tensor labels = (*ds)->NextTrain(200, n).y;
  EXPECT_EQ(labels.max().item<int64_t>(), 1);
  EXPECT_EQ(labels.min().item<int64_t>(), 0);
}

// Region 1 of Fashion-MNIST is the same images in the same order with the
// labels permuted: a fixed derangement, identical for train and validation.
TEST(FmnistTest, DriftRegionPermutesTheLabels) {
  std::string dir = TempDir();
  testing::WriteTinyFmnist(dir, 200, 50);
  DataOptions o;
  o.spec = "fmnist:" + dir;
  o.two_regions = true;
  o.shard = *ParseShard("1/2", "iid");
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->regions(), 2);
  EXPECT_EQ((*ds)->train_size(1), (*ds)->train_size(0));
  Sampler a(4), b(4);
  std::map<int64_t, int64_t> map;
  auto check = [&](const Batch& x0, const Batch& x1) {
    EXPECT_TRUE(x0.x.equal(x1.x));
    for (int64_t i = 0; i < x0.y.size(0); ++i) {
      const int64_t from = x0.y[i].item<int64_t>();
      const int64_t to = x1.y[i].item<int64_t>();
      EXPECT_NE(from, to) << "label " << from << " kept";
      auto [it, inserted] = map.emplace(from, to);
      EXPECT_EQ(it->second, to) << "label " << from << " maps two ways";
    }
  };
  for (int i = 0; i < 5; ++i) {  // 5 x 40 > the 100-image shard: two epochs
    check((*ds)->NextTrain(40, a, 0), (*ds)->NextTrain(40, b, 1));
  }
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.cursor, b.cursor);
  check((*ds)->ValBatch(0, 50, 0), (*ds)->ValBatch(0, 50, 1));
  ASSERT_EQ(map.size(), 10u);
  std::set<int64_t> images;
  for (const auto& [from, to] : map) images.insert(to);
  EXPECT_EQ(images.size(), 10u);  // a permutation
  // The same permutation in a fresh load (fixed, not seeded per run).
  o.split_seed = 77;
  auto again = LoadDataset(o);
  ASSERT_TRUE(again.ok());
  Batch v0 = (*again)->ValBatch(0, 50, 0), v1 = (*again)->ValBatch(0, 50, 1);
  for (int64_t i = 0; i < 50; ++i) {
    EXPECT_EQ(map[v0.y[i].item<int64_t>()], v1.y[i].item<int64_t>());
  }
}

TEST(FmnistTest, CorruptOrInconsistentFilesAreRejected) {
  std::string dir = TempDir();
  testing::WriteTinyFmnist(dir, 20, 10);
  DataOptions o;
  o.spec = "fmnist:" + dir;
  // Labels count differs from images count.
  WriteGzip(dir + "/train-labels-idx1-ubyte.gz",
            IdxBytes({19}, std::string(19, '\1')));
  auto r = LoadDataset(o);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("labels"), std::string::npos);
  // Label out of range.
  WriteGzip(dir + "/train-labels-idx1-ubyte.gz",
            IdxBytes({20}, std::string(20, '\x0b')));
  r = LoadDataset(o);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("outside 0..9"), std::string::npos);
  // Missing file.
  testing::WriteTinyFmnist(dir, 20, 10);
  ASSERT_EQ(std::remove((dir + "/t10k-images-idx3-ubyte.gz").c_str()), 0);
  r = LoadDataset(o);
  EXPECT_TRUE(absl::IsNotFound(r.status()));
  EXPECT_NE(r.status().message().find("t10k-images"), std::string::npos);
}

TEST(FmnistTest, DebianPackageLoads) {
  if (!FileExists(
          "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  DataOptions o;
  o.spec = "fmnist";
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->train_size(), 60000);
  EXPECT_EQ((*ds)->val_examples(), 10000);
}

}  // namespace
}  // namespace starling
