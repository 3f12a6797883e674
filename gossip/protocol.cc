#include "gossip/protocol.h"

#include <google/protobuf/wire_format_lite.h>

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"
#include "core/model.h"

namespace starling {

static_assert(kChunkDataTag ==
                  google::protobuf::internal::WireFormatLite::MakeTag(
                      peer::v1::TensorChunk::kDataFieldNumber,
                      google::protobuf::internal::WireFormatLite::
                          WIRETYPE_LENGTH_DELIMITED),
              "kChunkDataTag is TensorChunk.data's key");

peer::v1::ModelFingerprint MakeFingerprint(
    const std::string& architecture, int64_t parameters,
    const std::string& init_hash, const std::vector<std::string>& tensors) {
  peer::v1::ModelFingerprint f;
  f.set_architecture(architecture);
  f.set_parameters(parameters);
  f.set_dtype("float32");
  f.set_init_hash(init_hash);
  for (const std::string& t : tensors) f.add_tensors(t);
  return f;
}

peer::v1::HandshakeRequest MakeHandshakeRequest(const PeerIdentity& identity,
                                                const std::string& address) {
  peer::v1::HandshakeRequest req;
  req.set_protocol_version(kProtocolVersion);
  req.set_run_id(identity.run_id);
  req.set_algo(identity.algo);
  req.set_world(identity.world);
  req.set_compression(identity.compression);
  req.set_aggregate(identity.aggregate);
  *req.mutable_model() = identity.model;
  req.set_address(address);
  return req;
}

std::string HandshakeMismatch(const peer::v1::HandshakeRequest& theirs,
                              const PeerIdentity& mine,
                              const std::string& my_address) {
  // The peer's strings are its own: quoted, so they cannot forge log lines.
  const std::string their_label =
      my_address.empty()
          ? "peer"
          : absl::StrCat("node at ", QuoteForLog(theirs.address(), 64));
  const std::string my_label =
      my_address.empty() ? "this node" : absl::StrCat("node at ", my_address);
  std::vector<std::string> diffs;
  auto differ = [&](absl::string_view what, const std::string& a,
                    const std::string& b) {
    if (a != b) {
      diffs.push_back(absl::StrCat(what, " differs (", their_label, " ",
                                   QuoteForLog(a, 256), ", ", my_label, " ",
                                   QuoteForLog(b, 256), ")"));
    }
  };
  differ("protocol version", absl::StrCat(theirs.protocol_version()),
         absl::StrCat(kProtocolVersion));
  differ("run id", theirs.run_id(), mine.run_id);
  differ("algorithm", theirs.algo(), mine.algo);
  differ("member count", absl::StrCat(theirs.world()),
         absl::StrCat(mine.world));
  differ("compression", theirs.compression(), mine.compression);
  differ("aggregation (--aggregate, --norm_bound)", theirs.aggregate(),
         mine.aggregate);
  differ("model architecture", theirs.model().architecture(),
         mine.model.architecture());
  if (theirs.model().architecture() != mine.model.architecture()) {
    // Both lists, when both sides sent one: the first tensor that differs.
    std::vector<std::string> their_tensors;
    for (const std::string& t : theirs.model().tensors()) {
      if (their_tensors.size() > static_cast<size_t>(mine.model.tensors_size()))
        break;  // past this node's last tensor: that one names the difference
      their_tensors.push_back(absl::CHexEscape(t.substr(0, 256)));
    }
    const std::vector<std::string> my_tensors(mine.model.tensors().begin(),
                                              mine.model.tensors().end());
    if (!their_tensors.empty() && !my_tensors.empty()) {
      const std::string first =
          SignatureDifference(their_tensors, their_label, my_tensors, my_label);
      if (!first.empty()) diffs.back() += absl::StrCat(": ", first);
    }
  }
  differ("parameter count", absl::StrCat(theirs.model().parameters()),
         absl::StrCat(mine.model.parameters()));
  differ("dtype", theirs.model().dtype(), mine.model.dtype());
  if (diffs.empty()) {
    differ("initial model hash (use the same --seed)",
           theirs.model().init_hash(), mine.model.init_hash());
  }
  return absl::StrJoin(diffs, "; ");
}

}  // namespace starling
