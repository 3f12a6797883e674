#include "node/run_output.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <torch/utils.h>
#include <unistd.h>

#include <atomic>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/logging.h"
#include "core/status.h"

namespace starling {

EventLog::EventLog(std::string path, std::string node_id, double wall_offset)
    : path_(std::move(path)),
      node_id_(std::move(node_id)),
      start_(std::chrono::steady_clock::now()),
      wall_offset_(wall_offset) {}

double EventLog::WallSeconds() const {
  return wall_offset_ + std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - start_)
                            .count();
}

void EventLog::Write(absl::string_view event, const JsonObject& fields) {
  JsonObject line;
  line.Add("event", event)
      .Add("node", node_id_)
      .Add("time", absl::FormatTime(absl::RFC3339_full, absl::Now(),
                                    absl::UTCTimeZone()))
      .Add("wall_seconds", WallSeconds());
  line.Merge(fields);
  absl::Status st = AppendLine(path_, line.Dump());
  if (!st.ok() && !warned_) {
    STARLING_LOG(WARNING) << "cannot write events: " << st.message();
    warned_ = true;
  }
}

void LogDrift(EventLog& events, const Trainer& trainer, const StepResult& r) {
  if (!r.drifted) return;
  const int64_t step = trainer.drift().step;
  events.Write(
      "drift",
      JsonObject().Add("step", step).Add("region", static_cast<int64_t>(1)));
  STARLING_LOG(INFO) << "data drift at inner step " << step
                     << ": training and validating on the second data region "
                        "from now on";
}

std::string ConfigJson(const TrainConfig& config) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(config, &json, opts).ok()) {
    return "{}";
  }
  return json;
}

JsonObject RoundJson(const RoundRecord& r) {
  JsonArray members;
  for (const std::string& m : r.members) members.Push(m);
  JsonObject o;
  o.Add("round", r.round)
      .Add("step", static_cast<int64_t>(r.step))
      .Add("members", members)
      .Add("model_hash", r.model_hash)
      .Add("train_loss", r.train_loss);
  if (r.val_loss >= 0) {
    o.Add("val_loss", r.val_loss);
  } else {
    o.AddNull("val_loss");
  }
  o.Add("bytes", r.bytes).Add("seconds", r.seconds);
  if (r.inner_steps > 0) {
    o.Add("inner_steps", static_cast<int64_t>(r.inner_steps));
  }
  if (r.early) o.Add("early", true);
  if (r.sync_seconds >= 0) o.Add("sync_seconds", r.sync_seconds);
  if (r.inner_seconds >= 0) o.Add("inner_seconds", r.inner_seconds);
  if (r.copy_seconds >= 0) o.Add("copy_seconds", r.copy_seconds);
  if (r.outer_seconds >= 0) o.Add("outer_seconds", r.outer_seconds);
  if (r.overlapped) o.Add("overlapped", true);
  if (r.residual_flush) o.Add("residual_flush", true);
  return o;
}

std::optional<JsonObject> RoundTimeSplit(
    const std::vector<RoundRecord>& rounds) {
  double inner = 0, copy = 0, exchange = 0, outer = 0;
  int64_t n = 0;
  for (const RoundRecord& r : rounds) {
    if (r.inner_seconds < 0 || r.copy_seconds < 0 || r.outer_seconds < 0 ||
        r.sync_seconds < 0 || r.residual_flush) {
      continue;
    }
    inner += r.inner_seconds;
    copy += r.copy_seconds;
    exchange += r.sync_seconds;
    outer += r.outer_seconds;
    ++n;
  }
  if (n == 0) return std::nullopt;
  return JsonObject()
      .Add("rounds", n)
      .Add("inner_seconds", inner / n)
      .Add("copy_seconds", copy / n)
      .Add("exchange_seconds", exchange / n)
      .Add("outer_seconds", outer / n);
}

std::vector<RoundRecord> ReadRoundEvents(const std::string& path,
                                         int64_t before_round) {
  std::vector<RoundRecord> out;
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return out;
  for (absl::string_view line :
       absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
    google::protobuf::Struct ev;
    if (!google::protobuf::util::JsonStringToMessage(std::string(line), &ev)
             .ok()) {
      continue;
    }
    auto get = [&](const char* key) -> const google::protobuf::Value& {
      static const google::protobuf::Value* null = new google::protobuf::Value;
      auto it = ev.fields().find(key);
      return it == ev.fields().end() ? *null : it->second;
    };
    if (get("event").string_value() != "round") continue;
    RoundRecord r;
    r.round = static_cast<int64_t>(get("round").number_value());
    if (r.round >= before_round) continue;
    r.step = static_cast<int>(get("step").number_value());
    for (const auto& m : get("members").list_value().values()) {
      r.members.push_back(m.kind_case() == google::protobuf::Value::kStringValue
                              ? m.string_value()
                              : absl::StrCat("n", m.number_value()));
    }
    r.model_hash = get("model_hash").string_value();
    r.train_loss = get("train_loss").number_value();
    r.val_loss =
        get("val_loss").kind_case() == google::protobuf::Value::kNumberValue
            ? get("val_loss").number_value()
            : -1;
    r.bytes = static_cast<int64_t>(get("bytes").number_value());
    r.seconds = get("seconds").number_value();
    r.residual_flush = get("residual_flush").bool_value();
    // A crash after a round's event but before its checkpoint logs the round
    // twice; keep the last.
    while (!out.empty() && out.back().round >= r.round) out.pop_back();
    out.push_back(r);
  }
  return out;
}

