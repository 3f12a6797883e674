#include "core/model.h"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/torch_error.h"

namespace starling {
namespace {

std::vector<torch::Tensor> ToVector(const std::vector<at::Tensor>& v) {
  return std::vector<torch::Tensor>(v.begin(), v.end());
}

// The names of a torch::nn::Module's named_parameters() / named_buffers().
template <typename Dict>
std::vector<std::string> Keys(const Dict& named) {
  std::vector<std::string> keys;
  for (const auto& item : named) keys.push_back(item.key());
  return keys;
}

// The same for a TorchScript module's.
template <typename List>
std::vector<std::string> Names(const List& named) {
  std::vector<std::string> names;
  for (const auto& item : named) names.push_back(item.name);
  return names;
}

// PyTorch's own spelling of the dtypes a model holds ("float32", "int64").
std::string DtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return "float32";
    case torch::kFloat64:
      return "float64";
    case torch::kFloat16:
      return "float16";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kInt64:
      return "int64";
    case torch::kInt32:
      return "int32";
    case torch::kInt16:
      return "int16";
    case torch::kInt8:
      return "int8";
    case torch::kUInt8:
      return "uint8";
    case torch::kBool:
      return "bool";
    default:
      return c10::toString(t);
  }
}

// Writes `bytes` (what a LibTorch serializer made) to `path` atomically.
absl::Status WriteExport(const std::string& path,
                         const std::function<std::string()>& serialize) {
  std::string bytes;
  try {
    bytes = serialize();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot serialize the model for ",
                                            path, ": ", TorchErrorMessage(e)));
  }
  return WriteFileAtomic(path, bytes);
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
  std::vector<std::string> ParameterNames() override {
    return Keys(net_->named_parameters());
  }
  std::vector<std::string> BufferNames() override {
    return Keys(net_->named_buffers());
  }
  void SetTraining(bool training) override { net_->train(training); }
  void To(const torch::Device& device) override { net_->to(device); }
  std::string Architecture() const override { return arch_; }
  // A state_dict: torch.save of an ordered name -> tensor dict, as
  // torch::pickle_save writes it (the zip format torch.load reads).
  absl::Status Export(const std::string& path) override {
    return WriteExport(path, [&] {
      c10::Dict<std::string, at::Tensor> dict;
      for (const auto& item : net_->named_parameters()) {
        dict.insert(item.key(), item.value().detach().cpu().contiguous());
      }
      for (const auto& item : net_->named_buffers()) {
        dict.insert(item.key(), item.value().detach().cpu().contiguous());
      }
      const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
      return std::string(bytes.begin(), bytes.end());
    });
  }

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

// `text` without TorchScript's class renamings: it renames a class it has
// seen before in the same process ("__torch__.___torch_mangle_3.ByteLM"),
// when Python scripts two models of one class and when a module is cloned
// (Export), so the mangle says nothing of the model.
std::string WithoutMangling(const std::string& text) {
  constexpr absl::string_view kMangle = "___torch_mangle_";
  std::string out;
  size_t i = 0;
  while (true) {
    const size_t at = text.find(kMangle.data(), i, kMangle.size());
    if (at == std::string::npos) return out.append(text, i, std::string::npos);
    out.append(text, i, at - i);
    i = at + kMangle.size();
    while (i < text.size() && absl::ascii_isdigit(text[i])) ++i;
    if (i < text.size() && text[i] == '.') ++i;
  }
}

