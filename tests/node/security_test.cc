// Security of `starling node` with real processes. TLS: a swarm over
// mutual TLS with certificates made at test time by the openssl command
// (none committed), intruders it refuses while it keeps training, TLS
// flags refused by name at start-up, and ids bound to certificates
// (--tls_bind_node_ids). Admission by the swarm secret
// (--join_token_file): members that hold the token train together; a node
// without it, one with a wrong token, a replayed call and a stale call are
// all refused UNAUTHENTICATED while the swarm trains on, and the refusals
// are logged once per peer host per minute. A state transfer whose reader
// stalls is cancelled.
#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/file_util.h"
#include "gossip/join_auth.h"
#include "gtest/gtest.h"
#include "starling/peer/v1/swarm.grpc.pb.h"
#include "tests/core/certs.h"
#include "tests/harness/node_group.h"
#include "tests/harness/process.h"
#include "tests/harness/run_files.h"
#include "tests/harness/wait.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::MakeCa;
using ::starling::testing::MakeCert;
using ::starling::testing::NodeGroup;
using ::starling::testing::Sh;
using ::starling::testing::TinyTextFlags;

std::string TlsFlags(const std::string& dir, const std::string& name,
                     const std::string& ca_file) {
  return absl::StrCat(" --tls_cert=", dir, "/", name, ".pem --tls_key=", dir,
                      "/", name, ".key --tls_ca=", dir, "/", ca_file);
}

// Runs nodes of one small run (run id "tls") in a temporary directory,
// which also holds the test's certificates and token files.
class SecurityTest : public ::testing::Test {
 protected:
  // Waits for members n0 and n1 to exit 0 with the same final model.
  void ExpectBothFinishWithOneModel() {
    EXPECT_EQ(nodes_.Wait("n0", absl::Seconds(120)), 0) << nodes_.LogText("n0");
    EXPECT_EQ(nodes_.Wait("n1", absl::Seconds(60)), 0) << nodes_.LogText("n1");
    EXPECT_FALSE(nodes_.FinalHash("n0").empty());
    EXPECT_EQ(nodes_.FinalHash("n0"), nodes_.FinalHash("n1"));
  }

  NodeGroup nodes_{"tls", absl::StrCat(TinyTextFlags(60000),
                                       " --inner_steps=10"
                                       " --shard_mode=contiguous --threads=1"
                                       " --eval_every=0 --suspect_timeout=2"
                                       " --run_id=tls")};
  const std::string dir_ = nodes_.dir();
};

class TlsTest : public SecurityTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(MakeCa(dir_, "swarm"));
    ASSERT_TRUE(MakeCa(dir_, "evil"));
    for (const char* name : {"n0", "n1"}) {
      ASSERT_TRUE(MakeCert(dir_, name, "swarm"));
    }
    ASSERT_TRUE(MakeCert(dir_, "intruder", "evil"));
    // The intruder trusts the swarm's CA as well as its own, so it passes
    // its own start-up checks and can verify the swarm's servers: only the
    // swarm's refusal keeps it out.
    const std::string both = ReadFile(dir_ + "/evil-ca.pem").value_or("") +
                             ReadFile(dir_ + "/swarm-ca.pem").value_or("");
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/both-ca.pem", both).ok());
  }
};

// n0 and n1 train together over mutual TLS. Meanwhile a node with a
// certificate from another CA and a plaintext node try to join through n0:
// both are refused, and the two members finish with the same model.
TEST_F(TlsTest, SwarmRefusesUntrustedAndPlaintextPeersAndTrainsOn) {
  const std::string mtls = " --tls_require_client_cert";
  nodes_.Start("n0", absl::StrCat("--steps=300 --min_members=2 --shard=0/2",
                                  TlsFlags(dir_, "n0", "swarm-ca.pem"), mtls));
  ASSERT_FALSE(nodes_.Address("n0").empty());
  nodes_.Start("n1",
               absl::StrCat("--steps=300 --shard=1/2",
                            TlsFlags(dir_, "n1", "swarm-ca.pem"), mtls),
               "n0");
  ASSERT_TRUE(nodes_.WaitForEvent("n1", "\"event\":\"round\""))
      << nodes_.LogText("n1");

  auto intruder =
      nodes_.Run("intruder",
                 absl::StrCat("--steps=300 --shard=1/2 --connect_timeout=5",
                              TlsFlags(dir_, "intruder", "both-ca.pem"), mtls),
                 "n0");
  EXPECT_NE(intruder.exit_code, 0) << intruder.err;
  EXPECT_NE(intruder.err.find("cannot reach any of --peers"), std::string::npos)
      << intruder.err;
  auto plain = nodes_.Run(
      "plain", "--steps=300 --shard=1/2 --connect_timeout=5 --insecure", "n0");
  EXPECT_NE(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.err.find("cannot reach any of --peers"), std::string::npos)
      << plain.err;

  ExpectBothFinishWithOneModel();
  const std::string events0 = ReadFile(nodes_.EventsPath("n0")).value_or("");
  EXPECT_EQ(events0.find("intruder"), std::string::npos);
  EXPECT_EQ(events0.find("plain"), std::string::npos);
  EXPECT_NE(nodes_.LogText("n0").find("peer traffic uses TLS (mutual)"),
            std::string::npos);
}

