// Test certificates made at test time by the openssl command (none are
// committed): a CA and certificates it signs, for TLS tests in-process or
// with real `starling` processes. Not thread-safe: each test uses its own
// directory.
#ifndef STARLING_TESTS_CORE_CERTS_H_
#define STARLING_TESTS_CORE_CERTS_H_

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "gtest/gtest.h"

namespace starling::testing {

// Runs a shell command in `dir`; fails the test (and returns false) when
// it exits non-zero.
inline bool Sh(const std::string& dir, const std::string& command) {
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
inline bool MakeCa(const std::string& dir, const std::string& name) {
  return Sh(dir,
            absl::StrCat("openssl req -x509 -newkey ec -pkeyopt "
                         "ec_paramgen_curve:prime256v1 -nodes -days 2 -subj "
                         "/CN=",
                         name, "-ca -keyout ", name, "-ca.key -out ", name,
                         "-ca.pem"));
}

// A certificate NAME.pem (key NAME.key, CN NAME) signed by CA's key, valid
// for 127.0.0.1 and localhost, for servers and clients alike.
inline bool MakeCert(const std::string& dir, const std::string& name,
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

}  // namespace starling::testing

#endif  // STARLING_TESTS_CORE_CERTS_H_
