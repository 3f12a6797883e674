#include "core/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <malloc.h>
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
#include "core/file_util.h"
#include "core/image_data.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/torch_error.h"

// ASan's allocator replaces glibc's, and counts its own bytes.
#if defined(__SANITIZE_ADDRESS__)
#define STARLING_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STARLING_ASAN 1
#endif
#endif
#ifdef STARLING_ASAN
#include <sanitizer/allocator_interface.h>
#endif

namespace starling {
namespace {

std::string ShapeString(const torch::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ","), "]");
}

// Bytes the C++ heap hands out for this process (LibTorch's CPU allocator
// is posix_memalign): the sanitizer allocator's count under ASan, else
// glibc's over all its arenas and mmapped blocks; 0 where neither is
// there (another libc or allocator).
int64_t HeapInUse() {
#ifdef STARLING_ASAN
  return static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
#elif defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
#else
  return 0;
#endif
}

// The memory this process may still take, and where that figure comes
// from: MemAvailable in /proc/meminfo, capped by the headroom under its
// memory cgroup's limit (a container's: v2 memory.max, v1
// memory.limit_in_bytes). Bytes -1 when unknown.
struct AvailableMemory {
  int64_t bytes = -1;  // unknown
  std::string source;
};

AvailableMemory AvailableMemoryNow() {
  AvailableMemory out;
  auto number = [](absl::string_view text, int64_t* value) {
    return absl::SimpleAtoi(
        absl::StripSuffix(absl::StripAsciiWhitespace(text), " kB"), value);
  };
  if (absl::StatusOr<std::string> info = ReadFile("/proc/meminfo"); info.ok()) {
    for (absl::string_view line : absl::StrSplit(*info, '\n')) {
      int64_t kib = 0;
      if (absl::ConsumePrefix(&line, "MemAvailable:") && number(line, &kib)) {
        out = {kib * 1024, "MemAvailable in /proc/meminfo"};
      }
    }
  }
  // /proc/self/cgroup names the cgroup ("0::/PATH" in v2, "N:memory:/PATH"
  // in v1) as the host sees it; a container that mounts its own cgroup at
  // the root of /sys/fs/cgroup has its limit there instead.
  absl::StatusOr<std::string> cgroup = ReadFile("/proc/self/cgroup");
  for (absl::string_view line :
       absl::StrSplit(cgroup.ok() ? *cgroup : "", '\n')) {
    std::string root, limit_file, usage_file;
    if (absl::ConsumePrefix(&line, "0::")) {
      root = "/sys/fs/cgroup";
      limit_file = "memory.max";
      usage_file = "memory.current";
    } else if (std::vector<absl::string_view> f =
                   absl::StrSplit(line, absl::MaxSplits(':', 2));
               f.size() == 3 && absl::StrContains(f[1], "memory")) {
      line = f[2];
      root = "/sys/fs/cgroup/memory";
      limit_file = "memory.limit_in_bytes";
      usage_file = "memory.usage_in_bytes";
    } else {
      continue;
    }
    for (const std::string& dir : {absl::StrCat(root, line), root}) {
      absl::StatusOr<std::string> limit_text = ReadFile(dir + "/" + limit_file);
      absl::StatusOr<std::string> usage_text = ReadFile(dir + "/" + usage_file);
      int64_t limit = 0, used = 0;
      if (!limit_text.ok() || !usage_text.ok()) continue;
      // "max" (v2) or a huge number (v1) when there is no limit.
      if (number(*limit_text, &limit) && number(*usage_text, &used) &&
          (out.bytes < 0 || limit - used < out.bytes)) {
        out = {std::max<int64_t>(0, limit - used),
               absl::StrCat("the headroom under ", dir, "/", limit_file)};
      }
      break;
    }
  }
  return out;
}

// Straight into the string, without a stream's buffer and its copy.
std::string ArchiveToString(torch::serialize::OutputArchive& archive) {
  std::string out;
  archive.save_to([&out](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  return out;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
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

namespace {

// The torch::Device that --device names: FailedPrecondition when it asks for
// CUDA and this build or machine has none.
absl::StatusOr<torch::Device> DeviceOf(const TrainConfig& config) {
  if (config.device() == "cpu") return torch::Device(torch::kCPU);
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=", config.device(),
        ": CUDA is not available (this LibTorch build has no CUDA support "
        "or no GPU is visible); build against a CUDA LibTorch with "
        "-DCMAKE_PREFIX_PATH=/path/to/libtorch, or use --device=cpu"));
  }
  try {
    return torch::Device(config.device());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", config.device(), ": ", TorchErrorMessage(e)));
  }
}

}  // namespace