// One certificate for the whole swarm, named for no address: every node
// checks that name through --tls_server_name (as deploy/ does in
// Kubernetes). Without it the name does not match 127.0.0.1.
TEST_F(TlsTest, OneSwarmCertificateWithServerName) {
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/shared.ext",
                              "subjectAltName=DNS:starling-peers\n")
                  .ok());
  ASSERT_TRUE(Sh(dir_,
                 "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1"
                 " -nodes -subj /CN=starling-peers -keyout shared.key -out "
                 "shared.csr"));
  ASSERT_TRUE(Sh(dir_,
                 "openssl x509 -req -days 2 -in shared.csr -CA swarm-ca.pem "
                 "-CAkey swarm-ca.key -CAcreateserial -extfile shared.ext "
                 "-out shared.pem"));
  // The certificate names no node: ids are not bound to it.
  const std::string tls =
      absl::StrCat(TlsFlags(dir_, "shared", "swarm-ca.pem"),
                   " --tls_require_client_cert", " --tls_bind_node_ids=false");
  nodes_.Start("n0", absl::StrCat("--steps=60 --min_members=2 --shard=0/2", tls,
                                  " --tls_server_name=starling-peers"));
  ASSERT_FALSE(nodes_.Address("n0").empty());
  // Without --tls_server_name the certificate does not cover the node's
  // own --listen host (127.0.0.1), which peers would check: refused at
  // start, naming both.
  auto unnamed = nodes_.Run(
      "unnamed",
      absl::StrCat("--steps=60 --shard=1/2 --connect_timeout=3", tls), "n0");
  EXPECT_EQ(unnamed.exit_code, 2) << unnamed.err;
  EXPECT_NE(unnamed.err.find("this node's --listen host 127.0.0.1"),
            std::string::npos)
      << unnamed.err;
  auto n1 = nodes_.Run("n1",
                       absl::StrCat("--steps=60 --shard=1/2", tls,
                                    " --tls_server_name=starling-peers"),
                       "n0");
  EXPECT_EQ(n1.exit_code, 0) << n1.err;
  EXPECT_EQ(nodes_.Wait("n0", absl::Seconds(60)), 0) << nodes_.LogText("n0");
  EXPECT_FALSE(nodes_.FinalHash("n0").empty());
  EXPECT_EQ(nodes_.FinalHash("n0"), nodes_.FinalHash("n1"));
}

