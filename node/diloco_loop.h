// diloco loop (intermediate split).
#ifndef STARLING_NODE_DILOCO_LOOP_H_
#define STARLING_NODE_DILOCO_LOOP_H_

#include "node/node_run.h"

namespace starling {

int RunDiloco(NodeRun& run);

}  // namespace starling

#endif  // STARLING_NODE_DILOCO_LOOP_H_
