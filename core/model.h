// Models the trainer can run: built-in `mlp` and `cnn` (image classifiers
// sized for the data's images and classes, e.g. Fashion-MNIST's), `gpt`
// (a byte/token-level decoder-only transformer), and any TorchScript module
// exported from Python whose forward(x) returns logits. A model goes back to
// PyTorch with Export: a TorchScript file, or for a built-in model a
// state_dict that python/starling_models.py's classes load.
// A Model is not thread-safe: one trainer owns it. LibTorch exceptions are
// caught inside CreateModel; Forward may throw c10::Error, which the trainer
// catches at its edge.
#ifndef STARLING_CORE_MODEL_H_
#define STARLING_CORE_MODEL_H_

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace starling {

class Model {
 public:
  virtual ~Model() = default;

  // Logits: [B, C] for classification, [B, T, V] for language models.
  virtual torch::Tensor Forward(const torch::Tensor& x) = 0;
  // Trainable parameters in a fixed order (the flat-view order).
  virtual std::vector<torch::Tensor> Parameters() = 0;
  // Non-trainable state that checkpoints keep (may be empty): BatchNorm's
  // running statistics and the like.
  virtual std::vector<torch::Tensor> Buffers() = 0;
  // PyTorch's names of Parameters() and Buffers(), in their order: the keys
  // of the model's state_dict, e.g. "block0.ln1.weight".
  virtual std::vector<std::string> ParameterNames() = 0;
  virtual std::vector<std::string> BufferNames() = 0;
  virtual void SetTraining(bool training) = 0;
  virtual void To(const torch::Device& device) = 0;
  // What identifies the model, e.g.
  // "gpt(layers=2,width=64,heads=4,context=64,vocab=256)". A TorchScript
  // model is identified by its content, never by its path:
  // "torchscript(DIGEST)", 16 hex digits of a hash over the code of its
  // methods and the names, shapes and dtypes of its parameters and buffers,
  // so the same file under two paths is the same model.
  virtual std::string Architecture() const = 0;
  // Writes the model, with its current parameters and buffers, for
  // PyTorch: a TorchScript model as a TorchScript file (torch.jit.load runs
  // it), a built-in one as a state_dict, name -> tensor (torch.load reads
  // it; python/starling_models.py's classes load it with strict=True). In
  // eval mode. Written atomically; Internal naming `path` on failure.
  virtual absl::Status Export(const std::string& path) = 0;
};

// One line per parameter, then per buffer: "parameter NAME DTYPE[SHAPE]" or
// "buffer NAME DTYPE[SHAPE]", e.g. "parameter fc1.weight float32[128,784]".
// Two models that can share weights have the same lines; the handshake and
// checkpoints carry them, so that a mismatch names the tensor.
std::vector<std::string> TensorSignature(Model& model);
// The same lines for named tensors held elsewhere (a PyTorch model that the
// Python module trains: python/starling_module.cc). A missing name is "#I".
std::vector<std::string> SignatureLines(
    const std::vector<std::string>& param_names,
    const std::vector<torch::Tensor>& params,
    const std::vector<std::string>& buffer_names,
    const std::vector<torch::Tensor>& buffers);

// The first line where two TensorSignature()s differ, as "parameter
// conv.weight is float32[48,16,3] at A, float32[32,16,3] at B" (A and B are
// the labels), or "... exists at A only"; empty when they are equal.
std::string SignatureDifference(const std::vector<std::string>& a,
                                const std::string& a_label,
                                const std::vector<std::string>& b,
                                const std::string& b_label);

struct ModelOptions {
  std::string spec = "gpt";  // "mlp", "cnn", "gpt" or "torchscript:PATH"
  int layers = 2;
  int width = 64;
  int heads = 4;
  int context = 64;
  int64_t num_classes = 256;   // vocabulary or classes, from the data set
  bool language_model = true;  // x is int64 [B, T] (else float images)
  // Images: the shape of one example, {C, H, W}; empty = {1, 28, 28}.
  std::vector<int64_t> input_shape;
};

// InvalidArgument naming the flag for an unknown model, a model that does not
// fit the data (e.g. `gpt` on images), or a bad shape; NotFound /
// InvalidArgument naming the file for an unreadable TorchScript file.
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelOptions& opts);

// The number of parameters CreateModel(opts) builds for mlp, cnn and gpt,
// computed without building the model (so a model too large for memory can
// be refused before it is allocated); -1 for a TorchScript model or options
// CreateModel refuses.
int64_t BuiltInParameterCount(const ModelOptions& opts);

}  // namespace starling

#endif  // STARLING_CORE_MODEL_H_