// With --tls_bind_node_ids a member is who its certificate says.
class BoundIdsTest : public TlsTest {
 protected:
  // A node whose own certificate names another id stops at start-up. n0
  // (running `algo`) refuses a join under the id n1 from a caller holding
  // n2's certificate (valid, from the swarm's CA), and gossip, a round
  // message and a push that n2 sends as n1; the real n1 then trains with
  // n0. Waits for both to exit 0.
  void ImpostorsAreRefused(const std::string& algo) {
    ASSERT_TRUE(MakeCert(dir_, "n2", "swarm"));
    const std::string bound = absl::StrCat(
        " --algo=", algo, " --tls_require_client_cert --tls_bind_node_ids");
    auto own = nodes_.Run(
        "n1", absl::StrCat("--steps=60", TlsFlags(dir_, "n2", "swarm-ca.pem"),
                           bound));
    EXPECT_EQ(own.exit_code, 2) << own.err;
    EXPECT_NE(own.err.find("but not this node's id \"n1\""), std::string::npos)
        << own.err;

    nodes_.Start("n0",
                 absl::StrCat("--steps=300 --min_members=2 --shard=0/2",
                              TlsFlags(dir_, "n0", "swarm-ca.pem"), bound));
    const std::string seed = nodes_.Address("n0");
    ASSERT_FALSE(seed.empty());
    // The impostor does not bind ids itself: n0's check is what refuses it.
    auto impostor = nodes_.Run(
        "n1",
        absl::StrCat(
            "--steps=300 --algo=", algo, " --shard=1/2 --connect_timeout=20",
            TlsFlags(dir_, "n2", "swarm-ca.pem"), " --tls_require_client_cert",
            " --tls_bind_node_ids=false"),
        "n0");
    EXPECT_NE(impostor.exit_code, 0) << impostor.err;
    EXPECT_NE(impostor.err.find("refused this node: a join as member \"n1\" "
                                "from a caller whose certificate names \"n2\""),
              std::string::npos)
        << impostor.err;
    ExpectCallsAsN1Refused(algo, seed);

    nodes_.Start("n1",
                 absl::StrCat("--steps=300 --shard=1/2",
                              TlsFlags(dir_, "n1", "swarm-ca.pem"), bound),
                 "n0");
    EXPECT_EQ(nodes_.Wait("n0", absl::Seconds(120)), 0) << nodes_.LogText("n0");
    EXPECT_EQ(nodes_.Wait("n1", absl::Seconds(60)), 0) << nodes_.LogText("n1");
  }

  // Gossip, a round message and (for gossip) a push that n2, with its own
  // certificate, sends to n0 at `seed` as n1: each refused.
  void ExpectCallsAsN1Refused(const std::string& algo,
                              const std::string& seed) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ReadFile(dir_ + "/swarm-ca.pem").value_or("");
    tls.pem_cert_chain = ReadFile(dir_ + "/n2.pem").value_or("");
    tls.pem_private_key = ReadFile(dir_ + "/n2.key").value_or("");
    auto stub = peer::v1::Swarm::NewStub(
        grpc::CreateChannel(seed, grpc::SslCredentials(tls)));
    auto expect_refused = [](const grpc::Status& s, const std::string& what) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << what << ": " << s.error_message();
      EXPECT_NE(s.error_message().find(what + " as member \"n1\""),
                std::string::npos)
          << s.error_message();
    };
    auto deadline = [] {
      return absl::ToChronoTime(absl::Now() + absl::Seconds(10));
    };
    for (const char* from : {"n1", "n2"}) {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      peer::v1::GossipRequest req;
      req.set_run_id("tls");
      req.set_from(from);
      peer::v1::GossipResponse resp;
      grpc::Status s = stub->Gossip(&ctx, req, &resp);
      if (std::string(from) == "n1") {
        expect_refused(s, "gossip");
      } else {
        EXPECT_TRUE(s.ok()) << s.error_message();  // n2 may speak for itself
      }
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      peer::v1::ControlMessage ready;
      ready.set_run_id("tls");
      ready.set_from("n1");
      ready.set_kind(peer::v1::ControlMessage::READY);
      ready.set_round(1);
      peer::v1::ControlAck ack;
      expect_refused(stub->Control(&ctx, ready, &ack), "a round message");
    }
    if (algo == "gossip") {
      // A well-formed push of the model's size.
      const int64_t n = nodes_.Parameters("n0");
      ASSERT_GT(n, 0);
      std::vector<float> values(static_cast<size_t>(n), 0.01f);
      peer::v1::PushChunk c;
      c.set_run_id("tls");
      c.set_from("n1");
      c.set_sequence(1);
      c.set_elements(n);
      c.set_total_bytes(n * static_cast<int64_t>(sizeof(float)));
      c.set_data(reinterpret_cast<const char*>(values.data()),
                 values.size() * sizeof(float));
      c.set_weight(0.5);
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline());
      peer::v1::PushAck ack;
      auto writer = stub->Push(&ctx, &ack);
      writer->Write(c);
      writer->WritesDone();
      expect_refused(writer->Finish(), "a push");
    }
  }
};

TEST_F(BoundIdsTest, DilocoRefusesCallsUnderAnotherMembersId) {
  ImpostorsAreRefused("diloco");
  EXPECT_FALSE(nodes_.FinalHash("n0").empty());
  EXPECT_EQ(nodes_.FinalHash("n0"), nodes_.FinalHash("n1"));
  // ddp has ranks, not ids, to bind.
  auto ddp = nodes_.Run(
      "n0", absl::StrCat("--steps=60 --algo=ddp",
                         TlsFlags(dir_, "n0", "swarm-ca.pem"),
                         " --tls_require_client_cert --tls_bind_node_ids"));
  EXPECT_EQ(ddp.exit_code, 2) << ddp.err;
  EXPECT_NE(ddp.err.find("--algo=ddp has no node ids"), std::string::npos)
      << ddp.err;
}

