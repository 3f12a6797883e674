// A list of named tensors as one stream of bytes (a checkpoint section):
// a small header per tensor (name, dtype, shape), then each tensor's raw
// little-endian bytes. Written from the tensors' own memory and read
// straight into their destinations, a bounded piece at a time where a copy
// is needed (another device, a strided tensor), so that a model-sized list
// is never held a second time.
//
// Layout, version 1 (little-endian):
//   "STARTNSR" u32 version u32 count
//   count x { u32 name_len, name, u8 dtype (c10::ScalarType), u8 ndim,
//             ndim x i64 dim }
//   count x the tensor's bytes, contiguous, row-major
// All headers come first: a reader checks every one against its
// destination before it writes into any.
// Free functions; the tensors are the caller's: thread-compatible.
#ifndef STARLING_CORE_TENSOR_STREAM_H_
#define STARLING_CORE_TENSOR_STREAM_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/byte_stream.h"
#include "core/checkpoint.h"

namespace starling {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct TensorHeader {
  std::string name;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;  // numel x element size
};

// The stream's size in bytes. InvalidArgument naming the tensor for a dtype
// the format does not carry (complex, quantized) or an undefined tensor.
absl::StatusOr<uint64_t> TensorsSize(const NamedTensors& tensors);

// Writes the stream of `tensors` into `sink`. Errors as TensorsSize's, or
// the sink's.
absl::Status WriteTensors(const NamedTensors& tensors, ByteSink& sink);

// `tensors` as a checkpoint section, produced when the file is written:
// they must stay alive and unchanged until then. Errors as TensorsSize's.
absl::StatusOr<CheckpointSection> TensorsSection(NamedTensors tensors);

// The tensor a header's bytes go into: of the header's dtype and shape, on
// any device; or an error, returned by ReadTensors as it is.
using TensorDestination =
    std::function<absl::StatusOr<torch::Tensor>(const TensorHeader& header)>;

// Reads a whole stream from `in`: every header, each one's destination,
// then the bytes into the destinations. DataLoss when the stream is
// malformed (bad magic or version, a header out of bounds, sizes that do
// not add up to the stream's) or a destination does not match its header.
// No destination is written unless every header is well formed and
// matched; an I/O error while reading the bytes may leave them partly
// written.
absl::Status ReadTensors(ByteSource& in, const TensorDestination& destination);

// ReadTensors without reading the tensors' bytes: checks every header and
// its destination, leaving `in` at the first tensor's bytes. A caller that
// restores several streams checks them all before it reads any.
absl::Status CheckTensors(ByteSource& in, const TensorDestination& destination);

// The stream's headers, leaving `in` at the first tensor's bytes. DataLoss
// as ReadTensors.
absl::StatusOr<std::vector<TensorHeader>> ReadTensorHeaders(ByteSource& in);

}  // namespace starling

#endif  // STARLING_CORE_TENSOR_STREAM_H_
