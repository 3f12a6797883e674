#include "node/train_command.h"

#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/checkpoint.h"
#include "core/file_util.h"
#include "core/flat_params.h"
#include "core/json.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/trainer.h"
#include "node/run_output.h"

// Defaults come from DefaultTrainConfig() so the library and the CLI agree.
ABSL_FLAG(std::string, model, starling::DefaultTrainConfig().model(),
          "mlp | cnn | gpt | torchscript:PATH. Empty = gpt for text data, cnn "
          "for images. mlp and cnn size themselves to the images (C x H x W) "
          "and classes of --data. A TorchScript module's forward(x) must "
          "return logits.");
ABSL_FLAG(int, layers, starling::DefaultTrainConfig().layers(),
          "gpt: number of transformer blocks");
ABSL_FLAG(int, width, starling::DefaultTrainConfig().width(),
          "gpt: embedding width; mlp: hidden width");
ABSL_FLAG(int, heads, starling::DefaultTrainConfig().heads(),
          "gpt: attention heads (must divide --width)");
ABSL_FLAG(int, context, starling::DefaultTrainConfig().context(),
          "text: window length in tokens");
ABSL_FLAG(std::string, data, starling::DefaultTrainConfig().data(),
          "kjv (the King James Bible via `bible`, cached on first use) | "
          "text:PATH (bytes of any file) | tokens:PATH (little-endian "
          "integers, --token_dtype; `starling tokenize` writes them) | fmnist "
          "(Debian's dataset-fashion-mnist) | fmnist:DIR (idx files named as "
          "Fashion-MNIST's, train-* and t10k-*, any image size and class "
          "count) | idx:IMAGES,LABELS (any idx image set: idx3 N x H x W "
          "grayscale or idx4 N x H x W x C channels last, C <= 4, and idx1 "
          "labels; gzipped or not)");
ABSL_FLAG(std::string, val_data, "",
          "a separate validation set of the same kind as --data (text:PATH "
          "or kjv for text, tokens:PATH for tokens, fmnist:DIR (its t10k "
          "files) or idx:IMAGES,LABELS for images); with it all of --data "
          "trains and --val_fraction is not used. Empty = hold out the tail "
          "--val_fraction of --data (fmnist: its test set)");
ABSL_FLAG(std::string, token_dtype,
          starling::DefaultTrainConfig().token_dtype(),
          "tokens:PATH: the file's element type, uint16 or uint32 "
          "(little-endian); uint32 for vocabularies over 65536");
ABSL_FLAG(std::string, shard, starling::DefaultTrainConfig().shard(),
          "K/N: train on shard K (0-based) of N of the training data");
ABSL_FLAG(std::string, shard_mode, starling::DefaultTrainConfig().shard_mode(),
          "iid | contiguous | noniid (fmnist only: split by label)");
ABSL_FLAG(double, val_fraction, starling::DefaultTrainConfig().val_fraction(),
          "text/tokens/idx: fraction held out at the end for validation "
          "(fmnist uses its 10k test set; unused with --val_data)");
ABSL_FLAG(std::string, cache_dir, "",
          "where the kjv corpus is cached; empty = $STARLING_CACHE_DIR, "
          "$XDG_CACHE_HOME/starling or ~/.cache/starling");
ABSL_FLAG(int, vocab, 0, "tokens: vocabulary size; 0 = largest token + 1");
ABSL_FLAG(std::string, optimizer, starling::DefaultTrainConfig().optimizer(),
          "inner optimizer: adamw | adam | sgd");
ABSL_FLAG(double, lr, starling::DefaultTrainConfig().lr(),
          "peak learning rate; 0 = auto (3e-3 text, 1e-3 fmnist)");
ABSL_FLAG(int, warmup, starling::DefaultTrainConfig().warmup(),
          "linear warmup steps before the cosine decay to 0; -1 = auto (50)");
ABSL_FLAG(double, weight_decay, starling::DefaultTrainConfig().weight_decay(),
          "weight decay (decoupled for adamw, L2 for adam and sgd)");
ABSL_FLAG(double, beta1, starling::DefaultTrainConfig().beta1(),
          "adam/adamw beta1");
ABSL_FLAG(double, beta2, starling::DefaultTrainConfig().beta2(),
          "adam/adamw beta2");
ABSL_FLAG(double, momentum, starling::DefaultTrainConfig().momentum(),
          "sgd momentum (0 = plain SGD)");
