#include "core/model.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/torch_error.h"

namespace starling {
namespace {

std::vector<torch::Tensor> ToVector(const std::vector<at::Tensor>& v) {
  return std::vector<torch::Tensor>(v.begin(), v.end());
}

// An image classifier's input: channels, height, width.
struct ImageShape {
  int64_t c = 1, h = 28, w = 28;
  int64_t pixels() const { return c * h * w; }
  // Fashion-MNIST's 1x28x28 keeps the architecture strings it always had
  // (checkpoints and peers compare them); others name their shape.
  std::string Label() const {
    if (c == 1 && h == 28 && w == 28) return "";
    return absl::StrCat("input=", c, "x", h, "x", w, ",");
  }
};

ImageShape ShapeOf(const ModelOptions& o) {
  ImageShape s;
  if (o.input_shape.size() == 3) {
    s.c = o.input_shape[0];
    s.h = o.input_shape[1];
    s.w = o.input_shape[2];
  }
  return s;
}

// Wraps a torch::nn::Module built in C++.
template <typename Net>
class NnModel : public Model {
 public:
  NnModel(Net net, std::string arch) : net_(net), arch_(std::move(arch)) {}
  torch::Tensor Forward(const torch::Tensor& x) override {
    return net_->forward(x);
  }
  std::vector<torch::Tensor> Parameters() override {
    return ToVector(net_->parameters());
  }
  std::vector<torch::Tensor> Buffers() override {
    return ToVector(net_->buffers());
  }
  void SetTraining(bool training) override { net_->train(training); }
  void To(const torch::Device& device) override { net_->to(device); }
  std::string Architecture() const override { return arch_; }

 private:
  Net net_;
  std::string arch_;
};

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t classes)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, classes))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

