#include "zerowait/storage/fault_store.hpp"

#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>

#include "common/file.hpp"
#include "storage/local/file_sources.hpp"

namespace zerowait {

struct FaultStore::Stalls {
  std::mutex mutex;
  std::condition_variable released_cv;
  bool released = false;
};

bool StoreOperation::mutates() const {
  return kind == "mkdir" || kind == "create" || kind == "write" || kind == "writeback" ||
         kind == "fsync" || kind == "close" || kind == "fsync-dir" || kind == "publish" ||
         kind == "remove" || kind == "remove-all";
}

namespace {

[[noreturn]] void exit_now(int status) {
  std::fflush(nullptr);  // what the process said so far reaches the test; nothing else runs
  ::_exit(status);
}

// Forwards to the inner store's file, passing each call through the owning store's rule.
class FaultFile final : public WritableFile {
 public:
  FaultFile(std::unique_ptr<WritableFile> inner, FaultStore& store, std::string path)
      : inner_(std::move(inner)), store_(store), path_(std::move(path)) {}

  Status write_at(uint64_t offset, std::span<const std::byte> bytes, Deadline deadline) override {
    ZW_RETURN_IF_ERROR(store_.apply({"write", path_, offset, bytes.size()}, deadline));
    return inner_->write_at(offset, bytes, deadline);
  }
  void start_writeback(uint64_t offset, uint64_t length, Deadline deadline) override {
    if (store_.apply({"writeback", path_, offset, length}, deadline).is_ok()) {
      inner_->start_writeback(offset, length, deadline);
    }
  }
  Status sync(Deadline deadline) override {
    ZW_RETURN_IF_ERROR(store_.apply({"fsync", path_}, deadline));
    return inner_->sync(deadline);
  }
  Status close(Deadline deadline) override {
    ZW_RETURN_IF_ERROR(store_.apply({"close", path_}, deadline));
    return inner_->close(deadline);
  }

 private:
  std::unique_ptr<WritableFile> inner_;
  FaultStore& store_;
  std::string path_;
};

}  // namespace

// Applies the rule to each range of a read of an object the FaultStore opened. It holds the
// rule through the store, so the store must outlive it (Store's contract for its sources).
class FaultSource final : public ByteSource {
 public:
  FaultSource(std::unique_ptr<ByteSource> inner, FaultStore& store, std::string path)
      : inner_(std::move(inner)), store_(store), path_(std::move(path)) {}

  const std::string& name() const override { return inner_->name(); }
  uint64_t size() const override { return inner_->size(); }
  std::string version() const override { return inner_->version(); }
  bool bypasses_page_cache() const override { return inner_->bypasses_page_cache(); }
  void advise_sequential() override { inner_->advise_sequential(); }
  void prefetch(uint64_t offset, uint64_t length) override { inner_->prefetch(offset, length); }

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    std::vector<Fault> faults;
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      StoreOperation op{"read", path_, r.offset, r.dst.size()};
      op.deadline = deadline;
      const Fault fault = store_.decide(op);
      faults.push_back(fault);
      switch (fault.kind) {
        case Fault::Kind::kError:
          return errno_status(fault.error, "cannot read (injected fault)", name(),
                              static_cast<long long>(r.offset));
        case Fault::Kind::kShortRead: {
          const uint64_t half = r.dst.size() / 2;
          ZW_RETURN_IF_ERROR(inner_->read_at(r.offset, r.dst.first(half), deadline));
          return internal::short_read_status(name(), r.offset + half, r.dst.size() - half);
        }
        case Fault::Kind::kStall:
          store_.stall(deadline);
          return internal::deadline_status(name(), r.offset, requests.size() - i);
        case Fault::Kind::kExit:
          exit_now(fault.exit_status);
        case Fault::Kind::kNone:
        case Fault::Kind::kFlipByte:
          break;
      }
    }
    ZW_RETURN_IF_ERROR(inner_->read(requests, deadline));
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      const uint64_t at = faults[i].flip_offset;
      if (faults[i].kind == Fault::Kind::kFlipByte && at >= r.offset &&
          at - r.offset < r.dst.size()) {
        r.dst[at - r.offset] ^= std::byte{0xff};
      }
    }
    return Status::ok();
  }

 private:
  std::unique_ptr<ByteSource> inner_;
  FaultStore& store_;
  std::string path_;
};

