// EstimateMemory (core/memory.h): the plan behind the start-up memory check,
// item by item, for the algorithms and options that change what a node
// holds. Pure: no model, no allocation.
#include "core/memory.h"

#include <string>

#include "gtest/gtest.h"

namespace starling {
namespace {

constexpr double kCopy = 4e6;  // one fp32 copy of 1M parameters

MemoryPlanOptions Diloco() {
  MemoryPlanOptions o;
  o.algo = "diloco";
  o.parameters = 1000000;
  return o;
}

double Sum(const std::vector<MemoryItem>& items) {
  double total = 0;
  for (const MemoryItem& i : items) total += i.bytes;
  return total;
}

TEST(EstimateMemoryTest, Fp32DilocoPeaksInTheRoundsExchange) {
  const MemoryEstimate e = EstimateMemory(Diloco());
  // Weights, two AdamW moments, θ_global, outer momentum.
  EXPECT_DOUBLE_EQ(e.Held(), 5 * kCopy);
  // Gradients only inside a step.
  EXPECT_DOUBLE_EQ(Sum(e.step), kCopy);
  // The step's freed memory kept (here its gradients), Δ with the ring's
  // input and working copy, and the transport's 7.5 copies.
  EXPECT_DOUBLE_EQ(Sum(e.round), (1 + 3 + 7.5) * kCopy);
  // The trainer's tensors stream from their own memory; only the outer
  // state goes as a string.
  EXPECT_DOUBLE_EQ(Sum(e.checkpoint), 2 * kCopy);
  EXPECT_EQ(e.PeakPhase(), "round");
  EXPECT_DOUBLE_EQ(e.Peak(), (5 + 11.5) * kCopy);
  const std::string d = e.Describe();
  EXPECT_EQ(d.rfind("66.0 MB at peak (a round's exchange): 30.0 MB of "
                    "transport buffers, 12.0 MB of Δ",
                    0),
            0u)
      << d;
  EXPECT_NE(d.find("8.0 MB of AdamW moments"), std::string::npos) << d;
}

TEST(EstimateMemoryTest, ErrorFeedbackAndCompressionChangeTheRound) {
  MemoryPlanOptions o = Diloco();
  o.compression = "topk:0.01+int8";
  o.error_feedback = true;
  const MemoryEstimate e = EstimateMemory(o);
  EXPECT_DOUBLE_EQ(e.Held(), 6 * kCopy);  // and the residual
  // Kept, Δ's three, the compressed Δ and saved residual, the node's own
  // model (the residual lives in it), 3 copies of transport.
  EXPECT_DOUBLE_EQ(Sum(e.round), (1 + 3 + 2 + 1 + 3) * kCopy);
  EXPECT_DOUBLE_EQ(Sum(e.checkpoint), (1 + 1 + 1 + 1) * kCopy);
  // --overlap keeps the residual out of the model, and a round in flight.
  o.overlap = true;
  const MemoryEstimate overlap = EstimateMemory(o);
  EXPECT_DOUBLE_EQ(overlap.Held(), 9 * kCopy);
  EXPECT_DOUBLE_EQ(Sum(overlap.round), (1 + 3 + 2 + 1 + 3) * kCopy);
  EXPECT_DOUBLE_EQ(Sum(overlap.checkpoint), 3 * kCopy);
}

TEST(EstimateMemoryTest, EachAlgorithmCountsItsOwnBuffers) {
  MemoryPlanOptions o = Diloco();
  o.algo = "train";
  o.activation_bytes = 10 * kCopy;
  o.process_bytes = 100e6;
  const MemoryEstimate train = EstimateMemory(o);
  // A plain trainer: the process, weights and moments; its peak is a step
  // (gradients, activations and half again of them in the backward pass).
  EXPECT_DOUBLE_EQ(train.Held(), 100e6 + 3 * kCopy);
  EXPECT_EQ(train.PeakPhase(), "step");
  EXPECT_DOUBLE_EQ(train.Peak(), 100e6 + (3 + 1 + 15) * kCopy);
  o.algo = "ddp";
  EXPECT_DOUBLE_EQ(Sum(EstimateMemory(o).step), (1 + 15 + 2) * kCopy);
  o.algo = "gossip";
  o.activation_bytes = 0;
  o.process_bytes = 0;
  o.gossip_momentum = true;
  const MemoryEstimate gossip = EstimateMemory(o);
  // Weights, moments, the push-sum model, the momentum's anchor and buffer.
  EXPECT_DOUBLE_EQ(gossip.Held(), 6 * kCopy);
  EXPECT_DOUBLE_EQ(Sum(gossip.round), 3 * kCopy);
  // Plain SGD keeps no state; without --out nothing is checkpointed.
  o.optimizer = "sgd";
  o.sgd_momentum = false;
  o.gossip_momentum = false;
  o.checkpoints = false;
  const MemoryEstimate sgd = EstimateMemory(o);
  EXPECT_DOUBLE_EQ(sgd.Held(), 2 * kCopy);
  EXPECT_TRUE(sgd.checkpoint.empty());
}

}  // namespace
}  // namespace starling
