#include "core/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/checkpoint.h"
#include "core/device.h"
#include "core/file_util.h"
#include "core/image_data.h"
#include "core/logging.h"
#include "core/memory.h"
#include "core/optimizer_state.h"
#include "core/status.h"
#include "core/tensor_stream.h"
#include "core/torch_compat.h"
#include "core/torch_error.h"

namespace starling {
namespace {

std::string ShapeString(const torch::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ","), "]");
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

// torch::nn::utils::clip_grad_norm_ (2-norm) with the same operations, so
// the same bits, minus its last line: it reads the norm back to the host,
// which on a GPU stalls every step until the backward pass has finished.
void ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> grads, norms;
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad().data());
  }
  if (grads.empty()) return;
  for (const torch::Tensor& g : grads) norms.push_back(g.norm(2.0));
  const torch::Tensor total =
      norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
  const torch::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (torch::Tensor& g : grads) g.mul_(coef);
}

// The data options of `config`, shard and drift aside.
DataOptions DataOptionsOf(const TrainConfig& config) {
  DataOptions data;
  data.spec = config.data();
  data.context = config.context();
  data.val_fraction = config.val_fraction();
  data.vocab = config.vocab();
  data.token_dtype = config.token_dtype();
  data.val_spec = config.val_data();
  data.cache_dir = config.cache_dir();
  data.split_seed = config.seed();
  return data;
}

}  // namespace

TrainConfig DefaultTrainConfig() {
  TrainConfig c;
  c.set_model("");  // auto: gpt for text, cnn for fmnist
  c.set_layers(2);
  c.set_width(64);
  c.set_heads(4);
  c.set_context(64);
  c.set_data("kjv");
  c.set_token_dtype("uint16");
  c.set_shard("0/1");
  c.set_shard_mode("iid");
  c.set_val_fraction(0.05);
  c.set_optimizer("adamw");
  c.set_lr(0);       // auto
  c.set_warmup(-1);  // auto
  c.set_weight_decay(0.1);
  c.set_beta1(0.9);
  c.set_beta2(0.95);
  c.set_momentum(0.9);
  c.set_clip(1.0);
  c.set_batch(0);  // auto
  c.set_steps(0);  // auto
  c.set_device("cpu");
  c.set_precision("fp32");
  c.set_gpu_memory_fraction(0);
  c.set_memory_limit_mb(0);
  c.set_threads(0);
  c.set_seed(0);
  c.set_eval_every(200);
  c.set_checkpoint_every(200);
  c.set_log_every(50);
  c.set_slowdown(1.0);
  c.set_drift("");
  return c;
}

absl::Status ResolveTrainConfig(TrainConfig* c) {
  const bool images = IsImageSpec(c->data());
  if (c->model().empty()) c->set_model(images ? "cnn" : "gpt");
  if (c->batch() == 0) c->set_batch(images ? 64 : 16);
  if (c->steps() == 0) c->set_steps(images ? 1900 : 800);
  if (c->lr() == 0) c->set_lr(images ? 1e-3 : 3e-3);
  if (c->warmup() < 0) c->set_warmup(50);
  auto bad = [](absl::string_view flag, auto value, absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", value, ": ", want));
  };
  // 0 picked the default above.
  if (c->batch() < 1) {
    return bad("batch", c->batch(), "must be >= 1 (0 = the default)");
  }
  if (c->steps() < 1) {
    return bad("steps", c->steps(), "must be >= 1 (0 = the default)");
  }
  if (!(c->lr() > 0) || !std::isfinite(c->lr())) {
    return bad("lr", c->lr(), "must be a positive number");
  }
  if (c->clip() < 0) return bad("clip", c->clip(), "must be >= 0 (0 = off)");
  if (c->weight_decay() < 0) {
    return bad("weight_decay", c->weight_decay(), "must be >= 0");
  }
  if (c->beta1() < 0 || c->beta1() >= 1) {
    return bad("beta1", c->beta1(), "must be in [0, 1)");
  }
  if (c->beta2() < 0 || c->beta2() >= 1) {
    return bad("beta2", c->beta2(), "must be in [0, 1)");
  }
  if (c->momentum() < 0 || c->momentum() >= 1) {
    return bad("momentum", c->momentum(), "must be in [0, 1)");
  }
  if (c->optimizer() != "adamw" && c->optimizer() != "adam" &&
      c->optimizer() != "sgd") {
    return bad("optimizer", c->optimizer(), "expected adamw, adam or sgd");
  }
  if (c->eval_every() < 0)
    return bad("eval_every", c->eval_every(), "must be >= 0");
  if (c->checkpoint_every() < 0) {
    return bad("checkpoint_every", c->checkpoint_every(), "must be >= 0");
  }
  if (c->threads() < 0) return bad("threads", c->threads(), "must be >= 0");
  // Far more threads than cores only switch between them: 256 on 2 cores
  // made a step 35x slower, and 100000 never finished starting.
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  if (c->threads() > 4 * cores) {
    return bad(
        "threads", c->threads(),
        absl::StrCat("at most 4 per core (this machine has ", cores,
                     ", so at most ", 4 * cores, "); 0 = LibTorch's default"));
  }
  if (c->log_every() < 0) {
    return bad("log_every", c->log_every(), "must be >= 0 (0 = no lines)");
  }
  if (c->device() != "cpu" && c->device() != "cuda" &&
      !absl::StartsWith(c->device(), "cuda:")) {
    return bad("device", c->device(), "expected cpu, cuda or cuda:N");
  }
  if (c->precision().empty()) c->set_precision("fp32");
  if (c->precision() != "fp32" && c->precision() != "bf16") {
    return bad("precision", c->precision(), "expected fp32 or bf16");
  }
  if (!(c->gpu_memory_fraction() >= 0 && c->gpu_memory_fraction() <= 1)) {
    return bad("gpu_memory_fraction", c->gpu_memory_fraction(),
               "must be in [0, 1] (0: no cap)");
  }
  if (c->memory_limit_mb() < 0) {
    return bad("memory_limit_mb", c->memory_limit_mb(), "must be >= 0");
  }
  if (!(c->slowdown() >= 1.0 && c->slowdown() <= kMaxSlowdown)) {
    return bad("slowdown", c->slowdown(),
               absl::StrCat("must be a factor in [1, ", kMaxSlowdown,
                            "] (1 = full speed)"));
  }
  STARLING_RETURN_IF_ERROR(ParseDrift(c->drift()).status());
  return absl::OkStatus();
}