ABSL_FLAG(double, clip, starling::DefaultTrainConfig().clip(),
          "clip the global gradient norm to this value; 0 = off");
ABSL_FLAG(int, batch, starling::DefaultTrainConfig().batch(),
          "examples per inner step; 0 = auto (16 text windows, 64 images)");
ABSL_FLAG(int, steps, starling::DefaultTrainConfig().steps(),
          "inner steps in the run; 0 = auto (800 text, 1900 fmnist)");
ABSL_FLAG(std::string, device, starling::DefaultTrainConfig().device(),
          "cpu | cuda | cuda:N (cuda needs a CUDA build of LibTorch): where "
          "the model, the inner optimizer and the batches live; DiLoCo's "
          "global weights and outer optimizer stay in host memory");
ABSL_FLAG(std::string, precision, starling::DefaultTrainConfig().precision(),
          "fp32 | bf16: bf16 runs the inner forward and backward passes "
          "under LibTorch's bf16 autocast (on a GPU, or a CPU where its "
          "autocast works: otherwise refused at start); weights, optimizer "
          "state, pseudo-gradients and DiLoCo's global weights stay fp32");
ABSL_FLAG(double, gpu_memory_fraction,
          starling::DefaultTrainConfig().gpu_memory_fraction(),
          "--device=cuda: the share of the GPU's memory this process's CUDA "
          "allocator may hold, in [0, 1], so that several processes can share "
          "one GPU (an allocation past it is an out-of-memory error); 0 = no "
          "cap. `starling sim` gives each of N nodes 0.9/N by default. No "
          "effect with --device=cpu");
ABSL_FLAG(int64_t, memory_limit_mb,
          starling::DefaultTrainConfig().memory_limit_mb(),
          "--device=cpu: the most memory, in MB (10^6 bytes), this process "
          "may plan for at its peak; the start-up memory check refuses "
          "(exit 2) a run whose plan is larger, naming what it holds. "
          "`starling sim`: for its nodes and itself together. 0 = no limit "
          "but the memory the machine has available");
ABSL_FLAG(int, threads, starling::DefaultTrainConfig().threads(),
          "intra-op CPU threads, at most 4 per core; 0 = LibTorch's default");
ABSL_FLAG(uint32_t, seed, starling::DefaultTrainConfig().seed(),
          "seed for initialization, sharding and sampling; the same seed "
          "gives the same run");
ABSL_FLAG(std::string, out, "",
          "run directory (events.jsonl, summary.json, checkpoint.ckpt); "
          "empty = runs/train-TIMESTAMP");
ABSL_FLAG(int, eval_every, starling::DefaultTrainConfig().eval_every(),
          "validation every N steps (and at the end); 0 = only at the end");
ABSL_FLAG(int, checkpoint_every,
          starling::DefaultTrainConfig().checkpoint_every(),
          "checkpoint every N steps (and at the end); 0 = only at the end");
ABSL_FLAG(int, log_every, starling::DefaultTrainConfig().log_every(),
          "progress line every N steps; 0 = none");
ABSL_FLAG(bool, resume, false,
          "continue the run in --out from its checkpoint.ckpt");
ABSL_FLAG(double, slowdown, starling::DefaultTrainConfig().slowdown(),
          "emulate slower hardware: after each inner step that took t "
          "seconds, wait (slowdown-1)*t more, counted as compute; 1 = full "
          "speed, 4 = four times slower (from 1 to 1000)");
ABSL_FLAG(std::string, drift, starling::DefaultTrainConfig().drift(),
          "concept drift. train/node: STEP = the data splits into two regions "
          "(text: first and second half; fmnist: permuted labels) and the "
          "node trains and validates on the first until it has done STEP "
          "inner steps, on the second from then on; never = two regions, "
          "staying on the first; empty = one region. sim: IDS@STEP, e.g. "
          "n0,n1@400: those nodes drift at STEP, the others get never");