// The content a TorchScript module is identified by: its submodules' types
// and the graphs of their methods (without source locations), then its
// tensors' names, shapes and dtypes. Nothing of the file's path or of
// the addresses that Module::dump_to_str prints.
std::string ModuleDigest(const torch::jit::script::Module& module,
                         const std::vector<std::string>& signature) {
  std::string text;
  for (const auto& sub : module.named_modules()) {
    absl::StrAppend(&text, "module ", sub.name, " ", sub.value.type()->str(),
                    "\n");
    for (const auto& method : sub.value.get_methods()) {
      absl::StrAppend(&text, "method ", method.name(), "\n",
                      method.graph()->toString(/*print_source_locations=*/
                                               false));
    }
  }
  absl::StrAppend(&text, absl::StrJoin(signature, "\n"));
  const std::string plain = WithoutMangling(text);
  return absl::StrFormat("%016x", HashBytes(plain.data(), plain.size()));
}

class TorchScriptModel : public Model {
 public:
  TorchScriptModel(torch::jit::script::Module module, std::string path)
      : module_(std::move(module)), path_(std::move(path)) {
    std::vector<std::string> signature = SignatureLines(
        ParameterNames(), Parameters(), BufferNames(), Buffers());
    digest_ = ModuleDigest(module_, signature);
  }

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
  std::vector<std::string> ParameterNames() override {
    return Names(module_.named_parameters());
  }
  std::vector<std::string> BufferNames() override {
    return Names(module_.named_buffers());
  }
  void SetTraining(bool training) override { module_.train(training); }
  void To(const torch::Device& device) override { module_.to(device); }
  std::string Architecture() const override {
    return absl::StrCat("torchscript(", digest_, ")");
  }
  // The module itself (its code, parameters and buffers), on the CPU.
  absl::Status Export(const std::string& path) override {
    return WriteExport(path, [&] {
      torch::jit::script::Module copy = module_.clone();
      copy.to(torch::kCPU);
      copy.eval();
      std::ostringstream out;
      copy.save(out);
      return out.str();
    });
  }

 private:
  torch::jit::script::Module module_;
  std::string path_;
  std::string digest_;
};

}  // namespace

std::vector<std::string> SignatureLines(
    const std::vector<std::string>& param_names,
    const std::vector<torch::Tensor>& params,
    const std::vector<std::string>& buffer_names,
    const std::vector<torch::Tensor>& buffers) {
  std::vector<std::string> lines;
  auto add = [&](const char* kind, const std::vector<std::string>& names,
                 const std::vector<torch::Tensor>& tensors) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      lines.push_back(absl::StrCat(
          kind, " ", i < names.size() ? names[i] : absl::StrCat("#", i), " ",
          DtypeName(tensors[i].scalar_type()), "[",
          absl::StrJoin(tensors[i].sizes(), ","), "]"));
    }
  };
  add("parameter", param_names, params);
  add("buffer", buffer_names, buffers);
  return lines;
}

std::vector<std::string> TensorSignature(Model& model) {
  return SignatureLines(model.ParameterNames(), model.Parameters(),
                        model.BufferNames(), model.Buffers());
}

std::string SignatureDifference(const std::vector<std::string>& a,
                                const std::string& a_label,
                                const std::vector<std::string>& b,
                                const std::string& b_label) {
  // "KIND NAME SHAPE": the kind and name, and what follows them.
  auto split = [](const std::string& line) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    f.resize(3);
    return f;
  };
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i < a.size() && i < b.size() && a[i] == b[i]) continue;
    if (i >= b.size()) {
      return absl::StrCat(a[i].substr(0, a[i].rfind(' ')), " exists at ",
                          a_label, " only");
    }
    if (i >= a.size()) {
      return absl::StrCat(b[i].substr(0, b[i].rfind(' ')), " exists at ",
                          b_label, " only");
    }
    const std::vector<std::string> fa = split(a[i]), fb = split(b[i]);
    if (fa[0] != fb[0] || fa[1] != fb[1]) {
      return absl::StrCat(fa[0], " ", fa[1], " at ", a_label, " is ", fb[0],
                          " ", fb[1], " at ", b_label);
    }
    return absl::StrCat(fa[0], " ", fa[1], " is ", fa[2], " at ", a_label, ", ",
                        fb[2], " at ", b_label);
  }
  return "";
}

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
