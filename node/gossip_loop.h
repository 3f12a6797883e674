// gossip loop (intermediate split).
#ifndef STARLING_NODE_GOSSIP_LOOP_H_
#define STARLING_NODE_GOSSIP_LOOP_H_

#include "node/node_run.h"

namespace starling {

int RunGossip(NodeRun& run);

}  // namespace starling

#endif  // STARLING_NODE_GOSSIP_LOOP_H_