namespace starling {

TrainConfig ConfigFromFlags() {
  TrainConfig c;
  c.set_model(absl::GetFlag(FLAGS_model));
  c.set_layers(absl::GetFlag(FLAGS_layers));
  c.set_width(absl::GetFlag(FLAGS_width));
  c.set_heads(absl::GetFlag(FLAGS_heads));
  c.set_context(absl::GetFlag(FLAGS_context));
  c.set_data(absl::GetFlag(FLAGS_data));
  c.set_shard(absl::GetFlag(FLAGS_shard));
  c.set_shard_mode(absl::GetFlag(FLAGS_shard_mode));
  c.set_val_fraction(absl::GetFlag(FLAGS_val_fraction));
  c.set_cache_dir(absl::GetFlag(FLAGS_cache_dir));
  c.set_vocab(absl::GetFlag(FLAGS_vocab));
  c.set_token_dtype(absl::GetFlag(FLAGS_token_dtype));
  c.set_val_data(absl::GetFlag(FLAGS_val_data));
  c.set_optimizer(absl::GetFlag(FLAGS_optimizer));
  c.set_lr(absl::GetFlag(FLAGS_lr));
  c.set_warmup(absl::GetFlag(FLAGS_warmup));
  c.set_weight_decay(absl::GetFlag(FLAGS_weight_decay));
  c.set_beta1(absl::GetFlag(FLAGS_beta1));
  c.set_beta2(absl::GetFlag(FLAGS_beta2));
  c.set_momentum(absl::GetFlag(FLAGS_momentum));
  c.set_clip(absl::GetFlag(FLAGS_clip));
  c.set_batch(absl::GetFlag(FLAGS_batch));
  c.set_steps(absl::GetFlag(FLAGS_steps));
  c.set_device(absl::GetFlag(FLAGS_device));
  c.set_precision(absl::GetFlag(FLAGS_precision));
  c.set_gpu_memory_fraction(absl::GetFlag(FLAGS_gpu_memory_fraction));
  c.set_memory_limit_mb(absl::GetFlag(FLAGS_memory_limit_mb));
  c.set_threads(absl::GetFlag(FLAGS_threads));
  c.set_seed(absl::GetFlag(FLAGS_seed));
  c.set_out(absl::GetFlag(FLAGS_out));
  c.set_eval_every(absl::GetFlag(FLAGS_eval_every));
  c.set_checkpoint_every(absl::GetFlag(FLAGS_checkpoint_every));
  c.set_log_every(absl::GetFlag(FLAGS_log_every));
  c.set_resume(absl::GetFlag(FLAGS_resume));
  c.set_slowdown(absl::GetFlag(FLAGS_slowdown));
  c.set_drift(absl::GetFlag(FLAGS_drift));
  return c;
}

const std::vector<std::string>& TrainFlagNames() {
  static const auto* names =
      new std::vector<std::string>{"model",
                                   "layers",
                                   "width",
                                   "heads",
                                   "context",
                                   "data",
                                   "val_data",
                                   "shard",
                                   "shard_mode",
                                   "val_fraction",
                                   "cache_dir",
                                   "vocab",
                                   "token_dtype",
                                   "optimizer",
                                   "lr",
                                   "warmup",
                                   "weight_decay",
                                   "beta1",
                                   "beta2",
                                   "momentum",
                                   "clip",
                                   "batch",
                                   "steps",
                                   "device",
                                   "threads",
                                   "seed",
                                   "out",
                                   "eval_every",
                                   "checkpoint_every",
                                   "log_every",
                                   "resume",
                                   "slowdown",
                                   "drift",
                                   "precision",
                                   "memory_limit_mb",
                                   "gpu_memory_fraction"};
  return *names;
}

namespace {

int Fail(const absl::Status& s, int code) {
  WriteStderrLine(absl::StrCat("starling train: error: ", s.message()));
  return code;
}

}  // namespace

const Subcommand& TrainSubcommand() {
  static const Subcommand* sub = new Subcommand{
      "train", "train one model on one node, no peers",
      "Trains one model on this machine: --steps inner steps of --optimizer "
      "with linear warmup and cosine decay, validation every --eval_every "
      "steps, and atomic checkpoints every --checkpoint_every steps. Writes "
      "--out/events.jsonl, --out/summary.json and --out/checkpoint.ckpt. "
      "--resume continues an interrupted run exactly.\n\n"
      "The KJV parity recipe:\n"
      "  starling train --model=gpt --layers=2 --width=64 --heads=4 "
      "--context=64 --data=kjv --batch=16 --steps=800 --lr=3e-3 --warmup=50 "
      "--threads=1 --seed=0 --out=runs/kjv\n"
      "Fashion-MNIST:\n"
      "  starling train --data=fmnist --out=runs/fmnist",
      TrainFlagNames()};
  return *sub;
}

namespace {

// Throughput and loss over the last --log_every window, for the progress
// line and its ETA.
struct ProgressWindow {
  double seconds = 0;
  int64_t tokens = 0;
  int steps = 0;
  double loss = 0;

