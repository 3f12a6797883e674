// The two ends of a relayed connection outside the relay (relay_server.h):
// a member's local TCP socket on one side, a Relay stream (Connect at the
// dialing peer, Accept at the relayed member) on the other, and the bytes
// copied between them. TunnelSet owns the threads of the tunnels one
// component runs, so that shutting down ends and joins them all.
// Thread-safety: TunnelSet is thread-safe; one thread runs each Pump.
#ifndef STARLING_GOSSIP_RELAY_PUMP_H_
#define STARLING_GOSSIP_RELAY_PUMP_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "starling/peer/v1/relay.grpc.pb.h"

namespace starling {

using RelayStream = grpc::ClientReaderWriterInterface<peer::v1::RelayFrame,
                                                      peer::v1::RelayFrame>;

// A connected TCP socket to "host:port" (a name, an IPv4 address or
// "[v6]"), or Unavailable naming it.
absl::StatusOr<int> DialTcp(const std::string& address);
// A socket listening on 127.0.0.1 at a port the kernel picks (`*port`).
absl::StatusOr<int> ListenOnLoopback(int* port);
// The address a process on this host dials to reach a server bound to
// `bound` ("0.0.0.0:P" -> "127.0.0.1:P", "[::]:P" -> "[::1]:P").
std::string LocalDialAddress(const std::string& bound);

// One tunnelled connection: its socket and its call.
struct Tunnel {
  int fd = -1;
  grpc::ClientContext ctx;
};

// Copies socket -> stream on a thread of its own and stream -> socket on
// the caller's until either ends, then shuts the socket, cancels the call
// and waits for the other direction. Adds the bytes copied to `*bytes`.
void Pump(Tunnel* tunnel, RelayStream* stream, std::atomic<int64_t>* bytes);

class TunnelSet {
 public:
  TunnelSet() = default;
  ~TunnelSet() { StopAll(); }
  TunnelSet(const TunnelSet&) = delete;
  TunnelSet& operator=(const TunnelSet&) = delete;

  // Runs `body` on a thread of its own with a tunnel that owns `fd` (closed
  // once that thread is joined). After StopAll, closes fd and runs nothing.
  void Start(int fd, std::function<void(Tunnel*)> body)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Shuts every tunnel's socket, cancels its call and joins its thread.
  void StopAll() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::shared_ptr<Tunnel> tunnel;
    std::shared_ptr<std::atomic<bool>> done;
    std::thread thread;
  };
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_RELAY_PUMP_H_
