#include "core/trainer.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/memory.h"
#include "core/model.h"
#include "core/optimizer_state.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"
#include "tests/core/tiny_gpt.h"
#include "tests/core/trainer_util.h"

namespace starling {
namespace {

using ::starling::testing::IdxBytes;
using ::starling::testing::MustCreate;
using ::starling::testing::RunSteps;
using ::starling::testing::TempDir;
using ::starling::testing::WriteGzip;

std::string Fixture(const char* name) {
  return absl::StrCat(STARLING_FIXTURE_DIR, "/", name);
}

TrainConfig TinyText() {
  static const std::string* path = [] {
    auto* p = new std::string(TempDir() + "/corpus.txt");
    EXPECT_TRUE(WriteFileAtomic(*p, testing::SampleText(200000)).ok());
    return p;
  }();
  TrainConfig c = testing::TinyGptConfig(*path);
  c.set_steps(40);
  c.set_lr(3e-3);
  c.set_warmup(5);
  c.set_seed(5);
  EXPECT_TRUE(ResolveTrainConfig(&c).ok());
  return c;
}

TrainConfig TinyImages(const std::string& model) {
  static const std::string* dir = [] {
    auto* d = new std::string(TempDir());
    testing::WriteTinyFmnist(*d, 300, 60);
    return d;
  }();
  TrainConfig c = DefaultTrainConfig();
  c.set_data("fmnist:" + *dir);
  c.set_model(model);
  c.set_width(32);
  c.set_batch(32);  // 300 examples: epochs wrap inside the run
  c.set_steps(30);
  c.set_optimizer("sgd");
  c.set_lr(0.05);
  c.set_seed(9);
  EXPECT_TRUE(ResolveTrainConfig(&c).ok());
  return c;
}

TEST(ResolveTest, AutoDefaultsFollowTheData) {
  TrainConfig text = DefaultTrainConfig();
  ASSERT_TRUE(ResolveTrainConfig(&text).ok());
  EXPECT_EQ(text.model(), "gpt");
  EXPECT_EQ(text.batch(), 16);
  EXPECT_EQ(text.steps(), 800);
  EXPECT_DOUBLE_EQ(text.lr(), 3e-3);
  EXPECT_EQ(text.warmup(), 50);
  TrainConfig img = DefaultTrainConfig();
  img.set_data("fmnist");
  ASSERT_TRUE(ResolveTrainConfig(&img).ok());
  EXPECT_EQ(img.model(), "cnn");
  EXPECT_EQ(img.batch(), 64);
}

TEST(ResolveTest, BadValuesNameTheFlag) {
  struct Case {
    std::function<void(TrainConfig*)> set;
    const char* flag;
  };
  std::vector<Case> cases = {
      {[](TrainConfig* c) { c->set_batch(-1); }, "--batch"},
      {[](TrainConfig* c) { c->set_steps(-5); }, "--steps"},
      {[](TrainConfig* c) { c->set_lr(-1); }, "--lr"},
      {[](TrainConfig* c) { c->set_optimizer("lion"); }, "--optimizer"},
      {[](TrainConfig* c) { c->set_device("tpu"); }, "--device"},
      {[](TrainConfig* c) { c->set_beta2(1.5); }, "--beta2"},
      {[](TrainConfig* c) { c->set_clip(-1); }, "--clip"},
      {[](TrainConfig* c) { c->set_slowdown(0.5); }, "--slowdown"},
      {[](TrainConfig* c) { c->set_slowdown(0); }, "--slowdown"},
      {[](TrainConfig* c) { c->set_slowdown(INFINITY); }, "--slowdown"},
      {[](TrainConfig* c) { c->set_slowdown(NAN); }, "--slowdown"},
      {[](TrainConfig* c) { c->set_slowdown(1e308); }, "--slowdown=1e+308"},
      {[](TrainConfig* c) { c->set_drift("abc"); }, "--drift"},
      {[](TrainConfig* c) { c->set_drift("-3"); }, "--drift"},
      {[](TrainConfig* c) { c->set_threads(100000); }, "--threads=100000"},
      {[](TrainConfig* c) { c->set_log_every(-1); }, "--log_every=-1"},
  };
  for (const Case& k : cases) {
    TrainConfig c = DefaultTrainConfig();
    k.set(&c);
    absl::Status s = ResolveTrainConfig(&c);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << k.flag;
    EXPECT_NE(s.message().find(k.flag), std::string::npos) << s.message();
  }
}

// The count a too-large model is refused by before it is built matches
// the model built.
TEST(MemoryTest, BuiltInParameterCountMatchesTheBuiltModel) {
  std::vector<ModelOptions> cases(5);
  cases[0].spec = "mlp";
  cases[0].width = 33;
  cases[1].spec = "cnn";
  for (ModelOptions* o : {&cases[0], &cases[1]}) {
    o->language_model = false;
    o->num_classes = 10;
  }
  cases[3].layers = 3;
  cases[3].width = 48;
  cases[3].heads = 6;
  cases[3].context = 17;
  cases[3].num_classes = 100;
  cases[4].layers = 1;
  cases[4].width = 8;
  cases[4].heads = 8;
  cases[4].context = 1;
  for (const ModelOptions& o : cases) {
    auto m = CreateModel(o);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(BuiltInParameterCount(o), NumElements((*m)->Parameters()))
        << (*m)->Architecture();
  }
  // Other image sizes and channels: the count follows the shape, and the
  // architecture names it (Fashion-MNIST's keeps its old name).
  for (const char* spec : {"mlp", "cnn"}) {
    ModelOptions o;
    o.spec = spec;
    o.language_model = false;
    o.num_classes = 13;
    o.input_shape = {3, 30, 18};
    auto m = CreateModel(o);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(BuiltInParameterCount(o), NumElements((*m)->Parameters()))
        << (*m)->Architecture();
    EXPECT_NE((*m)->Architecture().find("input=3x30x18,"), std::string::npos)
        << (*m)->Architecture();
    torch::NoGradGuard no_grad;
    EXPECT_EQ((*m)->Forward(torch::zeros({2, 3, 30, 18})).sizes(),
              (std::vector<int64_t>{2, 13}));
  }
  auto fmnist = CreateModel(cases[1]);
  ASSERT_TRUE(fmnist.ok());
  EXPECT_EQ((*fmnist)->Architecture(), "cnn(classes=10)");
  ModelOptions tiny = cases[1];
  tiny.input_shape = {1, 3, 28};
  EXPECT_NE(CreateModel(tiny).status().message().find("at least 4x4"),
            std::string::npos);
  ModelOptions script;
  script.spec = "torchscript:/some/model.pt";
  EXPECT_EQ(BuiltInParameterCount(script), -1);
  ModelOptions gpt_on_images;
  gpt_on_images.language_model = false;
  EXPECT_EQ(BuiltInParameterCount(gpt_on_images), -1);
}

TEST(MemoryTest, WhatCannotFitIsRefusedNamingTheFlag) {
  // About 0.3 MB of activations per example: a billion of them fit nowhere.
  TrainConfig c = TinyImages("cnn");
  c.set_batch(1000000000);
  auto t = Trainer::Create(c);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_NE(t.status().message().find(
                "--batch=1000000000: a training step holds at least"),
            std::string::npos)
      << t.status();
  EXPECT_NE(t.status().message().find("of memory available here"),
            std::string::npos)
      << t.status();
  // The launcher's check counts every node. Each refusal is InvalidArgument
  // and names what to change.
  auto expect_refused = [](const TrainConfig& c, int processes, int copies,
                           absl::string_view want) {
    absl::Status s = CheckTrainConfig(c, processes, copies);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
  };
  // At batch 2000 one node holds some 600 MB of activations and 5 MB of
  // weights and their state: 400 nodes need 240 GB for activations, 2 GB
  // for the rest.
  TrainConfig ok = TinyImages("cnn");
  ok.set_batch(2000);
  EXPECT_TRUE(CheckTrainConfig(ok, 1).ok());
  expect_refused(ok, 400, 0, "--batch=2000: the training steps of 400 nodes");
  // With a batch too small to measure activations on, the weights,
  // gradients and optimizer state still count: too many nodes for them
  // alone is refused naming the model, and the node's own copies count.
  TrainConfig small = TinyImages("cnn");
  small.set_batch(4);
  EXPECT_TRUE(CheckTrainConfig(small, 4, 3).ok());
  expect_refused(small, 1000000000, 0,
                 "--model=cnn: the weights, gradients and optimizer state of "
                 "1000000000 nodes need");
  expect_refused(small, 1000000000, 0, "or fewer nodes");
  expect_refused(small, 1000000000, 3, "and 3 more copies of the weights");
  // With a node's plan (core/memory.h), the refusal says what one node
  // holds at its peak, item by item.
  MemoryPlanOptions diloco;
  diloco.algo = "diloco";
  EXPECT_TRUE(CheckTrainConfig(small, 4, diloco).ok());
  const absl::Status plan = CheckTrainConfig(small, 1000000000, diloco);
  EXPECT_TRUE(absl::IsInvalidArgument(plan)) << plan;
  for (absl::string_view want :
       {"--model=cnn with --batch=4: 1000000000 nodes and this process need "
        "about",
        "at peak (a round's exchange): ", "of transport buffers",
        "of memory available here", "or fewer nodes"}) {
    EXPECT_NE(plan.message().find(want), std::string::npos) << plan;
  }
  // --memory_limit_mb caps the plan below what the machine has: 4 nodes of
  // the small cnn need far more than 10 MB (their code and runtime alone),
  // and far less than 100 GB.
  TrainConfig limited = small;
  limited.set_memory_limit_mb(100000);
  EXPECT_TRUE(CheckTrainConfig(limited, 4, diloco).ok());
  limited.set_memory_limit_mb(10);
  const absl::Status capped = CheckTrainConfig(limited, 4, diloco);
  EXPECT_TRUE(absl::IsInvalidArgument(capped)) << capped;
  for (absl::string_view want :
       {"4 nodes and this process need about", "each node ",
        "more than --memory_limit_mb=10 allows"}) {
    EXPECT_NE(capped.message().find(want), std::string::npos) << capped;
  }
  // A model whose weights alone cannot fit is refused before it is built:
  // a gpt of 10^15 parameters (4 PB) fails at once, not in an allocation.
  TrainConfig huge = TinyText();
  huge.set_layers(1000);
  huge.set_width(300000);
  huge.set_heads(1);
  auto t2 = Trainer::Create(huge);
  ASSERT_FALSE(t2.ok());
  EXPECT_NE(t2.status().message().find(
                "--model=gpt: the weights, gradients and optimizer state need "
                "at least"),
            std::string::npos)
      << t2.status();
}

TEST(TrainerTest, GptLearnsText) {
  auto t = MustCreate(TinyText());
  ASSERT_NE(t, nullptr);
  auto before = t->Evaluate();
  ASSERT_TRUE(before.ok());
  RunSteps(*t, 40);
  auto after = t->Evaluate();
  ASSERT_TRUE(after.ok());
  EXPECT_NEAR(before->loss, std::log(256.0), 0.6);
  EXPECT_LT(after->loss, before->loss - 1.0);
  EXPECT_EQ(t->state().step(), 40);
  EXPECT_EQ(t->state().samples(), 40 * 8);
  EXPECT_EQ(t->state().tokens(), 40 * 8 * 32);
}

// An evaluation asked to stop stops between batches and says how far it
// got; the next one runs in full, to the same loss.
TEST(TrainerTest, EvaluationCanBeCalledOff) {
  auto t = MustCreate(TinyText());
  ASSERT_NE(t, nullptr);
  const absl::StatusOr<EvalResult> full = t->Evaluate(4);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_GT(full->examples, 8);
  int asked = 0;
  const absl::StatusOr<EvalResult> off =
      t->Evaluate(4, [&] { return ++asked > 2; });
  EXPECT_TRUE(absl::IsCancelled(off.status())) << off.status();
  EXPECT_EQ(asked, 3);
  EXPECT_NE(off.status().message().find(
                absl::StrCat("after 8 of ", full->examples, " examples")),
            std::string::npos)
      << off.status();
  const absl::StatusOr<EvalResult> again = t->Evaluate(4, [] { return false; });
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->loss, full->loss);
}

TEST(TrainerTest, SameSeedSameRun) {
  auto a = MustCreate(TinyText()), b = MustCreate(TinyText());
  EXPECT_EQ(RunSteps(*a, 5), RunSteps(*b, 5));
  EXPECT_EQ(ModelHash(a->Parameters()), ModelHash(b->Parameters()));
}

// Resuming from a checkpoint gives exactly the losses and weights of an
// uninterrupted run.
void ExpectExactResume(const TrainConfig& config, int total, int cut) {
  auto straight = MustCreate(config);
  std::vector<double> expected = RunSteps(*straight, total);

  std::string path = TempDir() + "/resume.ckpt";
  auto first = MustCreate(config);
  std::vector<double> got = RunSteps(*first, cut);
  ASSERT_TRUE(first->SaveCheckpoint(path).ok());
  RunSteps(*first, 3);  // work after the checkpoint is lost on a crash
  first.reset();

  auto second = MustCreate(config);
  absl::Status s = second->RestoreCheckpoint(path);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(second->state().step(), cut);
  for (double l : RunSteps(*second, total - cut)) got.push_back(l);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(ModelHash(second->Parameters()), ModelHash(straight->Parameters()));
}

TEST(TrainerTest, ExactResumeGptAdamW) { ExpectExactResume(TinyText(), 20, 9); }

TEST(TrainerTest, ExactResumeImagesSgdAcrossEpochs) {
  ExpectExactResume(TinyImages("mlp"), 30, 13);
}

TEST(TrainerTest, ExactResumeAdam) {
  TrainConfig c = TinyText();
  c.set_optimizer("adam");
  c.set_weight_decay(0);
  ExpectExactResume(c, 12, 5);
}

TEST(TrainerTest, ResumeRefusesADifferentRun) {
  std::string path = TempDir() + "/a.ckpt";
  auto t = MustCreate(TinyText());
  RunSteps(*t, 2);
  ASSERT_TRUE(t->SaveCheckpoint(path).ok());

  TrainConfig other_seed = TinyText();
  other_seed.set_seed(6);
  absl::Status s = MustCreate(other_seed)->RestoreCheckpoint(path);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("--seed"), std::string::npos);