Trainer::Trainer(const TrainConfig& config, torch::Device device)
    : config_(config), device_(device) {}

Trainer::~Trainer() = default;

std::string ResumeDifferences(const TrainConfig& was_written,
                              const TrainConfig& now) {
  // A checkpoint from before --precision existed trained in fp32, and one
  // from before --token_dtype existed read uint16 tokens.
  TrainConfig was = was_written;
  if (was.precision().empty()) was.set_precision("fp32");
  if (was.token_dtype().empty()) was.set_token_dtype("uint16");
  static constexpr absl::string_view kNotCounted[] = {
      "out", "resume", "cache_dir", "eval_every", "log_every",
      "checkpoint_every", "threads", "device", "slowdown",
      // How much memory the process may hold, not what it computes.
      "gpu_memory_fraction", "memory_limit_mb"};
  const google::protobuf::Descriptor* d = TrainConfig::descriptor();
  const google::protobuf::Reflection* r = TrainConfig::GetReflection();
  std::vector<std::string> out;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (absl::c_linear_search(kNotCounted, f->name())) continue;
    // A double is compared at round-trip precision and shown in the short
    // form the user typed ("0.003").
    auto value = [&](const TrainConfig& c, bool exact) -> std::string {
      using F = google::protobuf::FieldDescriptor;
      switch (f->cpp_type()) {
        case F::CPPTYPE_INT32:
          return absl::StrCat(r->GetInt32(c, f));
        case F::CPPTYPE_UINT32:
          return absl::StrCat(r->GetUInt32(c, f));
        case F::CPPTYPE_INT64:
          return absl::StrCat(r->GetInt64(c, f));
        case F::CPPTYPE_DOUBLE:
          return exact ? absl::StrFormat("%.17g", r->GetDouble(c, f))
                       : absl::StrCat(r->GetDouble(c, f));
        case F::CPPTYPE_BOOL:
          return r->GetBool(c, f) ? "true" : "false";
        case F::CPPTYPE_STRING:
          return r->GetString(c, f);
        default:
          return "";
      }
    };
    if (value(was, true) == value(now, true)) continue;
    out.push_back(absl::StrCat("--", f->name(), "=", value(now, false),
                               " (was ", value(was, false), ")"));
  }
  return absl::StrJoin(out, ", ");
}

namespace {

// The trainer CheckTrainConfig checks: built and probed on the CPU (the
// launcher that checks should not hold a GPU context of its own for the
// whole run), unsharded. Create checks one process; GPU nodes keep their
// weights, state and activations in GPU memory, not this machine's.
absl::StatusOr<std::unique_ptr<Trainer>> ProbeTrainer(
    const TrainConfig& config) {
  STARLING_RETURN_IF_ERROR(ParseDevice(config.device()).status());
  TrainConfig probe = config;
  probe.set_device("cpu");
  probe.set_shard("0/1");
  return Trainer::Create(probe, /*check_memory=*/config.device() == "cpu");
}

}  // namespace

absl::Status CheckTrainConfig(const TrainConfig& config, int processes,
                              int weight_copies) {
  STARLING_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                            ProbeTrainer(config));
  if ((processes <= 1 && weight_copies == 0) || config.device() != "cpu") {
    return absl::OkStatus();
  }
  return trainer->CheckMemory(processes, weight_copies);
}

