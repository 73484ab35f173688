// The one fault injector (after RocksDB's FaultInjectionTestFS): a Store that wraps any other
// and can make any of its operations, data or metadata, reads or writes, fail with an errno
// (EIO, ENOSPC, ...), stall past its deadline, return short, flip a byte or end the process, at
// whichever operation a rule picks; a rule may also only count or observe the operations (it runs
// on the calling thread), or hold one back for as long as a test needs. Tests use it where a
// failure is hard to cause for real: a dataset opened over one (DatasetOptions::store) reads its
// manifest, listings and shards through it.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zerowait/storage/store.hpp"

namespace zerowait {

// One operation as a FaultStore sees it. Kinds: "mkdir", "create", "write", "writeback",
// "fsync", "close", "fsync-dir", "publish", "remove", "remove-all" (mutating); "list", "stat",
// "get" (a whole read), "open", "read" (one range of an opened object). `path` is relative to
// the store's root ("from -> to" for publish); a range read has its offset and length.
struct StoreOperation {
  std::string kind;
  std::string path;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t number = 0;  // 1 for the store's first operation of any kind, counting up
  // The caller's deadline: a rule can check that no call is unbounded.
  Deadline deadline = Deadline::none();

  bool mutates() const;
  std::string to_string() const { return kind + " " + path; }
};

// The exit status of Fault::kExit unless it names another (the crash tests look for it).
inline constexpr int kFaultExitStatus = 86;

// What a FaultStore does to one operation.
struct Fault {
  enum class Kind {
    kNone,       // perform it
    kError,      // fail with `error`, without performing it (naming the object and offset)
    kShortRead,  // a range read finds the object ending half-way (kCorrupt "short read"); other
                 // operations fail with `error`
    kStall,      // hang until the operation's deadline, then kDeadlineExceeded naming the
                 // object; without a deadline until release_stalls() or the store is destroyed
    kFlipByte,   // a range read: read it, then invert the byte at `flip_offset` if inside
    kExit,       // end the process at once with `exit_status` (_exit: as kill -9 would)
  };
  Kind kind = Kind::kNone;
  int error = EIO;
  uint64_t flip_offset = 0;
  int exit_status = kFaultExitStatus;
};

class FaultStore final : public Store {
 public:
  explicit FaultStore(std::shared_ptr<Store> inner);
  ~FaultStore() override;

  // Decides every operation's fault. Called for each operation, from the calling threads, with
  // no lock held: the rule must be thread-safe. nullptr: no faults.
  using Rule = std::function<Fault(const StoreOperation& operation)>;
  void set_rule(Rule rule);
  // Shorthand: fail the mutating operations for which `rule` returns an errno (0: perform it).
  // Called in order, under the store's lock (the rule needs none of its own).
  void set_fault_rule(std::function<int(const StoreOperation& operation)> rule);
  // Shorthand: the fault of each range read of an opened object.
  void set_read_fault_rule(
      std::function<Fault(const std::string& path, uint64_t offset, uint64_t length)> rule);
  // Ends every stall at once (kDeadlineExceeded), now and in future.
  void release_stalls();

  // The mutating operations performed or failed so far, in order; a failed one is recorded with
  // its kind prefixed "FAILED ".
  std::vector<StoreOperation> operations() const;
  void clear_operations();

  StoreTraits traits() const override;
  std::string describe() const override;
  Status make_directory(const std::string& path, Deadline deadline) override;
  Result<std::unique_ptr<WritableFile>> create(const std::string& path, Deadline deadline) override;
  Result<std::unique_ptr<WritableFile>> create_streamed(const std::string& path,
                                                        Deadline deadline) override;
  Status sync_directory(const std::string& path, Deadline deadline) override;
  Status publish(const std::string& from, const std::string& to, Deadline deadline,
                 std::string_view commit_record = {}) override;
  Result<std::vector<std::string>> list(const std::string& path, Deadline deadline) override;
  Result<ObjectStat> stat(const std::string& path, Deadline deadline) override;
  Result<std::string> read(const std::string& path, Deadline deadline) override;
  Result<std::unique_ptr<ByteSource>> open(const std::string& path, IoBackend backend,
                                           Deadline deadline) override;
  Status remove(const std::string& path, Deadline deadline) override;
  Status remove_all(const std::string& path, Deadline deadline,
                    std::string_view commit_record = {}) override;

  // Applies the rule to `operation` (numbering it): ok to perform it, or the injected error.
  // Its files and sources call it too.
  Status apply(StoreOperation operation, Deadline deadline);
  // The fault the rule picks for `operation` (numbered here), recording a mutating one.
  Fault decide(StoreOperation& operation);
  // Hangs like storage that never answers, until `deadline` or release_stalls().
  void stall(Deadline deadline);
  // The full name of a relative path, as the inner store's errors give it.
  std::string full_name(const std::string& path) const;

 private:
  std::shared_ptr<Store> inner_;
  std::mutex rule_mutex_;  // guards rule_
  Rule rule_;
  mutable std::mutex mutex_;  // orders the mutations: guards mutation_rule_ and operations_
  std::function<int(const StoreOperation&)> mutation_rule_;
  std::vector<StoreOperation> operations_;
  std::atomic<uint64_t> count_{0};
  // Shared with the sources it opened, which may outlive it.
  struct Stalls;
  std::shared_ptr<Stalls> stalls_;
};

// `store` wrapped in a FaultStore that ends the process (status kFaultExitStatus) instead of its
// N-th mutating operation when $ZEROWAIT_FAULT_EXIT_AT_OPERATION=N is set (crash tests through
// any entry point, the Python layer included); `store` itself when it is not.
std::shared_ptr<Store> with_exit_fault_from_environment(std::shared_ptr<Store> store);

}  // namespace zerowait
