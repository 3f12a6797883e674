// Integration tests of the user's model in and the trained model out, on
// real `starling` processes and Debian's python3-torch
// (tests/python/export_check.py): BatchNorm buffers averaged across a
// sim's members, `starling export` round trips (TorchScript and the
// built-in gpt through python/starling_models.py) whose loss in PyTorch is
// the run's, a TorchScript model known by its content (the same file under
// two paths joins one swarm, another layer is refused, named), and
// export's refusals, which name the input before any work.
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/node_group.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"

namespace starling {
namespace {

using ::starling::testing::ExpectRefused;
using ::starling::testing::Field;
using ::starling::testing::NodeGroup;
using ::starling::testing::ReadJson;
using ::starling::testing::RunResult;
using ::starling::testing::RunStarling;
using ::starling::testing::TempDir;

std::string Fixture(const char* name) {
  return absl::StrCat(STARLING_FIXTURE_DIR, "/", name);
}

// `/usr/bin/python3 tests/python/export_check.py ARGS`: its exit code and
// stdout (its stderr goes to the test's).
RunResult Python(const std::string& args) {
  const std::string cmd =
      absl::StrCat(STARLING_PYTHON, " ", STARLING_SOURCE_DIR,
                   "/tests/python/export_check.py ", args);
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The JSON object a command printed on stdout.
google::protobuf::Struct JsonOf(const RunResult& r) {
  const std::string path = TempDir() + "/out.json";
  EXPECT_TRUE(WriteFileAtomic(path, r.out).ok());
  return ReadJson(path);
}

double Number(const google::protobuf::Struct& s, const std::string& key) {
  return Field(s, key).number_value();
}

// The text every run here trains on, and its flags.
struct Text {
  std::string path;
  std::string flags;  // --data, --context and a short recipe
};

const Text& TinyText() {
  static const Text* text = [] {
    auto* t = new Text;
    t->path = TempDir() + "/corpus.txt";
    EXPECT_TRUE(WriteFileAtomic(t->path, testing::SampleText(200000)).ok());
    t->flags = absl::StrCat("--data=text:", t->path,
                            " --context=32 --batch=8 --lr=3e-3 --warmup=5 "
                            "--threads=1 --eval_every=0");
    return t;
  }();
  return *text;
}

// A 3-node sim of `model` (flags), run once per test binary and shared.
std::string Sim(const std::string& name, const std::string& model) {
  const std::string out = TempDir() + "/" + name;
  RunResult r =
      RunStarling(absl::StrCat("sim --nodes=3 --steps=30 --inner_steps=10 ",
                               TinyText().flags, " ", model, " --out=", out));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out;
}

const std::string& BatchNormSim() {
  static const std::string* out = new std::string(Sim(
      "bn_sim", absl::StrCat("--model=torchscript:", Fixture("byte_bn.pt"))));
  return *out;
}

const std::string& GptSim() {
  static const std::string* out = new std::string(
      Sim("gpt_sim", "--model=gpt --layers=1 --width=32 --heads=2"));
  return *out;
}

// Exports --from=FROM to OUT (expecting success): export's JSON summary.
google::protobuf::Struct Export(const std::string& from, const std::string& out,
                                const std::string& extra = "") {
  RunResult r = RunStarling(
      absl::StrCat("export --from=", from, " --out=", out, " ", extra));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return JsonOf(r);
}

// The validation loss PyTorch computes for an exported model (a state_dict
// when `architecture` is given) on the runs' text.
double PythonValLoss(const std::string& model,
                     const std::string& architecture = "") {
  RunResult r = Python(
      absl::StrCat("eval --model=", model,
                   architecture.empty()
                       ? ""
                       : absl::StrCat(" --architecture='", architecture, "'"),
                   " --text=", TinyText().path, " --context=32"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return Number(JsonOf(r), "val_loss");
}

// A BatchNorm model in a 3-node sim ends with the same buffers on every
// member (BatchNorm's running statistics moved, and were averaged), and
// the final hashes, which cover them, agree.
TEST(ExportTest, BatchNormBuffersAreTheSameOnEveryMember) {
  const std::string& sim = BatchNormSim();
  const auto summary = ReadJson(sim + "/summary.json");
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(Field(fin, "final_models_agree").bool_value());
  std::string files;
  for (const char* id : {"n0", "n1", "n2"}) {
    const std::string out = absl::StrCat(sim, "/", id, ".pt");
    const auto e = Export(absl::StrCat(sim, "/", id, "/checkpoint.ckpt"), out);
    EXPECT_EQ(Field(e, "format").string_value(), "torchscript");
    EXPECT_EQ(Number(e, "buffers"), 32 + 32 + 1);
    EXPECT_EQ(Field(e, "model_hash").string_value(),
              Field(fin, "model_hash").string_value());
    absl::StrAppend(&files, " ", out);
  }
  RunResult r = Python("buffers" + files);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto b = JsonOf(r);
  EXPECT_TRUE(Field(b, "moved").bool_value()) << r.out;
  EXPECT_EQ(Number(b, "max_diff"), 0) << r.out;
}

// ddp keeps the members' buffers equal too: their movement rides in each
// step's gradient all-reduce, so every step's hash (which covers them)
// agrees, and the members end on the same, moved, statistics.
TEST(ExportTest, DdpAveragesBatchNormBuffersEveryStep) {
  const std::string out = TempDir() + "/bn_ddp";
  RunResult r = RunStarling(absl::StrCat(
      "sim --nodes=2 --steps=6 --algo=ddp ", TinyText().flags,
      " --model=torchscript:", Fixture("byte_bn.pt"), " --out=", out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto summary = ReadJson(out + "/summary.json");
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(Field(fin, "all_hashes_agree").bool_value());
  EXPECT_TRUE(Field(fin, "final_models_agree").bool_value());
  std::string files;
  for (const char* id : {"n0", "n1"}) {
    const std::string file = absl::StrCat(out, "/", id, ".pt");
    Export(absl::StrCat(out, "/", id, "/checkpoint.ckpt"), file);
    absl::StrAppend(&files, " ", file);
  }
  r = Python("buffers" + files);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto b = JsonOf(r);
  EXPECT_TRUE(Field(b, "moved").bool_value()) << r.out;
  EXPECT_EQ(Number(b, "max_diff"), 0) << r.out;
}

// TorchScript in, TorchScript out: torch.jit.load runs the exported model,
// and its validation loss is the one the sim reported.
TEST(ExportTest, TorchScriptRoundTripGivesTheRunsValLoss) {
  const std::string& sim = BatchNormSim();
  const double reported =
      Number(Field(ReadJson(sim + "/summary.json"), "final").struct_value(),
             "val_loss");
  const std::string out = sim + "/exported.pt";
  const auto e = Export(sim, out);
  EXPECT_NEAR(Number(e, "val_loss"), reported, 1e-4);
  EXPECT_NEAR(PythonValLoss(out), reported, 1e-4);
}

// A built-in gpt comes out as a state_dict that starling_models.py's Gpt
// loads with strict=True, and whose loss in PyTorch is the run's.
TEST(ExportTest, BuiltInGptRoundTripThroughTheStateDict) {
  const std::string& sim = GptSim();
  const double reported =
      Number(Field(ReadJson(sim + "/summary.json"), "final").struct_value(),
             "val_loss");
  const std::string out = sim + "/gpt.pt";
  const auto e = Export(sim, out);
  EXPECT_EQ(Field(e, "format").string_value(), "state_dict");
  const std::string arch = Field(e, "architecture").string_value();
  EXPECT_EQ(arch, "gpt(layers=1,width=32,heads=2,context=32,vocab=256)");
  EXPECT_NEAR(Number(e, "val_loss"), reported, 1e-4);
  EXPECT_NEAR(PythonValLoss(out, arch), reported, 1e-4);
}

// The run's TorchScript file moved: export finds it with --model, and a
// file with another model is refused, naming the tensor that differs.
TEST(ExportTest, AMovedTorchScriptFileIsNamedWithModel) {
  const std::string& sim = BatchNormSim();
  const std::string dir = TempDir();
  const std::string moved = dir + "/moved.pt";
  ASSERT_TRUE(
      WriteFileAtomic(moved, ReadFile(Fixture("byte_bn.pt")).value()).ok());
  Export(sim, dir + "/a.pt", "--model=torchscript:" + moved);
  ExpectRefused(
      absl::StrCat("export --from=", sim, " --out=", dir,
                   "/b.pt --model=torchscript:", Fixture("byte_bn_wide.pt")),
      "parameter conv.weight is float32[32,16,3] at the checkpoint");
  ExpectRefused(absl::StrCat("export --from=", GptSim(), " --out=", dir,
                             "/c.pt --model=torchscript:", moved),
                "--model=gpt");
}

// Bad input is refused with exit 2, naming it, before any work.
TEST(ExportTest, BadInputIsRefusedNamingIt) {
  const std::string dir = TempDir();
  const std::string out = dir + "/model.pt";
  ExpectRefused("export --out=" + out, "--from");
  ExpectRefused(absl::StrCat("export --from=", dir, "/missing --out=", out),
                dir + "/missing");
  ExpectRefused(absl::StrCat("export --from=", dir, " --out=", out),
                "no checkpoint.ckpt");
  const std::string garbage = dir + "/garbage.ckpt";
  ASSERT_TRUE(WriteFileAtomic(garbage, "not a checkpoint at all").ok());
  ExpectRefused(absl::StrCat("export --from=", garbage, " --out=", out),
                garbage);
  const std::string ckpt = GptSim() + "/n0/checkpoint.ckpt";
  ExpectRefused(absl::StrCat("export --from=", ckpt, " --out=", dir,
                             "/no/such/dir/model.pt"),
                "--out=" + dir + "/no/such/dir/model.pt");
  ExpectRefused(absl::StrCat("export --from=", ckpt, " --out=", dir),
                "is a directory");
  if (geteuid() != 0) {  // root writes anywhere
    const std::string locked = dir + "/locked";
    ASSERT_EQ(mkdir(locked.c_str(), 0555), 0);
    ExpectRefused(
        absl::StrCat("export --from=", ckpt, " --out=", locked, "/m.pt"),
        "cannot write in " + locked);
  }
  EXPECT_FALSE(FileExists(out));
}

// A sim whose members ended on different models is refused, naming them;
// so is a node whose summary says its model is not the swarm's, unless
// --allow_apart.
TEST(ExportTest, MembersApartAreRefusedNamingThem) {
  const std::string& sim = GptSim();
  const std::string dir = TempDir();
  const std::string summary = ReadFile(sim + "/n1/summary.json").value();
  const std::string hash = testing::FinalHash(sim + "/n1/summary.json");
  for (const char* id : {"n0", "n1"}) {
    const std::string member = absl::StrCat(dir, "/split/", id);
    ASSERT_TRUE(MakeDirs(member).ok());
    ASSERT_TRUE(
        WriteFileAtomic(
            member + "/checkpoint.ckpt",
            ReadFile(absl::StrCat(sim, "/", id, "/checkpoint.ckpt")).value())
            .ok());
    std::string s = summary;
    if (std::string(id) == "n1") {
      s = absl::StrReplaceAll(s, {{hash, "00000000deadbeef"}});
    }
    ASSERT_TRUE(WriteFileAtomic(member + "/summary.json", s).ok());
  }
  RunResult r = ExpectRefused(
      absl::StrCat("export --from=", dir, "/split --out=", dir, "/m.pt"),
      "members ended on different models");
  EXPECT_NE(r.err.find("n0 on model " + hash.substr(0, 8)), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("n1 on model 00000000"), std::string::npos) << r.err;

  // A node that knows it ended apart from the swarm (issue 57's field).
  const std::string apart = dir + "/apart";
  ASSERT_TRUE(MakeDirs(apart).ok());
  ASSERT_TRUE(WriteFileAtomic(apart + "/checkpoint.ckpt",
                              ReadFile(sim + "/n0/checkpoint.ckpt").value())
                  .ok());
  std::string says = ReadFile(sim + "/n0/summary.json").value();
  const std::string is_swarms = "\"model_is_swarms\":true";
  ASSERT_NE(says.find(is_swarms), std::string::npos) << says;
  says.replace(says.find(is_swarms), is_swarms.size(),
               "\"model_is_swarms\":false");
  ASSERT_TRUE(WriteFileAtomic(apart + "/summary.json", says).ok());
  ExpectRefused(absl::StrCat("export --from=", apart, " --out=", dir, "/m.pt"),
                "--allow_apart");
  Export(apart, dir + "/m.pt", "--allow_apart");
}

// The same TorchScript file under two paths is one model: its nodes form
// one swarm and end on one model. A file with a wider layer is refused at
// the handshake, naming the parameter.
TEST(ExportTest, TheSameFileUnderTwoPathsJoinsAnotherLayerIsRefused) {
  const std::string dir = TempDir();
  const std::string copy = dir + "/elsewhere/bn_copy.pt";
  ASSERT_TRUE(MakeDirs(dir + "/elsewhere").ok());
  ASSERT_TRUE(
      WriteFileAtomic(copy, ReadFile(Fixture("byte_bn.pt")).value()).ok());
  NodeGroup g("two_paths",
              absl::StrCat(TinyText().flags,
                           " --steps=20 --inner_steps=10 --insecure "
                           "--min_members=2 --run_id=two_paths"));
  g.Start("n0", "--shard=0/2 --model=torchscript:" + Fixture("byte_bn.pt"));
  RunResult bad = g.Run(
      "bad", "--shard=1/2 --model=torchscript:" + Fixture("byte_bn_wide.pt"),
      "n0");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("model architecture differs"), std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("parameter conv.weight is float32[48,16,3] at node "
                         "at \""),
            std::string::npos)
      << bad.err;
  g.Start("n1", "--shard=1/2 --model=torchscript:" + copy, "n0");
  EXPECT_EQ(g.Wait("n0"), 0) << g.LogText("n0");
  EXPECT_EQ(g.Wait("n1"), 0) << g.LogText("n1");
  EXPECT_EQ(g.FinalHash("n0"), g.FinalHash("n1"));
  EXPECT_FALSE(g.FinalHash("n0").empty());
}

}  // namespace
}  // namespace starling
