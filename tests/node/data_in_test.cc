// Integration tests of the doors a new user's model and data come in
// through, on the real `starling` binary: an --out that cannot be written
// fails before any work (train, node, sim; as root and as another user), a
// checkpoint that fails mid-run keeps the previous one, `starling tokenize`
// makes token files that train reads (checked against SentencePiece's own
// spm_encode), and an idx colour image set trains with the built-in cnn.
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::Process;
using ::starling::testing::ReadEvents;
using ::starling::testing::ReadJson;
using ::starling::testing::RunStarling;
using ::starling::testing::TempDir;
using ::starling::testing::TinyTextFlags;
using ::starling::testing::WaitFor;

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The subcommands that take --out as a run directory, each with a missing
// --data file: the --out error must come first, before the data is read.
const std::vector<std::string>& RunCommands() {
  static const auto* commands = new std::vector<std::string>{
      "train --data=text:/no/such/corpus.txt",
      "node --insecure --data=text:/no/such/corpus.txt",
      "sim --nodes=2 --data=text:/no/such/corpus.txt"};
  return *commands;
}

// /proc/self exists, and not even root may create a file in it: the probe
// fails where mkdir -p passes. Each command exits 2 naming --out, without
// reading its data, building a model or starting a node.
TEST(OutTest, AnUnwritableOutExitsTwoBeforeAnyWork) {
  for (const std::string& command : RunCommands()) {
    const absl::Time start = absl::Now();
    auto r = RunStarling(absl::StrCat(command, " --out=/proc/self"));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.err;
    EXPECT_TRUE(Contains(r.err,
                         "--out=/proc/self: the run directory is not "
                         "writable"))
        << command << "\n"
        << r.err;
    EXPECT_FALSE(Contains(r.err, "corpus.txt")) << command << "\n" << r.err;
    EXPECT_FALSE(Contains(r.err, "node n0")) << command << "\n" << r.err;
    // For the report; the test does not hold a machine to a time.
    RecordProperty(absl::StrCat("seconds ", command.substr(0, 5)),
                   absl::StrCat(seconds));
  }
}

// The user's case: a mode-555 directory, run as a user who may not write
// it (nobody, through setpriv; root may write anywhere). Needs root and
// setpriv (util-linux) to drop to that user.
TEST(OutTest, AMode555DirectoryIsRefusedForAnotherUser) {
  if (::geteuid() != 0 || std::system("command -v setpriv >/dev/null") != 0) {
    GTEST_SKIP() << "needs root and setpriv to run as another user";
  }
  const std::string dir = TempDir();
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  const std::string out = dir + "/readonly";
  ASSERT_TRUE(MakeDirs(out).ok());
  ASSERT_EQ(::chmod(out.c_str(), 0555), 0);
  Process::Options as_nobody;
  as_nobody.wrapper = "setpriv --reuid=65534 --regid=65534 --clear-groups";
  // That user must be able to run the binary and load its libraries (in a
  // chroot built as root, say, it may not read them).
  Process help =
      Process::Start("--help", absl::StrCat(dir, "/help.log"), as_nobody);
  if (!help.started() || help.Wait() != 0) {
    GTEST_SKIP() << "user 65534 cannot run starling here: " << help.LogText();
  }
  for (const std::string& command : RunCommands()) {
    Process p = Process::Start(absl::StrCat(command, " --out=", out),
                               absl::StrCat(dir, "/log"), as_nobody);
    ASSERT_TRUE(p.started());
    EXPECT_EQ(p.Wait(), 2) << command << "\n" << p.LogText();
    EXPECT_TRUE(Contains(p.LogText(), absl::StrCat("--out=", out,
                                                   ": the run directory is "
                                                   "not writable")))
        << command << "\n"
        << p.LogText();
    EXPECT_TRUE(Contains(p.LogText(), "Permission denied")) << p.LogText();
    EXPECT_FALSE(Contains(p.LogText(), "corpus.txt")) << p.LogText();
  }
}