  TrainConfig wider = TinyText();
  wider.set_width(64);
  s = MustCreate(wider)->RestoreCheckpoint(path);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("--model"), std::string::npos);
}

// --resume accepts a new --lr or --steps (extending a run is useful) but
// says so: the run no longer matches an uninterrupted one.
TEST(TrainerTest, ResumeDifferencesNameTheChangedSettings) {
  const TrainConfig was = TinyText();
  EXPECT_EQ(ResumeDifferences(was, was), "");
  TrainConfig now = was;
  now.set_threads(was.threads() + 1);  // how it runs, not what it computes
  now.set_out("elsewhere");
  EXPECT_EQ(ResumeDifferences(was, now), "");
  now.set_steps(was.steps() + 10);
  now.set_lr(0.5);
  EXPECT_EQ(ResumeDifferences(was, now),
            absl::StrCat("--lr=0.5 (was ", was.lr(), "), --steps=",
                         was.steps() + 10, " (was ", was.steps(), ")"));
}

TEST(TrainerTest, CorruptCheckpointIsDataLossAndChangesNothing) {
  std::string path = TempDir() + "/c.ckpt";
  auto t = MustCreate(TinyText());
  ASSERT_TRUE(t->SaveCheckpoint(path).ok());
  std::string bytes = *ReadFile(path);
  bytes[bytes.size() - 20] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  std::string before = ModelHash(t->Parameters());
  EXPECT_TRUE(absl::IsDataLoss(t->RestoreCheckpoint(path)));
  EXPECT_EQ(ModelHash(t->Parameters()), before);
}

