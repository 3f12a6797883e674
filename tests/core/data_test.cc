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
  // Labels up to 11: twelve classes (any class count is allowed).
  WriteGzip(dir + "/train-labels-idx1-ubyte.gz",
            IdxBytes({20}, std::string(20, '\x0b')));
  r = LoadDataset(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->num_classes(), 12);
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

// Little-endian uint32 tokens, each id given.
std::string Uint32Bytes(const std::vector<uint32_t>& ids) {
  std::string out;
  for (uint32_t v : ids) {
    for (int k = 0; k < 4; ++k) out += static_cast<char>((v >> (8 * k)) & 0xff);
  }
  return out;
}

TEST(TokenFileTest, Uint32TokensLoadWithTheirDtype) {
  auto t = ParseTokenFile32(Uint32Bytes({1, 70000, 0x01020304}), "f");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (std::vector<uint32_t>{1, 70000, 0x01020304}));
  auto bad = ParseTokenFile32("abcde", "five.bin");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("multiple of 4"), std::string::npos);

  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 4000; ++i) ids.push_back((i * 7919) % 70001);
  ids[0] = 70000;  // (i * 7919) % 70001 never reaches it for i < 4000
  const std::string path = TempDir() + "/big.tokens";
  ASSERT_TRUE(WriteFileAtomic(path, Uint32Bytes(ids)).ok());
  DataOptions o;
  o.spec = "tokens:" + path;
  o.context = 8;
  o.token_dtype = "uint32";
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_classes(), 70001);  // the largest id, 70000, + 1
  Batch v = (*ds)->ValBatch(0, 1);
  const int64_t split = static_cast<int64_t>(4000 * 0.95);
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(v.x[0][t].item<int64_t>(), ids[split + t]);
    EXPECT_EQ(v.y[0][t].item<int64_t>(), ids[split + t + 1]);
  }
  // Read as uint16 the same file is other tokens: the dtype matters.
  o.token_dtype = "uint16";
  ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_LT((*ds)->num_classes(), 65537);
  o.token_dtype = "int8";
  EXPECT_NE(LoadDataset(o).status().message().find("--token_dtype=int8"),
            std::string::npos);
  DataOptions text;
  text.spec = "text:" + WriteText(testing::SampleText(5000));
  text.token_dtype = "uint32";
  auto refused = LoadDataset(text);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_NE(refused.status().message().find("tokens:PATH only"),
            std::string::npos)
      << refused.status();
}

// --val_data: all of --data trains, and validation reads the other file.
TEST(ValDataTest, TextAndTokensValidateOnTheirOwnFile) {
  const std::string dir = TempDir();
  const std::string train = dir + "/train.txt", val = dir + "/val.txt";
  ASSERT_TRUE(WriteFileAtomic(train, testing::SampleText(20000)).ok());
  const std::string val_text = "zyxwvutsrqponmlkjihgfedcba0123456789";
  ASSERT_TRUE(WriteFileAtomic(val, val_text).ok());
  DataOptions o;
  o.spec = "text:" + train;
  o.val_spec = "text:" + val;
  o.context = 8;
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->val_examples(), (36 - 1) / 8);
  EXPECT_EQ((*ds)->train_size(), 20000);  // none held out
  Batch v = (*ds)->ValBatch(1, 1);
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(v.x[0][t].item<int64_t>(), val_text[8 + t]);
    EXPECT_EQ(v.y[0][t].item<int64_t>(), val_text[9 + t]);
  }
  // Training windows never reach into the validation text (letters
  // reversed and digits are not in the training words).
  Sampler s(5);
  torch::Tensor x = (*ds)->NextTrain(512, s).y;
  EXPECT_EQ((x == static_cast<int64_t>('z')).sum().item<int64_t>(), 0);
  EXPECT_EQ((x == static_cast<int64_t>('0')).sum().item<int64_t>(), 0);

  // Tokens: the vocabulary covers the validation file's ids too.
  const std::string tokens = dir + "/t.bin", val_tokens = dir + "/v.bin";
  std::string tb, vb;
  for (int i = 0; i < 3000; ++i)
    tb += std::string{static_cast<char>(i % 50), 0};
  for (int i = 0; i < 100; ++i) vb += std::string{static_cast<char>(60), 0};
  ASSERT_TRUE(WriteFileAtomic(tokens, tb).ok());
  ASSERT_TRUE(WriteFileAtomic(val_tokens, vb).ok());
  DataOptions t;
  t.spec = "tokens:" + tokens;
  t.val_spec = "tokens:" + val_tokens;
  t.context = 8;
  ds = LoadDataset(t);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_classes(), 61);
  EXPECT_EQ((*ds)->val_examples(), 99 / 8);
  EXPECT_EQ((*ds)->ValBatch(0, 1).x[0][0].item<int64_t>(), 60);
}

