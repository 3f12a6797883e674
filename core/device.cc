#include "core/device.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/flat_params.h"
#include "core/torch_error.h"

#ifdef STARLING_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace starling {
namespace {

// The allocator of a GPU exists once LibTorch has initialized CUDA there;
// a tensor on it does that (the C++ API has no public lazy-init call that
// is the same in LibTorch 1.13 and 2.x).
void TouchDevice(const torch::Device& device) {
  (void)torch::empty({1}, torch::TensorOptions().device(device));
}

}  // namespace

bool BuiltWithCuda() {
#ifdef STARLING_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<torch::Device> ParseDevice(const std::string& spec) {
  if (spec == "cpu") return torch::Device(torch::kCPU);
  int64_t index = 0;
  absl::string_view rest = spec;
  const bool cuda = absl::ConsumePrefix(&rest, "cuda") &&
                    (rest.empty() || (absl::ConsumePrefix(&rest, ":") &&
                                      absl::SimpleAtoi(rest, &index)));
  if (!cuda || index < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", spec, ": expected cpu, cuda or cuda:K (K >= 0)"));
  }
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=", spec,
        ": CUDA is not available (this LibTorch build has no CUDA support "
        "or no GPU is visible); build against a CUDA LibTorch (see "
        "scripts/gpu/run_on_device.sh), or use --device=cpu"));
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", spec, ": this machine has ", count,
        count == 1 ? " GPU (cuda:0)"
                   : absl::StrCat(" GPUs (cuda:0 to cuda:", count - 1, ")")));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

absl::Status SetGpuMemoryFraction(const torch::Device& device,
                                  double fraction) {
  if (!(fraction >= 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu_memory_fraction=", fraction, ": must be in [0, 1] (0: no cap)"));
  }
  if (!device.is_cuda() || fraction == 0) return absl::OkStatus();
#ifdef STARLING_WITH_CUDA
  try {
    TouchDevice(device);
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                       device.index());
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("--gpu_memory_fraction=", fraction,
                                            ": ", TorchErrorMessage(e)));
  }
#endif
  return absl::OkStatus();
}

DeviceMemory PeakDeviceMemory(const torch::Device& device) {
  DeviceMemory m;
#ifdef STARLING_WITH_CUDA
  if (device.is_cuda()) {
    TouchDevice(device);
    // [0]: StatType::AGGREGATE, over all pool kinds (its namespace moved
    // between LibTorch versions; the index did not).
    const auto stats =
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    m.peak_allocated_bytes = stats.allocated_bytes[0].peak;
    m.peak_reserved_bytes = stats.reserved_bytes[0].peak;
  }
#else
  (void)device;
#endif
  return m;
}

void ResetPeakDeviceMemory(const torch::Device& device) {
#ifdef STARLING_WITH_CUDA
  if (device.is_cuda()) {
    TouchDevice(device);
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  }
#else
  (void)device;
#endif
}

void SynchronizeDevice(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

absl::Span<const float> HostStaging::Copy(
    const std::vector<torch::Tensor>& tensors) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = NumElements(tensors);
  const torch::Tensor* on_gpu = nullptr;
  for (const torch::Tensor& t : tensors) {
    if (t.is_cuda()) on_gpu = &t;
  }
  absl::Span<const float> out;
  if (on_gpu == nullptr) {
    host_.resize(static_cast<size_t>(n));
    FlattenInto(tensors, absl::MakeSpan(host_));
    out = host_;
  } else {
    torch::NoGradGuard no_grad;
    if (!pinned_.defined() || pinned_.numel() != n) {
      pinned_ = torch::empty(
          {n},
          torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
    }
    // Queued on the current stream, after the step that wrote them; the
    // host waits once, for all of them.
    int64_t offset = 0;
    for (const torch::Tensor& t : tensors) {
      pinned_.narrow(0, offset, t.numel())
          .copy_(t.detach().reshape({-1}), /*non_blocking=*/true);
      offset += t.numel();
    }
    SynchronizeDevice(on_gpu->device());
    out =
        absl::MakeConstSpan(pinned_.data_ptr<float>(), static_cast<size_t>(n));
  }
  last_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return out;
}

}  // namespace starling