TEST_F(BoundIdsTest, GossipRefusesCallsUnderAnotherMembersId) {
  ImpostorsAreRefused("gossip");
}

// Mutual TLS binds ids without being asked: a node whose certificate names
// another id stops at start-up, unless binding is turned off explicitly.
TEST_F(BoundIdsTest, IdsAreBoundByDefaultWithMutualTls) {
  ASSERT_TRUE(MakeCert(dir_, "n2", "swarm"));
  const std::string as_n2 =
      absl::StrCat("--steps=20", TlsFlags(dir_, "n2", "swarm-ca.pem"),
                   " --tls_require_client_cert");
  auto bound = nodes_.Run("n1", as_n2);
  EXPECT_EQ(bound.exit_code, 2) << bound.err;
  EXPECT_NE(bound.err.find("but not this node's id \"n1\""), std::string::npos)
      << bound.err;
  EXPECT_NE(bound.err.find("--tls_bind_node_ids=false"), std::string::npos)
      << bound.err;
  auto unbound = nodes_.Run("n3", as_n2 + " --tls_bind_node_ids=false");
  EXPECT_EQ(unbound.exit_code, 0) << unbound.err;
  // Without mutual TLS the default asks for nothing.
  auto one_way = nodes_.Run(
      "n4", absl::StrCat("--steps=20", TlsFlags(dir_, "n2", "swarm-ca.pem")));
  EXPECT_EQ(one_way.exit_code, 0) << one_way.err;
}

// A certificate for another host: SAN DNS:node-b.example only, from the
// swarm's CA (ELSEWHERE.pem and .key in `dir`).
bool MakeElsewhereCert(const std::string& dir) {
  return WriteFileAtomic(dir + "/elsewhere.ext",
                         "subjectAltName=DNS:node-b.example\n")
             .ok() &&
         Sh(dir,
            "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
            "-nodes -subj /CN=elsewhere -keyout elsewhere.key -out "
            "elsewhere.csr") &&
         Sh(dir,
            "openssl x509 -req -days 2 -in elsewhere.csr -CA swarm-ca.pem "
            "-CAkey swarm-ca.key -CAcreateserial -extfile elsewhere.ext -out "
            "elsewhere.pem");
}

