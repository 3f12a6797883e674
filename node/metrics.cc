#include "node/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/logging.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace starling {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

// Bucket upper bounds in seconds, 1-2.5-5 per decade.
const Histogram::BucketBoundaries& StepBuckets() {  // 1 ms .. 10 s
  static const auto* b = new Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return *b;
}
const Histogram::BucketBoundaries& RoundBuckets() {  // 0.1 s .. 600 s
  static const auto* b = new Histogram::BucketBoundaries{
      0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 600};
  return *b;
}
const Histogram::BucketBoundaries& CheckpointBuckets() {  // 1 ms .. 60 s
  static const auto* b = new Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
      0.5,   1,      2.5,   5,    10,    25,   60};
  return *b;
}

template <typename T>
Family<T>& Register(prometheus::detail::Builder<T> builder,
                    const std::string& name, const std::string& help,
                    prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

// One scrape (read the request, write the response) may take this long
// before the server drops the connection.
constexpr absl::Duration kConnectionDeadline = absl::Seconds(5);
constexpr size_t kMaxRequestBytes = 8192;

std::string ErrnoText(int err) { return std::strerror(err); }

// Milliseconds left until `deadline` for poll(), at least 0.
int PollMillis(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(
      0, absl::ToInt64Milliseconds(deadline - absl::Now()) + 1));
}

std::string Response(absl::string_view status, absl::string_view extra_headers,
                     absl::string_view content_type, absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n",
                      extra_headers, "Connection: close\r\n\r\n", body);
}

}  // namespace

