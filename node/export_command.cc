#include "node/export_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/trainer.h"
#include "node/run_output.h"
#include "node/sim_events.h"

ABSL_FLAG(std::string, from, "",
          "export: what to export: a run directory of `starling train`, "
          "`starling node` or `starling sim` (its members must agree), or a "
          "checkpoint file (RUN/checkpoint.ckpt)");
ABSL_FLAG(bool, allow_apart, false,
          "export: export a node whose summary.json says its model is not "
          "the swarm's final one (model_is_swarms: false)");
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, model);

namespace starling {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

int Fail(const absl::Status& s, int code) {
  WriteStderrLine(absl::StrCat("starling export: error: ", s.message()));
  return code;
}

// --out must name a file in a directory this process can write, checked
// with a probe file before any work.
absl::Status CheckOut(const std::string& out) {
  if (out.empty()) {
    return absl::InvalidArgumentError(
        "--out: name the file to write, e.g. --out=model.pt");
  }
  struct stat st;
  if (stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out=", out, " is a directory; name the file to write in it"));
  }
  std::string dir = std::filesystem::path(out).parent_path().string();
  if (dir.empty()) dir = ".";
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out=", out, ": directory ", dir, " does not exist"));
  }
  const std::string probe =
      absl::StrCat(dir, "/.starling-export-probe-", getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out=", out, ": cannot write in ", dir, ": ", std::strerror(errno)));
  }
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

// A summary.json's final figures ("final"), or an empty Struct.
const Struct& FinalOf(const Struct& summary) {
  return FieldOf(summary, "final").struct_value();
}

// False only where the summary says so: a node that knows its model is not
// the swarm's final one.
bool ModelIsSwarms(const Struct& summary) {
  for (const Struct* s : {&summary, &FinalOf(summary)}) {
    const Value& v = FieldOf(*s, "model_is_swarms");
    if (v.kind_case() == Value::kBoolValue && !v.bool_value()) return false;
  }
  return true;
}

double ValLossOf(const Struct& summary) {
  const Value& v = FieldOf(FinalOf(summary), "val_loss");
  return v.kind_case() == Value::kNumberValue ? v.number_value() : NAN;
}

absl::StatusOr<ExportSource> FromRunDir(const std::string& from,
                                        bool allow_apart) {
  ExportSource src;
  src.checkpoint = CheckpointPathInRunDir(from);
  src.summary_val_loss = NAN;
  const std::string summary_path = from + "/summary.json";
  // None: a run still going, or one that crashed. One that cannot be read
  // may hide model_is_swarms: false, so it stops the export.
  if (!FileExists(summary_path)) return src;
  absl::StatusOr<Struct> summary = ReadJsonFile(summary_path);
  if (!summary.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from=", from, ": cannot read ", summary_path, ": ",
                     summary.status().message()));
  }
  if (!ModelIsSwarms(*summary) && !allow_apart) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--from=", from,
        ": this node's summary.json says its model is not the swarm's final "
        "one (model_is_swarms: false); export a member that holds the "
        "swarm's model, or this one anyway with --allow_apart"));
  }
  const Struct& fin = FinalOf(*summary);
  // An interrupted node's summary hashes its own model, which may hold
  // back an error-feedback residual; its checkpoint holds θ_global.
  if (!FieldOf(fin, "interrupted").bool_value()) {
    src.summary_hash = FieldOf(fin, "model_hash").string_value();
    src.summary_val_loss = ValLossOf(*summary);
  }
  return src;
}

// A sim member's run directory and what its summary.json says.
struct Member {
  std::string id;
  bool finished = false;  // it has a summary, and was not interrupted
  double steps = 0;
  std::string hash;
  bool apart = false;  // model_is_swarms: false
};

