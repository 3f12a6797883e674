#include "core/checkpoint.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/flat_params.h"
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

}  // namespace
}  // namespace starling
