// SentencePiece for `starling tokenize`: trains a model and encodes text with
// it, through libstarling_sentencepiece.so (node/sentencepiece_shim.cc),
// which this loads with dlopen(RTLD_DEEPBIND) because Debian's
// libsentencepiece bundles a protobuf that clashes with Starling's (the
// shim's header comment says how).
//
// The library is looked up next to the running binary (build/), then in
// ../lib/starling/ beside it (an installed /usr/local/bin/starling finds
// /usr/local/lib/starling/). Thread-compatible: one caller at a time.
#ifndef STARLING_NODE_SENTENCEPIECE_H_
#define STARLING_NODE_SENTENCEPIECE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace starling {

// What encoding a text gives.
struct EncodedText {
  std::vector<int32_t> ids;
  int32_t vocab = 0;  // the model's pieces: ids are in [0, vocab)
  int32_t eos = -1;   // the id that ends each line (-1: the model has none)
};

class SentencePiece {
 public:
  // Loads the library. FailedPrecondition naming where it looked when it
  // is missing or does not load.
  static absl::StatusOr<SentencePiece> Load();

  // Trains a model with SentencePiece's trainer options (input,
  // model_prefix, vocab_size, model_type, ...), which writes
  // MODEL_PREFIX.model and MODEL_PREFIX.vocab. InvalidArgument with
  // SentencePiece's reason when it refuses.
  absl::Status Train(const std::map<std::string, std::string>& options) const;

  // Encodes every line of `text` with the model at `model_path`, each line
  // followed by the model's end-of-sentence id. InvalidArgument with
  // SentencePiece's reason (a file that is not a model, say).
  absl::StatusOr<EncodedText> Encode(const std::string& model_path,
                                     absl::string_view text) const;

 private:
  using TrainFn = int (*)(const char* const*, const char* const*, int, char*,
                          size_t);
  using EncodeFn = int (*)(const char*, const char*, size_t, int32_t**, size_t*,
                           int32_t*, int32_t*, char*, size_t);
  using FreeFn = void (*)(int32_t*);

  SentencePiece(TrainFn train, EncodeFn encode, FreeFn free)
      : train_(train), encode_(encode), free_(free) {}

  // The library stays loaded for the life of the process.
  TrainFn train_;
  EncodeFn encode_;
  FreeFn free_;
};

}  // namespace starling

#endif  // STARLING_NODE_SENTENCEPIECE_H_
