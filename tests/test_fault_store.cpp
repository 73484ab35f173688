// The fault injector: every kind of Store call, data and metadata, can be stalled past its
// deadline (kDeadlineExceeded naming the object, within the deadline plus a second), failed with
// an errno, cut short, or made to end the process at operation N.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>

#include "testing/testing.hpp"
#include "zerowait/storage/fault_store.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

using testing::TempDir;
using namespace std::chrono_literals;

std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A local store holding "dir/obj" (8 bytes), wrapped in a FaultStore.
class FaultStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto local = open_store(dir_.path());
    ASSERT_TRUE(local.is_ok()) << local.status().to_string();
    inner_ = *local;
    ASSERT_TRUE(inner_->make_directory("dir", Deadline::none()).is_ok());
    ASSERT_TRUE(inner_->put("dir/obj", as_bytes("01234567"), Deadline::none()).is_ok());
    faults_ = std::make_shared<FaultStore>(inner_);
  }

  TempDir dir_;
  std::shared_ptr<Store> inner_;
  std::shared_ptr<FaultStore> faults_;
};

struct Call {
  const char* kind;  // the operation the rule stalls
  std::string name;  // what the error must name
  std::function<Status(Store&, Deadline)> run;
};

TEST_F(FaultStoreTest, AStalledCallOfEveryKindEndsAtItsDeadlineNamingTheObject) {
  const std::string root = dir_.path();
  const std::vector<Call> calls = {
      {"mkdir", root + "/new", [](Store& s, Deadline d) { return s.make_directory("new", d); }},
      {"create", root + "/dir/x",
       [](Store& s, Deadline d) { return s.create("dir/x", d).status(); }},
      {"fsync-dir", root + "/dir", [](Store& s, Deadline d) { return s.sync_directory("dir", d); }},
      {"publish", root + "/dir/obj",
       [](Store& s, Deadline d) { return s.publish("dir/obj", "dir/moved", d); }},
      {"list", root + "/dir", [](Store& s, Deadline d) { return s.list("dir", d).status(); }},
      {"stat", root + "/dir/obj",
       [](Store& s, Deadline d) { return s.stat("dir/obj", d).status(); }},
      {"get", root + "/dir/obj",
       [](Store& s, Deadline d) { return s.read("dir/obj", d).status(); }},
      {"open", root + "/dir/obj",
       [](Store& s, Deadline d) { return s.open("dir/obj", IoBackend::kPread, d).status(); }},
      {"read", root + "/dir/obj",
       [](Store& s, Deadline d) -> Status {
         ZW_ASSIGN_OR_RETURN(auto source, s.open("dir/obj", IoBackend::kPread, Deadline::none()));
         std::byte buffer[4];
         return source->read_at(2, buffer, d);
       }},
      {"remove", root + "/dir/obj", [](Store& s, Deadline d) { return s.remove("dir/obj", d); }},
      {"remove-all", root + "/dir", [](Store& s, Deadline d) { return s.remove_all("dir", d); }},
  };
  for (const Call& call : calls) {
    SCOPED_TRACE(call.kind);
    const std::string kind = call.kind;
    faults_->set_rule([kind](const StoreOperation& op) {
      return Fault{op.kind == kind ? Fault::Kind::kStall : Fault::Kind::kNone};
    });
    const auto deadline = 200ms;
    const auto start = std::chrono::steady_clock::now();
    const Status status = call.run(*faults_, Deadline::after(deadline));
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(status.code(), ErrorCode::kDeadlineExceeded) << status.to_string();
    EXPECT_TRUE(contains(status.message(), call.name)) << status.message();
    EXPECT_GE(took, deadline);
    EXPECT_LT(took, deadline + 1s);
    // Nothing happened to the object: the stalled call never reached the inner store.
    EXPECT_TRUE(inner_->exists("dir/obj", Deadline::none()).value());
  }
}

TEST_F(FaultStoreTest, ErrorsShortReadsAndFlippedBytesReachTheCaller) {
  faults_->set_rule([](const StoreOperation& op) {
    if (op.kind == "create") return Fault{Fault::Kind::kError, ENOSPC};
    if (op.kind == "list") return Fault{Fault::Kind::kError, EIO};
    if (op.kind == "read" && op.offset == 0) return Fault{Fault::Kind::kShortRead};
    if (op.kind == "read") return Fault{Fault::Kind::kFlipByte, EIO, 5};
    return Fault{};
  });
  Status full = faults_->put("dir/y", as_bytes("abc"), Deadline::none());
  EXPECT_EQ(full.code(), ErrorCode::kIo);
  EXPECT_TRUE(contains(full.message(), std::strerror(ENOSPC))) << full.message();
  EXPECT_TRUE(contains(full.message(), dir_ / "dir/y")) << full.message();
  EXPECT_FALSE(inner_->exists("dir/y", Deadline::none()).value());

  auto listed = faults_->list("dir", Deadline::none());
  EXPECT_TRUE(contains(listed.status().message(), std::strerror(EIO)));

  auto source = faults_->open("dir/obj", IoBackend::kPread, Deadline::none());
  ASSERT_TRUE(source.is_ok());
  std::byte buffer[8];
  Status short_read = (*source)->read_at(0, buffer);
  EXPECT_EQ(short_read.code(), ErrorCode::kCorrupt) << short_read.to_string();
  EXPECT_TRUE(contains(short_read.message(), "short read")) << short_read.message();
  ASSERT_TRUE((*source)->read_at(4, std::span(buffer, 4)).is_ok());
  EXPECT_EQ(static_cast<char>(buffer[1]), static_cast<char>('5' ^ 0xff));
}

TEST_F(FaultStoreTest, OperationsAreNumberedAndTheNthCanEndTheProcess) {
  std::vector<uint64_t> numbers;
  faults_->set_rule([&](const StoreOperation& op) {
    numbers.push_back(op.number);
    return Fault{};
  });
  ASSERT_TRUE(faults_->stat("dir/obj", Deadline::none()).is_ok());
  ASSERT_TRUE(faults_->list("dir", Deadline::none()).is_ok());
  EXPECT_EQ(numbers, (std::vector<uint64_t>{1, 2}));

  EXPECT_EXIT(
      {
        faults_->set_rule([](const StoreOperation& op) {
          return op.number == 4 ? Fault{Fault::Kind::kExit} : Fault{};
        });
        (void)faults_->make_directory("a", Deadline::none());          // operation 3
        (void)faults_->put("dir/z", as_bytes("z"), Deadline::none());  // create: 4
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kFaultExitStatus), "");
  // The child died before creating it.
  EXPECT_FALSE(inner_->exists("dir/z", Deadline::none()).value());
}

TEST(LocalStore, AMetadataCallThatOutlivesItsDeadlineIsReportedNotWaitedOn) {
  // A deadline already passed: the call is not started at all, and says which object.
  TempDir dir;
  auto store = open_store(dir.path());
  ASSERT_TRUE(store.is_ok());
  Status late = (*store)->list("", Deadline{Clock::now() - 1s}).status();
  EXPECT_EQ(late.code(), ErrorCode::kDeadlineExceeded) << late.to_string();
  EXPECT_TRUE(contains(late.message(), dir.path())) << late.message();
}

}  // namespace
}  // namespace zerowait
