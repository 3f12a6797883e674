#include "core/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/memory.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace starling {
namespace {

Checkpoint Make(int version, size_t bytes) {
  Checkpoint c;
  c.sections["meta"] = absl::StrCat("version=", version);
  c.sections["blob"] =
      std::string(bytes, static_cast<char>('a' + version % 26));
  return c;
}

TEST(CheckpointTest, RoundTrip) {
  std::string path = testing::TempDir() + "/c.ckpt";
  Checkpoint c = Make(3, 1000);
  c.sections["empty"] = "";
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  absl::StatusOr<Checkpoint> r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sections, c.sections);
}

// The file is the layout checkpoint.cc documents, byte for byte, so that
// checkpoints of earlier builds stay readable and the other way round:
// "STARCKPT", u32 version 1, u32 section count, then per section (by name)
// u32 name length, the name, u64 size and the bytes, then u64 HashBytes of
// all of that.
TEST(CheckpointTest, TheFileIsTheDocumentedLayout) {
  const std::string path = testing::TempDir() + "/c.ckpt";
  Checkpoint c;
  c.sections["zeta"] = std::string(1001, 'z');
  c.sections["alpha"] = "abc";
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  auto put32 = [](std::string* s, uint32_t v) {
    s->append(reinterpret_cast<const char*>(&v), 4);
  };
  auto put64 = [](std::string* s, uint64_t v) {
    s->append(reinterpret_cast<const char*>(&v), 8);
  };
  std::string want = "STARCKPT";
  put32(&want, 1);
  put32(&want, 2);
  for (const auto& [name, bytes] : c.sections) {
    put32(&want, static_cast<uint32_t>(name.size()));
    want += name;
    put64(&want, bytes.size());
    want += bytes;
  }
  put64(&want, HashBytes(want.data(), want.size()));
  EXPECT_EQ(ReadFile(path).value_or(""), want);
}

TEST(CheckpointTest, MissingFileIsNotFound) {
  absl::StatusOr<Checkpoint> r =
      ReadCheckpoint(testing::TempDir() + "/absent.ckpt");
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
}

// ReadFile reads to the end, not to the size stat reports: /proc files say 0.
TEST(FileUtilTest, ReadFileReadsProcFilesWhole) {
  absl::StatusOr<std::string> status = ReadFile("/proc/self/status");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_NE(status->find("Pid:"), std::string::npos) << *status;
  const std::string path = testing::TempDir() + "/big";
  const std::string big = testing::SampleText(3 << 20);
  ASSERT_TRUE(WriteFileAtomic(path, big).ok());
  EXPECT_EQ(ReadFile(path).value_or(""), big);
  EXPECT_TRUE(
      absl::IsNotFound(ReadFile(testing::TempDir() + "/none").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ReadFile(testing::TempDir()).status()));
}

TEST(FileUtilTest, FileReaderReadsPiecesAndNamesAnEarlyEnd) {
  const std::string path = testing::TempDir() + "/f";
  ASSERT_TRUE(WriteFileAtomic(path, "0123456789").ok());
  absl::StatusOr<FileReader> file = FileReader::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), 10u);
  std::string a(3, '\0'), b(7, '\0');
  ASSERT_TRUE(file->Read(a.data(), 3).ok());
  ASSERT_TRUE(file->Read(b.data(), 7).ok());
  EXPECT_EQ(a + b, "0123456789");
  absl::Status past = file->Read(a.data(), 1);
  EXPECT_TRUE(absl::IsInvalidArgument(past)) << past;
  EXPECT_NE(past.message().find(path), std::string::npos) << past;
  EXPECT_TRUE(absl::IsNotFound(
      FileReader::Open(testing::TempDir() + "/none").status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(FileReader::Open(testing::TempDir()).status()));
}

