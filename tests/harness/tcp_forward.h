// A TCP port forward for tests: listens on a loopback port the kernel picks
// and copies bytes both ways between each connection it accepts and
// `target` (set once known), like a router's forwarded port in front of a
// node. It counts the connections it carried, so that a test can tell
// that peers dialed the forwarded address rather than the node's own.
// Thread-safe; its threads end when it is destroyed.
#ifndef STARLING_TESTS_HARNESS_TCP_FORWARD_H_
#define STARLING_TESTS_HARNESS_TCP_FORWARD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace starling::testing {

class TcpForward {
 public:
  // Listens on 127.0.0.1 (port() is the port); accepts once a target is
  // set, refusing (closing) connections before.
  TcpForward();
  ~TcpForward();
  TcpForward(const TcpForward&) = delete;
  TcpForward& operator=(const TcpForward&) = delete;

  int port() const { return port_; }
  std::string address() const;
  // "host:port" to forward to (IPv4 loopback or any numeric IPv4 address).
  void SetTarget(const std::string& target) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t connections() const { return connections_.load(); }
  int64_t bytes() const { return bytes_.load(); }

 private:
  void AcceptLoop();
  void Pump(int from, int to);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> connections_{0};
  std::atomic<int64_t> bytes_{0};
  absl::Mutex mu_;
  std::string target_ ABSL_GUARDED_BY(mu_);
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);  // open, closed on destruction
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace starling::testing

#endif  // STARLING_TESTS_HARNESS_TCP_FORWARD_H_