absl::StatusOr<ExportSource> FromSim(const std::string& from,
                                     const std::vector<std::string>& ids) {
  std::vector<Member> members;
  double max_steps = 0;
  for (const std::string& id : ids) {
    Member m;
    m.id = id;
    absl::StatusOr<Struct> s =
        ReadJsonFile(absl::StrCat(from, "/", id, "/summary.json"));
    if (s.ok()) {
      const Struct& fin = FinalOf(*s);
      m.finished = !FieldOf(fin, "interrupted").bool_value();
      m.steps = FieldOf(fin, "inner_steps").number_value();
      m.hash = FieldOf(fin, "model_hash").string_value();
      m.apart = !ModelIsSwarms(*s);
      if (m.finished) max_steps = std::max(max_steps, m.steps);
    }
    members.push_back(m);
  }
  // The final model: that of the members that ran to the end with the
  // swarm, which must all hold the same one.
  std::map<std::string, std::vector<std::string>> by_hash;
  const Member* chosen = nullptr;
  for (const Member& m : members) {
    if (!m.finished || m.steps != max_steps || m.apart || m.hash.empty()) {
      continue;
    }
    by_hash[m.hash].push_back(m.id);
    if (chosen == nullptr) chosen = &m;
  }
  const std::string one = absl::StrCat(from, "/", ids.front());
  if (chosen == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--from=", from,
        ": no member of this sim finished the run (no summary.json of a "
        "member that ran to the end); export one member's checkpoint, e.g. "
        "--from=",
        one));
  }
  if (by_hash.size() > 1) {
    std::vector<std::string> groups;
    for (const auto& [hash, who] : by_hash) {
      groups.push_back(absl::StrCat(absl::StrJoin(who, ", "), " on model ",
                                    hash.substr(0, 8)));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "--from=", from, ": the sim's members ended on different models (",
        absl::StrJoin(groups, "; "),
        "); export one member's checkpoint, e.g. --from=", one));
  }
  ExportSource src;
  src.member = chosen->id;
  src.checkpoint = CheckpointPathInRunDir(absl::StrCat(from, "/", chosen->id));
  src.summary_hash = chosen->hash;
  // The loss the sim reported for its final model.
  absl::StatusOr<Struct> merged = ReadJsonFile(from + "/summary.json");
  src.summary_val_loss = merged.ok() ? ValLossOf(*merged) : NAN;
  return src;
}

}  // namespace

absl::StatusOr<ExportSource> ResolveExportSource(const std::string& from,
                                                 bool allow_apart) {
  struct stat st;
  if (stat(from.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from=", from, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    if (access(from.c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--from=", from, ": ", std::strerror(errno)));
    }
    ExportSource src;
    src.checkpoint = from;
    src.summary_val_loss = NAN;
    return src;
  }
  if (FileExists(CheckpointPathInRunDir(from))) {
    return FromRunDir(from, allow_apart);
  }
  // A sim's run directory: one directory per member, each with its own.
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(from, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(ec) &&
        FileExists(CheckpointPathInRunDir(entry.path().string()))) {
      ids.push_back(name);
    }
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from=", from, ": ", ec.message()));
  }
  if (ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--from=", from,
        ": no checkpoint.ckpt in this directory (a train or node run's) nor "
        "in its subdirectories (a sim's members); name a run directory or a "
        "checkpoint file"));
  }
  std::sort(ids.begin(), ids.end());
  return FromSim(from, ids);
}

const Subcommand& ExportSubcommand() {
  static const Subcommand* sub = new Subcommand{
      "export",
      "write a trained model for PyTorch (TorchScript file or state_dict)",
      "Writes the model a run trained, θ_global of its last committed round "
      "with its buffers (BatchNorm's statistics), as PyTorch reads it. "
      "--from is a run directory of train, node or sim, or a checkpoint "
      "file; from a sim, the members that finished must hold the same model "
      "(export one member's directory otherwise). The model is rebuilt from "
      "the run's settings, so the run's data and TorchScript file must be "
      "where the run found them (run export from the same directory, or "
      "name a TorchScript file that moved with --model). It is evaluated on "
      "the run's validation set, and its val_loss printed.\n"
      "  TorchScript runs (--model=torchscript:PATH) come back as a "
      "TorchScript file:\n"
      "    model = torch.jit.load(\"model.pt\")\n"
      "  built-in models (gpt, cnn, mlp) as a state_dict, for the classes in "
      "python/starling_models.py:\n"
      "    model = starling_models.build(ARCHITECTURE)  # printed by export\n"
      "    model.load_state_dict(torch.load(\"model.pt\"))\n"
      "Exit codes: 0 written, 2 bad flags or input (named), 1 the write "
      "failed. Prints a JSON summary on stdout.\n"
      "example:\n"
      "  starling export --from=runs/sim --out=model.pt",
      {"from", "out", "model", "allow_apart"},
      "",
      {},
      {{"out", "the file to write (its directory must exist)"},
       {"model",
        "torchscript:PATH: the run's TorchScript file where it is now, when "
        "it moved (it must be the same model: code, names and shapes); "
        "empty = where the run found it"}}};
  return *sub;
}

namespace {

// The run's settings from the checkpoint, made to rebuild its model here:
// on the CPU, with --model's file when given.
absl::StatusOr<TrainConfig> ConfigOf(const std::string& path,
                                     const std::string& model) {
  STARLING_ASSIGN_OR_RETURN(Checkpoint ckpt, ReadCheckpoint(path));
  TrainerState st;
  auto it = ckpt.sections.find("trainer_state");
  if (it == ckpt.sections.end() && ckpt.sections.count("user_state")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", path,
        " was written by the Python module (starling.DiLoCo or "
        "starling.Gossip): its model is the Python program's, with no "
        "trainer state to rebuild it from; resume it with the same class "
        "(..., out=DIR, resume=True)"));
  }
  if (it == ckpt.sections.end() || !st.ParseFromString(it->second)) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", path, " holds no trainer state: not a Starling run's"));
  }
  TrainConfig config = st.config();
  config.set_device("cpu");
  config.set_resume(false);
  if (!model.empty()) {
    if (!absl::StartsWith(model, "torchscript:") ||
        !absl::StartsWith(config.model(), "torchscript:")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model=", model,
          ": export takes --model only to name the run's TorchScript file "
          "where it is now; the run's model is --model=",
          config.model()));
    }
    config.set_model(model);
  }
  return config;
}