FaultStore::FaultStore(std::shared_ptr<Store> inner)
    : inner_(std::move(inner)), stalls_(std::make_shared<Stalls>()) {}

// No call stays stalled on a rule nobody can change any more.
FaultStore::~FaultStore() { release_stalls(); }

void FaultStore::set_rule(Rule rule) {
  std::lock_guard<std::mutex> lock(rule_mutex_);
  rule_ = std::move(rule);
}

void FaultStore::set_fault_rule(std::function<int(const StoreOperation&)> rule) {
  std::lock_guard<std::mutex> lock(mutex_);
  mutation_rule_ = std::move(rule);
}

void FaultStore::set_read_fault_rule(
    std::function<Fault(const std::string&, uint64_t, uint64_t)> rule) {
  if (!rule) return set_rule(nullptr);
  set_rule([rule = std::move(rule)](const StoreOperation& op) {
    return op.kind == "read" ? rule(op.path, op.offset, op.length) : Fault{};
  });
}

void FaultStore::release_stalls() {
  {
    std::lock_guard<std::mutex> lock(stalls_->mutex);
    stalls_->released = true;
  }
  stalls_->released_cv.notify_all();
}

std::vector<StoreOperation> FaultStore::operations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return operations_;
}

void FaultStore::clear_operations() {
  std::lock_guard<std::mutex> lock(mutex_);
  operations_.clear();
}

std::string FaultStore::full_name(const std::string& path) const {
  const std::string root = inner_->describe() + "/";
  std::string full = root + path;
  if (size_t arrow = full.find(" -> "); arrow != std::string::npos) full.insert(arrow + 4, root);
  return full;
}

Fault FaultStore::decide(StoreOperation& operation) {
  operation.number = ++count_;
  Rule rule;
  {
    std::lock_guard<std::mutex> lock(rule_mutex_);
    rule = rule_;
  }
  Fault fault = rule ? rule(operation) : Fault{};
  if (!operation.mutates()) return fault;
  // Only mutations wait for each other here: a rule that holds one back (a slow mirror) does not
  // hold back the store's reads.
  std::lock_guard<std::mutex> lock(mutex_);
  if (fault.kind == Fault::Kind::kNone && mutation_rule_) {
    if (const int err = mutation_rule_(operation); err != 0) fault = {Fault::Kind::kError, err};
  }
  StoreOperation recorded = operation;
  if (fault.kind != Fault::Kind::kNone && fault.kind != Fault::Kind::kFlipByte) {
    recorded.kind = "FAILED " + recorded.kind;
  }
  operations_.push_back(std::move(recorded));
  return fault;
}

void FaultStore::stall(Deadline deadline) {
  std::unique_lock<std::mutex> lock(stalls_->mutex);
  const auto released = [&] { return stalls_->released; };
  if (deadline.at == Clock::time_point::max()) {
    stalls_->released_cv.wait(lock, released);
  } else {
    stalls_->released_cv.wait_until(lock, deadline.at, released);
  }
}

Status FaultStore::apply(StoreOperation operation, Deadline deadline) {
  operation.deadline = deadline;
  const Fault fault = decide(operation);
  switch (fault.kind) {
    case Fault::Kind::kNone:
    case Fault::Kind::kFlipByte:
      return Status::ok();
    case Fault::Kind::kExit:
      exit_now(fault.exit_status);
    case Fault::Kind::kStall:
      stall(deadline);
      return Status(ErrorCode::kDeadlineExceeded,
                    operation.kind + " of '" + full_name(operation.path) +
                        "' did not finish by its deadline (injected stall)");
    case Fault::Kind::kError:
    case Fault::Kind::kShortRead:
      break;
  }
  return errno_status(fault.error, "cannot " + operation.kind + " (injected fault)",
                      full_name(operation.path));
}

