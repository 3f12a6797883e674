// Reverse connections over loopback gRPC, without node processes: a relay
// (RelayServer) on a server of its own, a relayed member's side
// (RelayAttachment) whose "server" is an echo socket, and a peer's tunnel
// (RelayTunnel) to it. Bytes go through end to end and are counted; a
// relay that dies is replaced; calls for another run, for a member not
// attached here, for a connection nobody asked for, from a non-member, and
// streams that never send their first frame are refused.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gossip/join_auth.h"
#include "gossip/membership.h"
#include "gossip/relay_attachment.h"
#include "gossip/relay_pump.h"
#include "gossip/relay_routes.h"
#include "gossip/relay_server.h"
#include "gtest/gtest.h"
#include "tests/harness/wait.h"

namespace starling {
namespace {

using peer::v1::MemberEntry;
using peer::v1::RelayFrame;
using ::starling::testing::WaitFor;

// Echoes every connection's bytes back, on 127.0.0.1.
class EchoServer {
 public:
  EchoServer() {
    fd_ = *ListenOnLoopback(&port_);
    thread_ = std::thread([this] {
      while (true) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        echoes_.emplace_back([c] {
          char buf[1 << 14];
          ssize_t n;
          while ((n = ::read(c, buf, sizeof(buf))) > 0) {
            if (::send(c, buf, n, MSG_NOSIGNAL) != n) break;
          }
          ::close(c);
        });
      }
    });
  }
  ~EchoServer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    for (std::thread& t : echoes_) t.join();
    ::close(fd_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::vector<std::thread> echoes_;
};

// Plaintext, with the swarm secret `token` when it is not empty.
PeerCredentials Credentials(const std::string& token = "") {
  PeerCredentials c = InsecurePeerCredentials();
  if (!token.empty()) c.join_auth = *JoinAuth::FromToken(token);
  return c;
}

// A relay for run "r" whose table holds the ids in `members`.
struct Relay {
  explicit Relay(std::vector<std::string> members,
                 absl::Duration first_frame = absl::Seconds(10),
                 const std::string& token = "") {
    RelayServerOptions o;
    o.run_id = "r";
    o.credentials = Credentials(token);
    o.is_member = [members](const std::string& id) {
      return std::find(members.begin(), members.end(), id) != members.end();
    };
    o.first_frame_timeout = first_frame;
    service = std::make_unique<RelayServer>(std::move(o));
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service.get());
    server = b.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~Relay() { Stop(); }
  void Stop() {
    if (server == nullptr) return;
    service->Shutdown();
    server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    server.reset();
  }
  std::unique_ptr<RelayServer> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

// The table of member "m", which its dial-back found unreachable, with
// `relays` as reachable live members.
std::unique_ptr<Membership> TableOfM(const std::vector<Relay*>& relays) {
  MembershipOptions mo;
  mo.self_id = "m";
  mo.self_address = "10.9.9.9:7000";
  auto m = *Membership::Create(mo, absl::Now());
  m->SetReachability(peer::v1::REACHABILITY_UNREACHABLE);
  std::vector<MemberEntry> rows;
  int k = 0;
  for (Relay* r : relays) {
    MemberEntry e;
    e.set_id(absl::StrCat("r", k++));
    e.set_address(r->address);
    e.set_state(peer::v1::MEMBER_ALIVE);
    e.set_incarnation(1);
    e.set_heartbeat(1);
    e.set_reachability(peer::v1::REACHABILITY_REACHABLE);
    rows.push_back(e);
  }
  EXPECT_TRUE(m->Merge(rows, absl::Now()).ok());
  return m;
}

// Sends `n` bytes into `fd` and reads as many back; whether they matched.
bool EchoesBack(int fd, size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(i * 131 + 7);
  std::thread writer([&] { ::send(fd, out.data(), out.size(), MSG_NOSIGNAL); });
  std::string in;
  char buf[1 << 14];
  while (in.size() < n) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r <= 0) break;
    in.append(buf, static_cast<size_t>(r));
  }
  writer.join();
  return in == out;
}

// Without a join token, and with one (every call of the relay, and every
// call inside the tunnel, must prove it).
class RelayBytesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RelayBytesTest, BytesGoThroughTheRelayBothWaysAndAreCounted) {
  const std::string token = GetParam();
  EchoServer echo;
  Relay relay({"m"}, absl::Seconds(10), token);
  std::unique_ptr<Membership> table = TableOfM({&relay});
  std::atomic<bool> stopping{false};
  RelayAttachment attachment(
      {"m", "r", "auto", echo.address(), Credentials(token)}, table.get(),
      &stopping);
  attachment.Start();
  ASSERT_TRUE(WaitFor([&] { return attachment.relay() == relay.address; },
                      absl::Seconds(30)));
  EXPECT_EQ(table->Get("m")->relay(), relay.address);
  std::atomic<int64_t> bytes{0};
  auto tunnel =
      *RelayTunnel::Start(relay.address, "m", "r", Credentials(token), &bytes);
  const int fd = *DialTcp(tunnel->local_address());
  EXPECT_TRUE(EchoesBack(fd, 3 << 20));
  ::close(fd);
  EXPECT_GE(relay.service->forwarded_bytes(), 2 * (3 << 20));
  EXPECT_GE(relay.service->forwarded_by_member()["m"], 2 * (3 << 20));
  EXPECT_GE(bytes.load(), 2 * (3 << 20));
  EXPECT_GE(attachment.relayed_bytes(), 2 * (3 << 20));
  if (!token.empty()) {
    // A tunnel that does not know the secret gets nothing through.
    std::atomic<int64_t> none{0};
    auto stranger =
        *RelayTunnel::Start(relay.address, "m", "r", Credentials(), &none);
    const int sfd = *DialTcp(stranger->local_address());
    EXPECT_FALSE(EchoesBack(sfd, 1 << 10));
    ::close(sfd);
  }
  stopping = true;
  attachment.Join();
}