void PrintResult(const ExportSource& src, const std::string& out,
                 Trainer& trainer, const std::string& hash,
                 const EvalResult& eval) {
  Model& model = trainer.model();
  const std::string arch = model.Architecture();
  const bool torchscript =
      absl::StartsWith(trainer.config().model(), "torchscript:");
  WriteStderrLine(absl::StrFormat(
      "exported %s (%d parameters, %d buffer values, model %s) from %s%s to "
      "%s",
      arch, NumElements(model.Parameters()), NumElements(model.Buffers()),
      hash.substr(0, 8), src.checkpoint,
      src.member.empty() ? "" : absl::StrCat(" (member ", src.member, ")"),
      out));
  WriteStderrLine(absl::StrFormat(
      "val_loss %.6f on the run's validation set%s", eval.loss,
      std::isnan(src.summary_val_loss)
          ? ""
          : absl::StrFormat(" (the run reported %.6f)", src.summary_val_loss)));
  WriteStderrLine(
      torchscript ? absl::StrCat("load it: model = torch.jit.load(",
                                 JsonQuote(out), ")")
                  : absl::StrCat("load it (python/starling_models.py): model = "
                                 "starling_models.build(",
                                 JsonQuote(arch),
                                 "); model.load_state_dict(torch.load(",
                                 JsonQuote(out), "))"));
  JsonObject json;
  json.Add("out", out)
      .Add("format", torchscript ? "torchscript" : "state_dict")
      .Add("architecture", arch)
      .Add("checkpoint", src.checkpoint)
      .Add("member", src.member)
      .Add("model_hash", hash)
      .Add("parameters", NumElements(model.Parameters()))
      .Add("buffers", NumElements(model.Buffers()))
      .Add("val_loss", eval.loss);
  if (eval.accuracy >= 0) json.Add("val_accuracy", eval.accuracy);
  std::printf("%s\n", json.Dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int RunExportCommand() {
  const std::string from = absl::GetFlag(FLAGS_from);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (from.empty()) {
    return Fail(absl::InvalidArgumentError(
                    "--from: name a run directory or a checkpoint file"),
                2);
  }
  if (absl::Status s = CheckOut(out); !s.ok()) return Fail(s, 2);
  absl::StatusOr<ExportSource> src =
      ResolveExportSource(from, absl::GetFlag(FLAGS_allow_apart));
  if (!src.ok()) return Fail(src.status(), 2);
  absl::StatusOr<TrainConfig> config =
      ConfigOf(src->checkpoint, absl::GetFlag(FLAGS_model));
  if (!config.ok()) return Fail(config.status(), 2);
  if (config->threads() > 0) torch::set_num_threads(config->threads());
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(*config, /*check_memory=*/false);
  if (!trainer.ok()) {
    const bool torchscript = absl::StartsWith(config->model(), "torchscript:");
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "rebuilding the model of ", src->checkpoint,
                    " from its run's settings: ", trainer.status().message(),
                    torchscript ? "; name a TorchScript file that moved with "
                                  "--model=torchscript:PATH"
                                : "")),
                2);
  }
  Trainer& t = **trainer;
  if (absl::Status s = t.RestoreCheckpoint(src->checkpoint); !s.ok()) {
    return Fail(s, 2);
  }
  const std::string hash =
      ModelHash(t.model().Parameters(), t.model().Buffers());
  if (!src->summary_hash.empty() && hash != src->summary_hash) {
    const std::string why =
        absl::StrCat(src->checkpoint, " holds model ", hash.substr(0, 8),
                     ", not the final model ", src->summary_hash.substr(0, 8),
                     " that its summary.json reports");
    if (!src->member.empty()) {
      return Fail(absl::FailedPreconditionError(
                      absl::StrCat("--from=", from, ": ", why)),
                  2);
    }
    STARLING_LOG(WARNING) << why;
  }
  absl::StatusOr<EvalResult> eval = t.Evaluate();
  if (!eval.ok()) return Fail(eval.status(), 1);
  if (absl::Status s = t.model().Export(out); !s.ok()) return Fail(s, 1);
  PrintResult(*src, out, t, hash, *eval);
  return 0;
}

}  // namespace starling
