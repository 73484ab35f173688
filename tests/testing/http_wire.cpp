#include "testing/http_wire.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <future>
#include <stdexcept>

namespace zerowait::testing {

int listen_on_loopback(int port, int* bound_port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(fd, 128) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("listening on 127.0.0.1:" + std::to_string(port) + ": " + why);
  }
  *bound_port = ntohs(addr.sin_port);
  return fd;
}

int connect_to(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string numeric = host == "localhost" ? "127.0.0.1" : host;
  if (::inet_pton(AF_INET, numeric.c_str(), &addr.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  set_no_delay(fd);
  return fd;
}

void set_no_delay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

ConnectionThreads::ConnectionThreads(int port, std::function<void(int fd)> serve)
    : serve_(std::move(serve)) {
  listen_fd_ = listen_on_loopback(port, &port_);
  // Returns once the acceptor thread runs its loop: a test that forks right after making a
  // server must not fork while that thread is still being set up (under ASan its start-up takes
  // allocator locks, which a forked child would inherit held; see ChildProcesses).
  std::promise<void> running;
  std::future<void> started = running.get_future();
  acceptor_ = std::thread([this, &running] {
    running.set_value();
    accept_loop();
  });
  started.wait();
}

ConnectionThreads::~ConnectionThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  stop_cv_.notify_all();
  acceptor_.join();
  for (std::thread& t : threads_) t.join();
  ::close(listen_fd_);
}

bool ConnectionThreads::wait_or_stop(std::chrono::nanoseconds duration) {
  if (duration.count() <= 0) return !stopping_;
  std::unique_lock<std::mutex> lock(mutex_);
  return !stop_cv_.wait_for(lock, duration, [this] { return stopping_.load(); });
}

void ConnectionThreads::track(int fd, bool add) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (add) {
    open_fds_.push_back(fd);
    if (stopping_) ::shutdown(fd, SHUT_RDWR);
  } else {
    std::erase(open_fds_, fd);
  }
}

// Polls every 50 ms, so that stopping is seen without a connection.
void ConnectionThreads::accept_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    set_no_delay(fd);
    ++connections_;
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    open_fds_.push_back(fd);
    threads_.emplace_back([this, fd] {
      serve_(fd);
      track(fd, false);
      ::close(fd);
    });
  }
}

bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string lowercase(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string HttpHead::method() const { return first_line.substr(0, first_line.find(' ')); }

std::string HttpHead::target() const {
  const size_t sp1 = first_line.find(' ');
  if (sp1 == std::string::npos) return "";
  const size_t sp2 = first_line.find(' ', sp1 + 1);
  return first_line.substr(sp1 + 1, sp2 == std::string::npos ? std::string::npos : sp2 - sp1 - 1);
}

int HttpHead::status() const {
  const size_t sp = first_line.find(' ');
  if (sp == std::string::npos) return 0;
  try {
    return std::stoi(first_line.substr(sp + 1, 3));
  } catch (const std::exception&) {
    return 0;
  }
}

std::string HttpHead::header(const std::string& lowercase_name) const {
  auto it = headers.find(lowercase_name);
  return it == headers.end() ? "" : it->second;
}

std::optional<uint64_t> HttpHead::content_length() const {
  const std::string value = header("content-length");
  if (value.empty()) return std::nullopt;
  try {
    return std::stoull(value);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool HttpHead::chunked() const {
  return lowercase(header("transfer-encoding")).find("chunked") != std::string::npos;
}

HttpHead parse_head(const std::string& head) {
  HttpHead parsed;
  size_t line_end = head.find("\r\n");
  parsed.first_line = head.substr(0, line_end);
  while (line_end != std::string::npos) {
    const size_t next = head.find("\r\n", line_end + 2);
    const std::string line =
        head.substr(line_end + 2, next == std::string::npos ? std::string::npos
                                                            : next - line_end - 2);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      parsed.headers[lowercase(line.substr(0, colon))] = value;
    }
    line_end = next;
  }
  return parsed;
}

bool SocketReader::fill() {
  char chunk[65536];
  for (;;) {
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }
}

std::optional<std::string> SocketReader::read_head() {
  size_t end;
  while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (!fill()) return std::nullopt;
  }
  std::string head = buffer_.substr(0, end);
  buffer_.erase(0, end + 4);
  return head;
}

std::optional<std::string> SocketReader::read_exact(uint64_t n) {
  while (buffer_.size() < n) {
    if (!fill()) return std::nullopt;
  }
  std::string out = buffer_.substr(0, n);
  buffer_.erase(0, n);
  return out;
}

std::string SocketReader::read_some(size_t max) {
  if (buffer_.empty() && !fill()) return "";
  std::string out = buffer_.substr(0, max);
  buffer_.erase(0, out.size());
  return out;
}

std::optional<std::string> SocketReader::read_line() {
  size_t end;
  while ((end = buffer_.find("\r\n")) == std::string::npos) {
    if (!fill()) return std::nullopt;
  }
  std::string line = buffer_.substr(0, end);
  buffer_.erase(0, end + 2);
  return line;
}

}  // namespace zerowait::testing
