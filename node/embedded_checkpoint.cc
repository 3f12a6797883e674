// The Python module's checkpoints: the shared part (embedded_checkpoint.h)
// EmbeddedDiloco's and EmbeddedGossip's (their headers say what they hold).
#include "node/embedded_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/flat_params.h"
#include "core/model.h"
#include "core/status.h"
#include "core/tensor_stream.h"
#include "gossip/push_sum.h"
#include "node/embedded_gossip.h"

namespace starling {
namespace {

// The node's section names (core/trainer.cc writes the same).
constexpr char kModelTensors[] = "model_tensors";
constexpr char kTensorSignature[] = "tensor_signature";

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

std::vector<std::string> Signature(const EmbeddedModel& model) {
  return SignatureLines(model.param_names, model.params, model.buffer_names,
                        model.buffers);
}

}  // namespace

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

absl::Status CheckCheckpointOut(const std::string& out) {
  if (!out.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "no --out: name a run directory to checkpoint into");
}

absl::StatusOr<CheckpointSections> EmbeddedModelSections(
    const EmbeddedModel& model, const std::string& architecture,
    const std::vector<float>& params, const std::vector<float>& buffers) {
  STARLING_ASSIGN_OR_RETURN(std::vector<torch::Tensor> theta,
                            Shaped(params, model.params));
  STARLING_ASSIGN_OR_RETURN(std::vector<torch::Tensor> bufs,
                            Shaped(buffers, model.buffers));
  NamedTensors named;
  for (size_t i = 0; i < theta.size(); ++i) {
    named.emplace_back(absl::StrCat("param.", i), theta[i]);
  }
  for (size_t i = 0; i < bufs.size(); ++i) {
    named.emplace_back(absl::StrCat("buffer.", i), bufs[i]);
  }
  CheckpointSections sections;
  STARLING_ASSIGN_OR_RETURN(CheckpointSection tensors,
                            TensorsSection(std::move(named)));
  sections.emplace(kModelTensors, std::move(tensors));
  sections.emplace("architecture", architecture);
  sections.emplace(kTensorSignature, absl::StrJoin(Signature(model), "\n"));
  return sections;
}

absl::Status WriteEmbeddedCheckpoint(const std::string& path,
                                     const CheckpointSections& sections,
                                     NodeMetrics* metrics) {
  const absl::Time start = absl::Now();
  STARLING_RETURN_IF_ERROR(WriteCheckpoint(path, sections));
  if (metrics != nullptr) {
    metrics->Checkpoint(absl::ToDoubleSeconds(absl::Now() - start),
                        absl::Now());
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointReader> OpenEmbeddedCheckpoint(
    const std::string& path, EmbeddedKind kind,
    const std::vector<const char*>& required) {
  STARLING_ASSIGN_OR_RETURN(CheckpointReader reader,
                            CheckpointReader::Open(path));
  const char* who = "";
  if (reader.Has("trainer_state")) {
    who =
        "a starling node's (it has a trainer_state section): resume it "
        "with starling node --resume";
  } else if (kind != EmbeddedKind::kGossip && reader.Has("gossip_weight")) {
    who = "a starling.Gossip member's: resume it with starling.Gossip";
  } else if (kind != EmbeddedKind::kDiloco && reader.Has("lineage")) {
    who = "a starling.DiLoCo member's: resume it with starling.DiLoCo";
  }
  if (*who != '\0') {
    return absl::FailedPreconditionError(
        absl::StrCat("--resume: checkpoint ", path, " is ", who));
  }
  std::vector<const char*> all = {"architecture", kModelTensors};
  all.insert(all.end(), required.begin(), required.end());
  for (const char* name : all) {
    if (!reader.Has(name)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, " has no '", name, "' section"));
    }
  }
  return reader;
}

absl::StatusOr<std::vector<float>> ReadEmbeddedModel(
    const CheckpointReader& reader, const std::string& architecture,
    EmbeddedModel& model) {
  const std::string& path = reader.path();
  // The same model, named by its first tensor that differs.
  STARLING_ASSIGN_OR_RETURN(std::string was, reader.ReadString("architecture"));
  if (was != architecture) {
    std::string first;
    if (reader.Has(kTensorSignature)) {
      STARLING_ASSIGN_OR_RETURN(std::string lines,
                                reader.ReadString(kTensorSignature));
      first = SignatureDifference(
          absl::StrSplit(lines, '\n', absl::SkipEmpty()), "the checkpoint",
          Signature(model), "this run's model");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("--resume: checkpoint ", path, " holds model ", was,
                     " but this run's model is ", architecture,
                     first.empty() ? "" : absl::StrCat(" (", first, ")")));
  }
  std::vector<torch::Tensor> theta;
  for (const torch::Tensor& p : model.params) {
    theta.push_back(torch::empty_like(p));
  }
  auto into = [&](const TensorHeader& h) -> absl::StatusOr<torch::Tensor> {
    for (size_t i = 0; i < theta.size(); ++i) {
      if (h.name == absl::StrCat("param.", i)) return theta[i];
    }
    for (size_t i = 0; i < model.buffers.size(); ++i) {
      if (h.name == absl::StrCat("buffer.", i)) return model.buffers[i];
    }
    return absl::DataLossError(
        absl::StrCat("tensor ", h.name, " is not in this model"));
  };
  STARLING_ASSIGN_OR_RETURN(SectionReader in, reader.Section(kModelTensors));
  if (absl::Status s = ReadTensors(in, into); !s.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, " section ",
                                            kModelTensors, ": ", s.message()));
  }
  return Flatten(theta);
}