// The probe a run makes of its --out before any work: a directory it can
// write passes (made if missing) and keeps no probe file; one it cannot
// (/proc/self, not writable even by root; a file in a directory's place)
// fails naming the path.
TEST(FileUtilTest, CheckDirWritableProbesAndCleansUp) {
  const std::string dir = testing::TempDir() + "/a/b";
  ASSERT_TRUE(CheckDirWritable(dir).ok());
  EXPECT_TRUE(FileExists(dir));
  EXPECT_FALSE(FileExists(dir + "/.starling-write-probe"));
  absl::Status proc = CheckDirWritable("/proc/self");
  EXPECT_FALSE(proc.ok());
  EXPECT_NE(proc.message().find("/proc/self/.starling-write-probe"),
            std::string::npos)
      << proc;
  const std::string file = testing::TempDir() + "/file";
  ASSERT_TRUE(WriteFileAtomic(file, "x").ok());
  absl::Status not_dir = CheckDirWritable(file + "/sub");
  EXPECT_FALSE(not_dir.ok());
  EXPECT_NE(not_dir.message().find(file), std::string::npos) << not_dir;
}

TEST(CheckpointTest, FlippedByteIsDataLossNamingTheFile) {
  std::string path = testing::TempDir() + "/c.ckpt";
  ASSERT_TRUE(WriteCheckpoint(path, Make(1, 5000)).ok());
  std::string bytes = *ReadFile(path);
  bytes[bytes.size() / 2] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  absl::StatusOr<Checkpoint> r = ReadCheckpoint(path);
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_NE(r.status().message().find(path), std::string::npos);
}

TEST(CheckpointTest, TruncatedFileIsDataLoss) {
  std::string path = testing::TempDir() + "/c.ckpt";
  ASSERT_TRUE(WriteCheckpoint(path, Make(1, 5000)).ok());
  std::string bytes = *ReadFile(path);
  for (size_t keep : {size_t{0}, size_t{7}, size_t{30}, bytes.size() - 1}) {
    ASSERT_TRUE(WriteFileAtomic(path, bytes.substr(0, keep)).ok());
    EXPECT_TRUE(absl::IsDataLoss(ReadCheckpoint(path).status())) << keep;
  }
}

// A file whose checksum matches but whose framing does not hold together
// (as a buggy or hostile writer could make) is DataLoss naming the field,
// and a size field is not believed past the file's end: a section that
// claims 2^62 bytes allocates nothing. Damage under a stale checksum is
// a checksum mismatch whichever field it hit, even when the framing is read
// (streamed) before the checksum.
TEST(CheckpointTest, BadFramingUnderAMatchingChecksumIsNamed) {
  const std::string path = testing::TempDir() + "/c.ckpt";
  Checkpoint c;
  c.sections["alpha"] = "abc";
  c.sections["beta"] = std::string(3000, 'b');
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  const std::string good = *ReadFile(path);
  // Offsets: magic 0, version 8, count 12, alpha's name_len 16, name 20,
  // size 25, bytes 33.
  auto with = [&](size_t offset, const std::string& bytes, bool rehash) {
    std::string f = good.substr(0, good.size() - 8);
    f.replace(offset, bytes.size(), bytes);
    uint64_t h;
    std::memcpy(&h, good.data() + good.size() - 8, 8);
    if (rehash) h = HashBytes(f.data(), f.size());
    f.append(reinterpret_cast<const char*>(&h), 8);
    EXPECT_TRUE(WriteFileAtomic(path, f).ok());
    return ReadCheckpoint(path).status();
  };
  auto u32 = [](uint32_t v) {
    return std::string(reinterpret_cast<const char*>(&v), 4);
  };
  auto u64 = [](uint64_t v) {
    return std::string(reinterpret_cast<const char*>(&v), 8);
  };
  struct Case {
    size_t offset;
    std::string bytes;
    std::string why;
  };
  for (const Case& k : std::vector<Case>{
           {8, u32(2), "unsupported version 2"},
           {12, u32(3), "section 2 is out of bounds"},
           {12, u32(1), "trailing bytes after the sections"},
           {16, u32(1u << 31), "section 0 is out of bounds"},
           {25, u64(uint64_t{1} << 62), "section 0 is out of bounds"},
           {25, u64(4), "section 1 is out of bounds"},
       }) {
    SCOPED_TRACE(k.why);
    absl::Status st = with(k.offset, k.bytes, /*rehash=*/true);
    EXPECT_TRUE(absl::IsDataLoss(st)) << st;
    EXPECT_EQ(st.message(),
              absl::StrCat("checkpoint ", path, " is unreadable: ", k.why));
    st = with(k.offset, k.bytes, /*rehash=*/false);
    EXPECT_TRUE(absl::IsDataLoss(st)) << st;
    EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st;
  }
  ASSERT_TRUE(WriteFileAtomic(path, good).ok());
  absl::StatusOr<Checkpoint> r = ReadCheckpoint(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sections, c.sections);
}