absl::Status CheckTrainConfig(const TrainConfig& config, int processes,
                              const MemoryPlanOptions& plan) {
  STARLING_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                            ProbeTrainer(config));
  if (config.device() != "cpu") return absl::OkStatus();
  return trainer->CheckMemory(processes, plan, /*launcher=*/true);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainConfig& config, bool check_memory) {
  STARLING_ASSIGN_OR_RETURN(torch::Device device, ParseDevice(config.device()));
  // Before this process allocates on the GPU: the cap holds from the start.
  STARLING_RETURN_IF_ERROR(
      SetGpuMemoryFraction(device, config.gpu_memory_fraction()));
  auto trainer = std::unique_ptr<Trainer>(new Trainer(config, device));
  trainer->check_memory_ = check_memory;
  STARLING_RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

absl::Status Trainer::Init() {
  DataOptions data = DataOptionsOf(config_);
  STARLING_ASSIGN_OR_RETURN(drift_, ParseDrift(config_.drift()));
  data.two_regions = drift_.two_regions;
  STARLING_ASSIGN_OR_RETURN(data.shard,
                            ParseShard(config_.shard(), config_.shard_mode()));
  STARLING_ASSIGN_OR_RETURN(dataset_, LoadDataset(data));
  const ResidentMemory resident = ResidentMemoryNow();
  process_bytes_ = std::max<int64_t>(0, resident.anon);
  code_bytes_ = std::max<int64_t>(0, resident.file);

  ModelOptions mo;
  mo.spec = config_.model();
  mo.layers = config_.layers();
  mo.width = config_.width();
  mo.heads = config_.heads();
  mo.context = config_.context();
  mo.num_classes = dataset_->num_classes();
  mo.language_model = dataset_->kind() == TaskKind::kLanguageModel;
  if (!mo.language_model) mo.input_shape = dataset_->example_shape();
  // Gradients, and the optimizer's state per trainable value: Adam's two
  // moments, SGD's momentum buffer.
  const int states =
      config_.optimizer() == "sgd" ? (config_.momentum() > 0 ? 1 : 0) : 2;
  // A built-in model too large to train here is refused before it exists.
  if (const int64_t n = BuiltInParameterCount(mo); n >= 0) {
    weight_bytes_ = static_cast<double>(n) * sizeof(float);
    training_state_bytes_ = weight_bytes_ * (1 + states);
    if (check_memory_) STARLING_RETURN_IF_ERROR(CheckMemory(1));
  }
  torch::manual_seed(config_.seed());
  STARLING_ASSIGN_OR_RETURN(model_, CreateModel(mo));

  const std::string model_flag = absl::StrCat("--model=", config_.model());
  std::vector<torch::Tensor> params;
  try {
    model_->To(device_);
    params = model_->Parameters();
    // Probe once on two validation examples: the logits must fit the data.
    Batch probe =
        dataset_->ValBatch(0, std::min<int64_t>(2, dataset_->val_examples()));
    torch::Tensor logits;
    {
      torch::NoGradGuard no_grad;
      model_->SetTraining(false);
      logits = model_->Forward(probe.x.to(device_));
      model_->SetTraining(true);
    }
    std::vector<int64_t> want(probe.y.sizes().begin(), probe.y.sizes().end());
    want.push_back(dataset_->num_classes());
    if (logits.sizes().vec() != want || !logits.is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat(
          model_flag, ": forward(x) on input ", ShapeString(probe.x), " ",
          std::string(probe.x.dtype().name()), " returned ",
          std::string(logits.dtype().name()), " ", ShapeString(logits),
          "; expected float logits of shape [", absl::StrJoin(want, ","),
          "] for ", dataset_->Describe()));
    }
    MeasureActivations();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_flag, ": forward(x) failed on ",
                     dataset_->Describe(), ": ", TorchErrorMessage(e)));
  }
  STARLING_RETURN_IF_ERROR(ProbeAutocast());
  // The state as built (the count above is exact for built-in models; a
  // TorchScript model is counted only here).
  int64_t trainable = 0;
  weight_bytes_ = 0;
  training_state_bytes_ = 0;
  for (const auto& p : params) {
    const double bytes = static_cast<double>(p.numel() * p.element_size());
    weight_bytes_ += bytes;
    if (!p.requires_grad()) continue;
    ++trainable;
    training_state_bytes_ += bytes * (1 + states);
  }
  if (check_memory_) STARLING_RETURN_IF_ERROR(CheckMemory(1));
  if (trainable == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_flag, ": the model has no trainable parameters"));
  }

  if (config_.optimizer() == "adamw") {
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(config_.lr())
                    .betas(std::make_tuple(config_.beta1(), config_.beta2()))
                    .weight_decay(config_.weight_decay()));
  } else if (config_.optimizer() == "adam") {
    optimizer_ = std::make_unique<torch::optim::Adam>(
        params, torch::optim::AdamOptions(config_.lr())
                    .betas(std::make_tuple(config_.beta1(), config_.beta2()))
                    .weight_decay(config_.weight_decay()));
  } else {
    optimizer_ = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(config_.lr())
                    .momentum(config_.momentum())
                    .weight_decay(config_.weight_decay()));
  }
  schedule_.peak_lr = config_.lr();
  schedule_.warmup_steps = config_.warmup();
  schedule_.total_steps = config_.steps();

  ShardSpec shard = data.shard;
  sampler_ = Sampler(config_.seed() ^ (static_cast<uint64_t>(shard.index) *
                                       0x9E3779B97F4A7C15ULL));
  *state_.mutable_config() = config_;
  return absl::OkStatus();
}

