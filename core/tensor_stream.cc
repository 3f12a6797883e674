#include "core/tensor_stream.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "core/torch_error.h"

namespace starling {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'A', 'R', 'T', 'N', 'S', 'R'};
constexpr uint32_t kVersion = 1;
constexpr uint8_t kMaxDims = 32;
// Each piece copied through the CPU for a tensor on another device.
constexpr int64_t kPieceBytes = 4 << 20;

bool Carried(torch::ScalarType t) {
  switch (t) {
    case torch::kUInt8:
    case torch::kInt8:
    case torch::kInt16:
    case torch::kInt32:
    case torch::kInt64:
    case torch::kFloat16:
    case torch::kBFloat16:
    case torch::kFloat32:
    case torch::kFloat64:
    case torch::kBool:
      return true;
    default:
      return false;
  }
}

std::string Describe(torch::ScalarType dtype, c10::IntArrayRef shape) {
  return absl::StrCat(c10::toString(dtype), "[", absl::StrJoin(shape, ","),
                      "]");
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

absl::Status CheckCarried(const std::string& name, const torch::Tensor& t) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " is undefined"));
  }
  if (!Carried(t.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, " has dtype ", c10::toString(t.scalar_type()),
        ", which a tensor stream does not carry"));
  }
  return absl::OkStatus();
}

// Every header, as they are written.
absl::StatusOr<std::string> Headers(const NamedTensors& tensors) {
  std::string head(kMagic, sizeof(kMagic));
  Put<uint32_t>(&head, kVersion);
  Put<uint32_t>(&head, static_cast<uint32_t>(tensors.size()));
  for (const auto& [name, t] : tensors) {
    STARLING_RETURN_IF_ERROR(CheckCarried(name, t));
    Put<uint32_t>(&head, static_cast<uint32_t>(name.size()));
    head += name;
    Put<uint8_t>(&head, static_cast<uint8_t>(t.scalar_type()));
    Put<uint8_t>(&head, static_cast<uint8_t>(t.dim()));
    for (int64_t d : t.sizes()) Put<int64_t>(&head, d);
  }
  return head;
}

absl::Status WriteBytes(const torch::Tensor& tensor, ByteSink& sink) {
  torch::NoGradGuard no_grad;
  // A strided CPU tensor is copied once, whole (one tensor, not the list).
  torch::Tensor t = tensor.detach().contiguous();
  if (t.device().is_cpu()) return sink.Write(t.data_ptr(), t.nbytes());
  torch::Tensor flat = t.view(-1);
  const int64_t step =
      std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(t.itemsize()));
  for (int64_t at = 0; at < flat.numel(); at += step) {
    torch::Tensor piece =
        flat.narrow(0, at, std::min(step, flat.numel() - at)).to(torch::kCPU);
    STARLING_RETURN_IF_ERROR(sink.Write(piece.data_ptr(), piece.nbytes()));
  }
  return absl::OkStatus();
}