TEST(TrainerTest, ImageModelsLearnTheTinySet) {
  for (const char* model : {"mlp", "cnn"}) {
    TrainConfig c = TinyImages(model);
    c.set_optimizer("adamw");
    c.set_lr(2e-3);
    auto t = MustCreate(c);
    ASSERT_NE(t, nullptr);
    RunSteps(*t, 30);
    auto e = t->Evaluate();
    ASSERT_TRUE(e.ok());
    EXPECT_GT(e->accuracy, 0.9) << model;
  }
}

// A colour idx set of 16x12 images and 4 classes (idx4, channels last):
// the built-in models size themselves to it and learn it.
TEST(TrainerTest, ImageModelsAdaptToOtherImageSets) {
  const std::string dir = TempDir();
  std::string pixels, labels;
  for (uint32_t i = 0; i < 200; ++i) {
    const int label = i % 4;
    labels += static_cast<char>(label);
    for (int y = 0; y < 16; ++y) {
      for (int x = 0; x < 12; ++x) {
        for (int ch = 0; ch < 3; ++ch) {
          // The label is a bright row in its own channel.
          const bool on = ch == label % 3 && y == 2 + 3 * label;
          pixels += static_cast<char>(on ? 250 : (i * 13 + x * 7 + y) % 60);
        }
      }
    }
  }
  WriteGzip(dir + "/img.gz", IdxBytes({200, 16, 12, 3}, pixels));
  WriteGzip(dir + "/lab.gz", IdxBytes({200}, labels));
  for (const char* model : {"mlp", "cnn"}) {
    TrainConfig c = DefaultTrainConfig();
    c.set_data(absl::StrCat("idx:", dir, "/img.gz,", dir, "/lab.gz"));
    c.set_val_fraction(0.2);
    c.set_model(model);
    c.set_batch(32);
    c.set_steps(40);
    c.set_lr(2e-3);
    c.set_threads(1);
    ASSERT_TRUE(ResolveTrainConfig(&c).ok());
    auto t = MustCreate(c);
    ASSERT_NE(t, nullptr);
    EXPECT_NE(t->model().Architecture().find("input=3x16x12,"),
              std::string::npos);
    EXPECT_NE(t->model().Architecture().find("classes=4)"), std::string::npos);
    RunSteps(*t, 40);
    auto e = t->Evaluate();
    ASSERT_TRUE(e.ok());
    EXPECT_GT(e->accuracy, 0.9) << model;
  }
}

