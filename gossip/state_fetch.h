// The joiner's end of the FetchState stream (Swarm::FetchState): fetches
// the state from donors in turn, resuming with the next donor where one
// broke off (the assembler keeps what came, when the next serves the same
// digest), fetching again from the same donor after a corrupt chunk (three
// times at most), and skipping a donor whose state is behind what it asks
// for.
// Thread-compatible: one call at a time (the training thread's).
#ifndef STARLING_GOSSIP_STATE_FETCH_H_
#define STARLING_GOSSIP_STATE_FETCH_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gossip/membership.h"
#include "gossip/state_transfer.h"
#include "gossip/swarm.h"
#include "gossip/swarm_client.h"

namespace starling {

class StateFetcher {
 public:
  // `parameters`: the model's, bounding the state a donor may announce.
  // `membership` and `client` must outlive it.
  StateFetcher(std::string node_id, std::string run_id, int64_t parameters,
               const Membership* membership, SwarmClient* client);

  // Swarm::FetchState.
  absl::StatusOr<SwarmState> Fetch(const std::vector<std::string>& donors,
                                   const Swarm::Lineage* at_least,
                                   absl::Time deadline,
                                   Swarm::FetchStats* stats);

 private:
  // What one Fetch has met so far.
  struct Progress {
    std::string last_error = "no donors";
    int retries = 0;  // chunks or donors that failed and were retried
  };
  // One stream's outcome.
  struct Stream {
    absl::Status bad;  // a chunk the assembler refused
    bool any = false;  // chunks received
    grpc::Status status;
  };
  // Fetches from `donor` at `address` until the state is complete (it),
  // or the donor fails (nullopt: the next one).
  std::optional<SwarmState> FromDonor(
      const std::string& donor, const std::string& address,
      const Swarm::Lineage* at_least, absl::Time deadline,
      StateAssembler* assembler, Swarm::FetchStats* stats, Progress* progress);
  // Reads one stream from `address` into `assembler`.
  Stream Read(const std::string& address, const Swarm::Lineage* at_least,
              absl::Time deadline, StateAssembler* assembler,
              Swarm::FetchStats* stats);

  const std::string node_id_;
  const std::string run_id_;
  const int64_t parameters_;
  const Membership* const membership_;
  SwarmClient* const client_;
};

}  // namespace starling

#endif  // STARLING_GOSSIP_STATE_FETCH_H_
