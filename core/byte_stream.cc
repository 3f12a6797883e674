#include "core/byte_stream.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace starling {
namespace {

absl::Status PastTheEnd(uint64_t want, uint64_t have) {
  return absl::DataLossError(
      absl::StrCat("needs ", want, " more bytes, only ", have, " remain"));
}

}  // namespace

absl::Status StringSink::Write(const void* data, size_t size) {
  out_->append(static_cast<const char*>(data), size);
  return absl::OkStatus();
}

absl::Status StringSource::Read(void* dst, size_t size) {
  if (size > rest_.size()) return PastTheEnd(size, rest_.size());
  // memcpy's pointers must not be null, even for 0 bytes.
  if (size > 0) std::memcpy(dst, rest_.data(), size);
  rest_.remove_prefix(size);
  return absl::OkStatus();
}

absl::Status StringSource::Skip(uint64_t size) {
  if (size > rest_.size()) return PastTheEnd(size, rest_.size());
  rest_.remove_prefix(size);
  return absl::OkStatus();
}

}  // namespace starling