TEST(TorchScriptTest, ByteLmTrainsOnText) {
  TrainConfig c = TinyText();
  c.set_model("torchscript:" + Fixture("byte_lm.pt"));
  c.set_lr(1e-2);
  auto t = MustCreate(c);
  ASSERT_NE(t, nullptr);
  std::vector<double> losses = RunSteps(*t, 40);
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_LT(losses.back(), losses.front() - 1.0);
  // TorchScript models checkpoint and resume like built-in ones.
  ExpectExactResume(c, 10, 4);
}

// A TorchScript model is identified by its content: the same file under
// another path resumes (a run directory moved to another machine, say);
// another model is refused, naming the first tensor that differs.
TEST(TorchScriptTest, ResumeFollowsTheFileNotItsPath) {
  const std::string dir = TempDir() + "/moved";
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string moved = dir + "/renamed.pt";
  ASSERT_TRUE(
      WriteFileAtomic(moved, ReadFile(Fixture("byte_bn.pt")).value()).ok());
  const std::string path = TempDir() + "/bn.ckpt";
  TrainConfig c = TinyText();
  c.set_model("torchscript:" + Fixture("byte_bn.pt"));
  auto t = MustCreate(c);
  ASSERT_NE(t, nullptr);
  RunSteps(*t, 3);
  ASSERT_TRUE(t->SaveCheckpoint(path).ok());

  c.set_model("torchscript:" + moved);
  auto resumed = MustCreate(c);
  ASSERT_NE(resumed, nullptr);
  absl::Status s = resumed->RestoreCheckpoint(path);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(ModelHash(resumed->Parameters(), resumed->model().Buffers()),
            ModelHash(t->Parameters(), t->model().Buffers()));

  c.set_model("torchscript:" + Fixture("byte_bn_wide.pt"));
  s = MustCreate(c)->RestoreCheckpoint(path);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("--model"), std::string::npos) << s;
  EXPECT_NE(s.message().find("parameter conv.weight is float32[32,16,3] at "
                             "the checkpoint, float32[48,16,3] at this run's "
                             "model"),
            std::string::npos)
      << s;
}

