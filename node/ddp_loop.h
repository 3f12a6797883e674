// ddp loop (intermediate split).
#ifndef STARLING_NODE_DDP_LOOP_H_
#define STARLING_NODE_DDP_LOOP_H_

#include "node/node_run.h"

namespace starling {

int RunDdp(NodeRun& run);

}  // namespace starling

#endif  // STARLING_NODE_DDP_LOOP_H_