TEST(ValDataTest, MismatchedKindsDriftAndSmallSetsAreRefused) {
  const std::string dir = TempDir();
  const std::string train = WriteText(testing::SampleText(20000));
  struct Case {
    std::string spec, val;
    bool drift;
    std::string mention;
  };
  ASSERT_TRUE(WriteFileAtomic(dir + "/tiny.txt", "abc").ok());
  const std::vector<Case> cases = {
      {"text:" + train, "tokens:" + train, false, "must be too (text:PATH"},
      {"text:" + train, "fmnist", false, "must be too"},
      {"text:" + train, "text:/no/such.txt", false,
       "--val_data=text:/no/such.txt: file not found"},
      {"text:" + train, "text:" + dir + "/tiny.txt", false, "too small"},
      {"text:" + train, "text:" + train, true, "--drift"},
  };
  for (const Case& c : cases) {
    DataOptions o;
    o.spec = c.spec;
    o.val_spec = c.val;
    o.two_regions = c.drift;
    o.context = 16;
    auto r = LoadDataset(o);
    EXPECT_FALSE(r.ok()) << c.val;
    EXPECT_NE(r.status().message().find(c.mention), std::string::npos)
        << r.status();
  }
  testing::WriteTinyFmnist(dir, 20, 10);
  DataOptions images;
  images.spec = "fmnist:" + dir;
  images.val_spec = "text:" + train;
  EXPECT_NE(LoadDataset(images).status().message().find("holds images"),
            std::string::npos);
}

// An idx4 colour set (N x H x W x C, channels last) of `n` images of h x w
// with `c` channels; pixel (y, x, ch) = (i + y + 2x + 3ch) % 256 and the
// label i % classes as int32 when `int32_labels`, else as a byte.
void WriteColourIdx(const std::string& images, const std::string& labels,
                    uint32_t n, uint32_t h, uint32_t w, uint32_t c, int classes,
                    bool int32_labels) {
  std::string pixels, labs;
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t y = 0; y < h; ++y) {
      for (uint32_t x = 0; x < w; ++x) {
        for (uint32_t ch = 0; ch < c; ++ch) {
          pixels += static_cast<char>((i + y + 2 * x + 3 * ch) % 256);
        }
      }
    }
    const uint32_t label = i % classes;
    labs += int32_labels ? testing::BigEndian32(label)
                         : std::string(1, static_cast<char>(label));
  }
  std::string label_file =
      int32_labels ? std::string{0, 0, 0x0C, 1} + testing::BigEndian32(n) + labs
                   : IdxBytes({n}, labs);
  ASSERT_TRUE(
      WriteFileAtomic(images, IdxBytes({n, h, w, c}, pixels)).ok());  // raw
  WriteGzip(labels, label_file);
}

