#include "gossip/peer_credentials.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/file_util.h"
#include "core/logging.h"
#include "core/status.h"

namespace starling {
namespace {

struct FreeX509 {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, FreeX509>;

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM data";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

absl::Status Bad(const char* flag, const std::string& path,
                 absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", path, ": ", why));
}

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag,
                     " is missing: TLS needs --tls_cert, --tls_key and "
                     "--tls_ca (or --insecure for plaintext)"));
  }
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return Bad(flag, path, text.status().message());
  return text;
}

// Every certificate in `pem`, in order; an error when there is none.
absl::StatusOr<std::vector<X509Ptr>> ParseCerts(const char* flag,
                                                const std::string& path,
                                                const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  std::vector<X509Ptr> certs;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(x);
  }
  ERR_clear_error();  // the read past the last certificate
  if (certs.empty()) {
    return Bad(flag, path, "no PEM certificate in the file");
  }
  return certs;
}

// The names a certificate gives its holder: the CN, then every DNS name of
// its subjectAltName.
std::vector<std::string> NamesOf(X509* cert) {
  std::vector<std::string> names;
  char cn[256];
  const int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert),
                                          NID_commonName, cn, sizeof(cn));
  if (n > 0) names.emplace_back(cn, static_cast<size_t>(n));
  auto* sans = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; sans != nullptr && i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
    if (g->type != GEN_DNS) continue;
    const ASN1_STRING* dns = g->d.dNSName;
    names.emplace_back(
        reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
        static_cast<size_t>(ASN1_STRING_length(dns)));
  }
  GENERAL_NAMES_free(sans);
  ERR_clear_error();
  return names;
}

// Every name a certificate answers to, as a person would look for it: the
// CN, then its subjectAltName's DNS names and IP addresses ("DNS:a",
// "IP:127.0.0.1").
std::string AllNamesOf(X509* cert) {
  std::vector<std::string> names;
  char cn[256];
  const int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert),
                                          NID_commonName, cn, sizeof(cn));
  if (n > 0) names.push_back(absl::StrCat("CN=", absl::string_view(cn, n)));
  auto* sans = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; sans != nullptr && i < sk_GENERAL_NAME_num(sans); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
    if (g->type == GEN_DNS) {
      const ASN1_STRING* dns = g->d.dNSName;
      names.push_back(absl::StrCat(
          "DNS:", absl::string_view(
                      reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                      static_cast<size_t>(ASN1_STRING_length(dns)))));
    } else if (g->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = g->d.iPAddress;
      char text[INET6_ADDRSTRLEN] = "?";
      const int len = ASN1_STRING_length(ip);
      if (len == 4 || len == 16) {
        inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(ip),
                  text, sizeof(text));
      }
      names.push_back(absl::StrCat("IP:", text));
    }
  }
  GENERAL_NAMES_free(sans);
  ERR_clear_error();
  return names.empty() ? "no name at all" : absl::StrJoin(names, ", ");
}

// With TLS, peers that dial this node check its certificate against the
// host they dial (--listen's) or --tls_server_name: a certificate that
// does not cover it fails every handshake, so it is refused at start.
absl::Status CheckCoversListenHost(const PeerSecurityOptions& o, X509* leaf) {
  const bool by_name = !o.tls_server_name.empty();
  const std::string host = by_name ? o.tls_server_name : o.listen_host;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    return absl::OkStatus();
  }
  in6_addr ip;
  const bool is_ip = inet_pton(AF_INET, host.c_str(), &ip) == 1 ||
                     inet_pton(AF_INET6, host.c_str(), &ip) == 1;
  const int covered =
      is_ip ? X509_check_ip_asc(leaf, host.c_str(), 0)
            : X509_check_host(leaf, host.data(), host.size(), 0, nullptr);
  ERR_clear_error();
  if (covered == 1) return absl::OkStatus();
  return Bad("tls_cert", o.tls_cert,
             absl::StrCat(
                 "does not cover ",
                 by_name ? absl::StrCat("--tls_server_name=", host)
                         : absl::StrCat("this node's --listen host ", host),
                 ", which peers check it against; it names ", AllNamesOf(leaf),
                 ". Issue this node a certificate whose subjectAltName holds ",
                 is_ip ? "IP:" : "DNS:", host,
                 " (docs/security.md has the openssl commands)"));
}

// "none", or the names quoted and joined.
std::string ListNames(const std::vector<std::string>& names) {
  if (names.empty()) return "none";
  std::vector<std::string> quoted;
  for (const std::string& n : names) quoted.push_back(QuoteForLog(n));
  return absl::StrJoin(quoted, ", ");
}

