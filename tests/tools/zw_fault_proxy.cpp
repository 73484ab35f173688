// zw_fault_proxy: the tests' fault proxy (testing/fault_proxy.hpp) as a command, for the remote
// benchmark (bench/run remote) and the Python tests. Prints its URL once listening, then
// forwards until SIGINT or SIGTERM and prints what it forwarded to stderr (--log-requests: each
// exchange with its times, to see where a reader waits).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "testing/fault_proxy.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "A fault-injecting HTTP/1.1 proxy in front of a test server: adds latency per request and "
      "caps bandwidth. Prints 'http://127.0.0.1:PORT' on stdout once listening; runs until "
      "SIGINT or SIGTERM."};
  std::string upstream;
  int port = 0;
  int latency_ms = 0;
  double bandwidth_mbps = 0;
  app.add_option("--upstream", upstream, "the server, e.g. http://127.0.0.1:8000")->required();
  app.add_option("--port", port, "port to listen on, on 127.0.0.1 (0: any free one)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--latency-ms", latency_ms, "milliseconds added before each request")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--bandwidth-mbps", bandwidth_mbps,
                 "cap on answers' bytes, all connections together, in MB/s (0: none)")
      ->check(CLI::NonNegativeNumber);
  bool log_requests = false;
  app.add_flag("--log-requests", log_requests,
               "at exit, also print every exchange on stderr, one a line: when it began and "
               "ended (seconds since start), method, path, range, status, body bytes");
  CLI11_PARSE(app, argc, argv);

  // Blocked before any thread starts, so every thread inherits the mask and sigwait gets them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  try {
    zerowait::testing::FaultProxy proxy(upstream, port);
    proxy.set_latency(std::chrono::milliseconds(latency_ms));
    proxy.set_bandwidth(static_cast<uint64_t>(bandwidth_mbps * 1e6));
    std::cout << proxy.url() << std::endl;
    int signal = 0;
    sigwait(&stop_signals, &signal);
    uint64_t requests = 0, bytes = 0;
    for (const auto& exchange : proxy.log()) {
      ++requests;
      bytes += exchange.body_bytes;
      if (log_requests) {
        std::fprintf(stderr, "%9.3f %9.3f %s %s %s %d %llu%s\n", exchange.began_s, exchange.ended_s,
                     exchange.method.c_str(), exchange.path.c_str(),
                     exchange.range.empty() ? "-" : exchange.range.c_str(), exchange.status,
                     static_cast<unsigned long long>(exchange.body_bytes),
                     exchange.faulted ? " faulted" : "");
      }
    }
    std::fprintf(stderr, "zw_fault_proxy: %llu requests on %llu connections, %llu body bytes\n",
                 static_cast<unsigned long long>(requests),
                 static_cast<unsigned long long>(proxy.connections()),
                 static_cast<unsigned long long>(bytes));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zw_fault_proxy: %s\n", e.what());
    return 1;
  }
  return 0;
}
