// Inner-step throughput of the KJV parity recipe (gpt 2x64, 4 heads, context
// 64, batch 16, AdamW, one thread), the same work per step as
// bench/pytorch_kjv.py. Reports tokens/s as items_per_second.
//   build/bench/inner_step_bench --benchmark_format=json
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "core/trainer.h"

namespace starling {
namespace {

void BM_KjvInnerStep(benchmark::State& state) {
  torch::set_num_threads(static_cast<int>(state.range(0)));
  TrainConfig c = DefaultTrainConfig();
  c.set_data("kjv");
  c.set_model("gpt");
  c.set_steps(1000000);  // the LR schedule never reaches 0 here
  c.set_seed(0);
  if (!ResolveTrainConfig(&c).ok()) {
    state.SkipWithError("bad config");
    return;
  }
  auto trainer = Trainer::Create(c);
  if (!trainer.ok()) {
    state.SkipWithError(std::string(trainer.status().message()).c_str());
    return;
  }
  for (int i = 0; i < 10; ++i) (void)(*trainer)->Step();  // warm up
  int64_t tokens = 0;
  for (auto _ : state) {
    auto r = (*trainer)->Step();
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    tokens += r->tokens;
  }
  state.SetItemsProcessed(tokens);
  state.counters["threads"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_KjvInnerStep)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(5.0);

}  // namespace
}  // namespace starling

BENCHMARK_MAIN();
