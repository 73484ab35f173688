// The HTTP/1.1 wire format, as much of it as the test server and the fault proxy need: a loopback
// listener, whole sends, and reading heads, bodies and chunked bodies off a socket.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace zerowait::testing {

// A listening TCP socket on 127.0.0.1:`port` (0: an ephemeral port); throws on failure.
// Stores the bound port in `*bound_port`.
int listen_on_loopback(int port, int* bound_port);
// A connection to `host`:`port` (a numeric IPv4 address or "localhost"); -1 on failure.
int connect_to(const std::string& host, int port);
// Turns off Nagle's algorithm: headers and body go out in separate sends, and without this the
// peer's delayed ACK holds every answer back by ~40 ms.
void set_no_delay(int fd);

// Accepts connections on `listen_fd` (polled every 50 ms) until `stopping`, turns Nagle off on
// each and hands it to `take`, which owns it from then on.
void accept_until(int listen_fd, const std::atomic<bool>& stopping,
                  const std::function<void(int fd)>& take);

bool send_all(int fd, std::string_view data);
std::string lowercase(std::string s);

// A request's or response's head: its first line and its headers (lowercase names).
struct HttpHead {
  std::string first_line;
  std::map<std::string, std::string> headers;

  // Request line parts: "GET /a HTTP/1.1" -> "GET", "/a".
  std::string method() const;
  std::string target() const;
  // Response status: "HTTP/1.1 206 Partial Content" -> 206 (0 when it does not parse).
  int status() const;
  std::string header(const std::string& lowercase_name) const;  // "" when absent
  std::optional<uint64_t> content_length() const;
  bool chunked() const;
};

// "A: b\r\nC: d" after the first line, parsed.
HttpHead parse_head(const std::string& head);

// Buffered reads from one socket.
class SocketReader {
 public:
  explicit SocketReader(int fd) : fd_(fd) {}
  // The next head, up to and without its "\r\n\r\n"; nullopt on EOF or error.
  std::optional<std::string> read_head();
  // Exactly `n` bytes; nullopt on EOF or error first.
  std::optional<std::string> read_exact(uint64_t n);
  // Up to `max` bytes: what is buffered, or one recv; "" on EOF or error.
  std::string read_some(size_t max);
  // One line without its "\r\n"; nullopt on EOF or error.
  std::optional<std::string> read_line();

 private:
  bool fill();  // one recv into the buffer; false on EOF or error
  int fd_;
  std::string buffer_;
};

}  // namespace zerowait::testing
