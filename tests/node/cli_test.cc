// Integration tests of the `starling` binary: flags, exit codes, messages,
// the run directory, interruption and --resume.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/run_util.h"
#include "tests/core/test_util.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::ReadJson;
using ::starling::testing::RunStarling;
using ::starling::testing::TempDir;

std::string TinyTextFlags() {
  static const std::string* flags = new std::string(absl::StrCat(
      testing::TinyTextFlags(200000), " --threads=1 --seed=3 --log_every=10"));
  return *flags;
}

TEST(CliTest, HelpListsSubcommandsAndFlags) {
  auto top = RunStarling("--help");
  EXPECT_EQ(top.exit_code, 0);
  for (const char* word : {"train", "node", "sim", "int8", "topk:0.01+int8"}) {
    EXPECT_NE(top.out.find(word), std::string::npos) << word;
  }
  auto train = RunStarling("train --help");
  EXPECT_EQ(train.exit_code, 0);
  for (const char* flag :
       {"--model", "--data", "--shard", "--optimizer", "--device", "--resume",
        "--checkpoint_every", "--flagfile", "torchscript:PATH"}) {
    EXPECT_NE(train.out.find(flag), std::string::npos) << flag;
  }
  for (const char* sub : {"node --help", "sim --help"}) {
    auto help = RunStarling(sub);
    EXPECT_EQ(help.exit_code, 0) << sub;
    for (const char* flag : {"--link_bandwidth_mbps", "--link_latency_ms",
                             "HOST:PORT=MBPS", "ID-ID=MBPS"}) {
      EXPECT_NE(help.out.find(flag), std::string::npos) << sub << " " << flag;
    }
  }
  EXPECT_EQ(RunStarling("").exit_code, 2);
}

TEST(CliTest, BadInputExitsTwoNamingTheInput) {
  struct Case {
    std::string args;
    std::string mention;
  };
  std::string dir = TempDir();
  std::string odd = dir + "/odd.bin";
  ASSERT_TRUE(WriteFileAtomic(odd, "abc").ok());
  std::vector<Case> cases = {
      {"frobnicate", "unknown subcommand 'frobnicate'"},
      {"train --no_such_flag=1", "--no_such_flag"},
      {"train --steps=abc", "--steps=abc"},
      {"train --steps=-3", "--steps=-3"},
      {"train --model=resnet", "--model=resnet"},
      {"train --data=text:/no/such/file.txt",
       "--data=text:/no/such/file.txt: file not found: /no/such/file.txt"},
      {"train --data=tokens:" + odd, "--data=tokens:" + odd + ": "},
      {"train --data=tokens:" + odd, "odd size"},
      {"train --data=fmnist:" + dir, "--data=fmnist:" + dir + ": "},
      {"train --data=fmnist:" + dir, "train-images-idx3-ubyte.gz"},
      {"train --data=fmnist --model=gpt", "--model=gpt"},
      {"train --data=fmnist --model=torchscript:" STARLING_FIXTURE_DIR
       "/bad_output.pt",
       "expected float logits of shape [2,10]"},
      {"train --model=torchscript:/no/model.pt", "/no/model.pt"},
      {"train --device=cuda", "--device=cuda"},
      {"train --shard=3/2", "--shard=3/2"},
      {"train --flagfile=/no/flags.txt", "/no/flags.txt"},
      {"train --resume --out=" + dir + "/none", "no checkpoint"},
      {"node --round_seconds=-1", "--round_seconds=-1"},
      {"node --weighting=median", "--weighting=median"},
      {"node --min_inner_steps=80 --max_inner_steps=20",
       "--min_inner_steps=80"},
      {"node --drift_detector=cusum", "--drift_detector=cusum"},
      {"node --divergence_threshold=-2", "--divergence_threshold=-2"},
      {"node --link_bandwidth_mbps=fast", "--link_bandwidth_mbps=fast"},
      {"node --compression=topk:2", "--compression=topk:2: invalid codec"},
      {"node --small_tensor_codec=int3", "--small_tensor_codec=int3"},
      {"node --error_feedback=maybe", "--error_feedback=maybe"},
      {"bench allreduce --compression=fp32,int3", "invalid codec 'int3'"},
      {"node --link_latency_ms=10,peer=5", "in 'peer=5'"},
      {"sim --link_bandwidth_mbps=100,n7=5", "in 'n7=5'"},
      {"sim --link_latency_ms=-1", "--link_latency_ms=-1"},
  };
  for (const Case& c : cases) {
    auto r = RunStarling(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.mention), std::string::npos)
        << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("Exception raised from"), std::string::npos) << r.err;
  }
}