// A single-threaded HTTP/1.x server for GET /metrics: it accepts one
// connection at a time, reads one request and answers it under
// kConnectionDeadline, then closes the connection. Prometheus scrapes are
// small and infrequent, so serial service is enough.
class NodeMetrics::HttpServer {
 public:
  // Binds and listens on numeric_host:port (`family` AF_INET or AF_INET6;
  // port 0 = any free port). Unavailable naming `address` when it cannot.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      int family, const std::string& numeric_host, const std::string& address,
      int port, std::shared_ptr<prometheus::Registry> registry) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat(
          "cannot serve metrics on ", address, ": socket: ", ErrnoText(errno)));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage addr{};
    socklen_t addr_len = 0;
    if (family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, numeric_host.c_str(), &a->sin_addr);
      addr_len = sizeof(*a);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET6, numeric_host.c_str(), &a->sin6_addr);
      addr_len = sizeof(*a);
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 ||
        listen(fd, 16) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0) {
      const int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat(
          "cannot serve metrics on ", address, ": ", ErrnoText(err)));
    }
    const int bound_port =
        family == AF_INET
            ? ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port)
            : ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    int stop[2];
    if (pipe2(stop, O_CLOEXEC | O_NONBLOCK) != 0) {
      const int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat(
          "cannot serve metrics on ", address, ": pipe: ", ErrnoText(err)));
    }
    return std::unique_ptr<HttpServer>(
        new HttpServer(fd, stop[0], stop[1], bound_port, std::move(registry)));
  }

  ~HttpServer() {
    const char byte = 0;
    while (write(stop_write_, &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
    close(listen_fd_);
    close(stop_read_);
    close(stop_write_);
  }

  int port() const { return port_; }

 private:
  HttpServer(int listen_fd, int stop_read, int stop_write, int port,
             std::shared_ptr<prometheus::Registry> registry)
      : listen_fd_(listen_fd),
        stop_read_(stop_read),
        stop_write_(stop_write),
        port_(port),
        registry_(std::move(registry)),
        thread_([this] { Run(); }) {}

  void Run() {
    for (;;) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_read_, POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        STARLING_LOG(ERROR) << "metrics endpoint: poll: " << ErrnoText(errno);
        return;
      }
      if (fds[1].revents != 0) return;
      if (fds[0].revents == 0) continue;
      int conn =
          accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK ||
            errno == ECONNABORTED) {
          continue;
        }
        // E.g. EMFILE: back off instead of spinning, but still stop promptly.
        STARLING_LOG(WARNING)
            << "metrics endpoint: accept: " << ErrnoText(errno);
        pollfd stop{stop_read_, POLLIN, 0};
        if (poll(&stop, 1, 100) > 0) return;
        continue;
      }
      Serve(conn);
      close(conn);
    }
  }

  // Waits for `events` on `conn` until `deadline`; false on timeout, error or
  // when the destructor asks to stop.
  bool WaitFor(int conn, short events, absl::Time deadline) const {
    for (;;) {
      pollfd fds[2] = {{conn, events, 0}, {stop_read_, POLLIN, 0}};
      int n = poll(fds, 2, PollMillis(deadline));
      if (n < 0 && errno == EINTR) continue;
      return n > 0 && fds[1].revents == 0;
    }
  }

  // Reads one request from `conn` and writes the answer, within the deadline.
  void Serve(int conn) {
    const absl::Time deadline = absl::Now() + kConnectionDeadline;
    std::string request;
    while (!absl::StrContains(request, "\r\n\r\n") &&
           !absl::StrContains(request, "\n\n")) {
      if (request.size() > kMaxRequestBytes) {
        Send(conn,
             Response("431 Request Header Fields Too Large", "", "text/plain",
                      "request too large\n"),
             deadline);
        return;
      }
      char buf[2048];
      ssize_t n = recv(conn, buf, sizeof(buf), 0);
      if (n > 0) {
        request.append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        return;  // the client went away
      } else if (errno == EINTR) {
        continue;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return;
      } else if (!WaitFor(conn, POLLIN, deadline)) {
        return;  // too slow
      }
    }
    // Request line: METHOD TARGET VERSION
    absl::string_view line(request);
    line = line.substr(0, line.find_first_of("\r\n"));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = line.find(' ', sp1 == line.npos ? sp1 : sp1 + 1);
    if (sp1 == line.npos || sp2 == line.npos) {
      Send(conn, Response("400 Bad Request", "", "text/plain", "bad request\n"),
           deadline);
      return;
    }
    const absl::string_view method = line.substr(0, sp1);
    absl::string_view path = line.substr(sp1 + 1, sp2 - sp1 - 1);
    path = path.substr(0, path.find('?'));
    if (path != "/metrics") {
      Send(conn, Response("404 Not Found", "", "text/plain", "not found\n"),
           deadline);
      return;
    }
    if (method != "GET") {
      Send(conn,
           Response("405 Method Not Allowed", "Allow: GET\r\n", "text/plain",
                    "only GET\n"),
           deadline);
      return;
    }
    std::string body;
    try {
      body = prometheus::TextSerializer().Serialize(registry_->Collect());
    } catch (const std::exception& e) {
      Send(conn,
           Response("500 Internal Server Error", "", "text/plain",
                    absl::StrCat(e.what(), "\n")),
           deadline);
      return;
    }
    Send(conn,
         Response("200 OK", "", "text/plain; version=0.0.4; charset=utf-8",
                  body),
         deadline);
  }

  void Send(int conn, const std::string& data, absl::Time deadline) const {
    size_t sent = 0;
    while (sent < data.size()) {
      ssize_t n =
          send(conn, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!WaitFor(conn, POLLOUT, deadline)) return;
      } else {
        return;
      }
    }
  }

  const int listen_fd_;
  const int stop_read_;  // readable once the destructor asks to stop
  const int stop_write_;
  const int port_;
  const std::shared_ptr<prometheus::Registry> registry_;
  std::thread thread_;  // last: starts once the fields above are set
};

struct NodeMetrics::Metrics {
  Counter* inner_steps;
  Counter* tokens;
  Histogram* step_duration;
  Gauge* train_loss;
  Family<Counter>* rounds;
  Histogram* round_duration;
  Histogram* sync_duration;
  Gauge* outer_lr;
  Gauge* inner_lr;
  Gauge* pseudo_gradient_norm;
  Gauge* consensus_distance;
  Gauge* val_loss;
  Gauge* val_accuracy;
  Counter* sent_bytes;
  Counter* received_bytes;
  Counter* before_compression_bytes;
  Counter* after_compression_bytes;
  Gauge* peers_known;
  Gauge* peers_connected;
  Gauge* reachable;
  Gauge* members_reachable;
  Gauge* members_unreachable;
  Gauge* members_unknown;
  Family<Counter>* rpc_errors;
  Family<Counter>* refusals;
  Gauge* early_bytes;
  Family<Counter>* relay_forwarded;
  Gauge* relay_attached;
  Histogram* checkpoint_duration;
  Gauge* last_checkpoint;
};