// A node whose certificate does not cover the host of its --listen address
// (which every peer checks it against) stops at start-up, exit 2, naming
// the certificate, the host and the names the certificate has. Given the
// name it covers as --tls_server_name, it starts.
TEST_F(TlsTest, ACertificateThatDoesNotCoverTheListenHostIsRefused) {
  ASSERT_TRUE(MakeElsewhereCert(dir_));
  const std::string tls = TlsFlags(dir_, "elsewhere", "swarm-ca.pem");
  auto r = nodes_.Run("b", absl::StrCat("--steps=10", tls));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  for (const std::string& want :
       {absl::StrCat("--tls_cert=", dir_, "/elsewhere.pem"),
        std::string("does not cover this node's --listen host 127.0.0.1"),
        std::string("it names CN=elsewhere, DNS:node-b.example"),
        std::string("subjectAltName holds IP:127.0.0.1")}) {
    EXPECT_NE(r.err.find(want), std::string::npos) << want << "\n" << r.err;
  }
  r = nodes_.Run("b", absl::StrCat("--steps=10 --listen=localhost:0", tls));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("subjectAltName holds DNS:localhost"), std::string::npos)
      << r.err;
  r = nodes_.Run("b", absl::StrCat("--steps=10 --tls_server_name=other", tls));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("does not cover --tls_server_name=other"),
            std::string::npos)
      << r.err;
  r = nodes_.Run(
      "b", absl::StrCat("--steps=10 --tls_server_name=node-b.example", tls));
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A joiner that cannot get in says, every 5 s, whom it tries and the last
// error, instead of waiting --connect_timeout in silence: here a peer whose
// certificate names another host (it listens on 0.0.0.0, whose name is not
// checked at its start), then nobody at all (connection refused).
TEST_F(TlsTest, AJoinerSaysWhomItTriesAndWhy) {
  ASSERT_TRUE(MakeElsewhereCert(dir_));
  nodes_.Start("n0", absl::StrCat("--steps=100000 --listen=0.0.0.0:0",
                                  TlsFlags(dir_, "elsewhere", "swarm-ca.pem")));
  const std::string address = nodes_.Address("n0");
  ASSERT_FALSE(address.empty());
  const std::string port = address.substr(address.rfind(':') + 1);
  auto joiner = nodes_.Run(
      "n1", absl::StrCat("--steps=10 --connect_timeout=16 --peers=127.0.0.1:",
                         port, TlsFlags(dir_, "n1", "swarm-ca.pem")));
  EXPECT_NE(joiner.exit_code, 0) << joiner.err;
  const std::string trying =
      absl::StrCat("joining the swarm through --peers=127.0.0.1:", port);
  size_t lines = 0;
  for (size_t at = joiner.err.find(trying); at != std::string::npos;
       at = joiner.err.find(trying, at + 1)) {
    ++lines;
  }
  // At 5 s and 10 s: the join itself has the time left after start-up.
  EXPECT_GE(lines, 2u) << joiner.err;
  EXPECT_NE(joiner.err.find("last error: 127.0.0.1:" + port + ": UNAVAILABLE"),
            std::string::npos)
      << joiner.err;
  // The reason, as gRPC gives it: the peer's certificate names another host.
  EXPECT_NE(joiner.err.find("Peer name 127.0.0.1 is not in peer certificate"),
            std::string::npos)
      << joiner.err;
  // Nobody listening.
  const int closed = testing::FreePort();
  auto alone = nodes_.Run(
      "n2", absl::StrCat("--steps=10 --connect_timeout=6 --peers=127.0.0.1:",
                         closed, TlsFlags(dir_, "n1", "swarm-ca.pem")));
  EXPECT_NE(alone.exit_code, 0) << alone.err;
  EXPECT_NE(alone.err.find("onnection refused"), std::string::npos)
      << alone.err;
  EXPECT_NE(alone.err.find(absl::StrCat(
                "joining the swarm through --peers=127.0.0.1:", closed)),
            std::string::npos)
      << alone.err;
}

// The README's certificate recipe, as written there and in
// docs/security.md, for several hosts: a CA, then one certificate per node
// whose subjectAltName is its host (an IP address or a DNS name). Each
// verifies against the CA and covers its host, and a node starts with its
// own certificate and is refused with another host's.
TEST_F(TlsTest, TheDocumentedCertificateRecipeWorksForSeveralHosts) {
  for (const char* doc : {"README.md", "docs/security.md"}) {
    const std::string text =
        ReadFile(absl::StrCat(STARLING_SOURCE_DIR, "/", doc)).value_or("");
    const size_t begin = text.find("    mkdir -p certs && cd certs\n");
    ASSERT_NE(begin, std::string::npos) << doc << " has no recipe";
    const size_t end = text.find("\n    cd ..\n", begin);
    ASSERT_NE(end, std::string::npos) << doc;
    std::string script;
    for (absl::string_view line :
         absl::StrSplit(text.substr(begin, end + 11 - begin), '\n')) {
      if (line.substr(0, 4) == "    ") line.remove_prefix(4);
      absl::StrAppend(&script, line, "\n");
    }
    const std::string hosts = "a=127.0.0.1 b=127.0.0.1";
    ASSERT_NE(script.find(hosts), std::string::npos) << doc << "\n" << script;
    script.replace(script.find(hosts), hosts.size(),
                   "a=127.0.0.1 b=node-b.example c=10.1.2.3");
    const std::string dir =
        absl::StrCat(dir_, "/recipe-", doc[0] == 'R' ? 1 : 2);
    ASSERT_TRUE(MakeDirs(dir).ok());
    ASSERT_TRUE(WriteFileAtomic(dir + "/recipe.sh", script).ok());
    ASSERT_TRUE(Sh(dir, "bash -euo pipefail recipe.sh")) << script;
    const std::string certs = dir + "/certs";
    for (const char* id : {"a", "b", "c"}) {
      ASSERT_TRUE(Sh(
          certs, absl::StrCat("openssl verify -CAfile ca.pem ", id, ".pem")));
    }
    ASSERT_TRUE(Sh(certs,
                   "openssl x509 -in a.pem -noout -checkip 127.0.0.1 "
                   "| grep 'does match'"));
    ASSERT_TRUE(Sh(certs,
                   "openssl x509 -in b.pem -noout -checkhost "
                   "node-b.example | grep 'does match'"));
    ASSERT_TRUE(Sh(certs,
                   "openssl x509 -in c.pem -noout -checkip 10.1.2.3 "
                   "| grep 'does match'"));
    // Node ids of their own per document: each run needs a fresh --out.
    auto a =
        nodes_.Run(absl::StrCat("a", doc[0] == 'R' ? 1 : 2),
                   absl::StrCat("--steps=5", TlsFlags(certs, "a", "ca.pem")));
    EXPECT_EQ(a.exit_code, 0) << doc << "\n" << a.err;
    auto b =
        nodes_.Run(absl::StrCat("b", doc[0] == 'R' ? 1 : 2),
                   absl::StrCat("--steps=5", TlsFlags(certs, "b", "ca.pem")));
    EXPECT_EQ(b.exit_code, 2) << doc << "\n" << b.err;
  }
}