std::string ResumeDifferences(const TrainConfig& was_as_saved,
                              const TrainConfig& now) {
  // A checkpoint from before --token_dtype existed read uint16 tokens.
  TrainConfig was = was_as_saved;
  if (was.token_dtype().empty()) was.set_token_dtype("uint16");
  static constexpr absl::string_view kNotCounted[] = {
      "out",        "resume",    "cache_dir",
      "eval_every", "log_every", "checkpoint_every",
      "threads",    "device",    "slowdown"};
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

absl::Status CheckTrainConfig(const TrainConfig& config, int processes,
                              int weight_copies) {
  STARLING_RETURN_IF_ERROR(DeviceOf(config).status());
  // The model is built and probed on the CPU: the launcher that checks
  // should not hold a GPU context of its own for the whole run.
  TrainConfig probe = config;
  probe.set_device("cpu");
  probe.set_shard("0/1");
  // Create checks one process. GPU nodes keep their weights, state and
  // activations in GPU memory, not this machine's.
  STARLING_ASSIGN_OR_RETURN(
      std::unique_ptr<Trainer> trainer,
      Trainer::Create(probe, /*check_memory=*/config.device() == "cpu"));
  if ((processes <= 1 && weight_copies == 0) || config.device() != "cpu") {
    return absl::OkStatus();
  }
  return trainer->CheckMemory(processes, weight_copies);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainConfig& config, bool check_memory) {
  STARLING_ASSIGN_OR_RETURN(torch::Device device, DeviceOf(config));
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
    const int64_t before = HeapInUse();
    torch::Tensor logits = model_->Forward(b.x);
    return HeapInUse() - before;
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
  const AvailableMemory available = AvailableMemoryNow();
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
    optimizer_->zero_grad();
    torch::Tensor logits = model_->Forward(x);
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
    loss.backward();
    if (hook) {
      auto hook_start = std::chrono::steady_clock::now();
      absl::Status s = hook(model_->Parameters());
      hook_seconds = Seconds(hook_start);
      if (!s.ok()) {
        optimizer_->zero_grad();
        return s;
      }
    }
    if (config_.clip() > 0) {
      torch::nn::utils::clip_grad_norm_(model_->Parameters(), config_.clip());
    }
    optimizer_->step();
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
      torch::Tensor logits = model_->Forward(b.x.to(device_));
      torch::Tensor flat = logits.reshape({-1, logits.size(-1)});
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

absl::Status Trainer::SaveCheckpoint(const std::string& path,
                                     std::map<std::string, std::string> extra) {
  Checkpoint ckpt;
  ckpt.sections = std::move(extra);
  TrainerState st = state_;
  std::ostringstream rng;
  rng << sampler_.rng;
  st.set_sampler_rng(rng.str());
  st.set_epoch(sampler_.epoch);
  st.set_cursor(sampler_.cursor);
  ckpt.sections["trainer_state"] = st.SerializeAsString();
  ckpt.sections["architecture"] = model_->Architecture();
  try {
    torch::serialize::OutputArchive model_archive;
    std::vector<torch::Tensor> params = model_->Parameters();
    std::vector<torch::Tensor> buffers = model_->Buffers();
    for (size_t i = 0; i < params.size(); ++i) {
      model_archive.write(absl::StrCat("param.", i), params[i].detach().cpu());
    }
    for (size_t i = 0; i < buffers.size(); ++i) {
      model_archive.write(absl::StrCat("buffer.", i), buffers[i].cpu());
    }
    ckpt.sections["model"] = ArchiveToString(model_archive);
    torch::serialize::OutputArchive opt_archive;
    optimizer_->save(opt_archive);
    ckpt.sections["optimizer"] = ArchiveToString(opt_archive);
    auto gen = at::detail::getDefaultCPUGenerator();
    torch::Tensor rng_state;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng_state = gen.get_state();
    }
    ckpt.sections["torch_rng"] = std::string(
        static_cast<const char*>(rng_state.data_ptr()), rng_state.nbytes());
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot serialize checkpoint ",
                                            path, ": ", TorchErrorMessage(e)));
  }
  return WriteCheckpoint(path, ckpt);
}

absl::Status Trainer::RestoreCheckpoint(
    const std::string& path, std::map<std::string, std::string>* sections) {
  STARLING_ASSIGN_OR_RETURN(Checkpoint ckpt, ReadCheckpoint(path));
  for (const char* name :
       {"trainer_state", "architecture", "model", "optimizer", "torch_rng"}) {
    if (!ckpt.sections.count(name)) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", path, " has no '", name, "' section"));
    }
  }
  TrainerState st;
  if (!st.ParseFromString(ckpt.sections["trainer_state"])) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": unreadable trainer state"));
  }
  auto mismatch = [&](absl::string_view flag, const std::string& was,
                      const std::string& now) {
    return absl::FailedPreconditionError(
        absl::StrCat("--resume: checkpoint ", path, " was written with --",
                     flag, "=", was, " but this run has --", flag, "=", now));
  };
  const TrainConfig& old = st.config();
  if (ckpt.sections["architecture"] != model_->Architecture()) {
    return mismatch("model", ckpt.sections["architecture"],
                    model_->Architecture());
  }
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
  try {
    torch::serialize::InputArchive model_archive;
    const std::string& mbytes = ckpt.sections["model"];
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
    torch::serialize::InputArchive opt_archive;
    const std::string& obytes = ckpt.sections["optimizer"];
    opt_archive.load_from(obytes.data(), obytes.size());
    optimizer_->load(opt_archive);
    const std::string& rbytes = ckpt.sections["torch_rng"];
    torch::Tensor rng_state =
        torch::empty({static_cast<int64_t>(rbytes.size())}, torch::kUInt8);
    std::memcpy(rng_state.data_ptr(), rbytes.data(), rbytes.size());
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng_state);
  } catch (const std::exception& e) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path,
                     " does not fit this model: ", TorchErrorMessage(e)));
  }
  std::istringstream rng(st.sampler_rng());
  rng >> sampler_.rng;
  if (rng.fail()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path, ": unreadable sampler state"));
  }
  sampler_.epoch = st.epoch();
  sampler_.cursor = st.cursor();
  sampler_.order_epoch = -1;
  if (std::string changed = ResumeDifferences(old, config_); !changed.empty()) {
    STARLING_LOG(WARNING) << "--resume: settings differ from the checkpoint's: "
                          << changed << "; training goes on from step "
                          << st.step()
                          << " with the new ones, so it no longer matches a "
                             "run never interrupted";
  }
  *st.mutable_config() = config_;
  state_ = st;
  if (sections != nullptr) *sections = std::move(ckpt.sections);
  return absl::OkStatus();
}

}  // namespace starling
