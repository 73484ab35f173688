// The fault injector: every kind of Store call, data and metadata, can be stalled past its
// deadline (kDeadlineExceeded naming the object, within the deadline plus a second), failed with
// an errno, cut short, or made to end the process at operation N.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>

#include "storage/local/call_runner.hpp"
#include "testing/testing.hpp"
#include "zerowait/storage/fault_store.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

using testing::TempDir;
using namespace std::chrono_literals;

using testing::as_bytes;

using ::zerowait::testing::contains;

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

// The calls on a file being written keep their deadlines as the store's own calls do, on a local
// directory and on memory alike.
TEST_F(FaultStoreTest, AStalledWriteSyncOrCloseEndsAtItsDeadlineNamingTheObject) {
  auto memory = open_store("memory://fault-store-write-stalls");
  ASSERT_TRUE(memory.is_ok()) << memory.status().to_string();
  ASSERT_TRUE((*memory)->make_directory("dir", Deadline::none()).is_ok());
  const std::vector<std::pair<std::string, std::shared_ptr<FaultStore>>> stores = {
      {dir_.path() + "/dir/x", faults_},
      {"memory://fault-store-write-stalls/dir/x", std::make_shared<FaultStore>(*memory)}};
  using FileCall = std::function<Status(WritableFile&, Deadline)>;
  const std::vector<std::pair<const char*, FileCall>> calls = {
      {"write", [](WritableFile& f, Deadline d) { return f.write_at(0, as_bytes("abc"), d); }},
      {"fsync", [](WritableFile& f, Deadline d) { return f.sync(d); }},
      {"close", [](WritableFile& f, Deadline d) { return f.close(d); }},
  };
  for (const auto& [name, store] : stores) {
    for (const auto& [kind_name, run] : calls) {
      SCOPED_TRACE(name + ": " + kind_name);
      const std::string kind = kind_name;
      store->set_rule([kind](const StoreOperation& op) {
        return Fault{op.kind == kind ? Fault::Kind::kStall : Fault::Kind::kNone};
      });
      auto file = store->create("dir/x", Deadline::none());
      ASSERT_TRUE(file.is_ok()) << file.status().to_string();
      if (kind != "write") {
        ASSERT_TRUE((*file)->write_at(0, as_bytes("abc"), Deadline::none()).is_ok());
      }
      const auto deadline = 200ms;
      const auto start = std::chrono::steady_clock::now();
      const Status status = run(**file, Deadline::after(deadline));
      const auto took = std::chrono::steady_clock::now() - start;
      EXPECT_EQ(status.code(), ErrorCode::kDeadlineExceeded) << status.to_string();
      EXPECT_TRUE(contains(status.message(), name)) << status.message();
      EXPECT_GE(took, deadline);
      EXPECT_LT(took, deadline + 1s);
      store->set_rule(nullptr);
      if (kind != "close") {
        EXPECT_TRUE((*file)->close(Deadline::none()).is_ok());
      }
    }
  }
  // A writeback hint has no error to report, but it too returns at its deadline.
  faults_->set_rule([](const StoreOperation& op) {
    return Fault{op.kind == "writeback" ? Fault::Kind::kStall : Fault::Kind::kNone};
  });
  auto file = faults_->create("dir/x", Deadline::none());
  ASSERT_TRUE(file.is_ok());
  const auto start = std::chrono::steady_clock::now();
  (*file)->start_writeback(0, 3, Deadline::after(200ms));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 200ms + 1s);
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

// A local file's calls run on threads the file keeps (no thread per call): one stuck in the
// kernel, as on a hung NFS mount, is reported at its deadline naming the file, and the file's
// next call runs on another thread while the stuck one waits.
TEST(LocalStore, AWriteCallStuckInTheKernelIsReportedAtItsDeadlineAndOthersGoOn) {
  struct Gate {
    std::mutex mutex;
    std::condition_variable cv;
    bool open = false;
    bool finished = false;
  };
  auto gate = std::make_shared<Gate>();
  {
    internal::CallRunner calls("/mnt/hung/part-0.safetensors");
    const auto deadline = 200ms;
    const auto start = std::chrono::steady_clock::now();
    Status stuck = calls.run(Deadline::after(deadline), "writing", [gate] {
      std::unique_lock<std::mutex> lock(gate->mutex);
      gate->cv.wait(lock, [&] { return gate->open; });
      gate->finished = true;
      return Status::ok();
    });
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(stuck.code(), ErrorCode::kDeadlineExceeded) << stuck.to_string();
    EXPECT_TRUE(contains(stuck.message(), "writing '/mnt/hung/part-0.safetensors'"))
        << stuck.message();
    EXPECT_GE(took, deadline);
    EXPECT_LT(took, deadline + 1s);
    EXPECT_TRUE(calls.abandoned());

    int runs = 0;
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(calls.run(Deadline::after(60s), "writing", [&] {
                         ++runs;
                         return Status::ok();
                       }).is_ok());
    }
    EXPECT_EQ(runs, 3);
    // A deadline already passed: the call is not made at all.
    EXPECT_EQ(calls.run(Deadline{Clock::now() - 1s}, "syncing", [&] {
                     ++runs;
                     return Status::ok();
                   }).code(),
              ErrorCode::kDeadlineExceeded);
    EXPECT_EQ(runs, 3);
    // Destroying the runner does not wait for the stuck call.
  }
  {
    std::lock_guard<std::mutex> lock(gate->mutex);
    EXPECT_FALSE(gate->finished);
    gate->open = true;
  }
  gate->cv.notify_all();
}

}  // namespace
}  // namespace zerowait