StoreTraits FaultStore::traits() const { return inner_->traits(); }
std::string FaultStore::describe() const { return inner_->describe(); }

Status FaultStore::make_directory(const std::string& path, Deadline deadline) {
  ZW_RETURN_IF_ERROR(apply({"mkdir", path}, deadline));
  return inner_->make_directory(path, deadline);
}

Result<std::unique_ptr<WritableFile>> FaultStore::create(const std::string& path,
                                                         Deadline deadline) {
  ZW_RETURN_IF_ERROR(apply({"create", path}, deadline));
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, inner_->create(path, deadline));
  return std::unique_ptr<WritableFile>(new FaultFile(std::move(file), *this, path));
}

// The same faults as create(): a test of a checkpoint fails its tensor files' calls by the names
// create() uses.
Result<std::unique_ptr<WritableFile>> FaultStore::create_streamed(const std::string& path,
                                                                  Deadline deadline) {
  ZW_RETURN_IF_ERROR(apply({"create", path}, deadline));
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, inner_->create_streamed(path, deadline));
  return std::unique_ptr<WritableFile>(new FaultFile(std::move(file), *this, path));
}

Status FaultStore::sync_directory(const std::string& path, Deadline deadline) {
  ZW_RETURN_IF_ERROR(apply({"fsync-dir", path}, deadline));
  return inner_->sync_directory(path, deadline);
}

Status FaultStore::publish(const std::string& from, const std::string& to, Deadline deadline,
                           std::string_view commit_record) {
  ZW_RETURN_IF_ERROR(apply({"publish", from + " -> " + to}, deadline));
  return inner_->publish(from, to, deadline, commit_record);
}

Result<std::vector<std::string>> FaultStore::list(const std::string& path, Deadline deadline) {
  ZW_RETURN_IF_ERROR(apply({"list", path}, deadline));
  return inner_->list(path, deadline);
}

Result<ObjectStat> FaultStore::stat(const std::string& path, Deadline deadline) {
  ZW_RETURN_IF_ERROR(apply({"stat", path}, deadline));
  return inner_->stat(path, deadline);
}

Result<std::string> FaultStore::read(const std::string& path, Deadline deadline) {
  ZW_RETURN_IF_ERROR(apply({"get", path}, deadline));
  return inner_->read(path, deadline);
}

Result<std::unique_ptr<ByteSource>> FaultStore::open(const std::string& path, IoBackend backend,
                                                     Deadline deadline) {
  ZW_RETURN_IF_ERROR(apply({"open", path}, deadline));
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> inner, inner_->open(path, backend, deadline));
  return std::unique_ptr<ByteSource>(new FaultSource(std::move(inner), *this, path));
}

Status FaultStore::remove(const std::string& path, Deadline deadline) {
  ZW_RETURN_IF_ERROR(apply({"remove", path}, deadline));
  return inner_->remove(path, deadline);
}

Status FaultStore::remove_all(const std::string& path, Deadline deadline,
                              std::string_view commit_record) {
  ZW_RETURN_IF_ERROR(apply({"remove-all", path}, deadline));
  return inner_->remove_all(path, deadline, commit_record);
}

std::shared_ptr<Store> with_exit_fault_from_environment(std::shared_ptr<Store> store) {
  const char* text = std::getenv("ZEROWAIT_FAULT_EXIT_AT_OPERATION");
  const uint64_t fatal = text == nullptr ? 0 : std::strtoull(text, nullptr, 10);
  if (fatal == 0) return store;
  auto faults = std::make_shared<FaultStore>(std::move(store));
  faults->set_fault_rule([fatal, count = uint64_t{0}](const StoreOperation&) mutable {
    if (++count == fatal) exit_now(kFaultExitStatus);
    return 0;
  });
  return faults;
}

}  // namespace zerowait
