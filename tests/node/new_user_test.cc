// Integration test of a new user's path through Starling, end to end on
// real `starling` processes and Debian's python3-torch (issue 50's
// acceptance): a model the user wrote in PyTorch
// (tests/python/new_user_model.py, none of the fixtures) scripted to a
// file, `starling tokenize` on a text that is not the Bible (the GPL, on
// every Debian system), a 3-node `starling sim` on those tokens, `starling
// export`, and PyTorch (tests/python/export_check.py) loading the exported
// model and computing, itself, the validation loss the run reported. The
// same for a built-in gpt, through the state_dict and
// python/starling_models.py.
#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::ParseJson;
using ::starling::testing::ReadJson;
using ::starling::testing::RunCommand;
using ::starling::testing::RunResult;
using ::starling::testing::RunStarling;
using ::starling::testing::TempDir;

constexpr int kVocab = 400;
constexpr int kContext = 32;

// `/usr/bin/python3 tests/python/SCRIPT ARGS`, expecting exit 0: its stdout.
std::string Python(const std::string& script, const std::string& args) {
  const RunResult r =
      RunCommand(absl::StrCat(STARLING_PYTHON, " ", STARLING_SOURCE_DIR,
                              "/tests/python/", script, " ", args));
  EXPECT_EQ(r.exit_code, 0) << script << " " << args << "\n" << r.err;
  return r.out;
}

// The GPL, tokenized as the user would: its first 600 lines to train on,
// the rest held out, one SentencePiece model for both.
struct Tokens {
  std::string dir;
  std::string train, val;  // the token files
  std::string flags;       // the flags tokenize said to train with
};

const Tokens& GplTokens() {
  static const Tokens* tokens = [] {
    auto* t = new Tokens;
    t->dir = TempDir();
    t->train = t->dir + "/train.tokens";
    t->val = t->dir + "/val.tokens";
    const std::string text =
        ReadFile("/usr/share/common-licenses/GPL-3").value_or("");
    size_t cut = 0;
    for (int i = 0; i < 600 && cut < text.size(); ++i) {
      const size_t line_end = text.find('\n', cut);
      cut = line_end == std::string::npos ? text.size() : line_end + 1;
    }
    EXPECT_LT(cut, text.size()) << "the GPL has under 600 lines";
    EXPECT_TRUE(
        WriteFileAtomic(t->dir + "/train.txt", text.substr(0, cut)).ok());
    EXPECT_TRUE(WriteFileAtomic(t->dir + "/val.txt", text.substr(cut)).ok());
    const RunResult r = RunStarling(absl::StrCat(
        "tokenize --input=", t->dir, "/train.txt --model_prefix=", t->dir,
        "/spm --vocab_size=", kVocab, " --out=", t->train,
        " --val_input=", t->dir, "/val.txt --val_out=", t->val));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const size_t at = r.err.rfind("train with: ");
    EXPECT_NE(at, std::string::npos) << r.err;
    if (at != std::string::npos) {
      t->flags = r.err.substr(at + 12, r.err.find('\n', at) - at - 12);
    }
    EXPECT_TRUE(absl::StrContains(t->flags, absl::StrCat("--vocab=", kVocab)))
        << t->flags;
    return t;
  }();
  return *tokens;
}

// What one model's trip through sim, export and PyTorch gave.
struct Trip {
  double reported = NAN;  // the sim's final val_loss (summary.json)
  double exported = NAN;  // export's, on the run's validation set
  double pytorch = NAN;   // PyTorch's own, on the held-out tokens
  google::protobuf::Struct export_json;
};

// A 3-node sim of `model` (flags) on the GPL's tokens, `starling export` of
// it to NAME.pt, and export_check.py's evaluation of that file (a
// TorchScript file, or a state_dict for python/starling_models.py's class
// of the architecture export names).
Trip RoundTrip(const std::string& name, const std::string& model,
               bool state_dict) {
  const Tokens& tokens = GplTokens();
  Trip trip;
  const std::string run = absl::StrCat(tokens.dir, "/", name);
  // The GPL's ~10k training tokens are fewer than one of iid sharding's
  // 64k-token chunks, so the members take contiguous thirds.
  RunResult r = RunStarling(absl::StrCat(
      "sim --nodes=3 --steps=60 --inner_steps=10 ", tokens.flags,
      " --shard_mode=contiguous --context=", kContext,
      " --batch=8 --lr=1e-2 --warmup=5 --threads=1 --eval_every=0 ", model,
      " --out=", run));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto summary = ReadJson(run + "/summary.json");
  const auto& fin = Field(summary, "final").struct_value();
  EXPECT_TRUE(Field(fin, "final_models_agree").bool_value());
  EXPECT_EQ(Field(fin, "members_at_end").list_value().values_size(), 3);
  trip.reported = Field(fin, "val_loss").number_value();

  const std::string file = absl::StrCat(tokens.dir, "/", name, ".pt");
  r = RunStarling(absl::StrCat("export --from=", run, " --out=", file));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  trip.export_json = ParseJson(r.out);
  trip.exported = Field(trip.export_json, "val_loss").number_value();

  const std::string arch =
      state_dict
          ? absl::StrCat(" --architecture='",
                         Field(trip.export_json, "architecture").string_value(),
                         "'")
          : "";
  const std::string out = Python(
      "export_check.py",
      absl::StrCat("eval --model=", file, arch, " --tokens=", tokens.train,
                   " --val_tokens=", tokens.val,
                   " --token_dtype=uint16 --context=", kContext));
  trip.pytorch = Field(ParseJson(out), "val_loss").number_value();
  return trip;
}

// The run learned: its validation loss is below a uniform guess's.
void ExpectLearned(const Trip& trip) {
  EXPECT_GT(trip.reported, 0);
  EXPECT_LT(trip.reported, std::log(static_cast<double>(kVocab)));
}

// The user's own model: a TorchScript file in, one out, whose loss in
// PyTorch is the run's.
TEST(NewUserTest, OwnModelTokenizedTextSimExportPyTorch) {
  const std::string model = GplTokens().dir + "/conv_gru.pt";
  Python("new_user_model.py", absl::StrCat(model, " --vocab=", kVocab));
  ASSERT_TRUE(FileExists(model));
  const Trip trip =
      RoundTrip("own", "--model=torchscript:" + model, /*state_dict=*/false);
  EXPECT_EQ(Field(trip.export_json, "format").string_value(), "torchscript");
  ExpectLearned(trip);
  EXPECT_NEAR(trip.exported, trip.reported, 1e-4);
  EXPECT_NEAR(trip.pytorch, trip.reported, 1e-4);
}

// A built-in gpt on the same tokens: a state_dict that
// starling_models.py's class loads (strict), whose loss in PyTorch is the
// run's.
TEST(NewUserTest, BuiltInGptTokenizedTextSimExportPyTorch) {
  const Trip trip =
      RoundTrip("gpt", "--model=gpt --layers=1 --width=32 --heads=2",
                /*state_dict=*/true);
  EXPECT_EQ(Field(trip.export_json, "format").string_value(), "state_dict");
  EXPECT_EQ(Field(trip.export_json, "architecture").string_value(),
            absl::StrCat("gpt(layers=1,width=32,heads=2,context=", kContext,
                         ",vocab=", kVocab, ")"));
  ExpectLearned(trip);
  EXPECT_NEAR(trip.exported, trip.reported, 1e-4);
  EXPECT_NEAR(trip.pytorch, trip.reported, 1e-4);
}

}  // namespace
}  // namespace starling
