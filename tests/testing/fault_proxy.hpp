// A fault-injecting HTTP/1.1 proxy for the remote-storage tests and benchmarks: it sits between a
// client and a real server (the S3 server ctest starts) and passes requests through unchanged —
// the Host header included, so SigV4 signatures still verify — while it adds latency, caps the
// bandwidth, stalls an answer mid-body, resets connections or answers 500/503 instead of the
// server. It logs every exchange, so a test can count what reached the server (one download
// per block) and what the client saw. One thread per client connection, each with its own
// keep-alive connection upstream; the destructor stops everything, also mid-stall.
// bench/run remote and the Python tests use it through the zw_fault_proxy command.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "testing/http_wire.hpp"

namespace zerowait::testing {

class FaultProxy {
 public:
  // Forwards to `upstream` ("http://127.0.0.1:8000"); listens on 127.0.0.1:`port` (0: any).
  explicit FaultProxy(const std::string& upstream, int port = 0);
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  int port() const { return listener_->port(); }
  std::string url() const;  // "http://127.0.0.1:<port>"

  // Steady conditions for every request from now on.
  void set_latency(std::chrono::milliseconds added);  // before each request is forwarded
  void set_bandwidth(uint64_t bytes_per_second);      // of answers' bodies, all connections; 0: no cap

  // What a matching request gets instead of the server's answer.
  struct Fault {
    std::string method;         // requests of this method only ("": any)
    std::string path_contains;  // whose path contains this ("": any)
    int status = 0;             // answered by the proxy with this status and an S3 error body
    bool reset = false;         // the client's connection is reset (RST) instead
    bool mid_body = false;      // with `reset` or `stall`: after half of the server's body
    std::chrono::milliseconds stall{0};  // held this long (then, mid-body, reset)
  };
  void fail_next(const Fault& fault, int times = 1);  // the next `times` matching requests
  void fail_always(const Fault& fault);               // every matching request until cleared
  void clear_faults();
  // Requests a fault has been applied to so far, counted when the fault begins (a stall under
  // way counts): a test can wait for this before it sends the requests that should meet it.
  uint64_t faults_applied() const;

  struct Exchange {
    std::string method, path, range;  // range: the Range header, "" when none
    int status = 0;                   // what the client got (0: reset before any answer)
    uint64_t body_bytes = 0;          // of the answer's body sent to the client
    bool faulted = false;             // a fault replaced or cut the server's answer
    double began_s = 0, ended_s = 0;  // since the proxy started: request received, answer done
  };
  std::vector<Exchange> log() const;
  // Requests the server answered in full, by method and part of the path.
  uint64_t count(std::string_view method, std::string_view path_contains = "") const;
  uint64_t connections() const { return listener_->connections(); }

 private:
  struct Rule {
    Fault fault;
    int remaining;  // < 0: always
  };
  std::optional<Fault> take_fault(const std::string& method, const std::string& path);
  void serve(int client_fd);
  bool throttle(uint64_t bytes);  // false: stopping
  double seconds_since_start() const;
  void record(Exchange exchange);

  std::string upstream_host_;
  int upstream_port_ = 0;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  mutable std::mutex mutex_;
  std::chrono::milliseconds latency_{0};
  uint64_t bandwidth_ = 0;
  std::chrono::steady_clock::time_point link_free_at_{};
  std::deque<Rule> rules_;
  uint64_t faults_applied_ = 0;
  std::vector<Exchange> log_;
  // Last: destroyed first, so the connections' threads end before the members they use.
  std::optional<ConnectionThreads> listener_;
};

}  // namespace zerowait::testing
