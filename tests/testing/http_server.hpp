// A real HTTP/1.1 server on 127.0.0.1 for the remote-storage tests: it serves objects held in
// memory (GET with Range, HEAD, PUT, DELETE) over keep-alive connections, and misbehaves when
// told to — stalls before answering or in the middle of a body, answers with an error status,
// drops the connection — so that clients' deadlines, retries and connection reuse meet real
// sockets. One thread per connection; the destructor stops everything, also mid-stall.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "testing/http_wire.hpp"

namespace zerowait::testing {

class TestHttpServer {
 public:
  TestHttpServer();  // listens on an ephemeral port of 127.0.0.1
  ~TestHttpServer();
  TestHttpServer(const TestHttpServer&) = delete;
  TestHttpServer& operator=(const TestHttpServer&) = delete;

  int port() const { return listener_.port(); }
  // "http://127.0.0.1:<port>" + path
  std::string url(const std::string& path) const;

  void put(const std::string& path, std::string body);
  // Serves every file directly in local `dir` as `prefix` + its name (e.g. "/ds/").
  void put_directory(const std::string& prefix, const std::string& dir);
  std::string object(const std::string& path) const;  // "" when absent

  // What the next requests get instead of a normal answer, one fault per request, in order; a
  // fault that names a range waits for a request with that Range header.
  struct Fault {
    int status = 0;  // answer with this status (and a short body) instead, e.g. 503
    std::chrono::milliseconds stall{0};  // wait this long before answering
    bool stall_mid_body = false;         // send the headers and half the body, then stall
    bool drop = false;                   // close the connection without answering
    std::string range;  // only for a request with this Range header (e.g. "bytes=0-65535")
  };
  void fail_next(Fault fault, int times = 1);

  uint64_t connections() const { return listener_.connections(); }  // accepted so far
  uint64_t requests() const { return requests_; }        // read so far
  // Each request's method, path and Range header: "GET /a bytes=0-9".
  std::vector<std::string> log() const;
  // The headers (lowercase names) of the last request.
  std::map<std::string, std::string> last_headers() const;

 private:
  void serve(int fd);

  std::atomic<uint64_t> requests_{0};
  mutable std::mutex mutex_;
  std::map<std::string, std::string> objects_;
  std::deque<Fault> faults_;
  std::vector<std::string> log_;
  std::map<std::string, std::string> last_headers_;
  // Last: destroyed first, so the connections' threads end before the members they use.
  ConnectionThreads listener_{0, [this](int fd) { serve(fd); }};
};

}  // namespace zerowait::testing
