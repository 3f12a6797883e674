#include "gossip/state_fetch.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"

namespace starling {

using peer::v1::MemberEntry;
using peer::v1::StateChunk;
using peer::v1::StateRequest;

StateFetcher::StateFetcher(std::string node_id, std::string run_id,
                           int64_t parameters, const Membership* membership,
                           SwarmClient* client)
    : node_id_(std::move(node_id)),
      run_id_(std::move(run_id)),
      parameters_(parameters),
      membership_(membership),
      client_(client) {}

absl::StatusOr<SwarmState> StateFetcher::Fetch(
    const std::vector<std::string>& donors, const Swarm::Lineage* at_least,
    absl::Time deadline, Swarm::FetchStats* stats) {
  const absl::Time start = absl::Now();
  StateAssembler assembler(MaxStateBytesFor(parameters_));
  Progress progress;
  // What this call took and retried, added to *stats on either way out.
  auto account = [&] {
    if (stats == nullptr) return;
    stats->seconds += absl::ToDoubleSeconds(absl::Now() - start);
    stats->retries += progress.retries;
  };
  for (size_t i = 0; i < donors.size() && absl::Now() < deadline; ++i) {
    absl::StatusOr<MemberEntry> e = membership_->Get(donors[i]);
    if (!e.ok() || client_->Blocked(e->address())) continue;
    std::optional<SwarmState> state =
        FromDonor(donors[i], e->address(), at_least, deadline, &assembler,
                  stats, &progress);
    if (state.has_value()) {
      account();
      if (stats) stats->donor = donors[i];
      return *std::move(state);
    }
  }
  account();
  return absl::UnavailableError(
      absl::StrCat("state transfer failed from every donor (",
                   absl::StrJoin(donors, ", "), "): ", progress.last_error));
}

std::optional<SwarmState> StateFetcher::FromDonor(
    const std::string& donor, const std::string& address,
    const Swarm::Lineage* at_least, absl::Time deadline,
    StateAssembler* assembler, Swarm::FetchStats* stats, Progress* progress) {
  int corrupt_retries = 0;
  while (absl::Now() < deadline) {
    const Stream s = Read(address, at_least, deadline, assembler, stats);
    if (!s.bad.ok()) {
      STARLING_LOG(WARNING) << "state chunk from " << donor << ": " << s.bad
                            << "; fetching again";
      ++progress->retries;
      progress->last_error = std::string(s.bad.message());
      if (++corrupt_retries > 3) return std::nullopt;
      continue;  // same donor, from next_offset()
    }
    if (assembler->complete()) {
      absl::StatusOr<SwarmState> state = assembler->Finish();
      if (state.ok() && at_least != nullptr &&
          LineageAhead(
              {at_least->round, at_least->lineage, at_least->member_rounds},
              {state->round, state->lineage, state->member_rounds})) {
        progress->last_error =
            absl::StrCat(donor, " serves round ", state->round,
                         ", behind round ", at_least->round);
        return std::nullopt;  // the next donor
      }
      if (state.ok()) return *std::move(state);
      progress->last_error = std::string(state.status().message());
      ++progress->retries;
      if (++corrupt_retries > 3) return std::nullopt;
      continue;
    }
    progress->last_error = absl::StrCat(
        donor, ": ",
        s.status.ok() ? "stream ended early" : s.status.error_message());
    if (!s.any &&
        s.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      // Refused before any byte (its state has not reached the round
      // asked for, is on a losing lineage, or is another run's): the next
      // donor, but no transfer broke off.
      STARLING_LOG(INFO) << "state from " << progress->last_error;
      return std::nullopt;
    }
    STARLING_LOG(WARNING) << "state transfer from " << donor
                          << " broke off at byte " << assembler->next_offset()
                          << ": " << progress->last_error
                          << "; trying the next donor";
    ++progress->retries;
    return std::nullopt;
  }
  return std::nullopt;
}

StateFetcher::Stream StateFetcher::Read(const std::string& address,
                                        const Swarm::Lineage* at_least,
                                        absl::Time deadline,
                                        StateAssembler* assembler,
                                        Swarm::FetchStats* stats) {
  StateRequest req;
  req.set_run_id(run_id_);
  req.set_from(node_id_);
  req.set_offset(assembler->next_offset());
  req.set_digest(assembler->digest());
  if (at_least != nullptr) {
    req.set_round(at_least->round);
    req.set_lineage(at_least->lineage);
    req.set_member_rounds(at_least->member_rounds);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  client_->credentials().Sign(&ctx, "FetchState");
  std::unique_ptr<grpc::ClientReader<StateChunk>> reader =
      client_->StubFor(address)->FetchState(&ctx, req);
  Stream s;
  StateChunk chunk;
  while (reader->Read(&chunk)) {
    s.any = true;
    if (stats) stats->bytes += static_cast<int64_t>(chunk.data().size());
    s.bad = assembler->Add(chunk.digest(), chunk.total_bytes(), chunk.offset(),
                           chunk.data(), chunk.checksum());
    if (!s.bad.ok()) break;
  }
  if (!s.bad.ok()) {
    ctx.TryCancel();
    (void)reader->Finish();
    return s;
  }
  s.status = reader->Finish();
  client_->rpc_errors().Record(s.status.error_code());
  return s;
}

}  // namespace starling