// Ways to get the TLS flags wrong, made from the certificates in `d`, each
// with the text its error must contain.
std::vector<std::pair<std::string, std::string>> BadTlsFlags(
    const std::string& d) {
  return {
      {"", "--insecure for plaintext"},
      {absl::StrCat(" --tls_cert=", d, "/n0.pem"), "--tls_key is missing"},
      {" --tls_server_name=peers", "--tls_cert is missing"},
      {absl::StrCat(" --tls_cert=", d, "/n0.pem --tls_key=", d,
                    "/n1.key --tls_ca=", d, "/swarm-ca.pem"),
       "does not match the certificate"},
      {TlsFlags(d, "intruder", "swarm-ca.pem"),
       "does not verify against --tls_ca"},
      {TlsFlags(d, "n0", "nope.pem"), "nope.pem"},
      {absl::StrCat(" --tls_cert=", d, "/n0.key --tls_key=", d,
                    "/n0.key --tls_ca=", d, "/swarm-ca.pem"),
       "no PEM certificate"},
      {absl::StrCat(" --insecure --tls_ca=", d, "/swarm-ca.pem"), "pick one"},
      {TlsFlags(d, "n0", "swarm-ca.pem") + " --tls_bind_node_ids",
       "--tls_bind_node_ids needs mutual TLS"}};
}

// Every way to get the TLS flags wrong stops the node at start-up (exit 2)
// with a message naming the flag or file; --insecure says so in the log.
TEST_F(TlsTest, BadTlsFlagsAreRefusedByName) {
  for (const auto& [flags, want] : BadTlsFlags(dir_)) {
    auto r = nodes_.Run("bad", absl::StrCat("--steps=10", flags));
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << flags << "\n" << r.err;
  }
  auto ok = nodes_.Run("plain", "--steps=10 --insecure");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("--insecure: peer traffic is plaintext"),
            std::string::npos)
      << ok.err;
}

// `starling sim` checks its nodes' TLS files before it starts any: a bad
// one exits 2 once, naming it, with no run directory and no node. With good
// files the nodes train over TLS.
TEST_F(TlsTest, SimChecksTlsFilesBeforeAnyNodeStarts) {
  const std::string out = dir_ + "/sim";
  const std::string sim =
      absl::StrCat("--nodes=2 --steps=20 ", TinyTextFlags(300000),
                   " --inner_steps=10 --eval_every=0");
  // The sim adds --insecure only when no --tls_* flag is given.
  for (const auto& [flags, want] : BadTlsFlags(dir_)) {
    if (flags.empty() || flags.find("--insecure") != std::string::npos) {
      continue;
    }
    testing::ExpectSimRefused(sim + flags, out, want);
  }
  // One certificate for all cannot name each node.
  testing::ExpectSimRefused(
      absl::StrCat(sim, TlsFlags(dir_, "n0", "swarm-ca.pem"),
                   " --tls_require_client_cert --tls_bind_node_ids"),
      out, "use it with starling node");
  auto summary = testing::RunToSummary(
      absl::StrCat("sim ", sim, TlsFlags(dir_, "n0", "swarm-ca.pem"),
                   " --tls_require_client_cert"),
      out);
  EXPECT_NE(ReadFile(out + "/n1/node.log")
                .value_or("")
                .find("peer traffic uses TLS (mutual)"),
            std::string::npos);
  EXPECT_TRUE(Field(Field(summary, "final").struct_value(), "all_hashes_agree")
                  .bool_value());
}