TEST(CheckpointTest, ForeignFileIsDataLoss) {
  std::string path = testing::TempDir() + "/c.ckpt";
  ASSERT_TRUE(WriteFileAtomic(path, std::string(100, 'x')).ok());
  EXPECT_TRUE(absl::IsDataLoss(ReadCheckpoint(path).status()));
}

// A writer killed with SIGKILL at a random moment (usually mid-write) must
// leave a checkpoint that reads back as one complete version.
TEST(CheckpointTest, KillDuringWriteLeavesAReadableCheckpoint) {
  const std::string path = testing::TempDir() + "/c.ckpt";
  ASSERT_TRUE(WriteCheckpoint(path, Make(0, 8 << 20)).ok());
  for (int trial = 0; trial < 5; ++trial) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int v = 1;; ++v) {
        if (!WriteCheckpoint(path, Make(v, 8 << 20)).ok()) _exit(3);
      }
    }
    usleep(20000 + 37000 * trial);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "writer exited early: " << status;
    absl::StatusOr<Checkpoint> r = ReadCheckpoint(path);
    ASSERT_TRUE(r.ok()) << "trial " << trial << ": " << r.status();
    const std::string& meta = r->sections.at("meta");
    int version = std::stoi(meta.substr(meta.find('=') + 1));
    EXPECT_EQ(r->sections.at("blob"),
              std::string(8 << 20, static_cast<char>('a' + version % 26)));
  }
}

// Bytes this process's heap hands out now (glibc's count over its arenas
// and mapped blocks), to bound what a checkpoint holds on the way.
int64_t HeapNow() { return HeapBytesInUse(); }

// The bytes of every section written whole, in pieces by a producer, or as
// a view make the same file as WriteCheckpoint of the same strings.
TEST(CheckpointTest, StreamedSectionsMakeTheSameFile) {
  const std::string a = testing::TempDir() + "/a.ckpt";
  const std::string b = testing::TempDir() + "/b.ckpt";
  Checkpoint c = Make(7, 3 << 20);
  c.sections["small"] = "xyz";
  ASSERT_TRUE(WriteCheckpoint(a, c).ok());
  const std::string& blob = c.sections["blob"];
  CheckpointSections s;
  s.emplace(
      "blob", CheckpointSection(blob.size(), [&](ByteSink& sink) {
        for (size_t at = 0; at < blob.size(); at += 1000) {
          STARLING_RETURN_IF_ERROR(sink.Write(
              blob.data() + at, std::min<size_t>(1000, blob.size() - at)));
        }
        return absl::OkStatus();
      }));
  s.emplace("meta", CheckpointSection::View(c.sections["meta"]));
  s.emplace("small", "xyz");
  ASSERT_TRUE(WriteCheckpoint(b, s).ok());
  EXPECT_EQ(ReadFile(a).value_or("a"), ReadFile(b).value_or("b"));
}