  void Add(const StepResult& r) {
    seconds += r.seconds;
    tokens += r.tokens;
    loss += r.loss;
    ++steps;
  }
  // "step S/T | loss L | lr R | N tok/s | eta E", and a fresh window.
  std::string Line(int step, int total, double lr, const char* unit) {
    const double tps = seconds > 0 ? tokens / seconds : 0;
    const double eta = steps > 0 ? (total - step) * seconds / steps : 0;
    std::string line = absl::StrFormat(
        "step %d/%d | loss %.4f | lr %.2e | %.0f %s | eta %s", step, total,
        loss / steps, lr, tps, unit, FormatDuration(eta));
    *this = ProgressWindow();
    return line;
  }
};

// A `starling train` run once its trainer is built (and restored on
// --resume): the steps with their events, progress lines, evaluations and
// checkpoints, then the end of the run.
class TrainRun {
 public:
  TrainRun(const TrainConfig& config, Trainer& trainer)
      : config_(config),
        trainer_(trainer),
        ckpt_path_(CheckpointPathInRunDir(config.out())),
        events_(absl::StrCat(config.out(), "/events.jsonl"), "n0",
                trainer.state().wall_seconds()),
        checkpoint_step_(config.resume() ? trainer.state().step() : -1) {}

  int Run() {
    Start();
    absl::StatusOr<bool> interrupted = Train();
    if (!interrupted.ok()) return Fail(interrupted.status(), 1);
    return End(*interrupted);
  }

 private:
  void Start() {
    const int64_t params = NumElements(trainer_.Parameters());
    STARLING_LOG(INFO) << "model " << trainer_.model().Architecture() << ", "
                       << params << " parameters, on "
                       << trainer_.device().str() << ", "
                       << torch::get_num_threads() << " threads";
    STARLING_LOG(INFO) << "data " << trainer_.dataset().Describe();
    STARLING_LOG(INFO) << "run directory " << config_.out();
    events_.Write(
        config_.resume() ? "resume" : "start",
        JsonObject()
            .Add("step", static_cast<int64_t>(trainer_.state().step()))
            .Add("architecture", trainer_.model().Architecture())
            .Add("parameters", params)
            .Add("data", trainer_.dataset().Describe()));
    InstallStopSignals();
  }

  // Steps until the last one or a signal (true).
  absl::StatusOr<bool> Train() {
    const char* rate_unit =
        trainer_.dataset().kind() == TaskKind::kLanguageModel ? "tok/s"
                                                              : "img/s";
    ProgressWindow window;
    while (trainer_.state().step() < config_.steps()) {
      if (StopSignal() != 0) return true;
      absl::StatusOr<StepResult> r = trainer_.Step();
      if (!r.ok()) {
        events_.Write("error",
                      JsonObject().Add("message", r.status().message()));
        return r.status();
      }
      evaluated_at_step_ = false;
      const int step = trainer_.state().step();
      LogDrift(events_, trainer_, *r);
      window.Add(*r);
      events_.Write("step", JsonObject()
                                .Add("step", static_cast<int64_t>(step))
                                .Add("loss", r->loss)
                                .Add("lr", r->lr)
                                .Add("seconds", r->seconds));
      if (config_.log_every() > 0 &&
          (step % config_.log_every() == 0 || step == config_.steps())) {
        WriteStderrLine(window.Line(step, config_.steps(), r->lr, rate_unit));
      }
      if (config_.eval_every() > 0 && step % config_.eval_every() == 0) {
        STARLING_RETURN_IF_ERROR(Evaluate());
      }
      if (config_.checkpoint_every() > 0 &&
          step % config_.checkpoint_every() == 0 && step < config_.steps()) {
        // A full disk or a directory gone read-only costs this checkpoint,
        // not the run: the previous one is still whole (atomic writes).
        if (absl::Status s = Checkpoint(); !s.ok()) {
          WriteStderrLine(absl::StrCat("starling train: warning: ", s.message(),
                                       "; ", KeptCheckpoint(),
                                       "; training goes on"));
        }
      }
    }
    return false;
  }