std::unique_ptr<NodeMetrics::Metrics> NodeMetrics::RegisterAll(
    const BuildInfo& info, prometheus::Registry& r) {
  auto m = std::make_unique<NodeMetrics::Metrics>();
  RegisterTraining(info, r, *m);
  RegisterNetwork(r, *m);
  return m;
}

void NodeMetrics::RegisterTraining(const BuildInfo& info,
                                   prometheus::Registry& r, Metrics& metrics) {
  Metrics* m = &metrics;
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;

  Register(BuildGauge(), "starling_build_info",
           "Build and run information of this node; the value is always 1.", r)
      .Add({{"version", info.version},
            {"torch", info.torch},
            {"device", info.device},
            {"algo", info.algo},
            {"node", info.node_id}})
      .Set(1);

  m->inner_steps = &Register(BuildCounter(), "starling_inner_steps_total",
                             "Inner optimizer steps taken.", r)
                        .Add({});
  m->tokens =
      &Register(BuildCounter(), "starling_tokens_total",
                "Training tokens (or examples) consumed by inner steps.", r)
           .Add({});
  m->step_duration =
      &Register(BuildHistogram(), "starling_step_duration_seconds",
                "Wall time of one inner step.", r)
           .Add({}, StepBuckets());
  m->train_loss = &Register(BuildGauge(), "starling_train_loss",
                            "Training loss of the latest inner step.", r)
                       .Add({});

  m->rounds = &Register(BuildCounter(), "starling_rounds_total",
                        "Outer rounds ended, by result (committed, stale, "
                        "aborted, stopped).",
                        r);
  for (const char* result :
       {kRoundCommitted, kRoundStale, kRoundAborted, kRoundStopped}) {
    m->rounds->Add({{"result", result}});
  }
  m->round_duration =
      &Register(BuildHistogram(), "starling_round_duration_seconds",
                "Wall time of one committed outer round.", r)
           .Add({}, RoundBuckets());
  m->sync_duration =
      &Register(BuildHistogram(), "starling_sync_duration_seconds",
                "Wall time of the pseudo-gradient exchange of one committed "
                "outer round.",
                r)
           .Add({}, RoundBuckets());

  m->outer_lr = &Register(BuildGauge(), "starling_outer_learning_rate",
                          "Current outer optimizer learning rate.", r)
                     .Add({});
  m->inner_lr = &Register(BuildGauge(), "starling_inner_learning_rate",
                          "Current inner optimizer learning rate.", r)
                     .Add({});
  m->pseudo_gradient_norm =
      &Register(BuildGauge(), "starling_pseudo_gradient_norm",
                "L2 norm of the latest averaged pseudo-gradient.", r)
           .Add({});
  m->consensus_distance =
      &Register(BuildGauge(), "starling_consensus_distance",
                "gossip: squared L2 distance between this node's model and "
                "the last one it absorbed (an estimate of consensus).",
                r)
           .Add({});
  // NaN, not 0, until the first evaluation: 0 would read as a perfect model.
  m->val_loss = &Register(BuildGauge(), "starling_val_loss",
                          "Validation loss of this node's latest evaluation "
                          "(NaN until it first evaluates).",
                          r)
                     .Add({});
  m->val_loss->Set(std::numeric_limits<double>::quiet_NaN());
  m->val_accuracy =
      &Register(BuildGauge(), "starling_val_accuracy",
                "Validation accuracy (a fraction) of this node's latest "
                "evaluation of a classifier (NaN before it, and for language "
                "models).",
                r)
           .Add({});
  m->val_accuracy->Set(std::numeric_limits<double>::quiet_NaN());
}

