// `starling tokenize`: turns text into a token file that
// `--data=tokens:PATH --token_dtype=... --vocab=N` trains on. It trains a
// SentencePiece model on the text (or applies a given one) and encodes the
// text with it, each line followed by the model's end-of-sentence id; it can
// encode a validation text with the same model for --val_data. SentencePiece
// is Debian's library (node/sentencepiece.h), not a tokenizer of our own.
// Call from the main thread only.
#ifndef STARLING_NODE_TOKENIZE_COMMAND_H_
#define STARLING_NODE_TOKENIZE_COMMAND_H_

#include "node/flags.h"

namespace starling {

const Subcommand& TokenizeSubcommand();

// Runs `starling tokenize` with the already-parsed flags. Returns the exit
// code: 0 ok, 2 bad flags or input (found before any work), 1 a failure
// while training, encoding or writing.
int RunTokenizeCommand();

}  // namespace starling

#endif  // STARLING_NODE_TOKENIZE_COMMAND_H_
