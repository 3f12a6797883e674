#include "gossip/protocol.h"

#include <google/protobuf/wire_format_lite.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"

namespace starling {

static_assert(kChunkDataTag ==
                  google::protobuf::internal::WireFormatLite::MakeTag(
                      peer::v1::TensorChunk::kDataFieldNumber,
                      google::protobuf::internal::WireFormatLite::
                          WIRETYPE_LENGTH_DELIMITED),
              "kChunkDataTag is TensorChunk.data's key");

peer::v1::ModelFingerprint MakeFingerprint(const std::string& architecture,
                                           int64_t parameters,
                                           const std::string& init_hash) {
  peer::v1::ModelFingerprint f;
  f.set_architecture(architecture);
  f.set_parameters(parameters);
  f.set_dtype("float32");
  f.set_init_hash(init_hash);
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
                              const PeerIdentity& mine) {
  std::vector<std::string> diffs;
  auto differ = [&](absl::string_view what, const std::string& a,
                    const std::string& b) {
    if (a != b) {
      // The peer's value is its own: quoted, so it cannot forge log lines.
      diffs.push_back(absl::StrCat(what, " differs (peer ", QuoteForLog(a, 256),
                                   ", this node ", QuoteForLog(b, 256), ")"));
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