void NodeMetrics::RegisterNetwork(prometheus::Registry& r, Metrics& metrics) {
  Metrics* m = &metrics;
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;

  m->sent_bytes = &Register(BuildCounter(), "starling_sent_bytes_total",
                            "Bytes sent to peers.", r)
                       .Add({});
  m->received_bytes = &Register(BuildCounter(), "starling_received_bytes_total",
                                "Bytes received from peers.", r)
                           .Add({});
  auto& pg_bytes =
      Register(BuildCounter(), "starling_pseudo_gradient_bytes_total",
               "Pseudo-gradient bytes this node sent, by stage: "
               "before_compression or after_compression.",
               r);
  m->before_compression_bytes =
      &pg_bytes.Add({{"stage", "before_compression"}});
  m->after_compression_bytes = &pg_bytes.Add({{"stage", "after_compression"}});

  m->peers_known = &Register(BuildGauge(), "starling_peers_known",
                             "Peers in this node's membership view.", r)
                        .Add({});
  m->peers_connected =
      &Register(BuildGauge(), "starling_peers_connected",
                "Peers that answered this node's latest request.", r)
           .Add({});
  m->reachable = &Register(BuildGauge(), "starling_reachable",
                           "Whether a member dialed this node back at its "
                           "join: 1 yes, 0 no (behind NAT?), -1 not checked.",
                           r)
                      .Add({});
  m->reachable->Set(-1);
  Family<Gauge>& by_reachability =
      Register(BuildGauge(), "starling_members_reachability",
               "Live members by what the dial-back at their join found.", r);
  m->members_reachable = &by_reachability.Add({{"reachability", "reachable"}});
  m->members_unreachable =
      &by_reachability.Add({{"reachability", "unreachable"}});
  m->members_unknown = &by_reachability.Add({{"reachability", "unknown"}});
  m->rpc_errors = &Register(BuildCounter(), "starling_rpc_errors_total",
                            "Failed outgoing RPCs, by gRPC status code.", r);
  // Every code but OK, at 0 from the start (absl and gRPC share the codes).
  for (int code = 1;
       code <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++code) {
    m->rpc_errors->Add({{"code", absl::StatusCodeToString(
                                     static_cast<absl::StatusCode>(code))}});
  }
  m->refusals =
      &Register(BuildCounter(), "starling_peer_refusals_total",
                "Incoming calls and streams refused or cut off to protect "
                "this node, by reason.",
                r);
  m->early_bytes =
      &Register(BuildGauge(), "starling_early_message_bytes",
                "Payload bytes of tensor messages held for an attempt this "
                "node has not started yet.",
                r)
           .Add({});
  m->relay_forwarded =
      &Register(BuildCounter(), "starling_relay_forwarded_bytes_total",
                "Bytes this node forwarded as a relay for a member that "
                "peers cannot dial, by that member.",
                r);
  m->relay_attached =
      &Register(BuildGauge(), "starling_relay_attached",
                "1 while this node (unreachable) is attached to a relay.", r)
           .Add({});
  for (const char* reason :
       {"rate_limit", "stream_limit", "stream_cancelled"}) {
    m->refusals->Add({{"reason", reason}});
  }

  m->checkpoint_duration =
      &Register(BuildHistogram(), "starling_checkpoint_duration_seconds",
                "Wall time of writing one checkpoint.", r)
           .Add({}, CheckpointBuckets());
  m->last_checkpoint =
      &Register(BuildGauge(), "starling_last_checkpoint_timestamp_seconds",
                "Unix time of the latest checkpoint written.", r)
           .Add({});
}

absl::StatusOr<std::unique_ptr<NodeMetrics>> NodeMetrics::Start(
    const std::string& host, int port, const BuildInfo& info) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port ", port, " is outside [0, 65535]"));
  }
  in_addr v4;
  in6_addr v6;
  int family;
  std::string shown_host;  // how address() prints the host
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    family = AF_INET;
    shown_host = host;
  } else if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    family = AF_INET6;
    shown_host = absl::StrCat("[", host, "]");
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics host \"", host, "\" is not a numeric IPv4 or IPv6 address"));
  }

  auto registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<Metrics> metrics;
  try {
    metrics = RegisterAll(info, *registry);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot register the node metrics: ", e.what()));
  }
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      family, host, absl::StrCat(shown_host, ":", port), port, registry);
  if (!server.ok()) return server.status();
  return std::unique_ptr<NodeMetrics>(
      new NodeMetrics(std::move(shown_host), std::move(registry),
                      std::move(metrics), std::move(server).value()));
}

NodeMetrics::NodeMetrics(std::string host,
                         std::shared_ptr<prometheus::Registry> registry,
                         std::unique_ptr<Metrics> metrics,
                         std::unique_ptr<HttpServer> server)
    : host_(std::move(host)),
      registry_(std::move(registry)),
      metrics_(std::move(metrics)),
      server_(std::move(server)) {}

NodeMetrics::~NodeMetrics() = default;

std::string NodeMetrics::address() const {
  return absl::StrCat(host_, ":", server_->port());
}