TEST(TorchScriptTest, ImageMlpTrains) {
  TrainConfig c = TinyImages("torchscript:" + Fixture("fmnist_mlp.pt"));
  auto t = MustCreate(c);
  ASSERT_NE(t, nullptr);
  RunSteps(*t, 30);
  EXPECT_GT(t->Evaluate()->accuracy, 0.9);
}

TEST(TorchScriptTest, WrongOutputShapeIsRejected) {
  TrainConfig c = TinyImages("torchscript:" + Fixture("bad_output.pt"));
  auto t = Trainer::Create(c);
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("[2,7]"), std::string::npos)
      << t.status();
  EXPECT_NE(t.status().message().find("[2,10]"), std::string::npos);
  // An image model on text data fails its probe with a clear message too.
  TrainConfig text = TinyText();
  text.set_model("torchscript:" + Fixture("fmnist_mlp.pt"));
  t = Trainer::Create(text);
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
}

TEST(TorchScriptTest, MissingOrGarbageFilesAreRejected) {
  TrainConfig c = TinyText();
  c.set_model("torchscript:/nonexistent/model.pt");
  auto t = Trainer::Create(c);
  EXPECT_TRUE(absl::IsNotFound(t.status())) << t.status();
  std::string garbage = TempDir() + "/garbage.pt";
  ASSERT_TRUE(WriteFileAtomic(garbage, "this is not a zip archive").ok());
  c.set_model("torchscript:" + garbage);
  t = Trainer::Create(c);
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_NE(t.status().message().find(garbage), std::string::npos);
}

TEST(ModelTest, MismatchedModelAndDataAreRejected) {
  TrainConfig c = TinyImages("gpt");
  EXPECT_TRUE(absl::IsInvalidArgument(Trainer::Create(c).status()));
  c = TinyText();
  c.set_model("cnn");
  EXPECT_TRUE(absl::IsInvalidArgument(Trainer::Create(c).status()));
  c = TinyText();
  c.set_heads(3);
  auto t = Trainer::Create(c);
  EXPECT_TRUE(absl::IsInvalidArgument(t.status()));
  EXPECT_NE(t.status().message().find("--heads"), std::string::npos);
  c = TinyText();
  c.set_model("resnet");
  t = Trainer::Create(c);
  EXPECT_NE(t.status().message().find("unknown model"), std::string::npos);
}

// A slowed node really takes longer per step and counts the wait as
// compute. The two trainers step in turns so that both see the same load.
TEST(SlowdownTest, StretchesComputeByTheFactor) {
  TrainConfig c = TinyText();
  auto normal = MustCreate(c);
  c.set_slowdown(4);
  auto slow = MustCreate(c);
  ASSERT_NE(normal, nullptr);
  ASSERT_NE(slow, nullptr);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(normal->Step().ok());
    ASSERT_TRUE(slow->Step().ok());
  }
  EXPECT_GE(slow->state().compute_seconds(),
            2.5 * normal->state().compute_seconds());
  // The same steps, only slower: identical weights.
  EXPECT_EQ(ModelHash(slow->Parameters()), ModelHash(normal->Parameters()));
}