// A checkpoint that cannot be written mid-run (here a directory sits where
// its temporary file goes) costs that checkpoint, not the run: a warning
// names the previous checkpoint, which stays whole, and training goes on
// to the last step. The final checkpoint fails the same way: exit 1,
// naming the checkpoint kept, which --resume then continues from.
TEST(CheckpointFailureTest, ThePreviousCheckpointIsKeptAndTrainingGoesOn) {
  const std::string out = TempDir() + "/run";
  const std::string flags =
      absl::StrCat(TinyTextFlags(100000),
                   " --threads=1 --steps=200 --checkpoint_every=10 "
                   "--eval_every=0 --log_every=0 --slowdown=10");
  Process p = Process::Start(absl::StrCat("train ", flags, " --out=", out),
                             TempDir() + "/train.log");
  ASSERT_TRUE(p.started());
  const std::string events = out + "/events.jsonl";
  ASSERT_TRUE(WaitFor([&] { return !ReadEvents(events, "checkpoint").empty(); },
                      absl::Minutes(2)));
  const std::string blocker =
      absl::StrCat(out, "/checkpoint.ckpt.tmp.", p.pid());
  // Retried: while a checkpoint is being written its temporary file sits
  // at that path, and the directory can go there once it is renamed.
  ASSERT_TRUE(
      WaitFor([&] { return MakeDirs(blocker).ok(); }, absl::Minutes(1)));
  EXPECT_EQ(p.Wait(absl::Minutes(5)), 1) << p.LogText();
  const std::vector<google::protobuf::Struct> written =
      ReadEvents(events, "checkpoint");
  ASSERT_FALSE(written.empty());
  const int kept =
      static_cast<int>(Field(written.back(), "step").number_value());
  EXPECT_LT(kept, 200);
  EXPECT_FALSE(ReadEvents(events, "checkpoint_failed").empty());
  const std::string log = p.LogText();
  EXPECT_TRUE(Contains(log, "starling train: warning: checkpoint at step"))
      << log;
  EXPECT_TRUE(Contains(log, absl::StrCat("keeping the previous checkpoint "
                                         "(step ",
                                         kept, ")")))
      << log;
  EXPECT_TRUE(Contains(log, "training goes on")) << log;
  // Every step ran: the final checkpoint, at the last step, is the one that
  // failed the run (no "end" event follows a failed final checkpoint).
  EXPECT_TRUE(Contains(log, "checkpoint at step 200 failed")) << log;
  // The kept checkpoint is whole: the run resumes from it.
  ASSERT_EQ(::rmdir(blocker.c_str()), 0);
  auto resumed = RunStarling(
      absl::StrCat("train ", flags, " --out=", out, " --resume --slowdown=1"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
}

// The same in a node: its periodic checkpoints go through NodeSession.
TEST(CheckpointFailureTest, ANodeWarnsAndTrainsOn) {
  const std::string out = TempDir() + "/node";
  Process p = Process::Start(
      absl::StrCat("node --insecure --node_id=n0 ", TinyTextFlags(100000),
                   " --threads=1 --steps=200 --inner_steps=10 "
                   "--checkpoint_every=10 --eval_every=0 --slowdown=10 --out=",
                   out),
      TempDir() + "/node.log");
  ASSERT_TRUE(p.started());
  const std::string events = out + "/events.jsonl";
  ASSERT_TRUE(WaitFor(
      [&] {
        return !ReadEvents(events, "checkpoint").empty() ||
               !ReadEvents(events, "round").empty();
      },
      absl::Minutes(2)));
  const std::string blocker =
      absl::StrCat(out, "/checkpoint.ckpt.tmp.", p.pid());
  ASSERT_TRUE(
      WaitFor([&] { return MakeDirs(blocker).ok(); }, absl::Minutes(1)));
  EXPECT_EQ(p.Wait(absl::Minutes(5)), 1) << p.LogText();
  const std::string log = p.LogText();
  EXPECT_TRUE(Contains(log, "training goes on")) << log;
  EXPECT_TRUE(Contains(log, "the final checkpoint failed")) << log;
  EXPECT_FALSE(ReadEvents(events, "checkpoint_failed").empty());
  // Every round ran, to the last step, before the final checkpoint failed.
  const std::vector<google::protobuf::Struct> rounds =
      ReadEvents(events, "round");
  ASSERT_FALSE(rounds.empty()) << log;
  EXPECT_EQ(Field(rounds.back(), "step").number_value(), 200) << log;
}

// `starling tokenize` on a text that is not the Bible (the GPL, which
// every Debian system has): it trains a model, writes tokens that match
// SentencePiece's own command-line encoder (each line then </s>), applies
// the model again with --sp_model to the same tokens, and train reads them
// with the flags it prints.
TEST(TokenizeTest, TrainsAModelWritesTokensAndTrainReadsThem) {
  const std::string text = "/usr/share/common-licenses/GPL-3";
  ASSERT_TRUE(FileExists(text));
  const std::string dir = TempDir();
  // Train on the first 600 lines, validate on the rest.
  const std::string all = ReadFile(text).value_or("");
  const size_t cut = [&] {
    size_t at = 0;
    for (int i = 0; i < 600; ++i) at = all.find('\n', at) + 1;
    return at;
  }();
  ASSERT_TRUE(WriteFileAtomic(dir + "/train.txt", all.substr(0, cut)).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/val.txt", all.substr(cut)).ok());
  auto r = RunStarling(absl::StrCat(
      "tokenize --input=", dir, "/train.txt --model_prefix=", dir,
      "/spm --vocab_size=400 --out=", dir, "/train.tokens --val_input=", dir,
      "/val.txt --val_out=", dir, "/val.tokens"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(FileExists(dir + "/spm.model"));
  EXPECT_TRUE(FileExists(dir + "/spm.vocab"));
  const std::string flags_line =
      absl::StrCat("train with: --data=tokens:", dir,
                   "/train.tokens --token_dtype=uint16 "
                   "--vocab=400 --val_data=tokens:",
                   dir, "/val.tokens");
  EXPECT_TRUE(Contains(r.err, flags_line)) << r.err;
  const std::string tokens = ReadFile(dir + "/train.tokens").value_or("");
  ASSERT_EQ(tokens.size() % 2, 0u);

  // SentencePiece's own encoder gives the same ids, line by line, each line
  // followed by </s> (id 2).
  if (std::system("command -v spm_encode >/dev/null") == 0) {
    ASSERT_EQ(std::system(absl::StrCat("spm_encode --model=", dir,
                                       "/spm.model --output_format=id <", dir,
                                       "/train.txt >", dir, "/ids.txt")
                              .c_str()),
              0);
    std::vector<std::string> lines =
        absl::StrSplit(ReadFile(dir + "/ids.txt").value_or(""), '\n');
    if (!lines.empty() && lines.back().empty()) lines.pop_back();
    std::string expected;
    for (const std::string& line : lines) {
      for (absl::string_view id :
           absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        uint32_t v = 0;
        ASSERT_TRUE(absl::SimpleAtoi(id, &v)) << id;
        expected +=
            std::string{static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
      }
      expected += std::string{2, 0};
    }
    EXPECT_EQ(lines.size(), 600u);
    EXPECT_EQ(tokens, expected);
  }

  // Applying the trained model gives the same file.
  r = RunStarling(absl::StrCat("tokenize --input=", dir,
                               "/train.txt --sp_model=", dir,
                               "/spm.model --out=", dir, "/again.tokens"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFile(dir + "/again.tokens").value_or("x"), tokens);

  // uint32 tokens: the same ids, four bytes each.
  r = RunStarling(absl::StrCat(
      "tokenize --input=", dir, "/train.txt --sp_model=", dir,
      "/spm.model --token_dtype=uint32 --out=", dir, "/wide.tokens"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFile(dir + "/wide.tokens").value_or("").size(),
            2 * tokens.size());

  // train reads them with the printed flags.
  const google::protobuf::Struct summary = testing::RunToSummary(
      absl::StrCat("train ", absl::StripPrefix(flags_line, "train with: "),
                   " --model=gpt --layers=1 --width=32 --heads=2 --context=32 "
                   "--batch=8 --steps=30 --threads=1 --eval_every=0 "
                   "--log_every=0"),
      dir + "/run");
  const google::protobuf::Struct& fin = Field(summary, "final").struct_value();
  EXPECT_GT(Field(fin, "val_loss").number_value(), 0);
  EXPECT_LT(Field(fin, "val_loss").number_value(), 6.5);  // ln 400 = 5.99
  EXPECT_TRUE(
      Contains(Field(Field(summary, "model").struct_value(), "architecture")
                   .string_value(),
               "vocab=400"));
  EXPECT_TRUE(
      Contains(Field(summary, "data").string_value(), "from --val_data"))
      << Field(summary, "data").string_value();
}

// Bad tokenize flags and inputs exit 2 before any training or encoding.
TEST(TokenizeTest, BadFlagsAreRefusedBeforeWork) {
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteFileAtomic(dir + "/t.txt", "hello world\n").ok());
  const std::string in = " --input=" + dir + "/t.txt";
  struct Case {
    std::string args, mention;
  };
  const std::vector<Case> cases = {
      {"tokenize --out=" + dir + "/o", "--input: name the text file"},
      {"tokenize --input=/no/such.txt --model_prefix=m --out=o",
       "--input=/no/such.txt: no such file"},
      {"tokenize" + in + " --out=" + dir + "/o",
       "exactly one of --model_prefix"},
      {"tokenize" + in + " --model_prefix=m --sp_model=" + dir +
           "/t.txt "
           "--out=o",
       "exactly one of --model_prefix"},
      {"tokenize" + in + " --model_prefix=" + dir + "/m", "--out: name"},
      {"tokenize" + in + " --model_prefix=" + dir +
           "/m --vocab_size=70000 "
           "--out=" +
           dir + "/o",
       "add --token_dtype=uint32"},
      {"tokenize" + in + " --model_prefix=" + dir +
           "/m --sp_model_type=wordpiece "
           "--out=" +
           dir + "/o",
       "--sp_model_type=wordpiece"},
      {"tokenize" + in + " --model_prefix=" + dir + "/m --out=/proc/self/t",
       "--out=/proc/self/t: its directory is not writable"},
      {"tokenize" + in + " --model_prefix=" + dir + "/m --out=" + dir +
           "/o --val_input=" + dir + "/t.txt",
       "--val_input and --val_out go together"},
      {"tokenize" + in + " --sp_model=" + dir + "/t.txt --out=" + dir + "/o",
       "SentencePiece cannot encode with"},
  };
  for (const Case& c : cases) {
    auto r = RunStarling(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_TRUE(Contains(r.err, c.mention)) << c.args << "\n" << r.err;
    EXPECT_FALSE(Contains(r.err, "training a")) << c.args << "\n" << r.err;
  }
  EXPECT_FALSE(FileExists(dir + "/m.model"));
}

// An idx colour set in the layout the docs give (N x H x W x C, labels
// idx1), trained from the command line: the built-in cnn sizes itself to
// 3x16x16 and 5 classes, and the run reports accuracy.
TEST(IdxDataTest, AColourSetTrainsWithTheBuiltInCnn) {
  const std::string dir = TempDir();
  std::string pixels, labels;
  const uint32_t n = 300;
  for (uint32_t i = 0; i < n; ++i) {
    const int label = i % 5;
    labels += static_cast<char>(label);
    for (int y = 0; y < 16; ++y) {
      for (int x = 0; x < 16; ++x) {
        for (int c = 0; c < 3; ++c) {
          const bool on = x == 3 * label && c == label % 3;
          pixels += static_cast<char>(on ? 255 : (i * 31 + y * 5 + x) % 40);
        }
      }
    }
  }
  testing::WriteGzip(dir + "/images.gz",
                     testing::IdxBytes({n, 16, 16, 3}, pixels));
  testing::WriteGzip(dir + "/labels.gz", testing::IdxBytes({n}, labels));
  const google::protobuf::Struct summary = testing::RunToSummary(
      absl::StrCat(
          "train --data=idx:", dir, "/images.gz,", dir,
          "/labels.gz --val_fraction=0.2 --steps=60 --batch=32 --lr=3e-3 "
          "--threads=1 --log_every=0 --eval_every=0"),
      dir + "/run");
  const std::string arch =
      Field(Field(summary, "model").struct_value(), "architecture")
          .string_value();
  EXPECT_EQ(arch, "cnn(input=3x16x16,classes=5)");
  const google::protobuf::Struct& fin = Field(summary, "final").struct_value();
  EXPECT_GT(Field(fin, "val_accuracy").number_value(), 0.9);
}

}  // namespace
}  // namespace starling