absl::Status Trainer::ProbeAutocast() {
  if (!bf16()) return absl::OkStatus();
  // A forward and backward pass on two validation examples, as a step runs
  // them: where LibTorch's autocast lacks a kernel for this model on this
  // device, say so now rather than at the first step.
  try {
    Batch probe =
        dataset_->ValBatch(0, std::min<int64_t>(2, dataset_->val_examples()));
    torch::Tensor logits;
    {
      torch_compat::AutocastScope autocast(device_.type(), true);
      logits = model_->Forward(probe.x.to(device_));
    }
    torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}),
        probe.y.to(device_).reshape({-1}))
        .backward();
    for (torch::Tensor& p : model_->Parameters()) p.mutable_grad().reset();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--precision=bf16: LibTorch ", TORCH_VERSION,
        " cannot run this model's training step under bf16 autocast on ",
        device_.str(), " (", TorchErrorMessage(e), "); use --precision=fp32"));
  }
  return absl::OkStatus();
}

void Trainer::MeasureActivations() {
  if (!device_.is_cpu() || config_.batch() <= 4 ||
      dataset_->val_examples() < 4) {
    return;
  }
  // The heap a forward pass with autograd still holds when it returns: the
  // activations the backward pass will need, and the logits. Eval mode, so
  // that no dropout draws a random number and no batch norm moves.
  auto held = [&](int64_t n) {
    Batch b = dataset_->ValBatch(0, n);
    const int64_t before = HeapBytesInUse();
    torch::Tensor logits = model_->Forward(b.x);
    return HeapBytesInUse() - before;
  };
  model_->SetTraining(false);
  held(2);  // first-call allocations (thread pools, caches) land here
  const int64_t two = held(2), four = held(4);
  model_->SetTraining(true);
  if (four > two) {
    activation_bytes_per_example_ = static_cast<double>(four - two) / 2;
    activation_bytes_fixed_ =
        std::max(0.0, two - 2 * activation_bytes_per_example_);
  }
}

absl::Status Trainer::CheckMemory(int processes, int weight_copies) const {
  if (!device_.is_cpu()) return absl::OkStatus();
  AvailableMemory available = AvailableMemoryNow();
  const int64_t limit_bytes = config_.memory_limit_mb() * 1000000;
  if (limit_bytes > 0 &&
      (available.bytes < 0 || limit_bytes < available.bytes)) {
    available = {limit_bytes, "--memory_limit_mb"};
  }
  if (available.bytes < 0) return absl::OkStatus();
  const double limit = static_cast<double>(available.bytes);
  // Once the model exists, this process's weights are allocated already
  // (and the launcher's probe frees its own before the nodes start theirs).
  const double state = processes * (training_state_bytes_ +
                                    (1.0 + weight_copies) * weight_bytes_) -
                       (model_ != nullptr ? weight_bytes_ : 0);
  const double activations =
      activation_bytes_per_example_ > 0
          ? processes * (activation_bytes_fixed_ +
                         config_.batch() * activation_bytes_per_example_)
          : 0;
  if (state + activations <= limit) return absl::OkStatus();
  const std::string nodes =
      processes > 1 ? absl::StrCat(" of ", processes, " nodes") : "";
  const std::string than =
      absl::StrCat("more than the ", FormatBytes(limit),
                   " of memory available here (", available.source, ")");
  if (state > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model=", config_.model(), ": the weights, gradients and optimizer",
        " state", nodes, " need at least ", FormatBytes(state), " (",
        FormatBytes(weight_bytes_), " of weights", processes > 1 ? " each" : "",
        ", --optimizer=", config_.optimizer(),
        weight_copies > 0
            ? absl::StrCat(", and ", weight_copies,
                           " more copies of the weights a node keeps")
            : "",
        "), ", than, "; use a smaller model",
        processes > 1 ? " or fewer nodes" : ""));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--batch=", config_.batch(), ": ",
      processes > 1
          ? absl::StrCat("the training steps of ", processes, " nodes hold")
          : "a training step holds",
      " at least ", FormatBytes(activations), " of activations (",
      FormatBytes(activation_bytes_per_example_),
      " per example, measured on forward passes over 2 and 4 validation "
      "examples) besides ",
      FormatBytes(state),
      " of weights, gradients and optimizer state: together ", than,
      "; lower --batch or the model's size"));
}