TrainConfig WithDrift(TrainConfig c, const std::string& drift) {
  c.set_drift(drift);
  EXPECT_TRUE(ResolveTrainConfig(&c).ok());
  return c;
}

// A node with --drift=5 matches a --drift=never node (same seed) for five
// steps, then trains and validates on the other region; the switch is
// reported exactly once.
TEST(DriftTest, SwitchesTrainingAndValidationAtTheStep) {
  for (TrainConfig base : {TinyText(), TinyImages("mlp")}) {
    auto never = MustCreate(WithDrift(base, "never"));
    auto drifts = MustCreate(WithDrift(base, "5"));
    ASSERT_NE(never, nullptr);
    ASSERT_NE(drifts, nullptr);
    int switches = 0;
    for (int i = 0; i < 5; ++i) {
      auto a = never->Step(), b = drifts->Step();
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->loss, b->loss) << "step " << i + 1;
      EXPECT_EQ(b->region, 0);
      // The step that brings the node to step 5 reports the switch.
      EXPECT_EQ(b->drifted, i == 4) << "step " << i + 1;
      switches += b->drifted ? 1 : 0;
    }
    EXPECT_EQ(ModelHash(never->Parameters()), ModelHash(drifts->Parameters()));
    EXPECT_EQ(never->region(), 0);
    EXPECT_EQ(drifts->region(), 1);
    // Same weights, different validation data.
    auto va = never->Evaluate(), vb = drifts->Evaluate();
    ASSERT_TRUE(va.ok() && vb.ok());
    EXPECT_NE(va->loss, vb->loss);
    for (int i = 0; i < 5; ++i) {
      auto a = never->Step(), b = drifts->Step();
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->region, 0);
      EXPECT_FALSE(a->drifted);
      EXPECT_EQ(b->region, 1);
      switches += b->drifted ? 1 : 0;
    }
    EXPECT_EQ(switches, 1);
    EXPECT_NE(ModelHash(never->Parameters()), ModelHash(drifts->Parameters()));
  }
}

TEST(DriftTest, NeverStaysOnTheFirstRegion) {
  TrainConfig c = WithDrift(TinyText(), "never");
  auto t = MustCreate(c);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dataset().regions(), 2);
  for (int i = 0; i < 8; ++i) {
    auto r = t->Step();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->region, 0);
    EXPECT_FALSE(r->drifted);
  }
  EXPECT_EQ(t->region(), 0);
  // Without --drift there is one region.
  EXPECT_EQ(MustCreate(TinyText())->dataset().regions(), 1);
}

// Resuming before, at and after the drift step gives the uninterrupted run.
TEST(DriftTest, ResumeAcrossTheDriftIsExact) {
  for (int cut : {4, 7, 11})
    ExpectExactResume(WithDrift(TinyText(), "7"), 14, cut);
  ExpectExactResume(WithDrift(TinyImages("mlp"), "9"), 20, 6);
  // A run resumed one step before the drift step reports the switch on its
  // first step; one resumed at the drift step (its switch was reported
  // before the checkpoint) does not report it again.
  std::string path = TempDir() + "/drift.ckpt";
  std::string at = TempDir() + "/at.ckpt";
  TrainConfig c = WithDrift(TinyText(), "3");
  auto first = MustCreate(c);
  RunSteps(*first, 2);
  ASSERT_TRUE(first->SaveCheckpoint(path).ok());
  RunSteps(*first, 1);
  ASSERT_TRUE(first->SaveCheckpoint(at).ok());
  auto second = MustCreate(c);
  ASSERT_TRUE(second->RestoreCheckpoint(path).ok());
  auto r = second->Step();
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->drifted);
  EXPECT_EQ(r->region, 0);
  ASSERT_TRUE(second->RestoreCheckpoint(at).ok());
  for (int i = 0; i < 3; ++i) {
    r = second->Step();
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->drifted);
    EXPECT_EQ(r->region, 1);
  }
  // --drift=0: on the second region from the start, reported on step 1.
  auto from_start = MustCreate(WithDrift(TinyText(), "0"));
  EXPECT_EQ(from_start->region(), 1);
  r = from_start->Step();
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->drifted);
  EXPECT_EQ(r->region, 1);
  EXPECT_FALSE(from_start->Step()->drifted);
  // A checkpoint from another drift schedule is refused.
  auto other = MustCreate(WithDrift(TinyText(), "5"));
  absl::Status s = other->RestoreCheckpoint(path);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("--drift"), std::string::npos) << s;
}

TEST(DeviceTest, CudaWithoutCudaIsAClearError) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA is available here";
  TrainConfig c = TinyText();
  c.set_device("cuda");
  auto t = Trainer::Create(c);
  EXPECT_TRUE(absl::IsFailedPrecondition(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("--device=cuda"), std::string::npos);
}

