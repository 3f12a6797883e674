// The inner trainer: one model, its data shard, the inner optimizer (AdamW,
// Adam or SGD) with warmup+cosine LR and gradient clipping, evaluation, and
// checkpoints that make a resumed run bit-identical to an uninterrupted one.
// It also emulates slower hardware (--slowdown) and concept drift (--drift:
// the data region is a function of the inner step, so resumes stay exact).
// `starling train` drives it for a whole run; the network modes call Step()
// for each inner step and exchange Parameters() between rounds.
// Not thread-safe: one thread owns a Trainer. LibTorch exceptions are caught
// here and returned as absl::Status.
#ifndef STARLING_CORE_TRAINER_H_
#define STARLING_CORE_TRAINER_H_

#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/data.h"
#include "core/device.h"
#include "core/lr_schedule.h"
#include "core/memory.h"
#include "core/model.h"
#include "starling/config/v1/config.pb.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace starling {

using config::v1::TrainConfig;
using config::v1::TrainerState;

// The largest --slowdown: a slower node than that is a stopped one (and
// longer sleeps overflow the clock).
inline constexpr double kMaxSlowdown = 1000;

// The flag defaults of `starling train`, before data-dependent resolution.
TrainConfig DefaultTrainConfig();

// Fills the fields left at "auto" (empty model, batch/steps/lr of 0, negative
// warmup) from the data set kind: text uses the KJV gpt recipe, images the
// Fashion-MNIST cnn recipe. InvalidArgument naming the flag for values out of
// range (including --slowdown outside [1, kMaxSlowdown], and a bad --drift).
absl::Status ResolveTrainConfig(TrainConfig* config);

// Builds a trainer for `config` on the CPU, unsharded, and drops it: the
// error Trainer::Create would give for the data (--data, --context,
// --val_fraction, --vocab), the model (--model and its shape flags, probed on
// the data) or --device, which is checked without allocating on the GPU.
// For a launcher that checks once before it starts its nodes; it also fills
// the KJV cache. On the CPU it also refuses a --batch whose activations in
// `processes` nodes would not fit in this machine's memory
// (Trainer::CheckMemory).
// `weight_copies` more fp32 copies of the weights each process keeps
// besides the trainer's (a DiLoCo node's global weights, say) count too.
absl::Status CheckTrainConfig(const TrainConfig& config, int processes = 1,
                              int weight_copies = 0);
// The same check, counting what each of `processes` processes of `plan`
// really holds at its peak (EstimateMemory: its algorithm, compression,
// error feedback and checkpoints; the model's size, optimizer, activations
// and the process's own cost come from the probed trainer).
absl::Status CheckTrainConfig(const TrainConfig& config, int processes,
                              const MemoryPlanOptions& plan);

// The settings in which `now` differs from `was` (a checkpoint's) that
// change what training computes, as "--lr=0.01 (was 0.003), --steps=2000
// (was 1000)"; empty when there are none. Where the output goes, how often
// it is written, and the threads, device and slowdown are not counted.
// A checkpoint without a precision (older) counts as fp32.
std::string ResumeDifferences(const TrainConfig& was, const TrainConfig& now);

struct StepResult {
  double loss = 0.0;
  double lr = 0.0;
  int64_t samples = 0;  // examples in this step's batch
  int64_t tokens = 0;   // predicted positions in this step's batch
  // Time of the step, including the --slowdown sleep (the node is slower
  // hardware; the sleep stretches the step's own compute, not the hook's).
  double seconds = 0.0;
  int region = 0;  // the data region the batch came from
  // True for the step that brings the node to its --drift step (with
  // --drift=0: its first step): the data switched to region 1 here, and
  // later steps and evaluations use it. Once per run, so a caller can log it
  // before the evaluation at that step.
  bool drifted = false;
};

struct EvalResult {
  double loss = 0.0;
  double accuracy = -1.0;  // classification only; -1 otherwise
  int64_t examples = 0;
};