// Checks that the key parses and matches the leaf, and that the leaf
// chains to one of the CA certificates (through the chain file's others).
// With bound ids, the leaf must also name this node.
absl::Status CheckPems(const PeerSecurityOptions& o, const std::string& cert,
                       const std::string& key, const std::string& ca) {
  absl::StatusOr<std::vector<X509Ptr>> chain =
      ParseCerts("tls_cert", o.tls_cert, cert);
  if (!chain.ok()) return chain.status();
  absl::StatusOr<std::vector<X509Ptr>> roots =
      ParseCerts("tls_ca", o.tls_ca, ca);
  if (!roots.ok()) return roots.status();

  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(key.data(), static_cast<int>(key.size())), BIO_free);
  // An empty passphrase: an encrypted key fails here instead of prompting.
  char empty[] = "";
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, empty),
      EVP_PKEY_free);
  if (pkey == nullptr) {
    return Bad("tls_key", o.tls_key,
               absl::StrCat("not an unencrypted PEM private key (",
                            OpenSslError(), ")"));
  }
  if (X509_check_private_key(chain->front().get(), pkey.get()) != 1) {
    ERR_clear_error();
    return Bad("tls_key", o.tls_key,
               absl::StrCat("does not match the certificate in --tls_cert=",
                            o.tls_cert));
  }

  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(
      X509_STORE_new(), X509_STORE_free);
  for (const X509Ptr& root : *roots)
    X509_STORE_add_cert(store.get(), root.get());
  std::unique_ptr<STACK_OF(X509), void (*)(STACK_OF(X509)*)> untrusted(
      sk_X509_new_null(), [](STACK_OF(X509) * s) { sk_X509_free(s); });
  for (size_t i = 1; i < chain->size(); ++i) {
    sk_X509_push(untrusted.get(), (*chain)[i].get());
  }
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(
      X509_STORE_CTX_new(), X509_STORE_CTX_free);
  X509_STORE_CTX_init(ctx.get(), store.get(), chain->front().get(),
                      untrusted.get());
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return Bad("tls_cert", o.tls_cert,
               absl::StrCat("does not verify against --tls_ca=", o.tls_ca, ": ",
                            X509_verify_cert_error_string(err)));
  }
  STARLING_RETURN_IF_ERROR(CheckCoversListenHost(o, chain->front().get()));
  if (o.tls_bind_node_ids && !o.node_id.empty()) {
    const std::vector<std::string> names = NamesOf(chain->front().get());
    if (std::find(names.begin(), names.end(), o.node_id) == names.end()) {
      return Bad(
          "tls_cert", o.tls_cert,
          absl::StrCat("names ", ListNames(names), " but not this node's id ",
                       QuoteForLog(o.node_id),
                       " (--tls_bind_node_ids, on by default with mutual "
                       "TLS: each member's certificate names its "
                       "--node_id, as CN or as a DNS subjectAltName; "
                       "--tls_bind_node_ids=false for one certificate for "
                       "every node)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void PeerCredentials::Apply(grpc::ChannelArguments* args) const {
  if (!server_name.empty()) args->SetSslTargetNameOverride(server_name);
}

PeerCredentials InsecurePeerCredentials() {
  PeerCredentials c;
  c.server = grpc::InsecureServerCredentials();
  c.channel = grpc::InsecureChannelCredentials();
  return c;
}

namespace {

// The PEM files' contents, read and checked.
struct TlsFiles {
  std::string cert, key, ca;
};

// Every check of the options, with no gRPC object built. Empty: plaintext.
absl::StatusOr<std::optional<TlsFiles>> CheckOptions(
    const PeerSecurityOptions& o) {
  if (!(o.peer_rate_limit >= 0) || !std::isfinite(o.peer_rate_limit)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_rate_limit=", o.peer_rate_limit,
                     ": must be a number of calls per second >= 0"));
  }
  if (o.tls_bind_node_ids && !o.tls_require_client_cert) {
    return absl::InvalidArgumentError(
        "--tls_bind_node_ids needs mutual TLS: pass "
        "--tls_require_client_cert (with --tls_cert, --tls_key and --tls_ca), "
        "so that every caller shows the certificate that names it");
  }
  if (o.insecure) {
    if (o.asks_for_tls()) {
      return absl::InvalidArgumentError(
          "--insecure turns TLS off, but --tls_* flags were given too: pick "
          "one");
    }
    return std::nullopt;
  }
  if (!o.asks_for_tls()) {
    return absl::InvalidArgumentError(
        "no transport security chosen: pass --tls_cert, --tls_key and "
        "--tls_ca (PEM files) for TLS, or --insecure for plaintext (a "
        "trusted network only)");
  }
  TlsFiles f;
  STARLING_ASSIGN_OR_RETURN(f.cert, ReadPem("tls_cert", o.tls_cert));
  STARLING_ASSIGN_OR_RETURN(f.key, ReadPem("tls_key", o.tls_key));
  STARLING_ASSIGN_OR_RETURN(f.ca, ReadPem("tls_ca", o.tls_ca));
  STARLING_RETURN_IF_ERROR(CheckPems(o, f.cert, f.key, f.ca));
  return f;
}

}  // namespace

bool PeerSecurityOptions::asks_for_tls() const {
  return !tls_cert.empty() || !tls_key.empty() || !tls_ca.empty() ||
         tls_require_client_cert || !tls_server_name.empty() ||
         tls_bind_node_ids;
}

absl::Status CheckPeerSecurity(const PeerSecurityOptions& o) {
  STARLING_RETURN_IF_ERROR(CheckOptions(o).status());
  if (o.join_token_file.empty()) return absl::OkStatus();
  return JoinAuth::FromFile(o.join_token_file).status();
}

absl::StatusOr<PeerCredentials> LoadPeerCredentials(
    const PeerSecurityOptions& o) {
  STARLING_ASSIGN_OR_RETURN(std::optional<TlsFiles> files, CheckOptions(o));
  PeerCredentials c;
  if (!files.has_value()) {
    c = InsecurePeerCredentials();
  } else {
    grpc::SslServerCredentialsOptions server(
        o.tls_require_client_cert
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
            : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    server.pem_root_certs = files->ca;
    server.pem_key_cert_pairs.push_back({files->key, files->cert});
    grpc::SslCredentialsOptions channel;
    channel.pem_root_certs = files->ca;
    channel.pem_private_key = files->key;  // presented when the server asks
    channel.pem_cert_chain = files->cert;
    c.server = grpc::SslServerCredentials(server);
    c.channel = grpc::SslCredentials(channel);
    c.server_name = o.tls_server_name;
    c.tls = true;
    c.mutual = o.tls_require_client_cert;
    c.bind_node_ids = o.tls_bind_node_ids;
  }
  if (o.peer_rate_limit > 0) {
    c.rate_limit = std::make_shared<PeerRateLimiter>(o.peer_rate_limit,
                                                     2 * o.peer_rate_limit);
  }
  if (!o.join_token_file.empty()) {
    STARLING_ASSIGN_OR_RETURN(c.join_auth,
                              JoinAuth::FromFile(o.join_token_file));
  }
  return c;
}

void PeerCredentials::Sign(grpc::ClientContext* ctx,
                           absl::string_view method) const {
  if (join_auth != nullptr) join_auth->Sign(ctx, method);
}

grpc::Status PeerCredentials::Admit(grpc::ServerContextBase* ctx,
                                    absl::string_view method) const {
  if (rate_limit != nullptr) {
    static PerHostLogLimiter* log = new PerHostLogLimiter(absl::Minutes(1));
    const std::string host = PeerHost(ctx->peer());
    const absl::Time now = absl::Now();
    if (absl::Status s = rate_limit->Take(host, now); !s.ok()) {
      log->Warn(host, now, "rate_limited",
                absl::StrCat("refused a ", method, " call: ", s.message()));
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          std::string(s.message()));
    }
  }
  if (join_auth == nullptr) return grpc::Status::OK;
  return join_auth->Admit(ctx, method);
}

std::vector<std::string> PeerCredentials::CallerNames(
    const grpc::ServerContextBase& ctx) {
  std::vector<std::string> names;
  if (std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context()) {
    // The CN and the DNS subjectAltNames, as NamesOf() reads them.
    for (const char* property :
         {GRPC_X509_CN_PROPERTY_NAME, GRPC_PEER_DNS_PROPERTY_NAME}) {
      for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
        names.emplace_back(v.data(), v.size());
      }
    }
  }
  return names;
}

grpc::Status PeerCredentials::CheckNames(const std::vector<std::string>& names,
                                         absl::string_view id,
                                         absl::string_view what) const {
  if (!bind_node_ids ||
      std::find(names.begin(), names.end(), id) != names.end()) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      absl::StrCat(what, " as member ", QuoteForLog(id),
                                   " from a caller whose certificate names ",
                                   ListNames(names), " (--tls_bind_node_ids)"));
}

grpc::Status PeerCredentials::CheckCaller(const grpc::ServerContextBase& ctx,
                                          absl::string_view id,
                                          absl::string_view what) const {
  if (!bind_node_ids) return grpc::Status::OK;
  return CheckNames(CallerNames(ctx), id, what);
}

}  // namespace starling