void Trainer::DropGradients() {
  for (torch::Tensor& p : model_->Parameters()) p.mutable_grad().reset();
}

void Trainer::ZeroMissingGradients() {
  std::vector<torch::Tensor> params = model_->Parameters();
  had_gradient_.resize(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) {
      had_gradient_[i] = true;
    } else if (had_gradient_[i]) {
      params[i].mutable_grad() = torch::zeros_like(params[i]);
    }
  }
}

MemoryPlanOptions Trainer::MemoryPlan(MemoryPlanOptions plan) const {
  plan.parameters = static_cast<int64_t>(weight_bytes_ / sizeof(float));
  plan.optimizer = config_.optimizer();
  plan.sgd_momentum = config_.momentum() > 0;
  plan.activation_bytes =
      activation_bytes_per_example_ > 0
          ? activation_bytes_fixed_ +
                config_.batch() * activation_bytes_per_example_
          : 0;
  plan.process_bytes = process_bytes_;
  plan.code_bytes = code_bytes_;
  return plan;
}

absl::Status Trainer::CheckMemory(int processes, const MemoryPlanOptions& plan,
                                  bool launcher) const {
  if (!device_.is_cpu()) return absl::OkStatus();
  const MemoryEstimate each = EstimateMemory(MemoryPlan(plan));
  // A launcher's own share is the memory it held before its probe model,
  // which it frees before its nodes start.
  const double total =
      launcher ? RunPeak(each, processes, process_bytes_) : each.Peak();
  // What is resident already is no longer in MemAvailable: a launcher's own
  // memory and the code its nodes share, or all of this process so far.
  const ResidentMemory now = ResidentMemoryNow();
  const double resident = launcher ? process_bytes_ + code_bytes_
                                   : std::max<int64_t>(0, now.anon) +
                                         std::max<int64_t>(0, now.file);
  const AvailableMemory available = AvailableMemoryNow();
  const double limit_mb = static_cast<double>(config_.memory_limit_mb());
  std::string over;
  const bool over_limit = limit_mb > 0 && total > limit_mb * 1e6;
  if (over_limit) {
    over = absl::StrCat(
        "more than --memory_limit_mb=", config_.memory_limit_mb(), " allows");
  } else if (available.bytes >= 0 &&
             total - resident > static_cast<double>(available.bytes)) {
    over = absl::StrCat(
        "more than the ", FormatBytes(static_cast<double>(available.bytes)),
        " of memory available here (", available.source, ") and the ",
        FormatBytes(resident), " resident already");
  } else {
    return absl::OkStatus();
  }
  const bool several = processes > 1;
  return absl::InvalidArgumentError(absl::StrCat(
      "--model=", config_.model(), " with --batch=", config_.batch(), ": ",
      launcher ? absl::StrCat(processes, several ? " nodes" : " node",
                              " and this process need about ",
                              FormatBytes(total), " at their peaks, each node ")
               : "a process needs ",
      each.Describe(), "; ", over, "; use a smaller model or --batch",
      several ? " or fewer nodes" : "",
      over_limit ? " (or a larger --memory_limit_mb)" : ""));
}

absl::StatusOr<StepResult> Trainer::Step(const GradientHook& hook) {
  auto start = std::chrono::steady_clock::now();
  double hook_seconds = 0;
  StepResult r;
  r.lr = LearningRateAt(schedule_, state_.step());
  r.region = region();
  r.drifted = drift_.step >= 0 && state_.step() + 1 >= drift_.step &&
              (state_.step() == 0 || state_.step() < drift_.step);
  try {
    for (auto& group : optimizer_->param_groups()) group.options().set_lr(r.lr);
    Batch batch = dataset_->NextTrain(config_.batch(), sampler_, r.region);
    torch::Tensor x = batch.x.to(device_), y = batch.y.to(device_);
    DropGradients();  // none, unless the last step threw
    torch::Tensor logits;
    {
      // --precision=bf16: the forward pass (and so its backward) in bf16
      // where autocast says so; the weights it casts stay fp32.
      torch_compat::AutocastScope autocast(device_.type(), bf16());
      logits = model_->Forward(x);
    }
    // The loss in fp32 whatever the precision (a no-op in fp32).
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}),
        y.reshape({-1}));
    loss.backward();
    ZeroMissingGradients();
    if (hook) {
      auto hook_start = std::chrono::steady_clock::now();
      absl::Status s = hook(model_->Parameters());
      hook_seconds = Seconds(hook_start);
      if (!s.ok()) {
        DropGradients();
        return s;
      }
    }
    if (config_.clip() > 0) ClipGradNorm(model_->Parameters(), config_.clip());
    optimizer_->step();
    DropGradients();
    r.loss = loss.item<double>();
    r.samples = batch.y.size(0);
    r.tokens = batch.y.numel();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("inner step ", state_.step() + 1,
                                            " failed: ", TorchErrorMessage(e)));
  }
  if (!std::isfinite(r.loss)) {
    return absl::InternalError(absl::StrCat(
        "training loss is ", r.loss, " at step ", state_.step() + 1,
        " (diverged); lower --lr or enable --clip"));
  }
  // Slower hardware: stretch the compute (not the hook's communication) by
  // the slowdown factor, and count the wait as compute.
  const double compute = std::max(0.0, Seconds(start) - hook_seconds);
  if (config_.slowdown() > 1.0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double>((config_.slowdown() - 1.0) * compute));
  }
  r.seconds = Seconds(start);
  state_.set_step(state_.step() + 1);
  state_.set_samples(state_.samples() + r.samples);
  state_.set_tokens(state_.tokens() + r.tokens);
  // Compute only: the hook's communication (ddp's all-reduce) is not.
  state_.set_compute_seconds(state_.compute_seconds() +
                             std::max(0.0, r.seconds - hook_seconds));
  state_.set_last_train_loss(r.loss);
  return r;
}

