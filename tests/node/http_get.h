// A minimal HTTP/1.0 GET over a raw socket, for tests that scrape /metrics.
// Header-only and stateless, so thread-safe. Not a general HTTP client: no
// redirects, no chunked transfer encoding, no TLS.
#ifndef STARLING_TESTS_NODE_HTTP_GET_H_
#define STARLING_TESTS_NODE_HTTP_GET_H_

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace starling::testing {

// GETs http://host_port/path ("127.0.0.1:9100", "[::1]:9100") and returns the
// body. Each socket operation (connect, send, each receive) gives up after
// `timeout`. Errors: InvalidArgument for a malformed host_port; Unavailable
// when it cannot connect, send or receive; DeadlineExceeded on a timeout;
// Internal for a malformed response; FailedPrecondition (with the status line
// and body) for a status other than 200.
inline absl::StatusOr<std::string> HttpGet(
    const std::string& host_port, const std::string& path,
    absl::Duration timeout = absl::Seconds(10)) {
  const std::string url = absl::StrCat("http://", host_port, path);
  size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", host_port, "\" is not host:port"));
  }
  std::string host = host_port.substr(0, colon);
  std::string port = host_port.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addrs = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &addrs);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", host_port, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string connect_error = "no address";
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    // On Linux SO_SNDTIMEO also bounds connect().
    timeval tv = absl::ToTimeval(timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    connect_error = strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(addrs);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("GET ", url, ": cannot connect: ", connect_error));
  }

  auto fail = [&](absl::string_view what) {
    const int err = errno;
    close(fd);
    std::string message =
        absl::StrCat("GET ", url, ": ", what, ": ", strerror(err));
    return (err == EAGAIN || err == EWOULDBLOCK || err == EINPROGRESS)
               ? absl::DeadlineExceededError(message)
               : absl::UnavailableError(message);
  };
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port,
                   "\r\nConnection: close\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    ssize_t n =
        send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("send");
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[16384];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("recv");
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);

  size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::InternalError(absl::StrCat(
        "GET ", url, ": response without a header end: ", response));
  }
  absl::string_view head(response.data(), header_end);
  std::string body = response.substr(header_end + 4);
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  // Status line: HTTP/1.x CODE REASON
  std::vector<absl::string_view> status =
      absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  int code = 0;
  if (status.size() < 2 || !absl::StartsWith(status[0], "HTTP/") ||
      !absl::SimpleAtoi(status[1], &code)) {
    return absl::InternalError(
        absl::StrCat("GET ", url, ": bad status line \"", lines[0], "\""));
  }
  if (code != 200) {
    return absl::FailedPreconditionError(
        absl::StrCat("GET ", url, ": ", lines[0], ": ", body));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string line = absl::AsciiStrToLower(lines[i]);
    if (absl::StartsWith(line, "transfer-encoding:") &&
        absl::StrContains(line, "chunked")) {
      return absl::InternalError(
          absl::StrCat("GET ", url, ": chunked responses are not supported"));
    }
  }
  return body;
}

}  // namespace starling::testing

#endif  // STARLING_TESTS_NODE_HTTP_GET_H_