INSTANTIATE_TEST_SUITE_P(Tokens, RelayBytesTest,
                         ::testing::Values("", "0123456789abcdef0123"));

TEST(RelayTest, AMemberWhoseRelayDiesAttachesToAnother) {
  EchoServer echo;
  Relay first({"m"}), second({"m"});
  std::unique_ptr<Membership> table = TableOfM({&first, &second});
  std::atomic<bool> stopping{false};
  RelayAttachment attachment(
      {"m", "r", "auto", echo.address(), InsecurePeerCredentials()},
      table.get(), &stopping);
  attachment.Start();
  ASSERT_TRUE(
      WaitFor([&] { return !attachment.relay().empty(); }, absl::Seconds(30)));
  Relay& dying = attachment.relay() == first.address ? first : second;
  Relay& other = &dying == &first ? second : first;
  dying.Stop();
  ASSERT_TRUE(WaitFor([&] { return attachment.relay() == other.address; },
                      absl::Seconds(30)));
  EXPECT_EQ(attachment.relays_lost(), 1);
  EXPECT_EQ(table->Get("m")->relay(), other.address);
  std::atomic<int64_t> bytes{0};
  auto tunnel = *RelayTunnel::Start(other.address, "m", "r",
                                    InsecurePeerCredentials(), &bytes);
  const int fd = *DialTcp(tunnel->local_address());
  EXPECT_TRUE(EchoesBack(fd, 1 << 16));
  ::close(fd);
  stopping = true;
  attachment.Join();
}

// One Connect or Accept call with `first` as its first frame (none when
// `send_first` is false): the status it ends with.
grpc::Status Call(const std::string& relay, bool connect,
                  const RelayFrame& first, bool send_first = true) {
  auto stub = peer::v1::Relay::NewStub(
      grpc::CreateChannel(relay, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto stream = connect ? stub->Connect(&ctx) : stub->Accept(&ctx);
  if (send_first) stream->Write(first);
  RelayFrame in;
  while (stream->Read(&in)) {
  }
  return stream->Finish();
}

TEST(RelayTest, RefusesCallsOfAnotherRunForStrangersAndUnknownConnections) {
  Relay relay({"m"}, /*first_frame=*/absl::Milliseconds(500));
  RelayFrame f;
  f.set_run_id("other");
  f.set_target("m");
  grpc::Status s = Call(relay.address, true, f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("\"other\""), std::string::npos)
      << s.error_message();

  f.set_run_id("r");
  f.set_target("ghost");
  s = Call(relay.address, true, f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("not attached"), std::string::npos)
      << s.error_message();

  f.set_conn(12345);
  s = Call(relay.address, false, f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);

  // A stream that never sends its first frame is ended, not held.
  s = Call(relay.address, true, f, /*send_first=*/false);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();

  auto stub = peer::v1::Relay::NewStub(
      grpc::CreateChannel(relay.address, grpc::InsecureChannelCredentials()));
  for (const auto& [run, id, want] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"r", "stranger", "not a member"}, {"other", "m", "\"other\""}}) {
    grpc::ClientContext ctx;
    peer::v1::AttachRequest req;
    req.set_run_id(run);
    req.set_node_id(id);
    auto events = stub->Attach(&ctx, req);
    peer::v1::RelayEvent e;
    EXPECT_FALSE(events->Read(&e));
    s = events->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(s.error_message().find(want), std::string::npos)
        << s.error_message();
  }
  EXPECT_TRUE(relay.service->attached().empty());
  EXPECT_EQ(relay.service->forwarded_bytes(), 0);
}

}  // namespace
}  // namespace starling
