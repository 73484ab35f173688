// The HTTP/1.1 wire format, as much of it as the test server and the fault proxy need: a loopback
// listener, whole sends, and reading heads, bodies and chunked bodies off a socket.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace zerowait::testing {

// A listening TCP socket on 127.0.0.1:`port` (0: an ephemeral port); throws on failure.
// Stores the bound port in `*bound_port`.
int listen_on_loopback(int port, int* bound_port);
// A connection to `host`:`port` (a numeric IPv4 address or "localhost"); -1 on failure.
int connect_to(const std::string& host, int port);
// Turns off Nagle's algorithm: headers and body go out in separate sends, and without this the
// peer's delayed ACK holds every answer back by ~40 ms.
void set_no_delay(int fd);

// A listener on 127.0.0.1 that serves each connection on a thread of its own: the test server's
// and the proxy's sockets, threads and stopping. It owns the listening socket and every
// connection; `serve(fd)` runs until the peer leaves or stopping() turns true, and the
// connection is closed after it. Stopping shuts every tracked descriptor down (so blocked reads
// return), wakes wait_or_stop(), and joins the threads. Make it the owner's last member: it is
// then destroyed first, so its threads end before the owner's other members, which serve uses.
class ConnectionThreads {
 public:
  // Listens on `port` (0: an ephemeral one) at once; throws on failure.
  ConnectionThreads(int port, std::function<void(int fd)> serve);
  ~ConnectionThreads();
  ConnectionThreads(const ConnectionThreads&) = delete;
  ConnectionThreads& operator=(const ConnectionThreads&) = delete;

  int port() const { return port_; }
  uint64_t connections() const { return connections_; }  // accepted so far
  bool stopping() const { return stopping_; }
  // Sleeps `duration`; false when stopping began (before or meanwhile).
  bool wait_or_stop(std::chrono::nanoseconds duration);
  // A descriptor of the caller's (an upstream connection) that stopping shuts down too, from
  // track(fd, true) until track(fd, false).
  void track(int fd, bool add);

 private:
  void accept_loop();

  const std::function<void(int fd)> serve_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> connections_{0};
  std::mutex mutex_;  // guards the two below, and orders stopping_ for stop_cv_
  std::condition_variable stop_cv_;
  std::vector<int> open_fds_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

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
