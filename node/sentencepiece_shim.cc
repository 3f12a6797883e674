// libstarling_sentencepiece.so: SentencePiece (Debian's libsentencepiece)
// behind a small C interface, for `starling tokenize`.
//
// Why a separate library, loaded with dlopen(RTLD_DEEPBIND): Debian's
// libsentencepiece carries its own copy of protobuf-lite 3.14, whose symbols
// (google::protobuf::...) clash with the system protobuf 3.21 that Starling
// links; linked into one binary, SentencePiece's model parser refuses to
// run ("compiled against version 3.14.0 ... not compatible with the
// installed version"). Loaded with RTLD_DEEPBIND, this library and its
// libsentencepiece resolve their own symbols first and never meet
// Starling's protobuf. Only C types cross the boundary.
//
// This file includes no Starling or Abseil header: SentencePiece's headers
// bring their own absl::string_view.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

void SetError(const std::string& message, char* err, size_t err_len) {
  if (err_len == 0) return;
  std::snprintf(err, err_len, "%s", message.c_str());
}

}  // namespace

extern "C" {

// Trains a model from the `n` options keys[i]=values[i] (SentencePiece's
// trainer flags: input, model_prefix, vocab_size, model_type, ...). 0 on
// success; otherwise 1 and the reason in `err`.
__attribute__((visibility("default"))) int starling_spm_train(
    const char* const* keys, const char* const* values, int n, char* err,
    size_t err_len) {
  try {
    std::unordered_map<std::string, std::string> kwargs;
    for (int i = 0; i < n; ++i) kwargs[keys[i]] = values[i];
    const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs);
    if (!status.ok()) {
      SetError(status.ToString(), err, err_len);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    SetError(e.what(), err, err_len);
    return 1;
  }
}

// Encodes each line of `text` (`len` bytes; lines end at '\n', and a last
// line without one counts too) with the model at `model_path`, following
// every line with the model's end-of-sentence id when it has one. On
// success returns 0 with *ids (malloc'd; free with starling_spm_free) and
// *count set, *vocab the model's number of pieces and *eos its
// end-of-sentence id (-1: none); otherwise 1 and the reason in `err`.
__attribute__((visibility("default"))) int starling_spm_encode(
    const char* model_path, const char* text, size_t len, int32_t** ids,
    size_t* count, int32_t* vocab, int32_t* eos, char* err, size_t err_len) {
  try {
    sentencepiece::SentencePieceProcessor sp;
    const auto loaded = sp.Load(model_path);
    if (!loaded.ok()) {
      SetError(loaded.ToString(), err, err_len);
      return 1;
    }
    *vocab = sp.GetPieceSize();
    *eos = sp.eos_id();
    std::vector<int32_t> out;
    std::vector<int> line_ids;
    size_t begin = 0;
    while (begin < len) {
      const void* nl = std::memchr(text + begin, '\n', len - begin);
      const size_t end =
          nl != nullptr
              ? static_cast<size_t>(static_cast<const char*>(nl) - text)
              : len;
      line_ids.clear();
      const auto encoded =
          sp.Encode(absl::string_view(text + begin, end - begin), &line_ids);
      if (!encoded.ok()) {
        SetError(encoded.ToString(), err, err_len);
        return 1;
      }
      out.insert(out.end(), line_ids.begin(), line_ids.end());
      if (*eos >= 0) out.push_back(*eos);
      begin = end + 1;
    }
    *count = out.size();
    *ids = static_cast<int32_t*>(
        std::malloc(sizeof(int32_t) * (out.empty() ? 1 : out.size())));
    if (*ids == nullptr) {
      SetError("out of memory", err, err_len);
      return 1;
    }
    std::memcpy(*ids, out.data(), sizeof(int32_t) * out.size());
    return 0;
  } catch (const std::exception& e) {
    SetError(e.what(), err, err_len);
    return 1;
  }
}

__attribute__((visibility("default"))) void starling_spm_free(int32_t* ids) {
  std::free(ids);
}

}  // extern "C"