// Two 3x3 convolutions, each followed by ReLU and a 2x2 max pool, then two
// linear layers: C x H x W images give fc1 64 * (H/4) * (W/4) inputs (7x7
// for 28x28).
struct CnnImpl : torch::nn::Module {
  CnnImpl(const ImageShape& in, int64_t classes)
      : conv1(register_module(
            "conv1", torch::nn::Conv2d(
                         torch::nn::Conv2dOptions(in.c, 32, 3).padding(1)))),
        conv2(register_module(
            "conv2",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc1(register_module(
            "fc1", torch::nn::Linear(64 * (in.h / 4) * (in.w / 4), 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, classes))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::max_pool2d(torch::relu(conv1(x)), 2);
    h = torch::max_pool2d(torch::relu(conv2(h)), 2);
    return fc2(torch::relu(fc1(h.flatten(1))));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Cnn);

// Pre-LayerNorm transformer block with causal multi-head attention and a 4x
// GELU MLP: x + Attn(LN(x)), then x + MLP(LN(x)).
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t width, int64_t heads)
      : heads(heads),
        ln1(register_module(
            "ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", torch::nn::Linear(width, width))),
        ln2(register_module(
            "ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, 4 * width))),
        fc2(register_module("fc2", torch::nn::Linear(4 * width, width))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    const int64_t hd = c / heads;
    std::vector<torch::Tensor> parts = qkv(ln1(x)).chunk(3, -1);
    auto split = [&](const torch::Tensor& z) {
      return z.view({b, t, heads, hd}).transpose(1, 2);
    };
    torch::Tensor q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) /
                        std::sqrt(static_cast<double>(hd));
    att = att.masked_fill(mask, -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1);
    torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({b, t, c});
    torch::Tensor h = x + proj(y);
    return h + fc2(torch::gelu(fc1(ln2(h))));
  }

  int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  GptImpl(int64_t vocab, int64_t context, int64_t width, int64_t heads,
          int64_t layers)
      : context(context),
        tok_emb(register_module("tok_emb", torch::nn::Embedding(vocab, width))),
        pos_emb(
            register_module("pos_emb", torch::nn::Embedding(context, width))) {
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(
          register_module(absl::StrCat("block", i), Block(width, heads)));
    }
    ln_f = register_module(
        "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    head = register_module("head", torch::nn::Linear(width, vocab));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t t = x.size(1);
    auto opts = torch::TensorOptions().device(x.device());
    torch::Tensor pos = torch::arange(t, opts.dtype(torch::kLong));
    torch::Tensor h = tok_emb(x) + pos_emb(pos);
    if (!mask.defined() || mask.size(0) != t || mask.device() != x.device()) {
      mask = torch::ones({t, t}, opts.dtype(torch::kBool)).triu(1);
    }
    for (auto& block : blocks) h = block->forward(h, mask);
    return head(ln_f(h));
  }

  int64_t context;
  torch::nn::Embedding tok_emb, pos_emb;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor mask;  // causal mask cache, not a parameter or buffer
};
TORCH_MODULE(Gpt);

class TorchScriptModel : public Model {
 public:
  TorchScriptModel(torch::jit::script::Module module, std::string path)
      : module_(std::move(module)), path_(std::move(path)) {}

  torch::Tensor Forward(const torch::Tensor& x) override {
    c10::IValue out = module_.forward({x});
    if (!out.isTensor()) {
      TORCH_CHECK(false, "forward(x) of ", path_, " returned ", out.tagKind(),
                  ", expected a logits tensor");
    }
    return out.toTensor();
  }
  std::vector<torch::Tensor> Parameters() override {
    std::vector<torch::Tensor> out;
    for (const auto& p : module_.parameters()) out.push_back(p);
    return out;
  }
  std::vector<torch::Tensor> Buffers() override {
    std::vector<torch::Tensor> out;
    for (const auto& b : module_.buffers()) out.push_back(b);
    return out;
  }
  void SetTraining(bool training) override { module_.train(training); }
  void To(const torch::Device& device) override { module_.to(device); }
  std::string Architecture() const override {
    return absl::StrCat("torchscript(", path_, ")");
  }

 private:
  torch::jit::script::Module module_;
  std::string path_;
};

}  // namespace

int64_t BuiltInParameterCount(const ModelOptions& o) {
  const int64_t c = o.num_classes;
  const ImageShape in = ShapeOf(o);
  auto linear = [](int64_t in, int64_t out) { return in * out + out; };
  if (o.spec == "mlp" && !o.language_model && o.width >= 1) {
    return linear(in.pixels(), o.width) + linear(o.width, c);
  }
  if (o.spec == "cnn" && !o.language_model && in.h >= 4 && in.w >= 4) {
    return (in.c * 32 * 9 + 32) + (32 * 64 * 9 + 64) +
           linear(64 * (in.h / 4) * (in.w / 4), 128) + linear(128, c);
  }
  if (o.spec == "gpt" && o.language_model && o.layers >= 1 && o.width >= 1 &&
      o.heads >= 1 && o.context >= 1 && o.width % o.heads == 0) {
    const int64_t w = o.width;
    const int64_t block = 2 * w + linear(w, 3 * w) + linear(w, w) + 2 * w +
                          linear(w, 4 * w) + linear(4 * w, w);
    return c * w + o.context * w + o.layers * block + 2 * w + linear(w, c);
  }
  return -1;
}

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelOptions& o) {
  const int64_t c = o.num_classes;
  if (o.spec == "mlp" || o.spec == "cnn") {
    if (o.language_model) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model=", o.spec,
                       " is an image classifier; use it with image data "
                       "(--data=fmnist, fmnist:DIR or idx:IMAGES,LABELS), or "
                       "use --model=gpt for text"));
    }
    const ImageShape in = ShapeOf(o);
    if (o.spec == "mlp") {
      if (o.width < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--width=", o.width, ": must be >= 1"));
      }
      return std::unique_ptr<Model>(
          new NnModel<Mlp>(Mlp(in.pixels(), o.width, c),
                           absl::StrCat("mlp(", in.Label(), "hidden=", o.width,
                                        ",classes=", c, ")")));
    }
    if (in.h < 4 || in.w < 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model=cnn pools twice by 2 and needs images of at least 4x4; "
          "these are ",
          in.h, "x", in.w, " (use --model=mlp)"));
    }
    return std::unique_ptr<Model>(new NnModel<Cnn>(
        Cnn(in, c), absl::StrCat("cnn(", in.Label(), "classes=", c, ")")));
  }
  if (o.spec == "gpt") {
    if (!o.language_model) {
      return absl::InvalidArgumentError(
          "--model=gpt is a language model; use it with text data "
          "(--data=kjv, text:PATH or tokens:PATH), or use --model=cnn/mlp "
          "for fmnist");
    }
    if (o.layers < 1 || o.width < 1 || o.heads < 1 || o.context < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--layers, --width, --heads and --context must be >= 1 (got ",
          o.layers, ", ", o.width, ", ", o.heads, ", ", o.context, ")"));
    }
    if (o.width % o.heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--width=", o.width, " must be divisible by --heads=", o.heads));
    }
    return std::unique_ptr<Model>(new NnModel<Gpt>(
        Gpt(c, o.context, o.width, o.heads, o.layers),
        absl::StrCat("gpt(layers=", o.layers, ",width=", o.width, ",heads=",
                     o.heads, ",context=", o.context, ",vocab=", c, ")")));
  }
  if (absl::StartsWith(o.spec, "torchscript:")) {
    std::string path = o.spec.substr(12);
    if (!FileExists(path)) {
      return absl::NotFoundError(
          absl::StrCat("--model=", o.spec, ": file not found: ", path));
    }
    try {
      torch::jit::script::Module m = torch::jit::load(path);
      return std::unique_ptr<Model>(new TorchScriptModel(std::move(m), path));
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model=", o.spec, ": ", path,
          " is not a TorchScript module saved with torch.jit.save (",
          TorchErrorMessage(e), ")"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--model=", o.spec,
      ": unknown model; expected mlp, cnn, gpt or torchscript:PATH"));
}

}  // namespace starling
