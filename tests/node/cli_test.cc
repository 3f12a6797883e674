// Integration tests of the `starling` binary: flags, exit codes, messages,
// the run directory, interruption and --resume.
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "node/flag_sections.h"
#include "node/flags.h"
#include "node/subcommands.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"

// A flag that no subcommand accepts and the section table lacks: help must
// still list it.
ABSL_FLAG(int, cli_test_unplaced, 0, "a flag the section table lacks");

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
  // The top-level help lists subcommands, not flags.
  EXPECT_FALSE(absl::StrContains(top.out, "(default:")) << top.out;
  auto bench = RunStarling("bench --help");
  EXPECT_EQ(bench.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(bench.out, "--sizes_mib")) << bench.out;
  EXPECT_EQ(RunStarling("").exit_code, 2);
}

// Every flag a subcommand accepts is placed in a help section, so none is
// left to "Other"; and every row of the table names a flag that some
// subcommand accepts, once.
TEST(CliTest, EveryAcceptedFlagHasAHelpSection) {
  std::set<std::string> accepted;
  for (const SubcommandEntry& e : Subcommands()) {
    for (const std::string& name : e.sub.flags) {
      accepted.insert(name);
      EXPECT_TRUE(SectionOfFlag(name).has_value())
          << "starling " << e.sub.name << " --" << name
          << " has no help section: place it in node/flag_sections.cc";
    }
  }
  // Test-only flags are those named test_* or documented "testing only".
  for (const std::string& name : accepted) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    ASSERT_NE(flag, nullptr) << name;
    const bool test_only = absl::StartsWith(name, "test_") ||
                           absl::StartsWith(flag->Help(), "testing only");
    EXPECT_EQ(SectionOfFlag(name) == FlagSection::kTestOnly, test_only)
        << "--" << name;
  }
  // Landmarks a user looks for.
  const std::map<std::string, FlagSection> landmarks = {
      {"model", FlagSection::kModelAndData},
      {"data", FlagSection::kModelAndData},
      {"optimizer", FlagSection::kTraining},
      {"algo", FlagSection::kTraining},
      {"peers", FlagSection::kSwarm},
      {"nodes", FlagSection::kSwarm},
      {"compression", FlagSection::kCompression},
      {"tls_cert", FlagSection::kSecurity},
      {"join_token_file", FlagSection::kSecurity},
      {"out", FlagSection::kOperations},
      {"metrics_port", FlagSection::kOperations},
  };
  for (const auto& [name, section] : landmarks) {
    EXPECT_EQ(SectionOfFlag(name), section) << "--" << name;
  }
  std::set<std::string> rows;
  for (const PlacedFlag& f : FlagTable()) {
    const std::string name(f.name);
    EXPECT_TRUE(rows.insert(name).second) << "--" << name << " placed twice";
    EXPECT_TRUE(accepted.count(name))
        << "--" << name << " is placed but no subcommand accepts it";
  }
}

// The headings of help, in the table's order, with "Other flags:" last.
std::vector<std::string> KnownHeadings() {
  std::vector<std::string> headings;
  for (const FlagSectionInfo& s : FlagSections()) {
    headings.emplace_back(s.heading);
  }
  headings.push_back("Other flags:");
  return headings;
}

std::string HeadingOf(FlagSection section) {
  for (const FlagSectionInfo& s : FlagSections()) {
    if (s.section == section) return std::string(s.heading);
  }
  return "";
}

// What help shows: its headings in the order they appear, with how many
// flags each lists, and for each flag the heading above it and how often it
// is listed.
struct HelpLayout {
  std::vector<std::string> headings;
  std::map<std::string, int> flags_under;
  std::map<std::string, std::string> heading_of_flag;
  std::map<std::string, int> times_listed;
};

HelpLayout ReadHelpLayout(const std::string& usage) {
  const std::vector<std::string> known = KnownHeadings();
  HelpLayout layout;
  std::string heading;
  for (absl::string_view line : absl::StrSplit(usage, '\n')) {
    if (std::find(known.begin(), known.end(), line) != known.end()) {
      heading = std::string(line);
      layout.headings.push_back(heading);
    } else if (absl::ConsumePrefix(&line, "  --")) {
      const std::string name(line.substr(0, line.find(' ')));
      layout.heading_of_flag[name] = heading;
      ++layout.times_listed[name];
      ++layout.flags_under[heading];
    }
  }
  return layout;
}