TEST(IdxImagesTest, ColourImagesOfAnySizeAndClassCount) {
  const std::string dir = TempDir();
  WriteColourIdx(dir + "/img.idx", dir + "/lab.idx.gz", 100, 12, 10, 3, 13,
                 /*int32_labels=*/true);
  DataOptions o;
  o.spec = "idx:" + dir + "/img.idx," + dir + "/lab.idx.gz";
  o.val_fraction = 0.2;
  auto ds = LoadDataset(o);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->kind(), TaskKind::kClassification);
  EXPECT_EQ((*ds)->example_shape(), (std::vector<int64_t>{3, 12, 10}));
  EXPECT_EQ((*ds)->num_classes(), 13);
  EXPECT_EQ((*ds)->train_size(), 80);
  EXPECT_EQ((*ds)->val_examples(), 20);
  // Validation image 0 is image 80, channels moved first; each channel is
  // normalized with the training images' own mean and deviation, so the
  // difference of two pixels of one channel keeps its sign and ratio.
  Batch v = (*ds)->ValBatch(0, 1);
  EXPECT_EQ(v.x.sizes(), (std::vector<int64_t>{1, 3, 12, 10}));
  EXPECT_EQ(v.y[0].item<int64_t>(), 80 % 13);
  for (int ch = 0; ch < 3; ++ch) {
    const float a = v.x[0][ch][0][0].item<float>();
    const float dy = v.x[0][ch][1][0].item<float>() - a;
    const float dx = v.x[0][ch][0][1].item<float>() - a;
    EXPECT_GT(dy, 0);
    EXPECT_NEAR(dx / dy, 2.0, 1e-3);
  }
  Sampler one_epoch(1);
  const torch::Tensor all = (*ds)->NextTrain(80, one_epoch).x;
  for (int ch = 0; ch < 3; ++ch) {
    EXPECT_NEAR(all.select(1, ch).mean().item<double>(), 0, 1e-3);
    EXPECT_NEAR(all.select(1, ch).std(false).item<double>(), 1, 1e-2);
  }
  // The same files as a separate validation set of a Fashion-MNIST-named
  // directory of the same shape.
  const std::string fdir = TempDir();
  WriteColourIdx(fdir + "/train-images-idx4-ubyte",
                 fdir + "/train-labels-idx1-ubyte", 40, 12, 10, 3, 13, false);
  DataOptions f;
  f.spec = "fmnist:" + fdir;
  f.val_spec = o.spec;
  ds = LoadDataset(f);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->train_size(), 40);
  EXPECT_EQ((*ds)->val_examples(), 100);
}

TEST(IdxImagesTest, BadLayoutsAreRefusedNamingTheFile) {
  const std::string dir = TempDir();
  // Channels first (N x C x H x W) reads as 32 channels: refused, with the
  // layout to write.
  WriteColourIdx(dir + "/nchw.idx", dir + "/lab.idx", 10, 3, 32, 32, 2, false);
  DataOptions o;
  o.spec = "idx:" + dir + "/nchw.idx," + dir + "/lab.idx";
  auto r = LoadDataset(o);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("channels last"), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("nchw.idx"), std::string::npos);
  // Images of another shape as the validation set.
  WriteColourIdx(dir + "/a.idx", dir + "/a-lab.idx", 10, 8, 8, 1, 2, false);
  WriteColourIdx(dir + "/b.idx", dir + "/b-lab.idx", 10, 9, 8, 1, 2, false);
  o.spec = "idx:" + dir + "/a.idx," + dir + "/a-lab.idx";
  o.val_spec = "idx:" + dir + "/b.idx," + dir + "/b-lab.idx";
  r = LoadDataset(o);
  EXPECT_NE(r.status().message().find("1x9x8 (CxHxW) but the training images "
                                      "are 1x8x8"),
            std::string::npos)
      << r.status();
  // Not "IMAGES,LABELS".
  o.spec = "idx:" + dir + "/a.idx";
  o.val_spec = "";
  EXPECT_NE(LoadDataset(o).status().message().find("idx:IMAGES,LABELS"),
            std::string::npos);
  // Labels that are not one-dimensional.
  o.spec = "idx:" + dir + "/a.idx," + dir + "/a.idx";
  EXPECT_NE(LoadDataset(o).status().message().find("idx1"), std::string::npos);
}

}  // namespace
}  // namespace starling