absl::Status ReadCheckpointCount(const CheckpointReader& reader,
                                 const char* name, int64_t* v) {
  if (!reader.Has(name)) return absl::OkStatus();
  STARLING_ASSIGN_OR_RETURN(std::string text, reader.ReadString(name));
  if (!absl::SimpleAtoi(text, v) || *v < 0) {
    return absl::DataLossError(absl::StrCat("checkpoint ", reader.path(),
                                            " section ", name,
                                            ": not a count: ", text));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ReadFloats(const CheckpointReader& reader,
                                              const char* name, size_t n) {
  STARLING_ASSIGN_OR_RETURN(std::string bytes, reader.ReadString(name));
  if (bytes.size() != n * sizeof(float)) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", reader.path(), " section ", name, " holds ",
        bytes.size(), " bytes, not the ", n, " floats of the model"));
  }
  std::vector<float> out(n);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

absl::Status EmbeddedDiloco::Checkpoint(const std::string& user_state) {
  STARLING_RETURN_IF_ERROR(CheckCheckpointOut(config_.train.out()));
  STARLING_ASSIGN_OR_RETURN(
      CheckpointSections sections,
      EmbeddedModelSections(model_, architecture_, theta_global_,
                            buffers_global_));
  sections.emplace("round", absl::StrCat(round_));
  sections.emplace("member_rounds", absl::StrCat(member_rounds_));
  sections.emplace("step", absl::StrCat(step_));
  sections.emplace("lineage", lineage_);
  sections.emplace("outer", outer_->SaveState());
  if (feedback_) sections.emplace("error_feedback", feedback_->SaveState());
  sections.emplace("buffers_global", FloatBytes(buffers_global_));
  sections.emplace("user_state", user_state);
  return WriteEmbeddedCheckpoint(CheckpointPathInRunDir(config_.train.out()),
                                 sections, ops_.metrics.get());
}

