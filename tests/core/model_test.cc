#include "core/model.h"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace starling {
namespace {

using ::starling::testing::TempDir;

std::string Fixture(const char* name) {
  return absl::StrCat(STARLING_FIXTURE_DIR, "/", name);
}

std::unique_ptr<Model> Load(const std::string& path) {
  ModelOptions o;
  o.spec = "torchscript:" + path;
  auto m = CreateModel(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

// A copy of fixture `name` at `path`.
std::string CopyFixture(const char* name, const std::string& path) {
  EXPECT_TRUE(MakeDirs(path.substr(0, path.rfind('/'))).ok());
  EXPECT_TRUE(WriteFileAtomic(path, ReadFile(Fixture(name)).value()).ok());
  return path;
}

TEST(ModelIdentityTest, TorchScriptIsItsContentNotItsPath) {
  const std::string a = CopyFixture("byte_bn.pt", TempDir() + "/a/model.pt");
  const std::string b = CopyFixture("byte_bn.pt", TempDir() + "/b/other.pt");
  auto ma = Load(a), mb = Load(b), wide = Load(Fixture("byte_bn_wide.pt"));
  ASSERT_TRUE(ma && mb && wide);
  EXPECT_EQ(ma->Architecture(), mb->Architecture());
  EXPECT_TRUE(absl::StartsWith(ma->Architecture(), "torchscript("))
      << ma->Architecture();
  EXPECT_EQ(ma->Architecture().find("model.pt"), std::string::npos);
  EXPECT_NE(ma->Architecture(), wide->Architecture());
  // Other code with the same tensors is another model too.
  auto lm = Load(Fixture("byte_lm.pt"));
  ASSERT_NE(lm, nullptr);
  EXPECT_NE(lm->Architecture(), ma->Architecture());
}

TEST(ModelIdentityTest, SignatureNamesEveryTensorAndTheFirstDifference) {
  auto bn = Load(Fixture("byte_bn.pt")),
       wide = Load(Fixture("byte_bn_wide.pt"));
  ASSERT_TRUE(bn && wide);
  const std::vector<std::string> sig = TensorSignature(*bn);
  ASSERT_EQ(sig.size(), 7u + 3u);  // emb, conv, bn, out; bn's 3 buffers
  EXPECT_EQ(sig[0], "parameter emb.weight float32[256,16]");
  EXPECT_EQ(sig[1], "parameter conv.weight float32[32,16,3]");
  EXPECT_EQ(sig[7], "buffer bn.running_mean float32[32]");
  EXPECT_EQ(sig[9], "buffer bn.num_batches_tracked int64[]");
  EXPECT_EQ(SignatureDifference(sig, "A", sig, "B"), "");
  EXPECT_EQ(SignatureDifference(sig, "A", TensorSignature(*wide), "B"),
            "parameter conv.weight is float32[32,16,3] at A, "
            "float32[48,16,3] at B");
  std::vector<std::string> fewer(sig.begin(), sig.end() - 1);
  EXPECT_EQ(SignatureDifference(sig, "A", fewer, "B"),
            "buffer bn.num_batches_tracked exists at A only");
  std::vector<std::string> renamed = sig;
  renamed[0] = "parameter embed.weight float32[256,16]";
  EXPECT_EQ(SignatureDifference(renamed, "A", sig, "B"),
            "parameter embed.weight at A is parameter emb.weight at B");
}

TEST(ModelExportTest, TorchScriptKeepsItsTrainedTensors) {
  auto m = Load(Fixture("byte_bn.pt"));
  ASSERT_NE(m, nullptr);
  {
    torch::NoGradGuard no_grad;
    m->Parameters()[1].add_(0.5);
    m->Buffers()[0].fill_(0.25);  // running_mean
    m->Buffers()[2].fill_(7);     // num_batches_tracked
  }
  const std::string out = TempDir() + "/exported_bn.pt";
  ASSERT_TRUE(m->Export(out).ok());
  auto back = Load(out);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->Architecture(), m->Architecture());
  EXPECT_EQ(ModelHash(back->Parameters(), back->Buffers()),
            ModelHash(m->Parameters(), m->Buffers()));
  EXPECT_EQ(back->Buffers()[2].item<int64_t>(), 7);
  absl::Status s = m->Export("/nonexistent/dir/model.pt");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/dir/model.pt"), std::string::npos)
      << s;
}

TEST(ModelExportTest, BuiltInIsAStateDictOfItsNamedTensors) {
  torch::manual_seed(3);
  ModelOptions o;
  o.spec = "gpt";
  o.layers = 2;
  o.width = 32;
  o.heads = 2;
  o.context = 16;
  auto m = CreateModel(o);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string out = TempDir() + "/gpt_state_dict.pt";
  ASSERT_TRUE((*m)->Export(out).ok());
  std::string bytes = ReadFile(out).value();
  c10::IValue v =
      torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  ASSERT_TRUE(v.isGenericDict());
  c10::impl::GenericDict dict = v.toGenericDict();
  const std::vector<std::string> names = (*m)->ParameterNames();
  const std::vector<torch::Tensor> params = (*m)->Parameters();
  ASSERT_EQ(dict.size(), names.size());
  EXPECT_EQ(names[0], "tok_emb.weight");
  EXPECT_EQ(names[2], "block0.ln1.weight");
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_TRUE(dict.contains(names[i])) << names[i];
    EXPECT_TRUE(torch::equal(dict.at(names[i]).toTensor(), params[i]))
        << names[i];
  }
}

}  // namespace
}  // namespace starling
