// The inner optimizer's state (Adam and AdamW: step counts and moments; SGD:
// momentum buffers) as a tensor stream (core/tensor_stream.h), for
// checkpoints: saved from the optimizer's own tensors, restored into new
// tensors that replace the optimizer's state only once the whole stream is
// read. Bit-exact: the same bytes, the same step counts.
//
// Entries, for each parameter that has state, by its index i in the order
// of the optimizer's parameter groups:
//   adam, adamw: "i.step" (int64, no dimensions), "i.exp_avg",
//                "i.exp_avg_sq", and "i.max_exp_avg_sq" with amsgrad
//   sgd:         "i.momentum_buffer"
// The moments have their parameter's dtype and shape.
// Free functions on the caller's optimizer: thread-compatible.
#ifndef STARLING_CORE_OPTIMIZER_STATE_H_
#define STARLING_CORE_OPTIMIZER_STATE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/byte_stream.h"
#include "core/tensor_stream.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace starling {

// The entries of `opt`'s state. The moments are the optimizer's own
// tensors (no copy); they must not change until written. InvalidArgument
// for an optimizer other than torch::optim's Adam, AdamW and SGD.
absl::StatusOr<NamedTensors> OptimizerStateTensors(
    torch::optim::Optimizer& opt);

// Replaces `opt`'s state with the stream's (a parameter without entries
// gets none). DataLoss when the stream is malformed, an entry names no
// parameter or field of this optimizer, a parameter's entries are
// incomplete or repeated, or a moment's dtype or shape is not its
// parameter's. On any error `opt` is unchanged.
absl::Status ReadOptimizerState(ByteSource& in, torch::optim::Optimizer& opt);

}  // namespace starling

#endif  // STARLING_CORE_OPTIMIZER_STATE_H_
