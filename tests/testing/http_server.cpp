#include "testing/http_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "testing/testing.hpp"

namespace zerowait::testing {
namespace {

bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string lowercase(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct ParsedRequest {
  std::string method, path;
  std::map<std::string, std::string> headers;
  std::string body;
};

// "bytes=A-B" or "bytes=A-" over an object of `size` bytes: [first, last], or nullopt when it
// does not parse or starts past the end.
std::optional<std::pair<uint64_t, uint64_t>> parse_range(const std::string& range, uint64_t size) {
  if (!range.starts_with("bytes=")) return std::nullopt;
  const size_t dash = range.find('-');
  if (dash == std::string::npos) return std::nullopt;
  try {
    const uint64_t first = std::stoull(range.substr(6, dash - 6));
    const std::string rest = range.substr(dash + 1);
    uint64_t last = rest.empty() ? size - 1 : std::stoull(rest);
    if (first >= size || last < first) return std::nullopt;
    return std::pair{first, std::min(last, size - 1)};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

TestHttpServer::TestHttpServer() {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error(std::string("test HTTP server: ") + std::strerror(errno));
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TestHttpServer::~TestHttpServer() {
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

std::string TestHttpServer::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(port_) + path;
}

void TestHttpServer::put(const std::string& path, std::string body) {
  std::lock_guard<std::mutex> lock(mutex_);
  objects_[path] = std::move(body);
}

std::string TestHttpServer::object(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = objects_.find(path);
  return it == objects_.end() ? "" : it->second;
}

void TestHttpServer::put_directory(const std::string& prefix, const std::string& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) {
      put(prefix + entry.path().filename().string(), read_file(entry.path().string()));
    }
  }
}

void TestHttpServer::fail_next(Fault fault, int times) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < times; ++i) faults_.push_back(fault);
}

std::vector<std::string> TestHttpServer::log() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_;
}

std::map<std::string, std::string> TestHttpServer::last_headers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_headers_;
}

bool TestHttpServer::wait_or_stop(std::chrono::milliseconds duration) {
  std::unique_lock<std::mutex> lock(mutex_);
  return !stop_cv_.wait_for(lock, duration, [this] { return stopping_.load(); });
}

void TestHttpServer::accept_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ++connections_;
    // Headers and body go out in separate sends: without this, Nagle's algorithm and the
    // client's delayed ACK hold every answer back by ~40 ms.
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      ::close(fd);
      break;
    }
    open_fds_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void TestHttpServer::serve(int fd) {
  std::string buffer;
  char chunk[65536];
  auto read_more = [&]() {
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
    return true;
  };
  while (!stopping_) {
    size_t end;
    while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
      if (!read_more()) goto done;
    }
    {
      ParsedRequest request;
      const std::string head = buffer.substr(0, end);
      buffer.erase(0, end + 4);
      size_t line_end = head.find("\r\n");
      const std::string first = head.substr(0, line_end);
      const size_t sp1 = first.find(' '), sp2 = first.find(' ', sp1 + 1);
      request.method = first.substr(0, sp1);
      request.path = first.substr(sp1 + 1, sp2 - sp1 - 1);
      while (line_end != std::string::npos) {
        const size_t next = head.find("\r\n", line_end + 2);
        const std::string line = head.substr(line_end + 2, next - line_end - 2);
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
          std::string value = line.substr(colon + 1);
          value.erase(0, value.find_first_not_of(' '));
          request.headers[lowercase(line.substr(0, colon))] = value;
        }
        line_end = next;
      }
      const uint64_t body_size = request.headers.count("content-length")
                                     ? std::stoull(request.headers["content-length"])
                                     : 0;
      while (buffer.size() < body_size) {
        if (!read_more()) goto done;
      }
      request.body = buffer.substr(0, body_size);
      buffer.erase(0, body_size);
      ++requests_;

      std::optional<Fault> fault;
      std::string object;
      bool found = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        const std::string range =
            request.headers.count("range") ? " " + request.headers["range"] : "";
        log_.push_back(request.method + " " + request.path + range);
        last_headers_ = request.headers;
        if (!faults_.empty()) {
          fault = faults_.front();
          faults_.pop_front();
        }
        if (request.method == "PUT") {
          objects_[request.path] = request.body;
        } else if (request.method == "DELETE") {
          objects_.erase(request.path);
        }
        auto it = objects_.find(request.path);
        found = it != objects_.end();
        if (found) object = it->second;
      }
      if (fault && fault->drop) break;
      if (fault && fault->stall.count() > 0 && !fault->stall_mid_body &&
          !wait_or_stop(fault->stall)) {
        break;
      }
      int status = 200;
      std::string body, extra;
      if (fault && fault->status != 0) {
        status = fault->status;
        body = "<Error><Code>Injected</Code></Error>";
      } else if (request.method == "PUT" || request.method == "DELETE") {
        status = request.method == "PUT" ? 200 : 204;
      } else if (!found) {
        status = 404;
        body = "<Error><Code>NoSuchKey</Code></Error>";
      } else if (request.headers.count("range")) {
        const auto range = parse_range(request.headers["range"], object.size());
        if (!range) {
          status = 416;
          extra = "Content-Range: bytes */" + std::to_string(object.size()) + "\r\n";
        } else {
          status = 206;
          body = object.substr(range->first, range->second - range->first + 1);
          extra = "Content-Range: bytes " + std::to_string(range->first) + "-" +
                  std::to_string(range->second) + "/" + std::to_string(object.size()) + "\r\n";
        }
      } else {
        body = object;
      }
      const uint64_t length = body.size();
      if (request.method == "HEAD") body.clear();
      const std::string headers = "HTTP/1.1 " + std::to_string(status) +
                                  " X\r\nContent-Length: " + std::to_string(length) + "\r\n" +
                                  extra + "\r\n";
      if (!send_all(fd, headers)) break;
      if (fault && fault->stall_mid_body) {
        if (!send_all(fd, std::string_view(body).substr(0, body.size() / 2))) break;
        if (!wait_or_stop(fault->stall)) break;
        body.erase(0, body.size() / 2);
      }
      if (!send_all(fd, body)) break;
    }
  }
done:
  std::lock_guard<std::mutex> lock(mutex_);
  open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
  ::close(fd);
}

}  // namespace zerowait::testing