// --help: the description with its example, then the sections in their
// order, each flag once under its own heading; test-only flags only with
// --helpfull.
TEST(CliTest, HelpGroupsFlagsInSectionsInOrder) {
  const std::vector<std::string> order = KnownHeadings();
  for (const SubcommandEntry& e : Subcommands()) {
    for (HelpRequest request : {HelpRequest::kHelp, HelpRequest::kHelpFull}) {
      const bool full = request == HelpRequest::kHelpFull;
      const std::string usage = SubcommandUsage(e.sub, request);
      const std::string where =
          absl::StrCat("starling ", e.sub.name, full ? " --helpfull" : "");
      HelpLayout layout = ReadHelpLayout(usage);
      ASSERT_FALSE(layout.headings.empty()) << where;
      EXPECT_LT(usage.find(e.sub.description), usage.find(layout.headings[0]))
          << where;
      EXPECT_LT(usage.find(absl::StrCat("  starling ", e.sub.name,
                                        e.sub.operand.empty() ? "" : " ",
                                        e.sub.operand, " --")),
                usage.find(layout.headings[0]))
          << where << ": an example comes before the flags";
      // Headings in the table's order, none twice, none empty, and every
      // flag under one.
      int last = -1;
      for (const std::string& h : layout.headings) {
        const int at = std::find(order.begin(), order.end(), h) - order.begin();
        EXPECT_GT(at, last) << where << ": " << h;
        last = at;
        EXPECT_GT(layout.flags_under[h], 0) << where << ": " << h;
      }
      EXPECT_EQ(layout.flags_under[""], 0) << where;
      int listed = 0;
      for (const std::string& name : e.sub.flags) {
        const std::optional<FlagSection> section = SectionOfFlag(name);
        if (!section.has_value()) {  // EveryAcceptedFlagHasAHelpSection fails
          EXPECT_EQ(layout.heading_of_flag[name], "Other flags:")
              << where << " --" << name;
          continue;
        }
        const bool hidden = *section == FlagSection::kTestOnly;
        if (hidden && !full) {
          EXPECT_EQ(layout.times_listed[name], 0) << where << " --" << name;
          EXPECT_FALSE(absl::StrContains(usage, "--" + name))
              << where << " --" << name;
          continue;
        }
        ++listed;
        EXPECT_EQ(layout.times_listed[name], 1) << where << " --" << name;
        EXPECT_EQ(layout.heading_of_flag[name], HeadingOf(*section))
            << where << " --" << name;
      }
      EXPECT_GT(listed, 0) << where;
    }
  }
  // The sections in the order users look for them.
  std::vector<FlagSection> sections;
  for (const FlagSectionInfo& s : FlagSections()) {
    sections.push_back(s.section);
  }
  EXPECT_EQ(sections, std::vector<FlagSection>(
                          {FlagSection::kModelAndData, FlagSection::kTraining,
                           FlagSection::kSwarm, FlagSection::kCompression,
                           FlagSection::kSecurity, FlagSection::kOperations,
                           FlagSection::kTestOnly}));
}

// A flag the table lacks is still listed, under "Other flags:".
TEST(CliTest, HelpListsAFlagWithoutSectionUnderOther) {
  const Subcommand sub{
      "fake", "", "A subcommand of this test.", {"model", "cli_test_unplaced"}};
  const std::string usage = SubcommandUsage(sub);
  EXPECT_TRUE(absl::StrContains(usage, "\nOther flags:\n  --cli_test_unplaced"))
      << usage;
  EXPECT_LT(usage.find(HeadingOf(FlagSection::kModelAndData)),
            usage.find("Other flags:"));
}

// Test-only flags are left out of --help, which says how to see them, yet
// accepted by the subcommands that take them.
TEST(CliTest, TestOnlyFlagsAreHiddenButAccepted) {
  auto node = RunStarling("node --help");
  EXPECT_EQ(node.exit_code, 0);
  for (const char* flag : {"--test_crash_at", "--test_poison", "--test_stall",
                           "--test_relay_fault"}) {
    EXPECT_FALSE(absl::StrContains(node.out, flag)) << flag;
  }
  EXPECT_TRUE(absl::StrContains(
      node.out, "--helpfull also lists the 4 test-only flags, hidden here."))
      << node.out;
  auto full = RunStarling("node --helpfull");
  EXPECT_EQ(full.exit_code, 0);
  for (const char* flag : {"--test_crash_at", "--test_poison", "--test_stall",
                           "--test_relay_fault"}) {
    EXPECT_TRUE(absl::StrContains(full.out, flag)) << flag;
  }
  EXPECT_TRUE(absl::StrContains(full.out, HeadingOf(FlagSection::kTestOnly)));
  EXPECT_FALSE(absl::StrContains(full.out, "--helpfull also lists"));
  // train takes no test-only flag, so its help has no such line.
  auto train = RunStarling("train --help");
  EXPECT_FALSE(absl::StrContains(train.out, "--helpfull")) << train.out;

  absl::FlagSaver restore;
  HelpRequest help = HelpRequest::kHelp;
  const Subcommand* node_sub = nullptr;
  const Subcommand* train_sub = nullptr;
  for (const SubcommandEntry& e : Subcommands()) {
    if (e.sub.name == "node") node_sub = &e.sub;
    if (e.sub.name == "train") train_sub = &e.sub;
  }
  ASSERT_NE(node_sub, nullptr);
  ASSERT_NE(train_sub, nullptr);
  EXPECT_TRUE(
      ParseSubcommandFlags(*node_sub,
                           {"--test_crash_at=commit@2", "--test_poison=nan@2-4",
                            "--test_stall", "5:1"},
                           &help)
          .ok());
  EXPECT_EQ(help, HelpRequest::kNone);
  absl::CommandLineFlag* stall = absl::FindCommandLineFlag("test_stall");
  ASSERT_NE(stall, nullptr);
  EXPECT_EQ(stall->CurrentValue(), "5:1");
  absl::Status s =
      ParseSubcommandFlags(*train_sub, {"--test_stall=5:1"}, &help);
  EXPECT_TRUE(absl::StrContains(
      s.message(), "unknown flag --test_stall for 'starling train'"))
      << s;
  // --helpfull wins over --help, wherever it stands.
  ASSERT_TRUE(
      ParseSubcommandFlags(*node_sub, {"--helpfull", "--help"}, &help).ok());
  EXPECT_EQ(help, HelpRequest::kHelpFull);
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
  testing::Process cut_run = testing::Process::Start(
      absl::StrCat("train ", common, " --out=", out), dir + "/cut.err");
  ASSERT_TRUE(cut_run.started());
  // Wait until training is under way, then interrupt.
  EXPECT_TRUE(testing::WaitForText(out + "/events.jsonl", "\"step\":20,",
                                   absl::Seconds(30)));
  EXPECT_EQ(cut_run.Interrupt(), 1);
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