absl::Status ReadBytes(ByteSource& in, const TensorHeader& h,
                       const torch::Tensor& dst) {
  torch::NoGradGuard no_grad;
  if (dst.device().is_cpu() && dst.is_contiguous()) {
    return in.Read(dst.data_ptr(), h.bytes);
  }
  if (!dst.is_contiguous()) {
    torch::Tensor whole = torch::empty(h.shape, torch::dtype(h.dtype));
    STARLING_RETURN_IF_ERROR(in.Read(whole.data_ptr(), h.bytes));
    torch::Tensor d = dst;
    d.copy_(whole);
    return absl::OkStatus();
  }
  torch::Tensor flat = dst.view(-1);
  const int64_t step =
      std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(dst.itemsize()));
  torch::Tensor staging =
      torch::empty({std::min(step, flat.numel())}, torch::dtype(h.dtype));
  for (int64_t at = 0; at < flat.numel(); at += step) {
    const int64_t n = std::min(step, flat.numel() - at);
    torch::Tensor piece = staging.narrow(0, 0, n);
    STARLING_RETURN_IF_ERROR(in.Read(piece.data_ptr(), piece.nbytes()));
    flat.narrow(0, at, n).copy_(piece);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> TensorsSize(const NamedTensors& tensors) {
  STARLING_ASSIGN_OR_RETURN(std::string head, Headers(tensors));
  uint64_t size = head.size();
  for (const auto& [name, t] : tensors) size += t.nbytes();
  return size;
}

absl::Status WriteTensors(const NamedTensors& tensors, ByteSink& sink) {
  STARLING_ASSIGN_OR_RETURN(std::string head, Headers(tensors));
  STARLING_RETURN_IF_ERROR(sink.Write(head));
  for (const auto& [name, t] : tensors) {
    try {
      STARLING_RETURN_IF_ERROR(WriteBytes(t, sink));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("cannot write tensor ", name,
                                              ": ", TorchErrorMessage(e)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointSection> TensorsSection(NamedTensors tensors) {
  STARLING_ASSIGN_OR_RETURN(uint64_t size, TensorsSize(tensors));
  return CheckpointSection(size,
                           [tensors = std::move(tensors)](ByteSink& sink) {
                             return WriteTensors(tensors, sink);
                           });
}

absl::StatusOr<std::vector<TensorHeader>> ReadTensorHeaders(ByteSource& in) {
  auto malformed = [](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("tensor stream: ", why));
  };
  char magic[sizeof(kMagic)];
  uint32_t version = 0, count = 0;
  if (in.remaining() < sizeof(magic) + 8) return malformed("bad magic");
  STARLING_RETURN_IF_ERROR(in.Read(magic, sizeof(magic)));
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return malformed("bad magic");
  }
  STARLING_RETURN_IF_ERROR(in.Read(&version, 4));
  if (version != kVersion) {
    return malformed(absl::StrCat("unsupported version ", version));
  }
  STARLING_RETURN_IF_ERROR(in.Read(&count, 4));
  // A header takes at least 6 bytes: no count allocates past the stream.
  if (count > in.remaining() / 6) {
    return malformed(absl::StrCat(count, " tensors cannot fit in ",
                                  in.remaining(), " bytes"));
  }
  std::vector<TensorHeader> headers(count);
  uint64_t data = 0;  // the tensors' bytes so far, at most what remains
  for (uint32_t i = 0; i < count; ++i) {
    TensorHeader& h = headers[i];
    uint32_t name_len = 0;
    uint8_t dtype = 0, ndim = 0;
    const std::string which = absl::StrCat("tensor ", i);
    STARLING_RETURN_IF_ERROR(in.Read(&name_len, 4));
    if (name_len > in.remaining()) {
      return malformed(absl::StrCat(which, ": its name is out of bounds"));
    }
    h.name.resize(name_len);
    STARLING_RETURN_IF_ERROR(in.Read(h.name.data(), name_len));
    STARLING_RETURN_IF_ERROR(in.Read(&dtype, 1));
    STARLING_RETURN_IF_ERROR(in.Read(&ndim, 1));
    h.dtype = static_cast<torch::ScalarType>(dtype);
    if (dtype >= static_cast<uint8_t>(torch::ScalarType::NumOptions) ||
        !Carried(h.dtype)) {
      return malformed(
          absl::StrCat(which, " (", h.name, ") has dtype code ", dtype));
    }
    if (ndim > kMaxDims) {
      return malformed(
          absl::StrCat(which, " (", h.name, ") has ", ndim, " dimensions"));
    }
    h.shape.resize(ndim);
    // Bounded by the stream's rest as it grows: it never overflows.
    uint64_t bytes = c10::elementSize(h.dtype);
    for (int64_t& d : h.shape) {
      STARLING_RETURN_IF_ERROR(in.Read(&d, 8));
      if (d < 0 ||
          (d > 0 && bytes > in.remaining() / static_cast<uint64_t>(d))) {
        return malformed(
            absl::StrCat(which, " (", h.name, ") is larger than the stream"));
      }
      bytes *= static_cast<uint64_t>(d);
    }
    h.bytes = bytes;
    data += bytes;
    if (data > in.remaining()) {
      return malformed(
          absl::StrCat(which, " (", h.name, ") is larger than the stream"));
    }
  }
  if (data != in.remaining()) {
    return malformed(absl::StrCat("the tensors hold ", data,
                                  " bytes; the stream has ", in.remaining(),
                                  " after their headers"));
  }
  return headers;
}

namespace {

// Every header with its destination, checked.
absl::StatusOr<std::vector<std::pair<TensorHeader, torch::Tensor>>> Match(
    ByteSource& in, const TensorDestination& destination) {
  STARLING_ASSIGN_OR_RETURN(std::vector<TensorHeader> headers,
                            ReadTensorHeaders(in));
  std::vector<std::pair<TensorHeader, torch::Tensor>> out;
  out.reserve(headers.size());
  for (TensorHeader& h : headers) {
    STARLING_ASSIGN_OR_RETURN(torch::Tensor t, destination(h));
    if (!t.defined() || t.scalar_type() != h.dtype ||
        t.sizes().vec() != h.shape) {
      return absl::DataLossError(absl::StrCat(
          "tensor ", h.name, " is ", Describe(h.dtype, h.shape),
          "; it goes into ",
          t.defined() ? Describe(t.scalar_type(), t.sizes()) : "nothing"));
    }
    out.emplace_back(std::move(h), std::move(t));
  }
  return out;
}

}  // namespace

absl::Status CheckTensors(ByteSource& in,
                          const TensorDestination& destination) {
  return Match(in, destination).status();
}

absl::Status ReadTensors(ByteSource& in, const TensorDestination& destination) {
  STARLING_ASSIGN_OR_RETURN(auto matched, Match(in, destination));
  for (const auto& [h, t] : matched) {
    try {
      STARLING_RETURN_IF_ERROR(ReadBytes(in, h, t));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("cannot read tensor ", h.name,
                                              ": ", TorchErrorMessage(e)));
    }
  }
  return absl::OkStatus();
}

}  // namespace starling