constexpr char kToken[] = "7f3a9c0e5b2d4f6a8c1e3b5d7f9a0c2e";

class JoinTokenTest : public SecurityTest {
 protected:
  // Flags of a node of `steps` steps with plaintext peer traffic: the token
  // alone admits it.
  static std::string Plain(int steps) {
    return absl::StrCat("--steps=", steps, " --insecure");
  }
  void SetUp() override {
    ASSERT_TRUE(
        WriteFileAtomic(dir_ + "/token", absl::StrCat(kToken, "\n")).ok());
    ASSERT_TRUE(
        WriteFileAtomic(dir_ + "/wrong.token", "not-the-swarm-secret-at-all\n")
            .ok());
  }
};

// A Control call to `address` carrying `header` as its join-token proof
// (none when empty). Control with a foreign run id changes nothing on the
// node: an admitted call gets FAILED_PRECONDITION, a refused one
// UNAUTHENTICATED.
grpc::Status ControlWithProof(const std::string& address,
                              const std::string& header) {
  auto stub = peer::v1::Swarm::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  ctx.set_wait_for_ready(true);  // through a failed first connection attempt
  if (!header.empty()) ctx.AddMetadata(kAuthHeader, header);
  peer::v1::ControlMessage m;
  m.set_run_id("probe");
  peer::v1::ControlAck ack;
  return stub->Control(&ctx, m, &ack);
}

TEST_F(JoinTokenTest, OnlyTokenHoldersJoinAndReplaysAreRefused) {
  const std::string token = " --join_token_file=" + dir_ + "/token";
  const absl::Time start = absl::Now();
  nodes_.Start(
      "n0", absl::StrCat(Plain(6000), " --min_members=2 --shard=0/2", token));
  const std::string seed = nodes_.Address("n0");
  ASSERT_FALSE(seed.empty());
  nodes_.Start("n1", absl::StrCat(Plain(6000), " --shard=1/2", token), "n0");
  ASSERT_TRUE(nodes_.WaitForEvent("n1", "\"event\":\"round\""))
      << nodes_.LogText("n1");

  // No token, and a wrong one: refused at once, saying why.
  auto none = nodes_.Run(
      "none", absl::StrCat(Plain(300), " --shard=1/2 --connect_timeout=20"),
      "n0");
  EXPECT_NE(none.exit_code, 0) << none.err;
  EXPECT_NE(none.err.find("refused this node's credentials: no join token"),
            std::string::npos)
      << none.err;
  auto wrong =
      nodes_.Run("wrong",
                 absl::StrCat(Plain(300), " --shard=1/2 --connect_timeout=20",
                              " --join_token_file=", dir_, "/wrong.token"),
                 "n0");
  EXPECT_NE(wrong.exit_code, 0) << wrong.err;
  EXPECT_NE(wrong.err.find("wrong join token"), std::string::npos) << wrong.err;

  // A captured call (a valid proof) works once; sent again it is refused.
  auto signer = JoinAuth::FromToken(kToken);
  ASSERT_TRUE(signer.ok());
  const std::string proof = (*signer)->Stamp("Control", absl::Now());
  grpc::Status first = ControlWithProof(seed, proof);
  EXPECT_EQ(first.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << first.error_message();
  grpc::Status replay = ControlWithProof(seed, proof);
  EXPECT_EQ(replay.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(replay.error_message().find("replayed"), std::string::npos)
      << replay.error_message();
  // An old capture, and a proof made for another method, are refused too.
  grpc::Status stale = ControlWithProof(
      seed, (*signer)->Stamp("Control", absl::Now() - absl::Minutes(10)));
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status other =
      ControlWithProof(seed, (*signer)->Stamp("Join", absl::Now()));
  EXPECT_EQ(other.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // A flood of unsigned calls: each refused, none floods the log.
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(ControlWithProof(seed, "").error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }

  ExpectBothFinishWithOneModel();
  const std::string events0 = ReadFile(nodes_.EventsPath("n0")).value_or("");
  EXPECT_EQ(events0.find("\"none\""), std::string::npos);
  EXPECT_EQ(events0.find("\"wrong\""), std::string::npos);

  // 44+ refusals from 127.0.0.1: one log line per started minute at most.
  const std::string log0 = nodes_.LogText("n0");
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(log0, '\n')) {
    if (absl::StrContains(line, "refused an unauthenticated")) ++lines;
  }
  const int minutes =
      1 + static_cast<int>(absl::ToInt64Minutes(absl::Now() - start));
  EXPECT_GE(lines, 1) << log0;
  EXPECT_LE(lines, minutes) << log0;
  EXPECT_NE(log0.find("signed and checked with the join token"),
            std::string::npos);
}

// A token file that is missing or too short stops the node at start-up.
TEST_F(JoinTokenTest, BadTokenFilesAreRefusedByName) {
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/short", "abc\n").ok());
  for (const auto& [file, want] :
       std::vector<std::pair<std::string, std::string>>{
           {dir_ + "/missing", "--join_token_file=" + dir_ + "/missing"},
           {dir_ + "/short", "at least 16"}}) {
    auto r =
        nodes_.Run("bad", absl::StrCat(Plain(10), " --join_token_file=", file));
    EXPECT_EQ(r.exit_code, 2) << file << "\n" << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << file << "\n" << r.err;
  }
}

// --peer_rate_limit: a flood of calls from one host is refused
// RESOURCE_EXHAUSTED beyond the limit, logged at most once a minute, and
// the node trains on.
TEST_F(JoinTokenTest, AFloodIsRateLimitedAndTheNodeTrainsOn) {
  const absl::Time start = absl::Now();
  nodes_.Start("n0", absl::StrCat(Plain(3000), " --peer_rate_limit=10"));
  const std::string address = nodes_.Address("n0");
  ASSERT_FALSE(address.empty());
  // Calls until 50 were refused: how fast this machine makes them does not
  // matter, only that no more were admitted than the burst and the rate
  // since the first call allow.
  int admitted = 0, limited = 0;
  const absl::Time flood_start = absl::Now();
  for (int i = 0; i < 2000 && limited < 50; ++i) {
    const grpc::Status s = ControlWithProof(address, "");
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++limited;
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) ++admitted;
  }
  const double flood_seconds = absl::ToDoubleSeconds(absl::Now() - flood_start);
  EXPECT_GE(admitted, 20);  // the burst, and the rate since
  EXPECT_GE(limited, 50);
  EXPECT_LE(admitted, 20 + static_cast<int>(10 * flood_seconds) + 2)
      << "in " << flood_seconds << " s";
  EXPECT_EQ(nodes_.Wait("n0", absl::Seconds(120)), 0) << nodes_.LogText("n0");
  const std::string log0 = nodes_.LogText("n0");
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(log0, '\n')) {
    if (absl::StrContains(line, "rate limit: 127.0.0.1")) ++lines;
  }
  EXPECT_GE(lines, 1) << log0;
  EXPECT_LE(lines,
            1 + static_cast<int>(absl::ToInt64Minutes(absl::Now() - start)));
}

