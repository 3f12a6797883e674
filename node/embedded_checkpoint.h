// What the Python module's checkpoints (EmbeddedDiloco's and
// EmbeddedGossip's, embedded_diloco.h and embedded_gossip.h) share: the
// node's format (core/checkpoint.h, core/tensor_stream.h) and section names
// for the model (model_tensors, architecture, tensor_signature), and the
// checks on reading one back: the same model, named by its first tensor
// that differs, and a checkpoint of the kind being resumed (a node's, a
// DiLoCo member's and a Gossip member's each resume only as themselves).
// Thread-safety: free functions over their arguments.
#ifndef STARLING_NODE_EMBEDDED_CHECKPOINT_H_
#define STARLING_NODE_EMBEDDED_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "node/embedded_diloco.h"
#include "node/metrics.h"

namespace starling {

// Which member wrote a checkpoint, by the section only that kind writes.
enum class EmbeddedKind { kDiloco, kGossip };

// FailedPrecondition for an empty --out: no run directory to checkpoint
// into.
absl::Status CheckCheckpointOut(const std::string& out);

// The model's sections: model_tensors holding `params` and `buffers` (flat,
// shaped as `model`'s tensors), the architecture and the tensor signature.
absl::StatusOr<CheckpointSections> EmbeddedModelSections(
    const EmbeddedModel& model, const std::string& architecture,
    const std::vector<float>& params, const std::vector<float>& buffers);

// Writes `sections` to `path` atomically; the time it took into `metrics`
// (null: none).
absl::Status WriteEmbeddedCheckpoint(const std::string& path,
                                     const CheckpointSections& sections,
                                     NodeMetrics* metrics);

// Opens `path` for a member of `kind`: FailedPrecondition for another
// kind's checkpoint (naming who resumes it), DataLoss for a missing one of
// `required` (the model's sections are always required).
absl::StatusOr<CheckpointReader> OpenEmbeddedCheckpoint(
    const std::string& path, EmbeddedKind kind,
    const std::vector<const char*>& required);

// The checkpoint's model: FailedPrecondition unless it is `architecture`
// (naming the first tensor that differs); its buffers are read into
// model.buffers, its parameters returned flat.
absl::StatusOr<std::vector<float>> ReadEmbeddedModel(
    const CheckpointReader& reader, const std::string& architecture,
    EmbeddedModel& model);

// Section `name` as a count (>= 0) into *v; *v unchanged when absent.
absl::Status ReadCheckpointCount(const CheckpointReader& reader,
                                 const char* name, int64_t* v);

// Raw fp32 bytes, as buffers_global and gossip_momentum hold them.
std::string FloatBytes(const std::vector<float>& v);
// Section `name` as `n` floats; DataLoss for another size.
absl::StatusOr<std::vector<float>> ReadFloats(const CheckpointReader& reader,
                                              const char* name, size_t n);

}  // namespace starling

#endif  // STARLING_NODE_EMBEDDED_CHECKPOINT_H_
