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

// The bytes of the item named `what` in `items`; 0 when there is none.
double Item(const std::vector<MemoryItem>& items, const std::string& what) {
  for (const MemoryItem& i : items) {
    if (i.what == what) return i.bytes;
  }
  return 0;
}

// What `o` holds whatever the model's size: the process, its code and a
// node's runtime.
double Fixed(MemoryPlanOptions o) {
  o.parameters = 0;
  return EstimateMemory(o).Peak();
}

TEST(EstimateMemoryTest, Fp32DilocoPeaksInTheRoundsExchange) {
  const MemoryEstimate e = EstimateMemory(Diloco());
  // Weights, two AdamW moments, θ_global, outer momentum, and the node's
  // runtime (gRPC, its threads), which does not grow with the model.
  EXPECT_DOUBLE_EQ(e.Held() - Fixed(Diloco()), 5 * kCopy);
  // Gradients only inside a step.
  EXPECT_DOUBLE_EQ(Sum(e.step), kCopy);
  // The step's freed memory kept (here its gradients), Δ with the ring's
  // input and working copy, and the transport's buffers, which bench/
  // memory.py measures: copies of the weights, more than one.
  const double transport = Item(e.round, "of transport buffers");
  EXPECT_GT(transport, kCopy);
  EXPECT_DOUBLE_EQ(Sum(e.round), (1 + 3) * kCopy + transport);
  // The trainer's tensors stream from their own memory; only the outer
  // state goes as a string.
  EXPECT_DOUBLE_EQ(Sum(e.checkpoint), 2 * kCopy);
  EXPECT_EQ(e.PeakPhase(), "round");
  EXPECT_DOUBLE_EQ(e.Peak() - Fixed(Diloco()), (5 + 4) * kCopy + transport);
  const std::string d = e.Describe();
  EXPECT_NE(d.find("at peak (a round's exchange): "), std::string::npos) << d;
  EXPECT_NE(d.find(" of transport buffers, "), std::string::npos) << d;
  EXPECT_NE(d.find("8.0 MB of AdamW moments"), std::string::npos) << d;
  EXPECT_NE(d.find("of the node's runtime"), std::string::npos) << d;
}

// The plan is a fixed part (the process before its model, its code, a
// node's runtime) plus a part that grows linearly with the parameters, at
// no less than the floor of what a DiLoCo node must hold: weights,
// gradients, two Adam moments, θ_global and outer momentum.
TEST(EstimateMemoryTest, PlanIsAFixedPartAndAPartPerParameter) {
  MemoryPlanOptions o = Diloco();
  o.process_bytes = 70e6;
  o.code_bytes = 120e6;
  const double fixed = Fixed(o);
  // The process, its code and the runtime, at least.
  EXPECT_GT(fixed, o.process_bytes + o.code_bytes);
  EXPECT_EQ(Fixed(Diloco()), fixed - o.process_bytes - o.code_bytes);
  double last = fixed;
  for (int64_t n : {1000000, 3000000, 19000000, 100000000}) {
    o.parameters = n;
    const double peak = EstimateMemory(o).Peak();
    EXPECT_GT(peak, last);
    EXPECT_GE((peak - fixed) / n, 24.0) << n;
    // Linear: the same bytes per parameter at every size.
    EXPECT_NEAR((peak - fixed) / n,
                (EstimateMemory(Diloco()).Peak() - Fixed(Diloco())) / 1e6, 1e-9)
        << n;
    last = peak;
  }
  // A plain trainer starts no runtime of its own.
  MemoryPlanOptions train = o;
  train.algo = "train";
  EXPECT_LT(Fixed(train), fixed);
  EXPECT_DOUBLE_EQ(Fixed(train), o.process_bytes + o.code_bytes);
}

// Several processes of one binary share its code: a machine holds it once,
// and every node's private part, and the launcher's own.
TEST(EstimateMemoryTest, RunPeakCountsSharedCodeOnce) {
  MemoryPlanOptions o = Diloco();
  o.code_bytes = 120e6;
  const MemoryEstimate e = EstimateMemory(o);
  EXPECT_DOUBLE_EQ(e.shared, 120e6);
  EXPECT_DOUBLE_EQ(RunPeak(e, 1, 0), e.Peak());
  EXPECT_DOUBLE_EQ(RunPeak(e, 4, 50e6), 4 * e.Peak() - 3 * 120e6 + 50e6);
  EXPECT_GT(RunPeak(e, 5, 50e6), RunPeak(e, 4, 50e6));
}

TEST(EstimateMemoryTest, ErrorFeedbackAndCompressionChangeTheRound) {
  MemoryPlanOptions o = Diloco();
  o.sparse = true;  // topk:0.01+int8
  o.error_feedback = true;
  const MemoryEstimate e = EstimateMemory(o);
  EXPECT_DOUBLE_EQ(e.Held() - Fixed(o), 6 * kCopy);  // and the residual
  // Kept, Δ's three, the compressed Δ and saved residual, the node's own
  // model (the residual lives in it), and the transport's buffers: the
  // sparse codec gathers small packs, a ring (of any dense codec) passes
  // whole segments.
  const double sparse = Item(e.round, "of transport buffers");
  const double ring = Item(EstimateMemory(Diloco()).round,
                           "of transport "
                           "buffers");
  EXPECT_GT(sparse, 0);
  EXPECT_LT(sparse, ring);
  EXPECT_DOUBLE_EQ(Sum(e.round), (1 + 3 + 2 + 1) * kCopy + sparse);
  EXPECT_DOUBLE_EQ(Sum(e.checkpoint), (1 + 1 + 1 + 1) * kCopy);
  // --overlap keeps the residual out of the model, and a round in flight.
  o.overlap = true;
  const MemoryEstimate overlap = EstimateMemory(o);
  EXPECT_DOUBLE_EQ(overlap.Held() - Fixed(o), 9 * kCopy);
  EXPECT_DOUBLE_EQ(Sum(overlap.round), (1 + 3 + 2 + 1) * kCopy + sparse);
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
  EXPECT_DOUBLE_EQ(gossip.Held() - Fixed(o), 6 * kCopy);
  EXPECT_DOUBLE_EQ(Sum(gossip.round), 3 * kCopy);
  // Plain SGD keeps no state; without --out nothing is checkpointed.
  o.optimizer = "sgd";
  o.sgd_momentum = false;
  o.gossip_momentum = false;
  o.checkpoints = false;
  const MemoryEstimate sgd = EstimateMemory(o);
  EXPECT_DOUBLE_EQ(sgd.Held() - Fixed(o), 2 * kCopy);
  EXPECT_TRUE(sgd.checkpoint.empty());
}

}  // namespace
}  // namespace starling
