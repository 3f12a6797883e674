// EmbeddedDiloco's checkpoints (embedded_diloco.h says what they hold):
// written and read with core/checkpoint.h and core/tensor_stream.h, the
// node's own format and section names.
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/checkpoint.h"
#include "core/flat_params.h"
#include "core/model.h"
#include "core/status.h"
#include "core/tensor_stream.h"
#include "node/embedded_diloco.h"

namespace starling {
namespace {

// The node's section names (core/trainer.cc writes the same).
constexpr char kModelTensors[] = "model_tensors";
constexpr char kTensorSignature[] = "tensor_signature";

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

// Each tensor of `like` as a new tensor of its dtype and shape holding the
// matching values of `flat` (Unflatten's conversion).
absl::StatusOr<std::vector<torch::Tensor>> Shaped(
    const std::vector<float>& flat, const std::vector<torch::Tensor>& like) {
  std::vector<torch::Tensor> out;
  out.reserve(like.size());
  for (const torch::Tensor& t : like) out.push_back(torch::empty_like(t));
  STARLING_RETURN_IF_ERROR(Unflatten(flat, out));
  return out;
}

}  // namespace

absl::Status EmbeddedDiloco::Checkpoint(const std::string& user_state) {
  if (!checkpoints()) {
    return absl::FailedPreconditionError(
        "no --out: name a run directory to checkpoint into");
  }
  const std::string path = CheckpointPathInRunDir(config_.train.out());
  STARLING_ASSIGN_OR_RETURN(std::vector<torch::Tensor> theta,
                            Shaped(theta_global_, model_.params));
  STARLING_ASSIGN_OR_RETURN(std::vector<torch::Tensor> buffers,
                            Shaped(buffers_global_, model_.buffers));
  NamedTensors named;
  for (size_t i = 0; i < theta.size(); ++i) {
    named.emplace_back(absl::StrCat("param.", i), theta[i]);
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    named.emplace_back(absl::StrCat("buffer.", i), buffers[i]);
  }
  CheckpointSections sections;
  STARLING_ASSIGN_OR_RETURN(CheckpointSection tensors,
                            TensorsSection(std::move(named)));
  sections.emplace(kModelTensors, std::move(tensors));
  sections.emplace("architecture", architecture_);
  sections.emplace(
      kTensorSignature,
      absl::StrJoin(SignatureLines(model_.param_names, model_.params,
                                   model_.buffer_names, model_.buffers),
                    "\n"));
  sections.emplace("round", absl::StrCat(round_));
  sections.emplace("member_rounds", absl::StrCat(member_rounds_));
  sections.emplace("step", absl::StrCat(step_));
  sections.emplace("lineage", lineage_);
  sections.emplace("outer", outer_->SaveState());
  if (feedback_) sections.emplace("error_feedback", feedback_->SaveState());
  sections.emplace("buffers_global", FloatBytes(buffers_global_));
  sections.emplace("user_state", user_state);
  const absl::Time start = absl::Now();
  STARLING_RETURN_IF_ERROR(WriteCheckpoint(path, sections));
  if (ops_.metrics) {
    ops_.metrics->Checkpoint(absl::ToDoubleSeconds(absl::Now() - start),
                             absl::Now());
  }
  return absl::OkStatus();
}

absl::Status EmbeddedDiloco::Restore() {
  const std::string path = CheckpointPathInRunDir(config_.train.out());
  STARLING_ASSIGN_OR_RETURN(CheckpointReader reader,
                            CheckpointReader::Open(path));
  if (reader.Has("trainer_state") && !reader.Has("lineage")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--resume: checkpoint ", path,
        " is a starling node's (it has a trainer_state section): resume it "
        "with starling node --resume; the Python module resumes only its "
        "own checkpoints"));
  }
  for (const char* name : {"architecture", kModelTensors, "round", "step",
                           "outer", "lineage", "buffers_global"}) {
    if (!reader.Has(name)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, " has no '", name, "' section"));
    }
  }
  if (feedback_ && !reader.Has("error_feedback")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--resume: checkpoint ", path,
        " holds no error-feedback residual, but this run's --compression "
        "keeps one (--error_feedback)"));
  }
  // The same model, named by its first tensor that differs.
  STARLING_ASSIGN_OR_RETURN(std::string was, reader.ReadString("architecture"));
  if (was != architecture_) {
    std::string first;
    if (reader.Has(kTensorSignature)) {
      STARLING_ASSIGN_OR_RETURN(std::string lines,
                                reader.ReadString(kTensorSignature));
      first = SignatureDifference(
          absl::StrSplit(lines, '\n', absl::SkipEmpty()), "the checkpoint",
          SignatureLines(model_.param_names, model_.params, model_.buffer_names,
                         model_.buffers),
          "this run's model");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("--resume: checkpoint ", path, " holds model ", was,
                     " but this run's model is ", architecture_,
                     first.empty() ? "" : absl::StrCat(" (", first, ")")));
  }
  std::vector<torch::Tensor> theta;
  for (const torch::Tensor& p : model_.params) {
    theta.push_back(torch::empty_like(p));
  }
  auto into = [&](const TensorHeader& h) -> absl::StatusOr<torch::Tensor> {
    for (size_t i = 0; i < theta.size(); ++i) {
      if (h.name == absl::StrCat("param.", i)) return theta[i];
    }
    for (size_t i = 0; i < model_.buffers.size(); ++i) {
      if (h.name == absl::StrCat("buffer.", i)) return model_.buffers[i];
    }
    return absl::DataLossError(
        absl::StrCat("tensor ", h.name, " is not in this model"));
  };
  STARLING_ASSIGN_OR_RETURN(SectionReader in, reader.Section(kModelTensors));
  if (absl::Status s = ReadTensors(in, into); !s.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " section ",
                                            kModelTensors, ": ", s.message()));
  }
  theta_global_ = Flatten(theta);
  // The buffers' exact mean: model_tensors holds integer buffers rounded.
  buffers_global_.assign(NumElements(model_.buffers), 0.0f);
  STARLING_ASSIGN_OR_RETURN(std::string bytes,
                            reader.ReadString("buffers_global"));
  if (bytes.size() != buffers_global_.size() * sizeof(float)) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", path, " section buffers_global holds ", bytes.size(),
        " bytes, not the ", buffers_global_.size(), " floats of the model"));
  }
  std::memcpy(buffers_global_.data(), bytes.data(), bytes.size());
  STARLING_ASSIGN_OR_RETURN(std::string outer, reader.ReadString("outer"));
  STARLING_RETURN_IF_ERROR(outer_->LoadState(outer));
  if (feedback_) {
    STARLING_ASSIGN_OR_RETURN(std::string ef,
                              reader.ReadString("error_feedback"));
    STARLING_RETURN_IF_ERROR(feedback_->LoadState(ef));
  }
  auto integer = [&](const char* name, int64_t* v) -> absl::Status {
    if (!reader.Has(name)) return absl::OkStatus();
    STARLING_ASSIGN_OR_RETURN(std::string text, reader.ReadString(name));
    if (!absl::SimpleAtoi(text, v) || *v < 0) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path, " section ",
                                              name, ": not a count: ", text));
    }
    return absl::OkStatus();
  };
  STARLING_RETURN_IF_ERROR(integer("round", &round_));
  STARLING_RETURN_IF_ERROR(integer("step", &step_));
  STARLING_RETURN_IF_ERROR(integer("member_rounds", &member_rounds_));
  member_rounds_ = std::min(member_rounds_, kMaxMemberRounds);
  lineage_ = FlatHash(theta_global_, buffers_global_);
  STARLING_ASSIGN_OR_RETURN(std::string saved, reader.ReadString("lineage"));
  if (saved != lineage_) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": its model hashes to ", lineage_,
                     ", not to the ", saved, " it was written with"));
  }
  if (reader.Has("user_state")) {
    STARLING_ASSIGN_OR_RETURN(user_state_, reader.ReadString("user_state"));
  }
  return LoadModel();
}

}  // namespace starling