class Trainer {
 public:
  // Loads the data, builds the model and optimizer and probes the model once
  // on validation data. `config` must be resolved (ResolveTrainConfig).
  // Errors name the bad flag or input: InvalidArgument / NotFound /
  // FailedPrecondition for user errors, Internal otherwise. On the CPU it
  // also refuses a model or batch that cannot fit (CheckMemory), unless
  // `check_memory` is false (a CPU probe of a model meant for a GPU).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainConfig& config, bool check_memory = true);
  ~Trainer();

  // Called after backward() and before clipping with the parameters, whose
  // .grad() it may replace in place (ddp averages them across nodes here).
  using GradientHook =
      std::function<absl::Status(const std::vector<torch::Tensor>& params)>;

  // One inner step at the schedule's LR for the current step.
  // Internal (with the step number) on a LibTorch failure or a non-finite
  // loss; the hook's error as it is. On error the parameters are unchanged.
  absl::StatusOr<StepResult> Step(const GradientHook& hook = nullptr);

  // Mean loss (and accuracy) over the whole validation set of the current
  // data region (region()). `cancelled`, when given, is asked before each
  // batch: Cancelled as soon as it returns true (a large model's evaluation
  // can take minutes on a CPU; a node that is told to leave at once should
  // not wait for it).
  absl::StatusOr<EvalResult> Evaluate(
      int batch_size = 64, const std::function<bool()>& cancelled = nullptr);

  // The data region of the next step and of Evaluate(): 0, or 1 once the
  // --drift step is reached.
  int region() const { return drift_.RegionAt(state_.step()); }
  const DriftSchedule& drift() const { return drift_; }

  // Writes model, optimizer, trainer state, sampler and RNG state atomically,
  // plus the caller's `extra` sections. The model's parameters and buffers
  // and the optimizer's state are streamed into the file from their own
  // memory, as are `extra` sections that are producers: a checkpoint holds
  // only bounded buffers besides what the trainer and the caller hold.
  // Internal on failure, the previous file then untouched.
  absl::Status SaveCheckpoint(const std::string& path,
                              CheckpointSections extra);
  // The same with the caller's sections held as strings (moved in, written
  // from where they are).
  absl::Status SaveCheckpoint(const std::string& path,
                              std::map<std::string, std::string> extra = {});

  // Restores everything SaveCheckpoint wrote from a checkpoint opened (and
  // so verified) by CheckpointReader::Open; the caller reads its own
  // sections from `reader`. The tensors are read straight into the model
  // and the optimizer's new state. Also restores the checkpoints of builds
  // that wrote LibTorch archives (sections "model" and "optimizer").
  // FailedPrecondition naming the flag when the checkpoint came from an
  // incompatible configuration; DataLoss when a section is missing or does
  // not fit this model. The trainer is unchanged on any error but an I/O
  // error while its tensors are read.
  absl::Status RestoreCheckpoint(const CheckpointReader& reader);
  // Opens and restores `path`, and returns in `sections`, when non-null,
  // every section but the trainer's tensors (the caller's sections, and the
  // trainer's small ones), read whole. Errors as Open's and the above.
  absl::Status RestoreCheckpoint(
      const std::string& path,
      std::map<std::string, std::string>* sections = nullptr);

  Model& model() { return *model_; }
  const Dataset& dataset() const { return *dataset_; }
  const TrainConfig& config() const { return config_; }
  const TrainerState& state() const { return state_; }
  // Wall time of the run so far (across resumes), saved in checkpoints.
  void set_wall_seconds(double seconds) { state_.set_wall_seconds(seconds); }
  // Moves the LR schedule to `step` (a joiner adopts the swarm's position;
  // a node that abandons a round goes back to its start).
  void set_step(int step) { state_.set_step(step); }
  // The schedule's inner learning rate at 0-based step `step`.
  double lr_at(int step) const { return LearningRateAt(schedule_, step); }
  // Trainable parameters in flat-view order.
  std::vector<torch::Tensor> Parameters() { return model_->Parameters(); }
  torch::Device device() const { return device_; }
  // --precision=bf16: the inner forward and backward under bf16 autocast.
  bool bf16() const { return config_.precision() == "bf16"; }
  // The GPU memory this trainer's process has used at most (-1 on a CPU).
  DeviceMemory PeakMemory() const { return PeakDeviceMemory(device_); }

