#include "node/sentencepiece.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"

namespace starling {
namespace {

constexpr char kLibrary[] = "libstarling_sentencepiece.so";

// The directory of the running binary.
std::string ExeDir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

absl::StatusOr<SentencePiece> SentencePiece::Load() {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizer runtime refuses RTLD_DEEPBIND, without which the
  // library's protobuf would meet Starling's.
  return absl::FailedPreconditionError(
      "starling tokenize is not available in an AddressSanitizer build "
      "(it loads SentencePiece with RTLD_DEEPBIND, which the sanitizer "
      "refuses); use a normal build");
#endif
  const std::string dir = ExeDir();
  const std::vector<std::string> candidates = {
      absl::StrCat(dir, "/", kLibrary),
      absl::StrCat(dir, "/../lib/starling/", kLibrary)};
  for (const std::string& path : candidates) {
    if (!FileExists(path)) continue;
    // RTLD_DEEPBIND: the library's own protobuf copy wins inside it.
    void* handle =
        ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot load ", path, ": ", ::dlerror(),
                       " (it needs Debian's libsentencepiece0: apt-get install "
                       "libsentencepiece0, or run scripts/setup.sh)"));
    }
    auto train =
        reinterpret_cast<TrainFn>(::dlsym(handle, "starling_spm_train"));
    auto encode =
        reinterpret_cast<EncodeFn>(::dlsym(handle, "starling_spm_encode"));
    auto free = reinterpret_cast<FreeFn>(::dlsym(handle, "starling_spm_free"));
    if (train == nullptr || encode == nullptr || free == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(path,
                       " lacks the starling_spm_* functions (a library "
                       "from another Starling build?)"));
    }
    return SentencePiece(train, encode, free);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("starling tokenize needs ", kLibrary,
                   ", built beside the starling "
                   "binary from Debian's libsentencepiece-dev; looked in ",
                   absl::StrJoin(candidates, " and ")));
}

absl::Status SentencePiece::Train(
    const std::map<std::string, std::string>& options) const {
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : options) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  char err[1024] = {0};
  if (train_(keys.data(), values.data(), static_cast<int>(keys.size()), err,
             sizeof(err)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SentencePiece training failed: ", err));
  }
  return absl::OkStatus();
}

absl::StatusOr<EncodedText> SentencePiece::Encode(
    const std::string& model_path, absl::string_view text) const {
  int32_t* ids = nullptr;
  size_t count = 0;
  EncodedText out;
  char err[1024] = {0};
  if (encode_(model_path.c_str(), text.data(), text.size(), &ids, &count,
              &out.vocab, &out.eos, err, sizeof(err)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SentencePiece cannot encode with ", model_path, ": ", err));
  }
  out.ids.assign(ids, ids + count);
  free_(ids);
  return out;
}

}  // namespace starling
