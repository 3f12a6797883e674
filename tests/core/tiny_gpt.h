// The tiny gpt that trainer tests train on a text file: 1 layer, width 32,
// 2 heads, context 32, batch 8. Fast enough for unit tests on a CPU. Callers
// add their own steps, learning rate or device, then ResolveTrainConfig.
// Stateless, so thread-safe.
#ifndef STARLING_TESTS_CORE_TINY_GPT_H_
#define STARLING_TESTS_CORE_TINY_GPT_H_

#include <string>

#include "core/trainer.h"

namespace starling::testing {

inline TrainConfig TinyGptConfig(const std::string& text_path) {
  TrainConfig c = DefaultTrainConfig();
  c.set_data("text:" + text_path);
  c.set_model("gpt");
  c.set_layers(1);
  c.set_width(32);
  c.set_heads(2);
  c.set_context(32);
  c.set_batch(8);
  return c;
}

}  // namespace starling::testing

#endif  // STARLING_TESTS_CORE_TINY_GPT_H_