absl::Status EmbeddedDiloco::Restore() {
  const std::string path = CheckpointPathInRunDir(config_.train.out());
  STARLING_ASSIGN_OR_RETURN(
      CheckpointReader reader,
      OpenEmbeddedCheckpoint(
          path, EmbeddedKind::kDiloco,
          {"round", "step", "outer", "lineage", "buffers_global"}));
  if (feedback_ && !reader.Has("error_feedback")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--resume: checkpoint ", path,
        " holds no error-feedback residual, but this run's --compression "
        "keeps one (--error_feedback)"));
  }
  STARLING_ASSIGN_OR_RETURN(theta_global_,
                            ReadEmbeddedModel(reader, architecture_, model_));
  // The buffers' exact mean: model_tensors holds integer buffers rounded.
  STARLING_ASSIGN_OR_RETURN(
      buffers_global_,
      ReadFloats(reader, "buffers_global", NumElements(model_.buffers)));
  STARLING_ASSIGN_OR_RETURN(std::string outer, reader.ReadString("outer"));
  STARLING_RETURN_IF_ERROR(outer_->LoadState(outer));
  if (feedback_) {
    STARLING_ASSIGN_OR_RETURN(std::string ef,
                              reader.ReadString("error_feedback"));
    STARLING_RETURN_IF_ERROR(feedback_->LoadState(ef));
  }
  STARLING_RETURN_IF_ERROR(ReadCheckpointCount(reader, "round", &round_));
  STARLING_RETURN_IF_ERROR(ReadCheckpointCount(reader, "step", &step_));
  STARLING_RETURN_IF_ERROR(
      ReadCheckpointCount(reader, "member_rounds", &member_rounds_));
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

absl::Status EmbeddedGossip::Checkpoint(const std::string& user_state) {
  STARLING_RETURN_IF_ERROR(CheckCheckpointOut(config_.train.out()));
  STARLING_ASSIGN_OR_RETURN(
      CheckpointSections sections,
      EmbeddedModelSections(model_, architecture_, period_->y(),
                            Flatten(model_.buffers)));
  sections.emplace("periods", absl::StrCat(periods_));
  sections.emplace("step", absl::StrCat(step_));
  // As the node writes it (node_session.cc): exact in 17 digits.
  sections.emplace("gossip_weight", absl::StrFormat("%.17g", weight()));
  if (period_->slowmo()) {
    sections.emplace("gossip_momentum", FloatBytes(period_->momentum()));
  }
  sections.emplace("model_hash", model_hash());
  sections.emplace("user_state", user_state);
  return WriteEmbeddedCheckpoint(CheckpointPathInRunDir(config_.train.out()),
                                 sections, ops_.metrics.get());
}

absl::Status EmbeddedGossip::Restore() {
  const std::string path = CheckpointPathInRunDir(config_.train.out());
  STARLING_ASSIGN_OR_RETURN(CheckpointReader reader,
                            OpenEmbeddedCheckpoint(path, EmbeddedKind::kGossip,
                                                   {"gossip_weight", "periods",
                                                    "step", "model_hash"}));
  if (period_->slowmo() && !reader.Has("gossip_momentum")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--resume: checkpoint ", path,
        " holds no SlowMo momentum, but this run has --gossip_momentum or "
        "--gossip_outer_lr"));
  }
  STARLING_ASSIGN_OR_RETURN(std::vector<float> y,
                            ReadEmbeddedModel(reader, architecture_, model_));
  STARLING_ASSIGN_OR_RETURN(std::string saved, reader.ReadString("model_hash"));
  if (saved != FlatHash(y)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": its model hashes to ", FlatHash(y),
                     ", not to the ", saved, " it was written with"));
  }
  STARLING_ASSIGN_OR_RETURN(std::string text,
                            reader.ReadString("gossip_weight"));
  double w = 0;
  if (!absl::SimpleAtod(text, &w) || !std::isfinite(w) || w <= 0 ||
      w > kMaxPushWeight) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path,
                     " section gossip_weight: not a push-sum weight "
                     "in (0, ",
                     kMaxPushWeight, "]: ", text));
  }
  STARLING_RETURN_IF_ERROR(ReadCheckpointCount(reader, "periods", &periods_));
  STARLING_RETURN_IF_ERROR(ReadCheckpointCount(reader, "step", &step_));
  period_->Start(y, w);
  if (period_->slowmo()) {
    STARLING_ASSIGN_OR_RETURN(
        std::vector<float> u,
        ReadFloats(reader, "gossip_momentum", static_cast<size_t>(n_params_)));
    STARLING_RETURN_IF_ERROR(period_->RestoreMomentum(std::move(u)));
  }
  if (reader.Has("user_state")) {
    STARLING_ASSIGN_OR_RETURN(user_state_, reader.ReadString("user_state"));
  }
  return Unflatten(y, model_.params);
}

}  // namespace starling
