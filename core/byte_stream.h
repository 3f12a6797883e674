// Byte streams taken and given in bounded pieces: a ByteSink takes bytes in
// order (a checkpoint file being written, a string), a ByteSource gives them
// back in order (a checkpoint section being read, a string). A producer
// writes a tensor's bytes from the tensor's own memory and a consumer reads
// them into their destination, so that neither holds the whole stream: a
// checkpoint holds the model several times over.
// The caller owns its sinks and sources; a StringSink writes into a string
// the caller owns, a StringSource reads bytes the caller keeps alive. Not
// thread-safe: one thread uses a sink or a source at a time.
#ifndef STARLING_CORE_BYTE_STREAM_H_
#define STARLING_CORE_BYTE_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace starling {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  // Takes the next `size` bytes; keeps no pointer into `data` once it
  // returns. A sink's own error (Internal on I/O) as it is.
  virtual absl::Status Write(const void* data, size_t size) = 0;
  absl::Status Write(absl::string_view bytes) {
    return Write(bytes.data(), bytes.size());
  }
};

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // The bytes not yet read.
  virtual uint64_t remaining() const = 0;
  // Reads the next `size` bytes into `dst`. DataLoss when fewer remain
  // (then nothing is read); a source's I/O error as it is.
  virtual absl::Status Read(void* dst, size_t size) = 0;
  // Passes over the next `size` bytes; DataLoss when fewer remain.
  virtual absl::Status Skip(uint64_t size) = 0;
};

// Appends to `*out`.
class StringSink : public ByteSink {
 public:
  explicit StringSink(std::string* out) : out_(out) {}
  using ByteSink::Write;
  absl::Status Write(const void* data, size_t size) override;

 private:
  std::string* out_;
};

// Reads `bytes`, which must outlive it.
class StringSource : public ByteSource {
 public:
  explicit StringSource(absl::string_view bytes) : rest_(bytes) {}
  uint64_t remaining() const override { return rest_.size(); }
  absl::Status Read(void* dst, size_t size) override;
  absl::Status Skip(uint64_t size) override;

 private:
  absl::string_view rest_;
};

}  // namespace starling

#endif  // STARLING_CORE_BYTE_STREAM_H_
