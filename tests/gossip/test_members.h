// Member table rows and a fake clock for the gossip unit tests.
#ifndef STARLING_TESTS_GOSSIP_TEST_MEMBERS_H_
#define STARLING_TESTS_GOSSIP_TEST_MEMBERS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "starling/peer/v1/swarm.pb.h"

namespace starling {

// Local time `s` seconds into a test.
inline absl::Time T(double s) {
  return absl::FromUnixSeconds(1'700'000'000) + absl::Seconds(s);
}

// The row of member `id` (at address "id:7000").
inline peer::v1::MemberEntry TestMember(
    const std::string& id, peer::v1::MemberState state = peer::v1::MEMBER_ALIVE,
    int64_t incarnation = 1, int64_t round = 0) {
  peer::v1::MemberEntry e;
  e.set_id(id);
  e.set_address(id + ":7000");
  e.set_incarnation(incarnation);
  e.set_state(state);
  e.set_round(round);
  return e;
}

}  // namespace starling

#endif  // STARLING_TESTS_GOSSIP_TEST_MEMBERS_H_