absl::StatusOr<EvalResult> Trainer::Evaluate(
    int batch_size, const std::function<bool()>& cancelled) {
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0, targets = 0;
  const int reg = region();
  const int64_t n = dataset_->val_examples(reg);
  try {
    torch::NoGradGuard no_grad;
    model_->SetTraining(false);
    for (int64_t begin = 0; begin < n; begin += batch_size) {
      if (cancelled && cancelled()) {
        model_->SetTraining(true);
        return absl::CancelledError(absl::StrCat(
            "evaluation called off after ", begin, " of ", n, " examples"));
      }
      Batch b = dataset_->ValBatch(
          begin, std::min<int64_t>(batch_size, n - begin), reg);
      torch::Tensor logits;
      {
        torch_compat::AutocastScope autocast(device_.type(), bf16());
        logits = model_->Forward(b.x.to(device_));
      }
      torch::Tensor flat =
          logits.to(torch::kFloat32).reshape({-1, logits.size(-1)});
      torch::Tensor y = b.y.to(device_).reshape({-1});
      loss_sum +=
          torch::nn::functional::cross_entropy(
              flat, y,
              torch::nn::functional::CrossEntropyFuncOptions().reduction(
                  torch::kSum))
              .item<double>();
      correct += flat.argmax(-1).eq(y).sum().item<int64_t>();
      targets += y.numel();
    }
    model_->SetTraining(true);
  } catch (const std::exception& e) {
    model_->SetTraining(true);
    return absl::InternalError(
        absl::StrCat("evaluation failed: ", TorchErrorMessage(e)));
  }
  r.examples = n;
  r.loss = targets > 0 ? loss_sum / targets : 0.0;
  if (dataset_->kind() == TaskKind::kClassification && targets > 0) {
    r.accuracy = static_cast<double>(correct) / targets;
  }
  return r;
}

namespace {

// The trainer's sections: its small ones, and its tensors (the old
// builds' LibTorch archives in "model" and "optimizer").
constexpr char kModelTensors[] = "model_tensors";
// The model's tensors' names, shapes and dtypes, one a line: a resume into
// another model names the first that differs.
constexpr char kTensorSignature[] = "tensor_signature";
constexpr char kOptimizerTensors[] = "optimizer_tensors";
constexpr char kModelArchive[] = "model";
constexpr char kOptimizerArchive[] = "optimizer";

// The model's parameters then buffers, named "param.i" and "buffer.i".
NamedTensors ModelTensors(Model& model) {
  NamedTensors out;
  std::vector<torch::Tensor> params = model.Parameters();
  std::vector<torch::Tensor> buffers = model.Buffers();
  for (size_t i = 0; i < params.size(); ++i) {
    out.emplace_back(absl::StrCat("param.", i), params[i].detach());
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    out.emplace_back(absl::StrCat("buffer.", i), buffers[i]);
  }
  return out;
}

// Each model tensor of the stream into its own tensor in `model`.
TensorDestination ModelDestination(const NamedTensors& model) {
  return [&model](const TensorHeader& h) -> absl::StatusOr<torch::Tensor> {
    for (const auto& [name, t] : model) {
      if (name == h.name) return t;
    }
    return absl::DataLossError(
        absl::StrCat("tensor ", h.name, " is not in this model"));
  };
}

std::string TorchRngState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  return std::string(static_cast<const char*>(state.data_ptr()),
                     state.nbytes());
}