  // InvalidArgument when `processes` trainers like this one, training at
  // once, would hold more memory than this machine has available
  // (MemAvailable, or the cgroup's memory.max headroom), rather than be
  // killed for it mid-run. Naming --model (and --nodes where there are
  // several) when their weights, gradients and optimizer state alone do not
  // fit; else naming --batch, adding the activations a step holds. Both
  // figures are lower bounds on the CPU: the state is counted from the
  // parameters and the optimizer, and the activations are the heap a
  // forward pass with autograd holds over 2 and 4 validation examples
  // (measured by Create), scaled to the batch; they are left out where they
  // could not be measured (another allocator, a batch of 4 or less). OK on
  // a GPU. Create checks one process, before and after it builds the model.
  // `weight_copies` more fp32 copies of the weights per process (what a
  // node keeps besides the trainer) count with the state.
  absl::Status CheckMemory(int processes, int weight_copies = 0) const;
  // CheckMemory against the peak of `plan` (MemoryPlan's): of this process
  // itself (`launcher` false, `processes` 1), or of the `processes` node
  // processes this process launches, and its own memory (RunPeak). Refuses
  // a plan above --memory_limit_mb, or whose memory not yet resident is
  // more than the machine has available: InvalidArgument naming --model,
  // --batch and --nodes, the need, the limit, and what a node holds item by
  // item. OK on a GPU.
  absl::Status CheckMemory(int processes, const MemoryPlanOptions& plan,
                           bool launcher = false) const;
  // `plan` with this trainer's part filled in: its parameters, optimizer,
  // the activations of a step at --batch (where measured) and the memory
  // this process held before it built its model (code, data).
  MemoryPlanOptions MemoryPlan(MemoryPlanOptions plan) const;

 private:
  Trainer(const TrainConfig& config, torch::Device device);
  absl::Status Init();
  // Fills activation_bytes_*; throws what the model's forward throws.
  void MeasureActivations();
  // The gradients live only from a step's backward pass to its optimizer
  // step: between steps (a round's exchange, a checkpoint) and through the
  // forward pass, the memory of one copy of the weights is free.
  // ZeroMissingGradients then gives a parameter that had a gradient in an
  // earlier step but none in this backward pass a zero one, as clearing
  // the gradients in place did: the optimizer steps it all the same.
  void DropGradients();
  void ZeroMissingGradients();
  // RestoreCheckpoint's parts: FailedPrecondition when the checkpoint's
  // trainer state `st` and architecture are not this run's; the tensors of
  // either format; the RNG state.
  absl::Status CheckResumable(const std::string& path, const TrainerState& st,
                              const std::string& architecture,
                              const std::string* signature) const;
  absl::Status RestoreTensors(const CheckpointReader& reader);
  absl::Status RestoreArchives(const CheckpointReader& reader);
  // --precision=bf16: InvalidArgument naming the flag when a training step
  // of this model fails under autocast here.
  absl::Status ProbeAutocast();

  TrainConfig config_;
  torch::Device device_;
  std::unique_ptr<Dataset> dataset_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  LrSchedule schedule_;
  DriftSchedule drift_;
  Sampler sampler_;
  TrainerState state_;
  double activation_bytes_fixed_ = 0;        // measured by Init
  double activation_bytes_per_example_ = 0;  // 0: not measured
  bool check_memory_ = true;                 // Init runs CheckMemory
  // Bytes of the weights, and of their gradients plus optimizer state.
  double weight_bytes_ = 0;
  double training_state_bytes_ = 0;
  double process_bytes_ = 0;  // RssAnon before the model, measured by Init
  double code_bytes_ = 0;     // RssFile then
  std::vector<bool> had_gradient_;  // by parameter, see ZeroMissingGradients
};

}  // namespace starling

#endif  // STARLING_CORE_TRAINER_H_