// A slow-loris joiner: it asks n0 for its state, reads one chunk and stops
// reading. n0 cancels the transfer after --stream_idle_timeout and trains
// on.
TEST_F(SecurityTest, AStalledStateTransferIsCancelled) {
  nodes_.Start("n0",
               "--steps=3000 --insecure --stream_idle_timeout=1"
               " --chunk_bytes=1024");
  const std::string address = nodes_.Address("n0");
  ASSERT_FALSE(address.empty());
  ASSERT_TRUE(nodes_.WaitForEvent("n0", "\"event\":\"round\""));
  // 1 KiB chunks and a small receive window, so that n0 has to wait for
  // this reader.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  auto stub = peer::v1::Swarm::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  peer::v1::StateRequest req;
  req.set_run_id("tls");
  req.set_from("loris");
  auto reader = stub->FetchState(&ctx, req);
  peer::v1::StateChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  const int64_t total = chunk.total_bytes();
  int64_t got = static_cast<int64_t>(chunk.data().size());
  ASSERT_LT(got, total) << "the state fits one chunk: nothing to stall";
  // Reads nothing more until n0 has given up on this reader.
  const std::string cancelled =
      "cancelled a FetchState stream from 127.0.0.1: it carried no message "
      "for 1s";
  EXPECT_TRUE(
      testing::WaitForText(nodes_.Log("n0"), cancelled, absl::Seconds(60)))
      << nodes_.LogText("n0");
  while (reader->Read(&chunk)) got += static_cast<int64_t>(chunk.data().size());
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  EXPECT_LT(got, total);
  EXPECT_EQ(nodes_.Wait("n0", absl::Seconds(120)), 0) << nodes_.LogText("n0");
}

}  // namespace
}  // namespace starling