// A run that cannot start leaves no empty run directory behind, but keeps
// a directory the user had made.
TEST(CliTest, ARunThatCannotStartLeavesNoRunDirectory) {
  const std::string out = TempDir() + "/never";
  auto r = RunStarling("train --data=text:/no/such/file.txt --out=" + out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_FALSE(FileExists(out)) << out;
  const std::string mine = TempDir();
  r = RunStarling("train --data=text:/no/such/file.txt --out=" + mine);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(FileExists(mine)) << mine;
  // sim checks the data once, before it makes its directory and nodes.
  r = RunStarling("sim --data=text:/no/such/file.txt --out=" + out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--data=text:/no/such/file.txt: file not found"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("node n0"), std::string::npos) << r.err;
  EXPECT_FALSE(FileExists(out)) << out;
}

TEST(CliTest, TrainWritesTheRunDirectory) {
  std::string out = TempDir() + "/run";
  auto r = RunStarling(absl::StrCat("train ", TinyTextFlags(),
                                    " --steps=30 --eval_every=10 --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Progress lines show step, loss, throughput and ETA.
  EXPECT_NE(r.err.find("step 10/30 | loss"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tok/s | eta"), std::string::npos);

  auto summary = ReadJson(out + "/summary.json");
  const auto& config = Field(summary, "config").struct_value();
  EXPECT_EQ(Field(config, "model").string_value(), "gpt");
  EXPECT_EQ(Field(config, "steps").number_value(), 30);
  const auto& nodes = Field(summary, "nodes").list_value();
  ASSERT_EQ(nodes.values_size(), 1);
  const auto& node = nodes.values(0).struct_value();
  for (const char* key :
       {"id", "device", "inner_steps", "samples", "bytes_sent",
        "bytes_received", "compute_seconds", "wall_seconds"}) {
    EXPECT_TRUE(node.fields().count(key)) << key;
  }
  EXPECT_EQ(Field(node, "inner_steps").number_value(), 30);
  EXPECT_EQ(Field(node, "samples").number_value(), 240);
  EXPECT_EQ(Field(node, "device").string_value(), "cpu");
  EXPECT_EQ(Field(summary, "rounds").list_value().values_size(), 0);
  const auto& fin = Field(summary, "final").struct_value();
  for (const char* key :
       {"val_loss", "total_bytes", "allreduce_equivalent_bytes",
        "comm_reduction", "utilization"}) {
    EXPECT_TRUE(fin.fields().count(key)) << key;
  }
  double val = Field(fin, "val_loss").number_value();
  EXPECT_GT(val, 0.5);
  EXPECT_LT(val, 4.0);
  double util = Field(fin, "utilization").number_value();
  EXPECT_GT(util, 0.0);
  EXPECT_LE(util, 1.0);

  // events.jsonl: one JSON object per line, with steps and evals.
  std::string events = *ReadFile(out + "/events.jsonl");
  int steps = 0, evals = 0;
  for (absl::string_view line :
       absl::StrSplit(events, '\n', absl::SkipEmpty())) {
    google::protobuf::Struct s;
    ASSERT_TRUE(
        google::protobuf::util::JsonStringToMessage(std::string(line), &s).ok())
        << line;
    std::string ev = Field(s, "event").string_value();
    steps += ev == "step";
    evals += ev == "eval";
  }
  EXPECT_EQ(steps, 30);
  EXPECT_EQ(evals, 3);
  EXPECT_TRUE(FileExists(out + "/checkpoint.ckpt"));

  // A second run into the same directory must not clobber it.
  auto again = RunStarling(
      absl::StrCat("train ", TinyTextFlags(), " --steps=30 --out=", out));
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.err.find("--resume"), std::string::npos) << again.err;
}

TEST(CliTest, FlagfileIsRead) {
  std::string dir = TempDir();
  std::string flags = dir + "/flags.txt";
  ASSERT_TRUE(
      WriteFileAtomic(flags, "# a comment\n--steps=4\n--eval_every=0\n").ok());
  auto r =
      RunStarling(absl::StrCat("train ", TinyTextFlags(), " --flagfile=", flags,
                               " --out=", dir, "/run"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto summary = ReadJson(dir + "/run/summary.json");
  EXPECT_EQ(
      Field(Field(summary, "config").struct_value(), "steps").number_value(),
      4);
}

// SIGINT stops the run with a checkpoint; --resume finishes it with exactly
// the weights of an uninterrupted run.
TEST(CliTest, InterruptThenResumeMatchesAnUninterruptedRun) {
  std::string dir = TempDir();
  const std::string common = absl::StrCat(TinyTextFlags(),
                                          " --steps=300 --eval_every=0 "
                                          "--checkpoint_every=7");
  auto straight =
      RunStarling(absl::StrCat("train ", common, " --out=", dir, "/straight"));
  ASSERT_EQ(straight.exit_code, 0) << straight.err;

  const std::string out = dir + "/cut";
  pid_t pid = testing::SpawnStarling(
      absl::StrCat("train ", common, " --out=", out), dir + "/cut.err");
  ASSERT_GT(pid, 0);
  // Wait until training is under way, then interrupt.
  EXPECT_TRUE(testing::WaitForText(out + "/events.jsonl", "\"step\":20,",
                                   absl::Seconds(30)));
  EXPECT_EQ(testing::InterruptAndWait(pid), 1);
  std::string err = *ReadFile(dir + "/cut.err");
  EXPECT_NE(err.find("--resume"), std::string::npos) << err;
  auto cut = ReadJson(out + "/summary.json");
  const auto& cut_final = Field(cut, "final").struct_value();
  EXPECT_TRUE(Field(cut_final, "interrupted").bool_value());
  double cut_steps = Field(cut_final, "inner_steps").number_value();
  EXPECT_GE(cut_steps, 20);
  EXPECT_LT(cut_steps, 300);

  auto resumed =
      RunStarling(absl::StrCat("train ", common, " --out=", out, " --resume"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  auto a =
      Field(ReadJson(dir + "/straight/summary.json"), "final").struct_value();
  auto b = Field(ReadJson(out + "/summary.json"), "final").struct_value();
  EXPECT_EQ(Field(b, "inner_steps").number_value(), 300);
  EXPECT_EQ(Field(a, "model_hash").string_value(),
            Field(b, "model_hash").string_value());
  EXPECT_EQ(Field(a, "val_loss").number_value(),
            Field(b, "val_loss").number_value());
  EXPECT_NE(ReadFile(out + "/events.jsonl")->find("\"event\":\"resume\""),
            std::string::npos);

  // A finished run extended by a new --steps goes on, and says what changed.
  auto extended = RunStarling(
      absl::StrCat("train ", common, " --out=", out, " --resume --steps=310"));
  ASSERT_EQ(extended.exit_code, 0) << extended.err;
  EXPECT_NE(extended.err.find("--resume: settings differ from the "
                              "checkpoint's: --steps=310 (was 300)"),
            std::string::npos)
      << extended.err;
  EXPECT_EQ(
      Field(Field(ReadJson(out + "/summary.json"), "final").struct_value(),
            "inner_steps")
          .number_value(),
      310);
}

}  // namespace
}  // namespace starling
