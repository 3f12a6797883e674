// Transport security of `starling node`: a swarm over mutual TLS with
// certificates made at test time by the openssl command (none committed),
// intruders it refuses while it keeps training, and TLS flags refused by
// name at start-up.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gtest/gtest.h"
#include "tests/core/run_util.h"

namespace starling {
namespace {

using ::starling::testing::Field;
using ::starling::testing::ListenAddress;
using ::starling::testing::ReadJson;
using ::starling::testing::RunStarling;
using ::starling::testing::SpawnStarling;
using ::starling::testing::TempDir;
using ::starling::testing::TinyTextFlags;
using ::starling::testing::WaitUntil;

// Runs a shell command in `dir`; fails the test (and returns false) when
// it exits non-zero.
bool Sh(const std::string& dir, const std::string& command) {
  const std::string cmd =
      absl::StrCat("cd ", dir, " && ", command, " >>openssl.log 2>&1");
  const int status = std::system(cmd.c_str());
  if (status != 0) {
    ADD_FAILURE() << command << " failed:\n"
                  << ReadFile(dir + "/openssl.log").value_or("");
    return false;
  }
  return true;
}

// A CA (NAME-ca.pem, NAME-ca.key) in `dir`.
bool MakeCa(const std::string& dir, const std::string& name) {
  return Sh(dir,
            absl::StrCat("openssl req -x509 -newkey ec -pkeyopt "
                         "ec_paramgen_curve:prime256v1 -nodes -days 2 -subj "
                         "/CN=",
                         name, "-ca -keyout ", name, "-ca.key -out ", name,
                         "-ca.pem"));
}

// A certificate NAME.pem (key NAME.key) signed by CA's key, valid for
// 127.0.0.1 and localhost, for servers and clients alike.
bool MakeCert(const std::string& dir, const std::string& name,
              const std::string& ca) {
  return WriteFileAtomic(dir + "/" + name + ".ext",
                         "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
             .ok() &&
         Sh(dir, absl::StrCat("openssl req -newkey ec -pkeyopt "
                              "ec_paramgen_curve:prime256v1 -nodes -subj /CN=",
                              name, " -keyout ", name, ".key -out ", name,
                              ".csr")) &&
         Sh(dir, absl::StrCat("openssl x509 -req -days 2 -in ", name,
                              ".csr -CA ", ca, "-ca.pem -CAkey ", ca,
                              "-ca.key -CAcreateserial -extfile ", name,
                              ".ext -out ", name, ".pem"));
}

std::string TlsFlags(const std::string& dir, const std::string& name,
                     const std::string& ca_file) {
  return absl::StrCat(" --tls_cert=", dir, "/", name, ".pem --tls_key=", dir,
                      "/", name, ".key --tls_ca=", dir, "/", ca_file);
}

class TlsTest : public ::testing::Test {
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

  std::string Node(const std::string& id, int steps) const {
    return absl::StrCat("node ", TinyTextFlags(60000), " --steps=", steps,
                        " --inner_steps=10 --shard_mode=contiguous --threads=1"
                        " --eval_every=0 --suspect_timeout=2 --run_id=tls"
                        " --listen=127.0.0.1:0 --node_id=",
                        id, " --out=", dir_, "/", id);
  }
  std::string Log(const std::string& id) const {
    return absl::StrCat(dir_, "/", id, ".log");
  }
  std::string FinalHash(const std::string& id) const {
    auto s = ReadJson(absl::StrCat(dir_, "/", id, "/summary.json"));
    return Field(Field(s, "final").struct_value(), "model_hash").string_value();
  }

  std::string dir_ = TempDir();
};

// n0 and n1 train together over mutual TLS. Meanwhile a node with a
// certificate from another CA and a plaintext node try to join through n0:
// both are refused, and the two members finish with the same model.
TEST_F(TlsTest, SwarmRefusesUntrustedAndPlaintextPeersAndTrainsOn) {
  const std::string mtls = " --tls_require_client_cert";
  pid_t n0 = SpawnStarling(
      absl::StrCat(Node("n0", 300), " --min_members=2 --shard=0/2",
                   TlsFlags(dir_, "n0", "swarm-ca.pem"), mtls),
      Log("n0"));
  const std::string seed = ListenAddress(Log("n0"), absl::Seconds(60));
  ASSERT_FALSE(seed.empty()) << ReadFile(Log("n0")).value_or("");
  pid_t n1 =
      SpawnStarling(absl::StrCat(Node("n1", 300), " --shard=1/2 --peers=", seed,
                                 TlsFlags(dir_, "n1", "swarm-ca.pem"), mtls),
                    Log("n1"));
  ASSERT_TRUE(::starling::testing::WaitForText(
      absl::StrCat(dir_, "/n1/events.jsonl"), "\"event\":\"round\"",
      absl::Seconds(60)))
      << ReadFile(Log("n1")).value_or("");

  auto intruder = RunStarling(absl::StrCat(
      Node("intruder", 300), " --shard=1/2 --connect_timeout=5",
      " --peers=", seed, TlsFlags(dir_, "intruder", "both-ca.pem"), mtls));
  EXPECT_NE(intruder.exit_code, 0) << intruder.err;
  EXPECT_NE(intruder.err.find("cannot reach any of --peers"), std::string::npos)
      << intruder.err;
  auto plain = RunStarling(absl::StrCat(Node("plain", 300),
                                        " --shard=1/2 --connect_timeout=5",
                                        " --peers=", seed, " --insecure"));
  EXPECT_NE(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.err.find("cannot reach any of --peers"), std::string::npos)
      << plain.err;

  EXPECT_EQ(WaitUntil(n0, absl::Now() + absl::Seconds(120)), 0)
      << ReadFile(Log("n0")).value_or("");
  EXPECT_EQ(WaitUntil(n1, absl::Now() + absl::Seconds(60)), 0)
      << ReadFile(Log("n1")).value_or("");
  EXPECT_FALSE(FinalHash("n0").empty());
  EXPECT_EQ(FinalHash("n0"), FinalHash("n1"));
  const std::string events0 = ReadFile(dir_ + "/n0/events.jsonl").value_or("");
  EXPECT_EQ(events0.find("intruder"), std::string::npos);
  EXPECT_EQ(events0.find("plain"), std::string::npos);
  EXPECT_NE(ReadFile(Log("n0")).value_or("").find("peer traffic uses TLS "
                                                  "(mutual)"),
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
  const std::string tls = absl::StrCat(TlsFlags(dir_, "shared", "swarm-ca.pem"),
                                       " --tls_require_client_cert");
  pid_t n0 =
      SpawnStarling(absl::StrCat(Node("n0", 60), " --min_members=2 --shard=0/2",
                                 tls, " --tls_server_name=starling-peers"),
                    Log("n0"));
  const std::string seed = ListenAddress(Log("n0"), absl::Seconds(60));
  ASSERT_FALSE(seed.empty()) << ReadFile(Log("n0")).value_or("");
  auto unnamed = RunStarling(
      absl::StrCat(Node("unnamed", 60),
                   " --shard=1/2 --connect_timeout=3 --peers=", seed, tls));
  EXPECT_NE(unnamed.exit_code, 0) << unnamed.err;
  auto n1 =
      RunStarling(absl::StrCat(Node("n1", 60), " --shard=1/2 --peers=", seed,
                               tls, " --tls_server_name=starling-peers"));
  EXPECT_EQ(n1.exit_code, 0) << n1.err;
  EXPECT_EQ(WaitUntil(n0, absl::Now() + absl::Seconds(60)), 0)
      << ReadFile(Log("n0")).value_or("");
  EXPECT_FALSE(FinalHash("n0").empty());
  EXPECT_EQ(FinalHash("n0"), FinalHash("n1"));
}

// Every way to get the TLS flags wrong stops the node at start-up (exit 2)
// with a message naming the flag or file; --insecure says so in the log.
TEST_F(TlsTest, BadTlsFlagsAreRefusedByName) {
  const std::string d = dir_;
  for (const auto& [flags, want] :
       std::vector<std::pair<std::string, std::string>>{
           {"", "--insecure for plaintext"},
           {absl::StrCat(" --tls_cert=", d, "/n0.pem"), "--tls_key is missing"},
           {absl::StrCat(" --tls_cert=", d, "/n0.pem --tls_key=", d,
                         "/n1.key --tls_ca=", d, "/swarm-ca.pem"),
            "does not match the certificate"},
           {TlsFlags(d, "intruder", "swarm-ca.pem"),
            "does not verify against --tls_ca"},
           {TlsFlags(d, "n0", "nope.pem"), "nope.pem"},
           {absl::StrCat(" --tls_cert=", d, "/n0.key --tls_key=", d,
                         "/n0.key --tls_ca=", d, "/swarm-ca.pem"),
            "no PEM certificate"},
           {absl::StrCat(" --insecure --tls_ca=", d, "/swarm-ca.pem"),
            "pick one"}}) {
    auto r = RunStarling(absl::StrCat(Node("bad", 10), flags));
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << flags << "\n" << r.err;
  }
  auto ok = RunStarling(absl::StrCat(Node("plain", 10), " --insecure"));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("--insecure: peer traffic is plaintext"),
            std::string::npos)
      << ok.err;
}

}  // namespace
}  // namespace starling
