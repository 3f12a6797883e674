// Conversions between absl::Status and grpc::Status for the transport's own
// files. The two enumerations share their values (both follow
// google.rpc.Code). Pure functions: thread-safe.
#ifndef STARLING_GOSSIP_GRPC_STATUS_H_
#define STARLING_GOSSIP_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace starling {

inline grpc::StatusCode ToGrpc(absl::StatusCode code) {
  return static_cast<grpc::StatusCode>(static_cast<int>(code));
}

inline grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(ToGrpc(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

}  // namespace starling

#endif  // STARLING_GOSSIP_GRPC_STATUS_H_
