// Fuzz target for the membership table (gossip/membership.h): Merge of
// MemberEntry lists parsed from the wire (a JoinResponse, a GossipRequest or
// a GossipResponse), mixed with the node's own calls (Tick, Beat,
// SetProgress, RequestEarlySync, Leave).
// Input: operations, each a u8 opcode and its fields (see the code);
// messages are a u32 length and the serialized proto.
// Invariants, after every operation: the table is sorted by id with unique
// ids and only valid entries; this node is in it with its own address,
// never SUSPECT or DEAD, and its incarnation never falls; no member's
// incarnation falls; a DEAD or LEFT member stays so until a higher
// incarnation; Live() is exactly the non-terminal rows.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gossip/membership.h"
#include "starling/peer/v1/swarm.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace starling {
namespace {

using peer::v1::MemberEntry;

constexpr char kSelf[] = "node-b";
constexpr char kSelfAddress[] = "10.0.0.2:7000";

bool Terminal(peer::v1::MemberState s) {
  return s == peer::v1::MEMBER_DEAD || s == peer::v1::MEMBER_LEFT;
}

template <typename Repeated>
std::vector<MemberEntry> ToVector(const Repeated& r) {
  return std::vector<MemberEntry>(r.begin(), r.end());
}

// The entries of one message from the input, or false when it does not
// parse.
bool ReadEntries(fuzz::Reader& in, std::vector<MemberEntry>* out) {
  const int kind = in.Get<uint8_t>() % 3;
  const absl::string_view b = in.LenBytes(1 << 16);
  const int n = static_cast<int>(b.size());
  if (kind == 0) {
    peer::v1::JoinResponse r;
    if (!r.ParseFromArray(b.data(), n)) return false;
    *out = ToVector(r.members());
  } else if (kind == 1) {
    peer::v1::GossipRequest r;
    if (!r.ParseFromArray(b.data(), n)) return false;
    *out = ToVector(r.members());
  } else {
    peer::v1::GossipResponse r;
    if (!r.ParseFromArray(b.data(), n)) return false;
    *out = ToVector(r.members());
  }
  return true;
}

struct Seen {
  int64_t incarnation = 0;
  peer::v1::MemberState state = peer::v1::MEMBER_STATE_UNSPECIFIED;
};

void CheckTable(const Membership& m, bool left,
                std::map<std::string, Seen>* seen) {
  const std::vector<MemberEntry> rows = m.Snapshot();
  bool self_found = false;
  size_t live = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const MemberEntry& e = rows[i];
    if (i > 0) {
      FUZZ_CHECK(rows[i - 1].id() < e.id(), "table not sorted/unique at %zu",
                 i);
    }
    FUZZ_CHECK(!e.id().empty() && !e.address().empty() &&
                   e.state() != peer::v1::MEMBER_STATE_UNSPECIFIED &&
                   peer::v1::MemberState_IsValid(e.state()) &&
                   e.incarnation() >= 0,
               "invalid row '%s'", e.id().c_str());
    if (!Terminal(e.state())) ++live;
    if (e.id() == kSelf) {
      self_found = true;
      FUZZ_CHECK(e.address() == kSelfAddress, "own address changed");
      FUZZ_CHECK(
          e.state() == (left ? peer::v1::MEMBER_LEFT : peer::v1::MEMBER_ALIVE),
          "own state is %s", MemberStateName(e.state()));
    }
    Seen& s = (*seen)[e.id()];
    FUZZ_CHECK(e.incarnation() >= s.incarnation,
               "incarnation of '%s' fell from %lld to %lld", e.id().c_str(),
               static_cast<long long>(s.incarnation),
               static_cast<long long>(e.incarnation()));
    if (Terminal(s.state) && e.incarnation() == s.incarnation) {
      FUZZ_CHECK(Terminal(e.state()), "'%s' came back from %s to %s",
                 e.id().c_str(), MemberStateName(s.state),
                 MemberStateName(e.state()));
    }
    s.incarnation = e.incarnation();
    s.state = e.state();
  }
  FUZZ_CHECK(self_found, "this node is not in its own table");
  FUZZ_CHECK(m.Live().size() == live, "Live() has %zu rows, expected %zu",
             m.Live().size(), live);
}

}  // namespace
}  // namespace starling

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace starling;
  fuzz::Reader in(data, size);
  absl::Time now = absl::FromUnixMillis(fuzz::kStartMs);
  MembershipOptions o;
  o.self_id = kSelf;
  o.self_address = kSelfAddress;
  o.incarnation = 1 + in.Get<uint8_t>();
  o.suspect_after = absl::Seconds(3);
  std::unique_ptr<Membership> m = std::move(Membership::Create(o, now)).value();
  std::map<std::string, Seen> seen;
  bool left = false;
  CheckTable(*m, left, &seen);
  for (int ops = 0; !in.empty() && ops < 128; ++ops) {
    switch (in.Get<uint8_t>() % 6) {
      case 0: {
        std::vector<MemberEntry> entries;
        if (!ReadEntries(in, &entries)) break;
        std::vector<MembershipChange> changes;
        const absl::Status s = m->Merge(entries, now, &changes);
        FUZZ_CHECK(s.ok() || absl::IsInvalidArgument(s), "Merge: %s",
                   s.ToString().c_str());
        for (const MembershipChange& c : changes) {
          FUZZ_CHECK(!c.id.empty(), "a change without an id");
        }
        break;
      }
      case 1:
        now += absl::Milliseconds(in.Get<uint16_t>());
        m->Tick(now);
        break;
      case 2:
        m->Beat();
        break;
      case 3: {
        const int64_t round = in.Get<uint8_t>();
        const int64_t member_rounds = in.Get<uint8_t>();
        m->SetProgress(round, "lineage", member_rounds, in.Get<uint8_t>() & 1);
        break;
      }
      case 4:
        m->RequestEarlySync(in.Get<uint8_t>());
        break;
      case 5:
        if (in.Get<uint8_t>() == 0x1E) {
          m->Leave();
          left = true;
        }
        break;
    }
    CheckTable(*m, left, &seen);
  }
  return 0;
}
