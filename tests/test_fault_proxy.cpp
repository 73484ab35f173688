// The tests' fault proxy (tests/testing/fault_proxy) itself, in front of the test HTTP server:
// what a client sees of each fault must be that fault. A "reset" is a TCP RST (the client's read
// fails with ECONNRESET, curl's error 56), never a FIN that a client would take for a clean end
// of the answer; an injected status reaches the client; count() counts what the server answered.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "testing/fault_proxy.hpp"
#include "testing/http_server.hpp"
#include "testing/http_wire.hpp"
#include "testing/testing.hpp"

namespace zerowait {
namespace {

using testing::FaultProxy;
using testing::TestHttpServer;

// What a raw client read off its connection until the connection ended, and how it ended.
struct Received {
  std::string bytes;
  int error = 0;  // errno of the read that ended it; 0: a clean end of stream (FIN)
};

Received get_raw(int port, const std::string& path) {
  Received received;
  const int fd = testing::connect_to("127.0.0.1", port);
  if (fd < 0) {
    ADD_FAILURE() << "cannot connect to the proxy on port " << port;
    return received;
  }
  const timeval limit{30, 0};  // a proxy that neither answers nor closes fails the test
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  EXPECT_TRUE(testing::send_all(fd, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  char buffer[64 << 10];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      received.bytes.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    received.error = n < 0 ? errno : 0;
    break;
  }
  ::close(fd);
  return received;
}

class FaultProxyTest : public ::testing::Test {
 protected:
  void SetUp() override { server_.put("/object", testing::random_bytes(1 << 20, 3)); }

  // curl's exit code for a GET of `path` through the proxy.
  std::string curl(const std::string& path) {
    const testing::CommandResult r = testing::run_command(
        {"/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", proxy_.url() + path});
    last_curl_error_ = r.err;
    last_status_ = r.out;
    return std::to_string(r.exit_code);
  }

  TestHttpServer server_;
  FaultProxy proxy_{server_.url("")};
  std::string last_curl_error_;
  std::string last_status_;  // the HTTP status curl got
};

TEST_F(FaultProxyTest, AResetBeforeTheAnswerIsAnRstNotAnEmptyAnswer) {
  proxy_.fail_next({.method = "GET", .path_contains = "/object", .reset = true});
  const Received received = get_raw(proxy_.port(), "/object");
  EXPECT_EQ(received.bytes, "");
  // A FIN would end the read with 0 and no error.
  EXPECT_EQ(received.error, ECONNRESET) << std::strerror(received.error);
  EXPECT_EQ(proxy_.faults_applied(), 1u);

  proxy_.fail_next({.method = "GET", .path_contains = "/object", .reset = true});
  // curl: 56 "Recv failure: Connection reset by peer" (a FIN gives 52 "Empty reply from server").
  EXPECT_EQ(curl("/object"), "56") << last_curl_error_;
  EXPECT_NE(last_curl_error_.find("reset"), std::string::npos) << last_curl_error_;
  EXPECT_EQ(proxy_.count("GET", "/object"), 0u);  // nothing reached the server in full
}

TEST_F(FaultProxyTest, AResetMidBodyCutsTheAnswerWithAnRst) {
  proxy_.fail_next({.method = "GET", .path_contains = "/object", .reset = true, .mid_body = true});
  const Received received = get_raw(proxy_.port(), "/object");
  EXPECT_LT(received.bytes.size(), 1u << 20);  // the answer was cut short
  EXPECT_EQ(received.error, ECONNRESET) << std::strerror(received.error);

  proxy_.fail_next({.method = "GET", .path_contains = "/object", .reset = true, .mid_body = true});
  // curl: 56 (a FIN mid-body gives 18 "transfer closed with N bytes remaining to read").
  EXPECT_EQ(curl("/object"), "56") << last_curl_error_;
}

TEST_F(FaultProxyTest, AnInjectedStatusReachesTheClientAndUnfaultedRequestsPassThrough) {
  proxy_.fail_next({.method = "GET", .path_contains = "/object", .status = 503});
  EXPECT_EQ(curl("/object"), "0") << last_curl_error_;
  EXPECT_EQ(last_status_, "503");
  EXPECT_EQ(curl("/object"), "0") << last_curl_error_;
  EXPECT_EQ(last_status_, "200");
  // The proxy logs an exchange once it has relayed the whole answer, which curl may have read
  // and exited on before the proxy's thread gets there on a busy machine.
  for (int i = 0; i < 3000 && proxy_.count("GET", "/object") == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(proxy_.count("GET", "/object"), 1u);  // the one the server answered
  EXPECT_EQ(proxy_.faults_applied(), 1u);
}

}  // namespace
}  // namespace zerowait
