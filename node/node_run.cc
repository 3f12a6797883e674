#include "node/node_run.h"

#include "core/checkpoint.h"

namespace starling {

std::string NodeRun::CheckpointPath() const {
  return CheckpointPathInRunDir(out());
}

}  // namespace starling