void NodeMetrics::InnerStep(double seconds, int64_t tokens, double loss) {
  metrics_->inner_steps->Increment();
  if (tokens > 0) metrics_->tokens->Increment(static_cast<double>(tokens));
  if (seconds >= 0) metrics_->step_duration->Observe(seconds);
  metrics_->train_loss->Set(loss);
}

void NodeMetrics::Round(const std::string& result, double round_seconds,
                        double sync_seconds) {
  metrics_->rounds->Add({{"result", result}}).Increment();
  if (result != kRoundCommitted) return;
  if (round_seconds >= 0) metrics_->round_duration->Observe(round_seconds);
  if (sync_seconds >= 0) metrics_->sync_duration->Observe(sync_seconds);
}

void NodeMetrics::SetOuterLr(double lr) { metrics_->outer_lr->Set(lr); }

void NodeMetrics::SetInnerLr(double lr) { metrics_->inner_lr->Set(lr); }

void NodeMetrics::SetPseudoGradientNorm(double norm) {
  metrics_->pseudo_gradient_norm->Set(norm);
}

void NodeMetrics::SetConsensusDistance(double distance) {
  metrics_->consensus_distance->Set(distance);
}

void NodeMetrics::SetValidation(double loss, double accuracy) {
  metrics_->val_loss->Set(loss);
  if (accuracy >= 0) metrics_->val_accuracy->Set(accuracy);
}

void NodeMetrics::Advance(prometheus::Counter& counter, int64_t total,
                          int64_t* seen) {
  if (total <= *seen) return;
  counter.Increment(static_cast<double>(total - *seen));
  *seen = total;
}

void NodeMetrics::SetTraffic(int64_t sent, int64_t received,
                             int64_t before_compression,
                             int64_t after_compression) {
  absl::MutexLock lock(&mu_);
  Advance(*metrics_->sent_bytes, sent, &sent_seen_);
  Advance(*metrics_->received_bytes, received, &received_seen_);
  Advance(*metrics_->before_compression_bytes, before_compression,
          &before_compression_seen_);
  Advance(*metrics_->after_compression_bytes, after_compression,
          &after_compression_seen_);
}

void NodeMetrics::SetPeers(int known, int connected) {
  metrics_->peers_known->Set(known);
  metrics_->peers_connected->Set(connected);
}

void NodeMetrics::SetReachability(int self, int reachable, int unreachable,
                                  int unknown) {
  metrics_->reachable->Set(self);
  metrics_->members_reachable->Set(reachable);
  metrics_->members_unreachable->Set(unreachable);
  metrics_->members_unknown->Set(unknown);
}

void NodeMetrics::SetEarlyBytes(int64_t bytes) {
  metrics_->early_bytes->Set(static_cast<double>(bytes));
}

void NodeMetrics::AdvanceEach(Family<Counter>& family, const std::string& label,
                              const std::map<std::string, int64_t>& totals,
                              std::map<std::string, int64_t>* seen) {
  for (const auto& [value, total] : totals) {
    // Family::Add returns the existing counter for a known label value.
    Advance(family.Add({{label, value}}), total, &(*seen)[value]);
  }
}

void NodeMetrics::SetRpcErrors(
    const std::map<std::string, int64_t>& totals_by_code) {
  absl::MutexLock lock(&mu_);
  AdvanceEach(*metrics_->rpc_errors, "code", totals_by_code, &rpc_errors_seen_);
}

void NodeMetrics::SetRefusals(
    const std::map<std::string, int64_t>& totals_by_reason) {
  absl::MutexLock lock(&mu_);
  AdvanceEach(*metrics_->refusals, "reason", totals_by_reason, &refusals_seen_);
}

void NodeMetrics::SetRelay(
    const std::map<std::string, int64_t>& forwarded_by_member, bool attached) {
  metrics_->relay_attached->Set(attached ? 1 : 0);
  absl::MutexLock lock(&mu_);
  AdvanceEach(*metrics_->relay_forwarded, "member", forwarded_by_member,
              &relay_forwarded_seen_);
}

void NodeMetrics::Checkpoint(double seconds, absl::Time when) {
  if (seconds >= 0) metrics_->checkpoint_duration->Observe(seconds);
  metrics_->last_checkpoint->Set(
      absl::ToDoubleSeconds(when - absl::UnixEpoch()));
}

}  // namespace starling
