// Fuzz target for the checkpoint loader (core/checkpoint.h ReadCheckpoint)
// and the parsers of the sections a resumed node reads besides LibTorch's
// archives: the trainer state proto, the outer optimizer's and the error
// feedback's saved state, and the round and comm counters
// (node/node_command.cc).
// Input: u8 mode, then the file's bytes. With mode bit0 set the correct
// trailing checksum is appended, so the fuzzer reaches the section parser;
// without it the bytes are the whole file. The file is written to a scratch
// directory of this process (under $TMPDIR) and nowhere else.
// Invariants: errors are DataLoss; a checkpoint that loads is written back
// and reads back with the same sections; a section state that loads saves
// back to the same bytes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "compression/codec.h"
#include "core/checkpoint.h"
#include "core/flat_params.h"
#include "outer_opt/outer_optimizer.h"
#include "starling/config/v1/config.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace starling {
namespace {

constexpr uint64_t kMaxValues = 1 << 20;

void WriteRaw(const std::string& path, absl::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  FUZZ_CHECK(f != nullptr, "cannot write %s", path.c_str());
  if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void LoadSections(const Checkpoint& c) {
  auto section = [&](const char* name) -> const std::string* {
    auto it = c.sections.find(name);
    return it == c.sections.end() ? nullptr : &it->second;
  };
  if (const std::string* s = section("trainer_state")) {
    config::v1::TrainerState st;
    (void)st.ParseFromString(*s);
  }
  if (const std::string* s = section("outer")) {
    int64_t n = 4;
    if (s->size() >= 16) {
      std::memcpy(&n, s->data() + 8, 8);
      if (n < 0 || static_cast<uint64_t>(n) > kMaxValues) n = 4;
    }
    auto outer = std::move(OuterOptimizer::Create({}, n)).value();
    const absl::Status st = outer->LoadState(*s);
    FUZZ_CHECK(st.ok() || absl::IsDataLoss(st), "outer: %s",
               st.ToString().c_str());
    if (st.ok()) {
      FUZZ_CHECK(outer->SaveState() == *s, "outer state does not save back");
    }
  }
  if (const std::string* s = section("error_feedback")) {
    uint64_t n = 0;
    if (s->size() >= 12) std::memcpy(&n, s->data() + 4, 8);
    if (n > kMaxValues) n = 0;
    ErrorFeedback ef(static_cast<int64_t>(n));
    const absl::Status st = ef.LoadState(*s);
    FUZZ_CHECK(st.ok() || absl::IsDataLoss(st), "error feedback: %s",
               st.ToString().c_str());
    if (st.ok()) {
      FUZZ_CHECK(ef.SaveState() == *s, "residual does not save back");
    }
  }
  if (const std::string* s = section("round")) {
    int64_t round = 0;
    (void)absl::SimpleAtoi(*s, &round);
  }
  if (const std::string* s = section("comm")) {
    std::vector<std::string> comm = absl::StrSplit(*s, ',');
    for (size_t i = 0; i < comm.size() && i < 4; ++i) {
      int64_t v = 0;
      (void)absl::SimpleAtoi(comm[i], &v);
    }
  }
}

}  // namespace
}  // namespace starling

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  static const std::string* path =
      new std::string(fuzz::ScratchDir() + "/checkpoint.ckpt");
  static const std::string* copy =
      new std::string(fuzz::ScratchDir() + "/rewritten.ckpt");
  fuzz::Reader in(data, size);
  const uint8_t mode = in.Get<uint8_t>();
  std::string file(in.Rest());
  if (mode & 1) {
    const uint64_t sum = HashBytes(file.data(), file.size());
    file.append(reinterpret_cast<const char*>(&sum), sizeof(sum));
  }
  WriteRaw(*path, file);
  absl::StatusOr<Checkpoint> c = ReadCheckpoint(*path);
  if (!c.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(c.status()), "ReadCheckpoint: %s",
               c.status().ToString().c_str());
    return 0;
  }
  LoadSections(*c);
  const absl::Status w = WriteCheckpoint(*copy, *c);
  FUZZ_CHECK(w.ok(), "WriteCheckpoint: %s", w.ToString().c_str());
  absl::StatusOr<Checkpoint> back = ReadCheckpoint(*copy);
  FUZZ_CHECK(back.ok(), "re-read: %s", back.status().ToString().c_str());
  FUZZ_CHECK(back->sections == c->sections, "sections changed on rewrite");
  return 0;
}
