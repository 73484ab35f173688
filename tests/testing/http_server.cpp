#include "testing/http_server.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "testing/http_wire.hpp"
#include "testing/testing.hpp"

namespace zerowait::testing {
namespace {

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

TestHttpServer::TestHttpServer() = default;
TestHttpServer::~TestHttpServer() = default;

std::string TestHttpServer::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(port()) + path;
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

void TestHttpServer::serve(int fd) {
  SocketReader reader(fd);
  while (!listener_.stopping()) {
    const std::optional<std::string> raw_head = reader.read_head();
    if (!raw_head) break;
    {
      const HttpHead request = parse_head(*raw_head);
      const std::string method = request.method(), path = request.target();
      std::optional<std::string> request_body =
          reader.read_exact(request.content_length().value_or(0));
      if (!request_body) break;
      ++requests_;

      std::optional<Fault> fault;
      std::string object;
      bool found = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        const std::string range = request.header("range");
        log_.push_back(method + " " + path + (range.empty() ? "" : " " + range));
        last_headers_ = request.headers;
        auto match = std::find_if(faults_.begin(), faults_.end(), [&](const Fault& f) {
          return f.range.empty() || f.range == range;
        });
        if (match != faults_.end()) {
          fault = *match;
          faults_.erase(match);
        }
        if (method == "PUT") {
          objects_[path] = std::move(*request_body);
        } else if (method == "DELETE") {
          objects_.erase(path);
        }
        auto it = objects_.find(path);
        found = it != objects_.end();
        if (found) object = it->second;
      }
      if (fault && fault->drop) break;
      if (fault && fault->stall.count() > 0 && !fault->stall_mid_body &&
          !listener_.wait_or_stop(fault->stall)) {
        break;
      }
      int status = 200;
      std::string body, extra;
      if (fault && fault->status != 0) {
        status = fault->status;
        body = "<Error><Code>Injected</Code></Error>";
      } else if (method == "PUT" || method == "DELETE") {
        status = method == "PUT" ? 200 : 204;
      } else if (!found) {
        status = 404;
        body = "<Error><Code>NoSuchKey</Code></Error>";
      } else if (!request.header("range").empty()) {
        const auto range = parse_range(request.header("range"), object.size());
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
      if (method == "HEAD") body.clear();
      const std::string headers = "HTTP/1.1 " + std::to_string(status) +
                                  " X\r\nContent-Length: " + std::to_string(length) + "\r\n" +
                                  extra + "\r\n";
      if (!send_all(fd, headers)) break;
      if (fault && fault->stall_mid_body) {
        if (!send_all(fd, std::string_view(body).substr(0, body.size() / 2))) break;
        if (!listener_.wait_or_stop(fault->stall)) break;
        body.erase(0, body.size() / 2);
      }
      if (!send_all(fd, body)) break;
    }
  }
}

}  // namespace zerowait::testing