// A checkpoint of the format earlier builds wrote, with the model and the
// optimizer as LibTorch archives ("model", "optimizer"), made here as they
// made it from a checkpoint of this build's: it resumes exactly as well.
void WriteArchiveCheckpoint(Trainer& t, const std::string& from,
                            const std::string& to) {
  absl::StatusOr<Checkpoint> ckpt = ReadCheckpoint(from);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  torch::serialize::OutputArchive model;
  std::vector<torch::Tensor> params = t.Parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    model.write(absl::StrCat("param.", i), params[i].detach().cpu());
  }
  std::vector<torch::Tensor> buffers = t.model().Buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    model.write(absl::StrCat("buffer.", i), buffers[i].cpu());
  }
  // The optimizer's state, through an AdamW of the same parameters.
  torch::optim::AdamW opt(params);
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(from);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<SectionReader> state = reader->Section("optimizer_tensors");
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(ReadOptimizerState(*state, opt).ok());
  torch::serialize::OutputArchive opt_archive;
  opt.save(opt_archive);
  auto bytes = [](torch::serialize::OutputArchive& a) {
    std::string out;
    a.save_to([&out](const void* data, size_t size) {
      out.append(static_cast<const char*>(data), size);
      return size;
    });
    return out;
  };
  ckpt->sections.erase("model_tensors");
  ckpt->sections.erase("optimizer_tensors");
  ckpt->sections["model"] = bytes(model);
  ckpt->sections["optimizer"] = bytes(opt_archive);
  ASSERT_TRUE(WriteCheckpoint(to, *ckpt).ok());
}

TEST(TrainerTest, CheckpointsOfTheArchiveFormatResumeExactly) {
  const TrainConfig config = TinyText();
  auto straight = MustCreate(config);
  std::vector<double> expected = RunSteps(*straight, 12);
  const std::string dir = TempDir();
  auto first = MustCreate(config);
  std::vector<double> got = RunSteps(*first, 5);
  ASSERT_TRUE(first->SaveCheckpoint(dir + "/new.ckpt").ok());
  WriteArchiveCheckpoint(*first, dir + "/new.ckpt", dir + "/old.ckpt");
  first.reset();
  auto second = MustCreate(config);
  absl::Status s = second->RestoreCheckpoint(dir + "/old.ckpt");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(second->state().step(), 5);
  for (double l : RunSteps(*second, 7)) got.push_back(l);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(ModelHash(second->Parameters()), ModelHash(straight->Parameters()));
}

// The caller's sections go in as producers or strings and come back through
// the reader the trainer restored from; `sections` has every section but
// the trainer's tensors.
TEST(TrainerTest, CallerSectionsStreamInAndOut) {
  const std::string path = TempDir() + "/c.ckpt";
  auto t = MustCreate(TinyText());
  RunSteps(*t, 2);
  const std::vector<float> outer(1000, 0.25f);
  CheckpointSections extra;
  extra.emplace("outer", CheckpointSection::View(absl::string_view(
                             reinterpret_cast<const char*>(outer.data()),
                             outer.size() * sizeof(float))));
  extra.emplace("round", "3");
  ASSERT_TRUE(t->SaveCheckpoint(path, std::move(extra)).ok());

  auto again = MustCreate(TinyText());
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE(again->RestoreCheckpoint(*reader).ok());
  EXPECT_EQ(ModelHash(again->Parameters()), ModelHash(t->Parameters()));
  std::vector<float> back(outer.size());
  absl::StatusOr<SectionReader> section = reader->Section("outer");
  ASSERT_TRUE(section.ok()) << section.status();
  ASSERT_TRUE(section->Read(back.data(), back.size() * sizeof(float)).ok());
  EXPECT_EQ(back, outer);
  EXPECT_EQ(reader->ReadString("round").value_or(""), "3");

  std::map<std::string, std::string> sections;
  ASSERT_TRUE(MustCreate(TinyText())->RestoreCheckpoint(path, &sections).ok());
  std::vector<std::string> names;
  for (const auto& [name, bytes] : sections) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"architecture", "outer", "round",
                                             "tensor_signature", "torch_rng",
                                             "trainer_state"}));
}

// A checkpoint adds no copy of the model to what the trainer holds: the
// tensors go to the file from their own memory. Measured from inside the
// write, by a caller section written after the trainer's (by name).
TEST(TrainerTest, CheckpointHoldsNoCopyOfTheModel) {
  TrainConfig c = TinyText();
  c.set_width(256);  // 0.8 M parameters: 3 MB a copy, 10 MB with Adam's
  c.set_heads(4);
  auto t = MustCreate(c);
  RunSteps(*t, 1);
  const int64_t weights = NumElements(t->Parameters()) * 4;
  const int64_t before = HeapBytesInUse();
  int64_t during = -1;
  CheckpointSections extra;
  extra.emplace("zz_probe", CheckpointSection(0, [&](ByteSink&) {
                  during = HeapBytesInUse() - before;
                  return absl::OkStatus();
                }));
  ASSERT_TRUE(t->SaveCheckpoint(TempDir() + "/c.ckpt", std::move(extra)).ok());
  EXPECT_GE(during, 0);
  EXPECT_LT(during, weights / 4) << "of " << weights << " bytes of weights";
}

