// Fuzz target for the checkpoint loaders (core/checkpoint.h ReadCheckpoint
// and the streaming CheckpointReader) and the parsers of the sections a
// resumed node reads besides LibTorch's archives: the trainer's tensor
// streams (core/tensor_stream.h: the model's, and the optimizer's state as
// core/optimizer_state.h reads it), the trainer state proto, the outer
// optimizer's and the error feedback's saved state, and the round and comm
// counters (node/node_command.cc).
// Input: u8 mode, then the file's bytes. With mode bit0 set the correct
// trailing checksum is appended, so the fuzzer reaches the section parser;
// without it the bytes are the whole file. The file is written to a scratch
// directory of this process (under $TMPDIR) and nowhere else.
// Invariants: errors are DataLoss; both loaders agree (the same error, or
// the same sections, the streaming one reading them from the file in
// pieces); a checkpoint that loads is written back and reads back with the
// same sections; a section state or a tensor stream that loads saves back
// to the same bytes.
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "compression/codec.h"
#include "core/byte_stream.h"
#include "core/checkpoint.h"
#include "core/flat_params.h"
#include "core/optimizer_state.h"
#include "core/tensor_stream.h"
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

// A section that is a tensor stream: read into tensors of its own headers'
// shapes, it streams back to the same bytes; as optimizer state, it loads
// into a small AdamW or is DataLoss.
void LoadTensorStream(const std::string& bytes) {
  if (bytes.compare(0, 8, "STARTNSR") != 0) return;
  NamedTensors read;
  StringSource in(bytes);
  const absl::Status st = ReadTensors(in, [&](const TensorHeader& h) {
    read.emplace_back(h.name, torch::empty(h.shape, torch::dtype(h.dtype)));
    return read.back().second;
  });
  FUZZ_CHECK(st.ok() || absl::IsDataLoss(st), "tensors: %s",
             st.ToString().c_str());
  if (st.ok()) {
    std::string back;
    StringSink sink(&back);
    FUZZ_CHECK(WriteTensors(read, sink).ok(), "tensors do not write back");
    FUZZ_CHECK(back == bytes, "tensors do not stream back to the same bytes");
  }
  static auto* params = new std::vector<torch::Tensor>{
      torch::zeros({2, 3}, torch::requires_grad()),
      torch::zeros({3}, torch::requires_grad())};
  torch::optim::AdamW opt(*params);
  StringSource again(bytes);
  const absl::Status os = ReadOptimizerState(again, opt);
  FUZZ_CHECK(os.ok() || absl::IsDataLoss(os), "optimizer state: %s",
             os.ToString().c_str());
  if (os.ok()) {
    FUZZ_CHECK(OptimizerStateTensors(opt).ok(), "state does not save back");
  }
}

// The streaming reader, keeping nothing, finds what ReadCheckpoint found.
void ReadStreamed(const std::string& path,
                  const absl::StatusOr<Checkpoint>& whole) {
  absl::StatusOr<CheckpointReader> reader =
      CheckpointReader::Open(path, /*keep_bytes=*/0);
  FUZZ_CHECK(reader.ok() == whole.ok(), "the loaders disagree: %s vs %s",
             reader.status().ToString().c_str(),
             whole.status().ToString().c_str());
  if (!whole.ok()) {
    FUZZ_CHECK(reader.status() == whole.status(), "different errors");
    return;
  }
  FUZZ_CHECK(reader->Names().size() == whole->sections.size(),
             "different sections");
  for (const auto& [name, bytes] : whole->sections) {
    absl::StatusOr<SectionReader> section = reader->Section(name);
    FUZZ_CHECK(section.ok(), "section %s: %s", name.c_str(),
               section.status().ToString().c_str());
    std::string got(bytes.size(), '\0');
    // In two pieces, as a consumer that reads a header then a body would.
    const size_t half = got.size() / 2;
    FUZZ_CHECK(section->Read(got.data(), half).ok() &&
                   section->Read(got.data() + half, got.size() - half).ok() &&
                   section->remaining() == 0,
               "section %s does not read back", name.c_str());
    FUZZ_CHECK(got == bytes, "section %s reads back other bytes", name.c_str());
    char past;
    FUZZ_CHECK(absl::IsDataLoss(section->Read(&past, 1)),
               "read past the end of %s", name.c_str());
  }
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
  for (const char* name : {"model_tensors", "optimizer_tensors"}) {
    if (const std::string* s = section(name)) LoadTensorStream(*s);
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
  ReadStreamed(*path, c);
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