void SetTorchRngState(const std::string& bytes) {
  torch::Tensor state =
      torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

absl::Status Trainer::SaveCheckpoint(const std::string& path,
                                     std::map<std::string, std::string> extra) {
  CheckpointSections sections;
  for (auto& [name, bytes] : extra) {
    sections.emplace(name, CheckpointSection(std::move(bytes)));
  }
  return SaveCheckpoint(path, std::move(sections));
}

absl::Status Trainer::SaveCheckpoint(const std::string& path,
                                     CheckpointSections extra) {
  CheckpointSections& sections = extra;
  TrainerState st = state_;
  std::ostringstream rng;
  rng << sampler_.rng;
  st.set_sampler_rng(rng.str());
  st.set_epoch(sampler_.epoch);
  st.set_cursor(sampler_.cursor);
  sections.insert_or_assign("trainer_state", st.SerializeAsString());
  sections.insert_or_assign("architecture", model_->Architecture());
  sections.insert_or_assign(kTensorSignature,
                            absl::StrJoin(TensorSignature(*model_), "\n"));
  try {
    STARLING_ASSIGN_OR_RETURN(CheckpointSection model,
                              TensorsSection(ModelTensors(*model_)));
    sections.insert_or_assign(kModelTensors, std::move(model));
    STARLING_ASSIGN_OR_RETURN(NamedTensors opt,
                              OptimizerStateTensors(*optimizer_));
    STARLING_ASSIGN_OR_RETURN(CheckpointSection opt_section,
                              TensorsSection(std::move(opt)));
    sections.insert_or_assign(kOptimizerTensors, std::move(opt_section));
    sections.insert_or_assign("torch_rng", TorchRngState());
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot serialize checkpoint ",
                                            path, ": ", TorchErrorMessage(e)));
  }
  return WriteCheckpoint(path, sections);
}

namespace {

// Whether the checkpoint at `path` (its "architecture" and, when present,
// "tensor_signature" sections) holds `model`: FailedPrecondition naming both
// and the first tensor that differs otherwise. A TorchScript model is
// compared by content (Model::Architecture), so a file that moved resumes.
absl::Status SameModel(const std::string& path, const std::string& was,
                       const std::string* tensors, Model& model) {
  const std::string now = model.Architecture();
  if (was == now) return absl::OkStatus();
  // A checkpoint without a tensor list names its TorchScript model by the
  // file's path, which proves nothing either way: the tensors are checked
  // as they load.
  if (tensors == nullptr && absl::StartsWith(was, "torchscript(") &&
      absl::StartsWith(now, "torchscript(")) {
    return absl::OkStatus();
  }
  std::string first;
  if (tensors != nullptr) {
    const std::vector<std::string> old_lines =
        absl::StrSplit(*tensors, '\n', absl::SkipEmpty());
    first = SignatureDifference(old_lines, "the checkpoint",
                                TensorSignature(model), "this run's model");
  }
  return absl::FailedPreconditionError(
      absl::StrCat("--resume: checkpoint ", path, " holds model ", was,
                   " but this run's --model is ", now,
                   first.empty() ? "" : absl::StrCat(" (", first, ")")));
}

}  // namespace

absl::Status Trainer::RestoreCheckpoint(
    const std::string& path, std::map<std::string, std::string>* sections) {
  STARLING_ASSIGN_OR_RETURN(CheckpointReader reader,
                            CheckpointReader::Open(path));
  STARLING_RETURN_IF_ERROR(RestoreCheckpoint(reader));
  if (sections == nullptr) return absl::OkStatus();
  sections->clear();
  for (const std::string& name : reader.Names()) {
    if (name == kModelTensors || name == kOptimizerTensors ||
        name == kModelArchive || name == kOptimizerArchive) {
      continue;
    }
    STARLING_ASSIGN_OR_RETURN((*sections)[name], reader.ReadString(name));
  }
  return absl::OkStatus();
}

absl::Status Trainer::CheckResumable(const std::string& path,
                                     const TrainerState& st,
                                     const std::string& architecture,
                                     const std::string* signature) const {
  auto mismatch = [&](absl::string_view flag, const std::string& was,
                      const std::string& now) {
    return absl::FailedPreconditionError(
        absl::StrCat("--resume: checkpoint ", path, " was written with --",
                     flag, "=", was, " but this run has --", flag, "=", now));
  };
  const TrainConfig& old = st.config();
  STARLING_RETURN_IF_ERROR(SameModel(path, architecture, signature, *model_));
  if (old.data() != config_.data())
    return mismatch("data", old.data(), config_.data());
  if (old.shard() != config_.shard()) {
    return mismatch("shard", old.shard(), config_.shard());
  }
  if (old.shard_mode() != config_.shard_mode()) {
    return mismatch("shard_mode", old.shard_mode(), config_.shard_mode());
  }
  if (old.drift() != config_.drift()) {
    return mismatch("drift", old.drift(), config_.drift());
  }
  if (old.optimizer() != config_.optimizer()) {
    return mismatch("optimizer", old.optimizer(), config_.optimizer());
  }
  if (old.seed() != config_.seed()) {
    return mismatch("seed", absl::StrCat(old.seed()),
                    absl::StrCat(config_.seed()));
  }
  return absl::OkStatus();
}