// A producer that fails, or writes other than it announced, fails the
// write and leaves the previous file and no temporary one.
TEST(CheckpointTest, AFailedProducerLeavesThePreviousFile) {
  const std::string dir = testing::TempDir();
  const std::string path = dir + "/c.ckpt";
  ASSERT_TRUE(WriteCheckpoint(path, Make(1, 100)).ok());
  const std::string before = *ReadFile(path);
  // Too few bytes, too many, and the producer's own error.
  for (const auto& [announced, produced] :
       std::vector<std::pair<uint64_t, absl::Status>>{
           {5, absl::OkStatus()},
           {3, absl::OkStatus()},
           {4, absl::UnavailableError("no bytes today")}}) {
    // A copy: C++17 lambdas cannot capture a structured binding.
    const absl::Status error = produced;
    CheckpointSections s;
    s.emplace("x", CheckpointSection(announced, [&](ByteSink& sink) {
                STARLING_RETURN_IF_ERROR(sink.Write("four"));
                return error;
              }));
    absl::Status st = WriteCheckpoint(path, s);
    EXPECT_FALSE(st.ok());
    if (error.ok()) {
      EXPECT_TRUE(absl::IsInternal(st)) << st;
      EXPECT_NE(st.message().find("section x wrote 4 bytes"), std::string::npos)
          << st;
    } else {
      EXPECT_EQ(st, error);
    }
    EXPECT_EQ(*ReadFile(path), before);
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(CheckpointTest, ReaderKeepsSmallSectionsAndReadsOthersFromTheFile) {
  const std::string path = testing::TempDir() + "/c.ckpt";
  Checkpoint c = Make(2, 5000);
  c.sections["empty"] = "";
  ASSERT_TRUE(WriteCheckpoint(path, c).ok());
  absl::StatusOr<CheckpointReader> r =
      CheckpointReader::Open(path, /*keep_bytes=*/100);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->path(), path);
  EXPECT_EQ(r->Names(), (std::vector<std::string>{"blob", "empty", "meta"}));
  EXPECT_TRUE(r->Has("meta"));
  EXPECT_FALSE(r->Has("nope"));
  EXPECT_EQ(*r->Size("blob"), 5000u);
  for (const auto& [name, bytes] : c.sections) {
    EXPECT_EQ(r->ReadString(name).value_or("?"), bytes) << name;
  }
  absl::StatusOr<SectionReader> blob = r->Section("blob");
  ASSERT_TRUE(blob.ok());
  std::string head(10, '\0'), tail(4980, '\0');
  ASSERT_TRUE(blob->Read(head.data(), 10).ok());
  ASSERT_TRUE(blob->Skip(10).ok());
  ASSERT_TRUE(blob->Read(tail.data(), tail.size()).ok());
  EXPECT_EQ(head + std::string(10, head[0]) + tail, c.sections["blob"]);
  absl::Status past = blob->Read(head.data(), 1);
  EXPECT_TRUE(absl::IsDataLoss(past)) << past;
  EXPECT_NE(past.message().find("section blob"), std::string::npos) << past;
  EXPECT_TRUE(absl::IsNotFound(r->ReadString("nope").status()));
  EXPECT_TRUE(absl::IsNotFound(r->Section("nope").status()));
  // Damage anywhere is found when the file is opened, before any section
  // is read.
  std::string bytes = *ReadFile(path);
  bytes[bytes.size() / 2] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  EXPECT_TRUE(absl::IsDataLoss(CheckpointReader::Open(path, 0).status()));
}

// Neither direction holds a section whole: writing a 64 MiB section held
// elsewhere, or reading it into its destination, takes the heap no more
// than the bounded buffers.
TEST(CheckpointTest, WritingAndReadingHoldOnlyBoundedBuffers) {
  const std::string path = testing::TempDir() + "/c.ckpt";
  const size_t size = 64 << 20;
  std::vector<char> blob(size, 'q');
  std::vector<char> into(size);
  const int64_t before = HeapNow();
  int64_t during = 0;
  CheckpointSections s;
  s.emplace("blob", CheckpointSection::View({blob.data(), size}));
  // Written after "blob" (by name): what the writer holds by then.
  s.emplace("probe", CheckpointSection(0, [&](ByteSink&) {
              during = HeapNow() - before;
              return absl::OkStatus();
            }));
  ASSERT_TRUE(WriteCheckpoint(path, s).ok());
  EXPECT_LT(during, 2 << 20);
  absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<SectionReader> section = r->Section("blob");
  ASSERT_TRUE(section.ok());
  ASSERT_TRUE(section->Read(into.data(), size).ok());
  EXPECT_LT(HeapNow() - before, 2 << 20);
  EXPECT_TRUE(into == blob);
}

}  // namespace
}  // namespace starling