absl::Status WriteNodeSummary(const std::string& out_dir,
                              absl::string_view command, Trainer& trainer,
                              const EvalResult& eval, const NodeTotals& totals,
                              const std::vector<RoundRecord>& rounds,
                              bool interrupted, const JsonObject& extra,
                              const JsonObject& final_extra) {
  const TrainerState& st = trainer.state();
  std::vector<torch::Tensor> params = trainer.Parameters();
  // Buffers too: members that agree on the weights but not on BatchNorm's
  // statistics hold different models.
  const std::string hash = ModelHash(params, trainer.model().Buffers());
  const double compute = st.compute_seconds();
  const double wall = totals.wall_seconds;
  JsonObject node;
  node.Add("id", totals.id)
      .Add("device", trainer.device().str())
      .Add("inner_steps", static_cast<int64_t>(st.step()))
      .Add("samples", st.samples())
      .Add("tokens", st.tokens())
      .Add("bytes_sent", totals.bytes_sent)
      .Add("bytes_received", totals.bytes_received)
      .Add("compute_seconds", compute)
      .Add("wall_seconds", wall)
      .Add("tokens_per_second", compute > 0 ? st.tokens() / compute : 0.0)
      .Add("model_hash", hash);
  node.Add("precision", trainer.config().precision());
  if (const DeviceMemory gpu = trainer.PeakMemory();
      gpu.peak_allocated_bytes >= 0) {
    node.Add("gpu_peak_allocated_bytes", gpu.peak_allocated_bytes)
        .Add("gpu_peak_reserved_bytes", gpu.peak_reserved_bytes);
  }
  if (std::optional<JsonObject> split = RoundTimeSplit(rounds)) {
    node.Add("round_time_split", *split);
  }
  if (!totals.compression.empty()) {
    node.Add("compression", totals.compression)
        .Add("bytes_before_compression", totals.bytes_before_compression)
        .Add("bytes_after_compression", totals.bytes_after_compression);
  }
  JsonObject final_obj;
  if (eval.examples > 0) {
    final_obj.Add("val_loss", eval.loss);
  } else {
    final_obj.AddNull("val_loss");
  }
  if (eval.accuracy >= 0) final_obj.Add("val_accuracy", eval.accuracy);
  final_obj.Add("train_loss", st.last_train_loss())
      .Add("inner_steps", static_cast<int64_t>(st.step()))
      .Add("total_bytes", totals.bytes_sent)
      .Add("allreduce_equivalent_bytes", totals.allreduce_equivalent_bytes);
  if (totals.bytes_sent > 0) {
    final_obj.Add("comm_reduction",
                  static_cast<double>(totals.allreduce_equivalent_bytes) /
                      totals.bytes_sent);
  } else {
    // Nothing was sent (a single node): the ratio is undefined.
    final_obj.AddNull("comm_reduction");
  }
  final_obj.Add("utilization", wall > 0 ? compute / wall : 0.0)
      .Add("model_hash", hash)
      .Add("interrupted", interrupted)
      .Merge(final_extra);
  JsonObject model;
  model.Add("architecture", trainer.model().Architecture())
      .Add("parameters", NumElements(params));
  JsonArray round_list;
  for (const RoundRecord& r : rounds) round_list.Push(RoundJson(r));
  JsonObject summary;
  summary.Add("command", command)
      .AddRaw("config", ConfigJson(trainer.config()))
      .Add("model", model)
      .Add("data", trainer.dataset().Describe())
      .Add("nodes", JsonArray().Push(node))
      .Add("rounds", round_list)
      .Add("final", final_obj)
      .Merge(extra);
  return WriteFileAtomic(absl::StrCat(out_dir, "/summary.json"),
                         summary.Dump() + "\n");
}

namespace {
std::atomic<int> g_stop_signal{0};
std::atomic<int> g_stop_count{0};
void OnStopSignal(int sig) {
  g_stop_signal.store(sig);
  g_stop_count.fetch_add(1);
}
}  // namespace

void InstallStopSignals() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int StopSignal() { return g_stop_signal.load(); }

int StopSignalCount() { return g_stop_count.load(); }

int ExitCodeFor(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsNotFound(s) ||
                 absl::IsFailedPrecondition(s) || absl::IsOutOfRange(s)
             ? 2
             : 1;
}

absl::Status CheckOutWritable(const std::string& out) {
  absl::Status s = CheckDirWritable(out);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat(
      "--out=", out, ": the run directory is not writable (", s.message(),
      "); choose a directory this user can write, or fix its permissions"));
}

absl::Status PrepareRunDir(TrainConfig* config, absl::string_view command) {
  if (config->out().empty()) {
    if (config->resume()) {
      return absl::InvalidArgumentError(
          "--resume needs --out=DIR naming the run to continue");
    }
    config->set_out(absl::StrCat(
        "runs/", command, "-",
        absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone())));
  }
  const std::string ckpt = CheckpointPathInRunDir(config->out());
  if (config->resume() && !FileExists(ckpt)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--resume: no checkpoint at ", ckpt));
  }
  if (!config->resume() && FileExists(ckpt)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out=", config->out(), " already holds a run (", ckpt,
        "); pass --resume to continue it, or choose another --out"));
  }
  return CheckOutWritable(config->out());
}

absl::StatusOr<std::unique_ptr<Trainer>> StartRun(TrainConfig* config,
                                                  absl::string_view command) {
  const bool existed = !config->out().empty() && FileExists(config->out());
  STARLING_RETURN_IF_ERROR(PrepareRunDir(config, command));
  if (config->threads() > 0) torch::set_num_threads(config->threads());
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(*config);
  // A run that could not start (bad --data, --model ...) leaves no empty
  // run directory behind; rmdir(2) removes it only while it is empty.
  if (!trainer.ok() && !existed) (void)::rmdir(config->out().c_str());
  return trainer;
}

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int s = static_cast<int>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

}  // namespace starling