absl::Status Trainer::RestoreTensors(const CheckpointReader& reader) {
  // Every header of both streams is checked before any tensor is read, and
  // the optimizer's state is installed only once read whole: a stream
  // that does not fit this model changes nothing.
  const NamedTensors model = ModelTensors(*model_);
  const TensorDestination into_model = ModelDestination(model);
  auto named = [&](const char* name, absl::Status s) {
    if (s.ok() || !absl::IsDataLoss(s)) return s;
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", reader.path(), " section ", name, ": ", s.message()));
  };
  STARLING_ASSIGN_OR_RETURN(SectionReader check, reader.Section(kModelTensors));
  STARLING_RETURN_IF_ERROR(
      named(kModelTensors, CheckTensors(check, into_model)));
  STARLING_ASSIGN_OR_RETURN(SectionReader opt,
                            reader.Section(kOptimizerTensors));
  STARLING_RETURN_IF_ERROR(
      named(kOptimizerTensors, ReadOptimizerState(opt, *optimizer_)));
  STARLING_ASSIGN_OR_RETURN(SectionReader in, reader.Section(kModelTensors));
  return named(kModelTensors, ReadTensors(in, into_model));
}

absl::Status Trainer::RestoreArchives(const CheckpointReader& reader) {
  STARLING_ASSIGN_OR_RETURN(std::string mbytes,
                            reader.ReadString(kModelArchive));
  torch::serialize::InputArchive model_archive;
  model_archive.load_from(mbytes.data(), mbytes.size());
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params = model_->Parameters();
  std::vector<torch::Tensor> buffers = model_->Buffers();
  auto load = [&](const std::string& key, torch::Tensor& dst) {
    torch::Tensor src;
    model_archive.read(key, src);
    TORCH_CHECK(src.sizes() == dst.sizes(), "tensor ", key, " has shape ",
                ShapeString(src), ", the model expects ", ShapeString(dst));
    dst.copy_(src);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    load(absl::StrCat("param.", i), params[i]);
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    load(absl::StrCat("buffer.", i), buffers[i]);
  }
  mbytes.clear();
  mbytes.shrink_to_fit();
  STARLING_ASSIGN_OR_RETURN(std::string obytes,
                            reader.ReadString(kOptimizerArchive));
  torch::serialize::InputArchive opt_archive;
  // The optimizer's state goes where its parameters are.
  opt_archive.load_from(obytes.data(), obytes.size(), device_);
  optimizer_->load(opt_archive);
  return absl::OkStatus();
}

absl::Status Trainer::RestoreCheckpoint(const CheckpointReader& reader) {
  const std::string& path = reader.path();
  const bool archives = !reader.Has(kModelTensors) && reader.Has(kModelArchive);
  for (const char* name : {"trainer_state", "architecture", "torch_rng",
                           archives ? kModelArchive : kModelTensors,
                           archives ? kOptimizerArchive : kOptimizerTensors}) {
    if (!reader.Has(name)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, " has no '", name, "' section"));
    }
  }
  STARLING_ASSIGN_OR_RETURN(std::string st_bytes,
                            reader.ReadString("trainer_state"));
  TrainerState st;
  if (!st.ParseFromString(st_bytes)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": unreadable trainer state"));
  }
  STARLING_ASSIGN_OR_RETURN(std::string architecture,
                            reader.ReadString("architecture"));
  std::string signature;
  if (reader.Has(kTensorSignature)) {
    STARLING_ASSIGN_OR_RETURN(signature, reader.ReadString(kTensorSignature));
  }
  STARLING_RETURN_IF_ERROR(
      CheckResumable(path, st, architecture,
                     reader.Has(kTensorSignature) ? &signature : nullptr));
  STARLING_ASSIGN_OR_RETURN(std::string rng_bytes,
                            reader.ReadString("torch_rng"));
  std::mt19937_64 sampler_rng;
  std::istringstream rng(st.sampler_rng());
  rng >> sampler_rng;
  if (rng.fail()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": unreadable sampler state"));
  }
  try {
    STARLING_RETURN_IF_ERROR(archives ? RestoreArchives(reader)
                                      : RestoreTensors(reader));
    SetTorchRngState(rng_bytes);
  } catch (const std::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path,
                     " does not fit this model: ", TorchErrorMessage(e)));
  }
  sampler_.rng = sampler_rng;
  sampler_.epoch = st.epoch();
  sampler_.cursor = st.cursor();
  sampler_.order_epoch = -1;
  if (std::string changed = ResumeDifferences(st.config(), config_);
      !changed.empty()) {
    STARLING_LOG(WARNING) << "--resume: settings differ from the checkpoint's: "
                          << changed << "; training goes on from step "
                          << st.step()
                          << " with the new ones, so it no longer matches a "
                             "run never interrupted";
  }
  *st.mutable_config() = config_;
  state_ = st;
  return absl::OkStatus();
}

}  // namespace starling