  absl::Status Checkpoint() {
    trainer_.set_wall_seconds(events_.WallSeconds());
    absl::Status s = trainer_.SaveCheckpoint(ckpt_path_);
    if (!s.ok()) {
      s = absl::Status(
          s.code(), absl::StrCat("checkpoint at step ", trainer_.state().step(),
                                 " failed: ", s.message()));
      events_.Write(
          "checkpoint_failed",
          JsonObject()
              .Add("step", static_cast<int64_t>(trainer_.state().step()))
              .Add("message", s.message()));
    } else {
      checkpoint_step_ = trainer_.state().step();
      events_.Write(
          "checkpoint",
          JsonObject()
              .Add("step", static_cast<int64_t>(trainer_.state().step()))
              .Add("path", ckpt_path_));
    }
    return s;
  }

  absl::Status Evaluate() {
    STARLING_ASSIGN_OR_RETURN(eval_, trainer_.Evaluate());
    JsonObject fields;
    fields.Add("step", static_cast<int64_t>(trainer_.state().step()))
        .Add("val_loss", eval_.loss);
    if (eval_.accuracy >= 0) fields.Add("val_accuracy", eval_.accuracy);
    events_.Write("eval", fields);
    WriteStderrLine(absl::StrFormat(
        "eval  step %d/%d | val_loss %.4f%s", trainer_.state().step(),
        config_.steps(), eval_.loss,
        eval_.accuracy >= 0
            ? absl::StrFormat(" | val_acc %.2f%%", 100 * eval_.accuracy)
            : ""));
    evaluated_at_step_ = true;
    return absl::OkStatus();
  }

  // The final evaluation (unless interrupted), checkpoint, end event and
  // summary.json: the exit code.
  int End(bool interrupted) {
    if (!evaluated_at_step_ && !interrupted) {
      if (absl::Status s = Evaluate(); !s.ok()) return Fail(s, 1);
    }
    if (absl::Status s = Checkpoint(); !s.ok()) {
      return Fail(absl::Status(s.code(), absl::StrCat(s.message(), "; ",
                                                      KeptCheckpoint())),
                  1);
    }
    NodeTotals totals;
    totals.wall_seconds = events_.WallSeconds();
    events_.Write(
        interrupted ? "interrupted" : "end",
        JsonObject()
            .Add("step", static_cast<int64_t>(trainer_.state().step()))
            .Add("val_loss", eval_.loss));
    if (absl::Status s =
            WriteNodeSummary(config_.out(), "train", trainer_, eval_, totals,
                             {}, interrupted, JsonObject());
        !s.ok()) {
      return Fail(s, 1);
    }
    if (interrupted) {
      WriteStderrLine(absl::StrCat(
          "starling train: interrupted by signal ", StopSignal(), " at step ",
          trainer_.state().step(), "; checkpoint saved to ", ckpt_path_,
          ". Continue with the same flags plus --resume."));
      return 1;
    }
    WriteStderrLine(absl::StrFormat(
        "done: %d steps, val_loss %.4f%s, %s wall, summary in %s/summary.json",
        trainer_.state().step(), eval_.loss,
        eval_.accuracy >= 0
            ? absl::StrFormat(", val_acc %.2f%%", 100 * eval_.accuracy)
            : "",
        FormatDuration(totals.wall_seconds), config_.out()));
    return 0;
  }

  // What a failed write leaves: the previous checkpoint, or none.
  std::string KeptCheckpoint() const {
    if (checkpoint_step_ < 0) return "no earlier checkpoint exists";
    return absl::StrCat("keeping the previous checkpoint (step ",
                        checkpoint_step_, ") in ", ckpt_path_);
  }

  const TrainConfig& config_;
  Trainer& trainer_;
  const std::string ckpt_path_;
  EventLog events_;
  EvalResult eval_;
  bool evaluated_at_step_ = false;
  // The step of the last checkpoint written (or resumed from); -1: none.
  int checkpoint_step_ = -1;
};

}  // namespace

int RunTrainCommand() {
  TrainConfig config = ConfigFromFlags();
  if (absl::Status s = ResolveTrainConfig(&config); !s.ok()) return Fail(s, 2);
  absl::StatusOr<std::unique_ptr<Trainer>> created = StartRun(&config, "train");
  if (!created.ok()) {
    return Fail(created.status(), ExitCodeFor(created.status()));
  }
  Trainer& trainer = **created;
  if (config.resume()) {
    absl::Status s =
        trainer.RestoreCheckpoint(CheckpointPathInRunDir(config.out()));
    if (!s.ok()) return Fail(s, ExitCodeFor(s));
  }
  return TrainRun(config, trainer).Run();
}

}  // namespace starling
