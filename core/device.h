// Where a trainer's tensors live: --device parsing, the GPU memory cap a
// process takes (--gpu_memory_fraction, for several nodes on one GPU), its
// peak GPU memory, and the copy of a model's parameters into host memory
// for the exchange (through pinned memory when they are on a GPU).
//
// The CUDA calls are compiled only against a CUDA LibTorch
// (STARLING_WITH_CUDA, set by core/CMakeLists.txt); on a CPU-only build
// every function here is the CPU case. Free functions are thread-safe;
// a HostStaging is not (one thread owns it).
#ifndef STARLING_CORE_DEVICE_H_
#define STARLING_CORE_DEVICE_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace starling {

// Whether this binary was built against a CUDA LibTorch.
bool BuiltWithCuda();

// "cpu", "cuda" or "cuda:K": the device. FailedPrecondition naming --device
// when CUDA is asked for and not available (a CPU-only LibTorch, or no GPU
// visible); InvalidArgument for another spelling or K past the last GPU.
// Asks the driver how many GPUs there are, without creating a context.
absl::StatusOr<torch::Device> ParseDevice(const std::string& spec);

// --gpu_memory_fraction: caps what this process's CUDA caching allocator
// may hold on `device` at `fraction` of the GPU's memory (an allocation past
// it fails as an out-of-memory error), so that several processes can share
// one GPU. 0 means no cap. Does nothing on the CPU. InvalidArgument outside
// [0, 1].
absl::Status SetGpuMemoryFraction(const torch::Device& device, double fraction);

// The caching allocator's peak use on a GPU since the process started (or
// the last ResetPeakDeviceMemory): bytes in tensors (what PyTorch's
// torch.cuda.max_memory_allocated reports) and bytes reserved from the
// driver (torch.cuda.max_memory_reserved). -1 on the CPU.
struct DeviceMemory {
  int64_t peak_allocated_bytes = -1;
  int64_t peak_reserved_bytes = -1;
};
DeviceMemory PeakDeviceMemory(const torch::Device& device);
void ResetPeakDeviceMemory(const torch::Device& device);

// Waits for the work queued on `device` (nothing to wait for on the CPU).
void SynchronizeDevice(const torch::Device& device);

// The parameters' values as one fp32 host buffer, in order (Flatten's
// layout, core/flat_params.h), kept between calls. On a GPU the copies go
// device to pinned host memory, queued together and waited for once;
// on the CPU it is a copy into ordinary memory. Not thread-safe.
class HostStaging {
 public:
  // Copies `tensors` (floating point, any device) into the buffer; the
  // span stays valid until the next call or the HostStaging's end.
  absl::Span<const float> Copy(const std::vector<torch::Tensor>& tensors);
  // Seconds the last Copy took (the device-to-host copy of the round).
  double last_seconds() const { return last_seconds_; }

 private:
  torch::Tensor pinned_;     // GPU tensors: the pinned buffer
  std::vector<float> host_;  // CPU tensors
  double last_seconds_ = 0;
};

}  // namespace starling

#endif  // STARLING_CORE_DEVICE_H_
