// Fuzz target for the handshake check (gossip/grpc_transport.h
// HandshakeMismatch) on requests parsed from the wire: a Peer.Handshake
// HandshakeRequest, or a Swarm.Join JoinRequest, whose hello is checked the
// way MembershipGossip::OnJoin does (member count not compared) and whose
// entry is then merged into a membership table.
// Input: u8 mode (even: HandshakeRequest, odd: JoinRequest), then the
// serialized request.
// Invariants: the answer is empty exactly when every compared field equals
// this node's, and otherwise names each field that differs (the model's
// tensor lists, whatever they hold, only add to the architecture's line).
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gossip/grpc_transport.h"
#include "gossip/membership.h"
#include "starling/peer/v1/peer.pb.h"
#include "starling/peer/v1/swarm.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace starling {
namespace {

PeerIdentity Mine() {
  PeerIdentity id;
  id.run_id = fuzz::kRunId;
  id.algo = "diloco";
  id.world = 3;
  id.compression = "int8";
  id.aggregate = "mean";
  id.model = MakeFingerprint("mlp(784,128,10)", 101770, "0123456789abcdef",
                             {"parameter fc1.weight float32[128,784]",
                              "parameter fc1.bias float32[128]",
                              "parameter fc2.weight float32[10,128]",
                              "parameter fc2.bias float32[10]"});
  return id;
}

void Check(const peer::v1::HandshakeRequest& r, const PeerIdentity& mine) {
  const std::string why = HandshakeMismatch(r, mine, "10.0.0.1:7000");
  struct Field {
    const char* name;
    bool same;
  };
  const Field fields[] = {
      {"protocol version", r.protocol_version() == kProtocolVersion},
      {"run id", r.run_id() == mine.run_id},
      {"algorithm", r.algo() == mine.algo},
      {"member count", r.world() == mine.world},
      {"compression", r.compression() == mine.compression},
      {"aggregation", r.aggregate() == mine.aggregate},
      {"model architecture",
       r.model().architecture() == mine.model.architecture()},
      {"parameter count", r.model().parameters() == mine.model.parameters()},
      {"dtype", r.model().dtype() == mine.model.dtype()},
  };
  bool all_same = true;
  for (const Field& f : fields) {
    all_same = all_same && f.same;
    if (!f.same) {
      FUZZ_CHECK(absl::StrContains(why, f.name),
                 "'%s' differs but the answer is: %s", f.name, why.c_str());
    }
  }
  if (all_same) {
    FUZZ_CHECK(why.empty() == (r.model().init_hash() == mine.model.init_hash()),
               "init hash check: %s", why.c_str());
  } else {
    FUZZ_CHECK(!why.empty(), "fields differ but the handshake passed");
  }
}

}  // namespace
}  // namespace starling

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  static const PeerIdentity* mine = new PeerIdentity(Mine());
  fuzz::Reader in(data, size);
  const bool join = in.Get<uint8_t>() & 1;
  const absl::string_view bytes = in.Rest();
  if (!join) {
    peer::v1::HandshakeRequest r;
    if (!r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return 0;
    }
    Check(r, *mine);
    return 0;
  }
  peer::v1::JoinRequest r;
  if (!r.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return 0;
  }
  PeerIdentity joining = *mine;
  joining.world = 0;  // as MembershipGossip::OnJoin: any size
  Check(r.hello(), joining);
  if (!HandshakeMismatch(r.hello(), joining).empty()) return 0;
  const absl::Time now = absl::FromUnixMillis(fuzz::kStartMs);
  MembershipOptions mo;
  mo.self_id = "node-a";
  mo.self_address = "10.0.0.1:7000";
  mo.incarnation = 1;
  std::unique_ptr<Membership> m =
      std::move(Membership::Create(mo, now)).value();
  const absl::Status s = m->Merge({r.self()}, now);
  FUZZ_CHECK(s.ok() || absl::IsInvalidArgument(s), "Merge: %s",
             s.ToString().c_str());
  if (s.ok() && r.self().id() != mo.self_id) {
    FUZZ_CHECK(m->Get(r.self().id()).ok(),
               "a valid joiner is not in the table");
  }
  return 0;
}