// The gradients live only inside a step: between steps (a round's
// exchange, a checkpoint) their copy of the weights is free. A step whose
// hook fails leaves none either, and the parameters as they were.
TEST(TrainerTest, GradientsLiveOnlyInsideAStep) {
  auto t = MustCreate(TinyText());
  auto no_grads = [&] {
    for (const torch::Tensor& p : t->Parameters()) {
      if (p.grad().defined()) return false;
    }
    return true;
  };
  RunSteps(*t, 2);
  EXPECT_TRUE(no_grads());
  const std::string before = ModelHash(t->Parameters());
  absl::StatusOr<StepResult> failed =
      t->Step([](const std::vector<torch::Tensor>& params) {
        EXPECT_TRUE(params[0].grad().defined());
        return absl::AbortedError("peer left");
      });
  EXPECT_TRUE(absl::IsAborted(failed.status()));
  EXPECT_TRUE(no_grads());
  EXPECT_EQ(ModelHash(t->Parameters()), before);
}

// --precision=bf16 on the CPU (LibTorch's CPU autocast): the default stays
// fp32, bf16 learns about as fp32 does, and autocast really ran.
TEST(PrecisionTest, Bf16TrainsCloseToFp32) {
  const TrainConfig fp32 = TinyText();
  EXPECT_EQ(fp32.precision(), "fp32");
  TrainConfig bf16 = fp32;
  bf16.set_precision("bf16");
  auto a = MustCreate(fp32), b = MustCreate(bf16);
  const std::vector<double> la = RunSteps(*a, 40), lb = RunSteps(*b, 40);
  ASSERT_EQ(lb.size(), 40u);
  double worst = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    worst = std::max(worst, std::abs(la[i] - lb[i]) / la[i]);
  }
  std::cerr << "bf16 vs fp32 loss: worst relative gap " << worst << ", final "
            << lb.back() << " vs " << la.back() << "\n";
  // bf16 keeps 8 bits of mantissa (a relative error of 2^-9 per value);
  // over 40 steps the two runs part a little, and stay within 5%.
  EXPECT_LT(worst, 0.05);
  EXPECT_LT(lb.back(), lb.front() - 1.0);  // it learns
  EXPECT_NE(ModelHash(a->Parameters()), ModelHash(b->Parameters()));
  for (const torch::Tensor& p : b->Parameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kFloat32);  // master weights stay fp32
  }
}

TEST(PrecisionTest, Bf16ResumesExactly) {
  TrainConfig c = TinyText();
  c.set_precision("bf16");
  ExpectExactResume(c, 20, 9);
}

// A model whose step LibTorch's CPU autocast cannot run (det has no bf16
// kernel in LibTorch 1.13's CPU) is refused before training, naming the
// flag and the cause; in fp32 the same model trains.
TEST(PrecisionTest, Bf16WhereAutocastCannotRunIsRefused) {
  TrainConfig c = TinyImages("torchscript:" + Fixture("no_bf16.pt"));
  ASSERT_NE(MustCreate(c), nullptr);
  c.set_precision("bf16");
  auto t = Trainer::Create(c);
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("--precision=bf16"), std::string::npos)
      << t.status();
  EXPECT_NE(t.status().message().find("BFloat16"), std::string::npos)
      << t.status();
}

TEST(PrecisionTest, BadValuesNameTheFlag) {
  TrainConfig c = TinyText();
  c.set_precision("fp16");
  absl::Status s = ResolveTrainConfig(&c);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("--precision=fp16"), std::string::npos) << s;
  c = TinyText();
  c.set_gpu_memory_fraction(1.5);
  s = ResolveTrainConfig(&c);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("--gpu_memory_fraction=1.5"), std::string::npos);
}

// A checkpoint from before --precision counts as fp32; a change of
// precision is named, a change of the GPU memory cap is not.
TEST(PrecisionTest, ResumeDifferencesCountPrecisionNotTheCap) {
  TrainConfig was = TinyText();
  was.clear_precision();
  TrainConfig now = TinyText();
  now.set_gpu_memory_fraction(0.5);
  EXPECT_EQ(ResumeDifferences(was, now), "");
  now.set_precision("bf16");
  EXPECT_EQ(ResumeDifferences(was, now), "--precision=bf16 (was fp32)");
}

}  // namespace
}  // namespace starling
