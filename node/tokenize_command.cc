#include "node/tokenize_command.h"

#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/run_output.h"
#include "node/sentencepiece.h"

// Shared with train, node and sim (defined in train_command.cc).
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, token_dtype);

ABSL_FLAG(std::string, input, "",
          "tokenize: the text file to encode (UTF-8; each line becomes its "
          "pieces followed by the model's end-of-sentence id), and to train "
          "the model on with --model_prefix");
ABSL_FLAG(std::string, model_prefix, "",
          "tokenize: train a new SentencePiece model on --input and write it "
          "to PREFIX.model (and its vocabulary to PREFIX.vocab)");
ABSL_FLAG(std::string, sp_model, "",
          "tokenize: encode with this existing SentencePiece model (a "
          "PREFIX.model file) instead of training one");
ABSL_FLAG(int, vocab_size, 8000,
          "tokenize: the vocabulary size of the model --model_prefix trains "
          "(SentencePiece refuses one the text is too small for, and says "
          "the largest it allows)");
ABSL_FLAG(std::string, sp_model_type, "unigram",
          "tokenize: the SentencePiece algorithm for --model_prefix: unigram "
          "| bpe | char | word");
ABSL_FLAG(std::string, val_input, "",
          "tokenize: a validation text to encode with the same model into "
          "--val_out (for train's --val_data=tokens:PATH)");
ABSL_FLAG(std::string, val_out, "",
          "tokenize: where --val_input's tokens go (the same --token_dtype)");

namespace starling {
namespace {

int Fail(const absl::Status& s, int code) {
  WriteStderrLine(absl::StrCat("starling tokenize: error: ", s.message()));
  return code;
}

// The tokenize flags, checked.
struct TokenizeSetup {
  std::string input, model_prefix, sp_model, out, token_dtype, model_type;
  std::string val_input, val_out;
  int vocab_size = 0;
  // The model file that encodes: PREFIX.model, or --sp_model.
  std::string ModelPath() const {
    return sp_model.empty() ? model_prefix + ".model" : sp_model;
  }
};

absl::Status Bad(absl::string_view flag, absl::string_view value,
                 absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": ", why));
}

// A readable regular file: NotFound or InvalidArgument naming the flag.
absl::Status CheckReadable(absl::string_view flag, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("--", flag, "=", path, ": no such file"));
  }
  if (!S_ISREG(st.st_mode)) {
    return Bad(flag, path, "not a regular file");
  }
  return absl::OkStatus();
}

// The directory of output `path` exists (made if missing) and is writable.
absl::Status CheckWritable(absl::string_view flag, const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, slash);
  absl::Status s = CheckDirWritable(dir.empty() ? "/" : dir);
  if (!s.ok()) {
    return Bad(
        flag, path,
        absl::StrCat("its directory is not writable (", s.message(), ")"));
  }
  return absl::OkStatus();
}

// Everything a bad flag or input fails, before any training or encoding.
absl::StatusOr<TokenizeSetup> CheckTokenize() {
  TokenizeSetup t;
  t.input = absl::GetFlag(FLAGS_input);
  t.model_prefix = absl::GetFlag(FLAGS_model_prefix);
  t.sp_model = absl::GetFlag(FLAGS_sp_model);
  t.out = absl::GetFlag(FLAGS_out);
  t.token_dtype = absl::GetFlag(FLAGS_token_dtype);
  t.model_type = absl::GetFlag(FLAGS_sp_model_type);
  t.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  t.val_input = absl::GetFlag(FLAGS_val_input);
  t.val_out = absl::GetFlag(FLAGS_val_out);
  if (t.input.empty()) {
    return absl::InvalidArgumentError("--input: name the text file to encode");
  }
  STARLING_RETURN_IF_ERROR(CheckReadable("input", t.input));
  if (t.model_prefix.empty() == t.sp_model.empty()) {
    return absl::InvalidArgumentError(
        "give exactly one of --model_prefix=PREFIX (train a new model on "
        "--input) and --sp_model=FILE (encode with an existing one)");
  }
  if (!t.sp_model.empty()) {
    STARLING_RETURN_IF_ERROR(CheckReadable("sp_model", t.sp_model));
  }
  if (t.out.empty()) {
    return absl::InvalidArgumentError(
        "--out: name the token file to write, e.g. --out=corpus.tokens");
  }
  if (t.token_dtype != "uint16" && t.token_dtype != "uint32") {
    return Bad("token_dtype", t.token_dtype, "expected uint16 or uint32");
  }
  if (!t.model_prefix.empty()) {
    if (t.vocab_size < 2) {
      return Bad("vocab_size", absl::StrCat(t.vocab_size), "must be >= 2");
    }
    if (t.token_dtype == "uint16" && t.vocab_size > 65536) {
      return Bad("vocab_size", absl::StrCat(t.vocab_size),
                 "does not fit uint16 tokens (at most 65536); add "
                 "--token_dtype=uint32");
    }
    if (t.model_type != "unigram" && t.model_type != "bpe" &&
        t.model_type != "char" && t.model_type != "word") {
      return Bad("sp_model_type", t.model_type,
                 "expected unigram, bpe, char or word");
    }
    STARLING_RETURN_IF_ERROR(CheckWritable("model_prefix", t.model_prefix));
  }
  if (t.val_input.empty() != t.val_out.empty()) {
    return absl::InvalidArgumentError(
        "--val_input and --val_out go together: the validation text and "
        "where its tokens go");
  }
  if (!t.val_input.empty()) {
    STARLING_RETURN_IF_ERROR(CheckReadable("val_input", t.val_input));
    STARLING_RETURN_IF_ERROR(CheckWritable("val_out", t.val_out));
  }
  STARLING_RETURN_IF_ERROR(CheckWritable("out", t.out));
  return t;
}

