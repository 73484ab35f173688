// The HTTP client and the http(s) byte source against a real server on 127.0.0.1
// (testing/http_server): ranged reads, connection reuse, retries of transient failures with the
// attempt count, stalls before and during a body, dropped connections, dead servers, and errors
// that name the request. No test waits on a timer to pass: a client that ignored its deadline
// would get the stalled answer and fail on its status instead.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "storage/http/http_source.hpp"
#include "testing/http_server.hpp"
#include "testing/testing.hpp"

namespace zerowait::internal {
namespace {

using testing::TestHttpServer;
using namespace std::chrono_literals;

HttpOptions quick_options() {
  HttpOptions o;
  o.backoff_base = 1ms;
  o.backoff_max = 10ms;
  o.connect_timeout = 2000ms;
  return o;
}

std::string read_range(ByteSource& source, uint64_t offset, size_t length, Status* status) {
  std::string out(length, '\0');
  *status = source.read_at(offset, std::as_writable_bytes(std::span(out)), Deadline::after(20s));
  return out;
}

// `bytes` random bytes served at `path`, and a byte source over them.
struct ServedObject {
  ServedObject(const std::string& path, size_t bytes, uint64_t seed)
      : object(testing::random_bytes(bytes, seed)) {
    server.put(path, object);
    source = open_http_source(std::make_shared<HttpClient>(quick_options()), server.url(path),
                              Deadline::after(20s));
  }
  TestHttpServer server;
  std::string object;
  Result<std::unique_ptr<ByteSource>> source = Status(ErrorCode::kInternal, "not opened");
};

TEST(HttpClient, RangedReadsOfAnObjectOverOneReusedConnection) {
  ServedObject served("/data/shard.zws", 300000, 1);
  TestHttpServer& server = served.server;
  const std::string& object = served.object;
  auto& source = served.source;
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  EXPECT_EQ((*source)->size(), object.size());
  EXPECT_EQ((*source)->name(), server.url("/data/shard.zws"));
  for (uint64_t i = 0; i < 20; ++i) {
    const uint64_t offset = (i * 7919) % (object.size() - 5000);
    Status status;
    EXPECT_EQ(read_range(**source, offset, 5000, &status), object.substr(offset, 5000));
    ASSERT_TRUE(status.is_ok()) << status.to_string();
  }
  std::vector<std::byte> a(10), b(20);
  const ReadRequest two[] = {{0, a}, {object.size() - 20, b}};
  ASSERT_TRUE((*source)->read(two, Deadline::after(20s)).is_ok());
  EXPECT_EQ(std::memcmp(a.data(), object.data(), 10), 0);
  EXPECT_EQ(std::memcmp(b.data(), object.data() + object.size() - 20, 20), 0);
  EXPECT_EQ(server.connections(), 1u);  // HEAD and 22 GETs, one connection
  EXPECT_EQ(server.log().back(), "GET /data/shard.zws bytes=299980-299999");

  // Past the end: refused before asking the server.
  Status past;
  read_range(**source, object.size() - 5, 10, &past);
  EXPECT_EQ(past.code(), ErrorCode::kCorrupt);
  EXPECT_NE(past.message().find("short read"), std::string::npos);
}

TEST(HttpClient, TransientStatusesAreRetriedAndCounted) {
  TestHttpServer server;
  server.put("/o", "0123456789");
  HttpClient client(quick_options());
  server.fail_next({.status = 503}, 2);  // S3's SlowDown
  server.fail_next({.status = 500});
  auto response = client.send({.url = server.url("/o")}, Deadline::after(20s));
  ASSERT_TRUE(response.is_ok()) << response.status().to_string();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "0123456789");
  EXPECT_EQ(response->attempts, 4);
  EXPECT_EQ(server.requests(), 4u);
}

TEST(HttpClient, RunningOutOfAttemptsNamesTheRequestAndWhatCameBack) {
  TestHttpServer server;
  server.put("/bucket/key", "x");
  HttpOptions options = quick_options();
  options.max_attempts = 3;
  HttpClient client(options);
  server.fail_next({.status = 503}, 10);
  auto response = client.send(
      {.url = server.url("/bucket/key?partNumber=1"), .headers = {{"Range", "bytes=0-0"}}},
      Deadline::after(20s));
  ASSERT_FALSE(response.is_ok());
  EXPECT_EQ(response.status().code(), ErrorCode::kIo);
  const std::string& message = response.status().message();
  EXPECT_NE(message.find("GET " + server.url("/bucket/key") + " (bytes=0-0)"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("partNumber"), std::string::npos) << "no query in errors: " << message;
  EXPECT_NE(message.find("3 attempts"), std::string::npos) << message;
  EXPECT_NE(message.find("503"), std::string::npos) << message;
  EXPECT_EQ(server.requests(), 3u);
}

TEST(HttpClient, AnswersThatAreNotTransientComeBackAsTheyAre) {
  TestHttpServer server;
  HttpClient client(quick_options());
  auto missing = client.send({.url = server.url("/nothing")}, Deadline::after(20s));
  ASSERT_TRUE(missing.is_ok()) << missing.status().to_string();
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->attempts, 1);
  auto source = open_http_source(std::make_shared<HttpClient>(quick_options()),
                                 server.url("/nothing"), Deadline::after(20s));
  EXPECT_EQ(source.status().code(), ErrorCode::kNotFound);
}

// The server stalls far longer than the caller's deadline: the call ends at the deadline with an
// error naming the request; it does not wait for the stalled answer (which would be a 200).
TEST(HttpClient, AStalledServerIsADeadlineErrorNotAHang) {
  TestHttpServer server;
  server.put("/o", "abc");
  HttpOptions options = quick_options();
  options.stall_timeout = 60s;  // only the deadline can end it
  HttpClient client(options);
  // Every attempt stalls: a retry sent in the last millisecond before the deadline must not
  // find a healthy server and pass for an answer within the deadline.
  server.fail_next({.stall = 60s}, 10);
  auto response = client.send({.url = server.url("/o")}, Deadline::after(1500ms));
  ASSERT_FALSE(response.is_ok());
  EXPECT_EQ(response.status().code(), ErrorCode::kDeadlineExceeded);
  EXPECT_NE(response.status().message().find("GET " + server.url("/o")), std::string::npos)
      << response.status().message();
}

// A body that stops halfway is given up once no byte has moved for stall_timeout, and the
// request is sent again: the caller gets every byte, from the second attempt.
TEST(HttpClient, ABodyThatStallsHalfwayIsFetchedAgain) {
  TestHttpServer server;
  const std::string object = testing::random_bytes(200000, 2);
  server.put("/o", object);
  HttpOptions options = quick_options();
  options.stall_timeout = 1000ms;
  HttpClient client(options);
  server.fail_next({.stall = 60s, .stall_mid_body = true});
  std::string into(object.size(), '\0');
  auto response =
      client.send({.url = server.url("/o"), .into = std::as_writable_bytes(std::span(into))},
                  Deadline::after(30s));
  ASSERT_TRUE(response.is_ok()) << response.status().to_string();
  EXPECT_EQ(response->attempts, 2);
  EXPECT_EQ(into, object);
}

TEST(HttpClient, DroppedConnectionsAndDeadServersAreRetriedThenReported) {
  TestHttpServer server;
  server.put("/o", "payload");
  HttpClient client(quick_options());
  server.fail_next({.drop = true}, 2);
  auto response = client.send({.url = server.url("/o")}, Deadline::after(20s));
  ASSERT_TRUE(response.is_ok()) << response.status().to_string();
  EXPECT_EQ(response->body, "payload");
  EXPECT_EQ(response->attempts, 3);

  std::string dead_url;
  {
    TestHttpServer gone;
    dead_url = gone.url("/o");
  }  // nothing listens on that port any more
  auto dead = client.send({.url = dead_url}, Deadline::after(20s));
  ASSERT_FALSE(dead.is_ok());
  EXPECT_EQ(dead.status().code(), ErrorCode::kIo);
  EXPECT_NE(dead.status().message().find("connect"), std::string::npos) << dead.status().message();
}

TEST(HttpClient, PutGetDeleteAndABodyTooLargeForItsBuffer) {
  TestHttpServer server;
  HttpClient client(quick_options());
  const std::string body = testing::random_bytes(3 << 20, 3);  // over curl's Expect threshold
  auto put =
      client.send({.method = "PUT", .url = server.url("/k"), .body = body}, Deadline::after(20s));
  ASSERT_TRUE(put.is_ok()) << put.status().to_string();
  EXPECT_EQ(put->status, 200);
  EXPECT_EQ(server.object("/k"), body);
  EXPECT_EQ(server.last_headers().count("expect"), 0u);

  std::string small(100, '\0');
  auto too_large =
      client.send({.url = server.url("/k"), .into = std::as_writable_bytes(std::span(small))},
                  Deadline::after(20s));
  EXPECT_EQ(too_large.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(too_large.status().message().find("100 bytes"), std::string::npos);

  auto removed = client.send({.method = "DELETE", .url = server.url("/k")}, Deadline::after(20s));
  ASSERT_TRUE(removed.is_ok());
  EXPECT_EQ(removed->status, 204);
  EXPECT_EQ(server.object("/k"), "");
}

TEST(HttpClient, ManyThreadsShareOneClient) {
  ServedObject served("/o", 100000, 4);
  const std::string& object = served.object;
  auto& source = served.source;
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 25; ++i) {
        const uint64_t offset = (i * 104729 + t * 13) % (object.size() - 1000);
        Status status;
        if (read_range(**source, offset, 1000, &status) != object.substr(offset, 1000) ||
            !status.is_ok()) {
          ++wrong[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
  EXPECT_LE(served.server.connections(), 4u);  // one per handle in use at once, then reused
}

}  // namespace
}  // namespace zerowait::internal