// Little-endian uint16 or uint32 ids, as --data=tokens:PATH reads them.
absl::StatusOr<std::string> TokenBytes(const EncodedText& e,
                                       const std::string& dtype) {
  const size_t width = dtype == "uint32" ? 4 : 2;
  if (width == 2 && e.vocab > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model has ", e.vocab,
                     " pieces, more than uint16 tokens hold (65536); add "
                     "--token_dtype=uint32"));
  }
  std::string out(e.ids.size() * width, '\0');
  for (size_t i = 0; i < e.ids.size(); ++i) {
    const uint32_t v = static_cast<uint32_t>(e.ids[i]);
    for (size_t k = 0; k < width; ++k) {
      out[width * i + k] = static_cast<char>((v >> (8 * k)) & 0xff);
    }
  }
  return out;
}

// Encodes `text_path` with the model and writes its tokens to `out_path`:
// the encoding, for the summary line.
absl::StatusOr<EncodedText> EncodeFile(const SentencePiece& sp,
                                       const TokenizeSetup& t,
                                       const std::string& text_path,
                                       const std::string& out_path) {
  STARLING_ASSIGN_OR_RETURN(std::string text, ReadFile(text_path));
  STARLING_ASSIGN_OR_RETURN(EncodedText e, sp.Encode(t.ModelPath(), text));
  if (e.ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(text_path, " encodes to no tokens (is it empty?)"));
  }
  STARLING_ASSIGN_OR_RETURN(std::string bytes, TokenBytes(e, t.token_dtype));
  STARLING_RETURN_IF_ERROR(WriteFileAtomic(out_path, bytes));
  return e;
}

}  // namespace

const Subcommand& TokenizeSubcommand() {
  static const Subcommand* sub = [] {
    auto* s = new Subcommand{
        "tokenize",
        "make a token file from text with SentencePiece (for "
        "--data=tokens:PATH)",
        "Encodes --input with a SentencePiece model (Debian's "
        "libsentencepiece) into --out, a file of little-endian "
        "--token_dtype integers that train, node and sim read with "
        "--data=tokens:OUT --token_dtype=... --vocab=N. With "
        "--model_prefix=PREFIX it first trains a model of --vocab_size "
        "pieces on --input (PREFIX.model, PREFIX.vocab); with "
        "--sp_model=FILE it uses an existing one. Each line of the text "
        "becomes its pieces followed by the model's end-of-sentence id "
        "(</s>). --val_input and --val_out encode a validation text with "
        "the same model, for --val_data=tokens:VAL_OUT. The last line "
        "printed is the flags to train with.\n\n"
        "  starling tokenize --input=corpus.txt --model_prefix=runs/spm "
        "--vocab_size=4000 --out=runs/corpus.tokens "
        "--val_input=held_out.txt --val_out=runs/val.tokens\n"
        "  starling sim --data=tokens:runs/corpus.tokens --token_dtype=uint16 "
        "--vocab=4000 --val_data=tokens:runs/val.tokens",
        {"input", "model_prefix", "sp_model", "vocab_size", "sp_model_type",
         "out", "token_dtype", "val_input", "val_out"}};
    s->help["out"] =
        "the token file to write (little-endian --token_dtype integers)";
    s->help["token_dtype"] =
        "the element type of the token files written: uint16 (vocabularies "
        "up to 65536) or uint32";
    return s;
  }();
  return *sub;
}

int RunTokenizeCommand() {
  absl::StatusOr<TokenizeSetup> setup = CheckTokenize();
  if (!setup.ok()) return Fail(setup.status(), 2);
  const TokenizeSetup& t = *setup;
  absl::StatusOr<SentencePiece> sp = SentencePiece::Load();
  if (!sp.ok()) return Fail(sp.status(), 1);
  if (!t.model_prefix.empty()) {
    WriteStderrLine(absl::StrCat("starling tokenize: training a ", t.model_type,
                                 " model of ", t.vocab_size, " pieces on ",
                                 t.input));
    // minloglevel 1: SentencePiece's warnings and errors, not its progress.
    absl::Status s = sp->Train({{"input", t.input},
                                {"model_prefix", t.model_prefix},
                                {"vocab_size", absl::StrCat(t.vocab_size)},
                                {"model_type", t.model_type},
                                {"minloglevel", "1"}});
    if (!s.ok()) return Fail(s, 2);
  }
  absl::StatusOr<EncodedText> e = EncodeFile(*sp, t, t.input, t.out);
  if (!e.ok()) return Fail(e.status(), ExitCodeFor(e.status()));
  std::string val_flag;
  if (!t.val_input.empty()) {
    absl::StatusOr<EncodedText> v = EncodeFile(*sp, t, t.val_input, t.val_out);
    if (!v.ok()) return Fail(v.status(), ExitCodeFor(v.status()));
    WriteStderrLine(absl::StrCat("starling tokenize: ", t.val_input, " -> ",
                                 v->ids.size(), " tokens in ", t.val_out));
    val_flag = absl::StrCat(" --val_data=tokens:", t.val_out);
  }
  WriteStderrLine(absl::StrCat("starling tokenize: ", t.input, " -> ",
                               e->ids.size(), " tokens in ", t.out, " (",
                               t.token_dtype, ", vocabulary ", e->vocab,
                               ", model ", t.ModelPath(), ")"));
  WriteStderrLine(absl::StrCat("train with: --data=tokens:", t.out,
                               " --token_dtype=", t.token_dtype,
                               " --vocab=", e->vocab, val_flag));
  return 0;
}

}  // namespace starling
