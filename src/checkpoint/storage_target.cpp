#include "zerowait/checkpoint/storage_target.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <system_error>

#include "checkpoint/checkpoint_io.hpp"
#include "common/file.hpp"
#include "common/log.hpp"
#include "common/path_check.hpp"
#include "storage/local/file_sources.hpp"

namespace zerowait {
namespace {

class LocalWritableFile : public WritableFile {
 public:
  explicit LocalWritableFile(internal::File file) : file_(std::move(file)) {}

  Status write_at(uint64_t offset, std::span<const std::byte> bytes) override {
    return file_.pwrite_all(offset, bytes);
  }

  void start_writeback(uint64_t offset, uint64_t length) override {
    // A hint: a failure here shows up again, and is reported, at sync().
    (void)::sync_file_range(file_.fd(), static_cast<off64_t>(offset), static_cast<off64_t>(length),
                            SYNC_FILE_RANGE_WRITE);
  }

  Status sync() override { return file_.sync(); }
  Status close() override { return file_.close(); }

 private:
  internal::File file_;
};

class LocalDirectoryTarget : public StorageTarget {
 public:
  // `refused`: why every operation fails (a URL root), or ok.
  LocalDirectoryTarget(std::filesystem::path root, Status refused)
      : root_(std::move(root)), refused_(std::move(refused)) {}

  std::string describe() const override { return root_.string(); }

  Status create_directory(const std::string& path) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::error_code ec;
    std::filesystem::create_directories(full, ec);
    if (ec) return errno_status(ec.value(), "cannot create directory", full);
    return Status::ok();
  }

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    ZW_ASSIGN_OR_RETURN(internal::File file, internal::File::create(full));
    return std::unique_ptr<WritableFile>(new LocalWritableFile(std::move(file)));
  }

  Status sync_directory(const std::string& path) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return internal::sync_directory(full);
  }

  Status rename(const std::string& from, const std::string& to) override {
    ZW_ASSIGN_OR_RETURN(std::string full_from, full_path(from));
    ZW_ASSIGN_OR_RETURN(std::string full_to, full_path(to));
    struct stat st;
    if (::stat(full_from.c_str(), &st) != 0) {
      return errno_status(errno, "cannot rename to '" + full_to + "' from", full_from);
    }
    if (!S_ISDIR(st.st_mode)) return internal::rename_file(full_from, full_to);
    return rename_directory(full_from, full_to);
  }

  Result<std::vector<std::string>> list(const std::string& path) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::error_code ec;
    std::filesystem::directory_iterator it(full, ec);
    std::vector<std::string> names;
    for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      names.push_back(it->path().filename().string());
    }
    if (ec) return errno_status(ec.value(), "cannot list directory", full);
    std::sort(names.begin(), names.end());
    return names;
  }

  Result<bool> exists(const std::string& path) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    ZW_ASSIGN_OR_RETURN(std::optional<mode_t> mode, stat_mode(full));
    return mode.has_value();
  }

  Result<bool> is_directory(const std::string& path) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    ZW_ASSIGN_OR_RETURN(std::optional<mode_t> mode, stat_mode(full));
    return mode.has_value() && S_ISDIR(*mode);
  }

  Result<std::string> read_file(const std::string& path) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return internal::read_whole_file<std::string>(full);
  }

  Result<uint64_t> file_size(const std::string& path) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    struct stat st;
    if (::stat(full.c_str(), &st) != 0) return errno_status(errno, "cannot stat", full);
    if (S_ISDIR(st.st_mode)) return errno_status(EISDIR, "cannot take the file size of", full);
    return static_cast<uint64_t>(st.st_size);
  }

  Status remove_file(const std::string& path) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    if (::unlink(full.c_str()) != 0 && errno != ENOENT) {
      return errno_status(errno, "cannot remove", full);
    }
    return Status::ok();
  }

  Status remove_all(const std::string& path) override {
    // "" would be the root itself: never what a caller cleaning up a step means.
    if (path.empty()) return invalid_argument("refusing to remove the whole of " + describe());
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    std::error_code ec;
    std::filesystem::remove_all(full, ec);
    if (ec) return errno_status(ec.value(), "cannot remove", full);
    return Status::ok();
  }

  Result<std::unique_ptr<ByteSource>> open_for_read(const std::string& path,
                                                    IoBackend backend) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return open_file_source(full, backend);
  }

 private:
  Result<std::string> full_path(const std::string& path) const {
    ZW_RETURN_IF_ERROR(refused_);
    return internal::join_target_path(root_.string(), path);
  }

  // The file type bits of `full`, or nullopt when it does not exist.
  static Result<std::optional<mode_t>> stat_mode(const std::string& full) {
    struct stat st;
    if (::stat(full.c_str(), &st) == 0) return std::optional<mode_t>(st.st_mode);
    if (errno == ENOENT || errno == ENOTDIR) return std::optional<mode_t>();
    return errno_status(errno, "cannot stat", full);
  }

  // rename(2) silently replaces an empty destination directory; publishing must never do that.
  static Status rename_directory(const std::string& from, const std::string& to) {
    const std::string what = "cannot rename to '" + to + "' from";
#ifdef RENAME_NOREPLACE
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
      return Status::ok();
    }
    if (errno != EINVAL && errno != ENOSYS) return errno_status(errno, what, from);
    internal::note_fallback("rename-noreplace",
                            "the filesystem of " + to +
                                " has no renameat2(RENAME_NOREPLACE); directories are published "
                                "by checking the destination first, then rename(2)");
#endif
    struct stat st;
    if (::lstat(to.c_str(), &st) == 0) return errno_status(EEXIST, what, from);
    if (::rename(from.c_str(), to.c_str()) != 0) return errno_status(errno, what, from);
    return Status::ok();
  }

  std::filesystem::path root_;
  Status refused_;
};

// Forwards to the inner target's file, recording each call through the owning target.
class FaultInjectingFile : public WritableFile {
 public:
  FaultInjectingFile(std::unique_ptr<WritableFile> inner, FaultInjectingTarget& target,
                     std::string path)
      : inner_(std::move(inner)), target_(target), path_(std::move(path)) {}

  Status write_at(uint64_t offset, std::span<const std::byte> bytes) override {
    ZW_RETURN_IF_ERROR(target_.record({"write", path_}));
    return inner_->write_at(offset, bytes);
  }
  void start_writeback(uint64_t offset, uint64_t length) override {
    if (target_.record({"writeback", path_}).is_ok()) inner_->start_writeback(offset, length);
  }
  Status sync() override {
    ZW_RETURN_IF_ERROR(target_.record({"fsync", path_}));
    return inner_->sync();
  }
  Status close() override {
    ZW_RETURN_IF_ERROR(target_.record({"close", path_}));
    return inner_->close();
  }

 private:
  std::unique_ptr<WritableFile> inner_;
  FaultInjectingTarget& target_;
  std::string path_;
};

}  // namespace

struct FaultInjectingTarget::ReadFaults {
  std::mutex mutex;
  std::condition_variable released_cv;
  bool released = false;
  ReadFaultRule rule;
};

namespace {

// Wraps the inner target's source and applies the rule's fault to each request.
class FaultInjectingSource final : public ByteSource {
 public:
  FaultInjectingSource(std::unique_ptr<ByteSource> inner, std::string path,
                       std::shared_ptr<FaultInjectingTarget::ReadFaults> faults)
      : inner_(std::move(inner)), path_(std::move(path)), faults_(std::move(faults)) {}

  const std::string& name() const override { return inner_->name(); }
  uint64_t size() const override { return inner_->size(); }
  bool bypasses_page_cache() const override { return inner_->bypasses_page_cache(); }
  void advise_sequential() override { inner_->advise_sequential(); }
  void prefetch(uint64_t offset, uint64_t length) override { inner_->prefetch(offset, length); }

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    FaultInjectingTarget::ReadFaultRule rule;
    {
      std::lock_guard<std::mutex> lock(faults_->mutex);
      rule = faults_->rule;
    }
    if (!rule) return inner_->read(requests, deadline);
    std::vector<ReadFault> faults;
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      const ReadFault fault = rule(path_, r.offset, r.dst.size());
      faults.push_back(fault);
      switch (fault.kind) {
        case ReadFault::Kind::kError:
          return errno_status(fault.error, "cannot read (injected fault)", name(),
                              static_cast<long long>(r.offset));
        case ReadFault::Kind::kShortRead: {
          const uint64_t half = r.dst.size() / 2;
          ZW_RETURN_IF_ERROR(inner_->read_at(r.offset, r.dst.first(half), deadline));
          return internal::short_read_status(name(), r.offset + half, r.dst.size() - half);
        }
        case ReadFault::Kind::kStall:
          stall(deadline);
          return internal::deadline_status(name(), r.offset, requests.size() - i);
        case ReadFault::Kind::kNone:
        case ReadFault::Kind::kFlipByte:
          break;
      }
    }
    ZW_RETURN_IF_ERROR(inner_->read(requests, deadline));
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      const uint64_t at = faults[i].flip_offset;
      if (faults[i].kind == ReadFault::Kind::kFlipByte && at >= r.offset &&
          at - r.offset < r.dst.size()) {
        r.dst[at - r.offset] ^= std::byte{0xff};
      }
    }
    return Status::ok();
  }

 private:
  // Hangs like a read the storage never answers, until `deadline` or a release.
  void stall(Deadline deadline) {
    std::unique_lock<std::mutex> lock(faults_->mutex);
    const auto released = [&] { return faults_->released; };
    if (deadline.at == Clock::time_point::max()) {
      faults_->released_cv.wait(lock, released);
    } else {
      faults_->released_cv.wait_until(lock, deadline.at, released);
    }
  }

  std::unique_ptr<ByteSource> inner_;
  std::string path_;
  std::shared_ptr<FaultInjectingTarget::ReadFaults> faults_;
};

}  // namespace

std::shared_ptr<StorageTarget> make_local_directory_target(const std::filesystem::path& root) {
  // A URL is kept as given, not normalised into "<cwd>/s3:/bucket": every operation of the
  // target then refuses it by name.
  if (Status refused = internal::require_local_path(root, "path"); !refused.is_ok()) {
    return std::make_shared<LocalDirectoryTarget>(root, std::move(refused));
  }
  std::filesystem::path absolute = std::filesystem::absolute(root).lexically_normal();
  // "/ckpt/" normalises to "/ckpt/"; messages read better without the trailing separator.
  if (!absolute.has_filename() && absolute.has_relative_path()) absolute = absolute.parent_path();
  return std::make_shared<LocalDirectoryTarget>(std::move(absolute), Status::ok());
}

FaultInjectingTarget::FaultInjectingTarget(std::shared_ptr<StorageTarget> inner)
    : inner_(std::move(inner)), read_faults_(std::make_shared<ReadFaults>()) {}

// A source may outlive its target: no read of it stays stalled on a rule nobody can change.
FaultInjectingTarget::~FaultInjectingTarget() { release_stalled_reads(); }

void FaultInjectingTarget::set_read_fault_rule(ReadFaultRule rule) {
  std::lock_guard<std::mutex> lock(read_faults_->mutex);
  read_faults_->rule = std::move(rule);
}

void FaultInjectingTarget::release_stalled_reads() {
  {
    std::lock_guard<std::mutex> lock(read_faults_->mutex);
    read_faults_->released = true;
  }
  read_faults_->released_cv.notify_all();
}

void FaultInjectingTarget::set_fault_rule(FaultRule rule) {
  std::lock_guard<std::mutex> lock(mutex_);
  rule_ = std::move(rule);
}

std::vector<StorageOperation> FaultInjectingTarget::operations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return operations_;
}

void FaultInjectingTarget::clear_operations() {
  std::lock_guard<std::mutex> lock(mutex_);
  operations_.clear();
}

Status FaultInjectingTarget::record(StorageOperation operation) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int err = rule_ ? rule_(operation) : 0;
  if (err == 0) {
    operations_.push_back(std::move(operation));
    return Status::ok();
  }
  // Name the full path(s), as the real target's errors do.
  const std::string root = inner_->describe() + "/";
  std::string full = root + operation.path;
  if (size_t arrow = full.find(" -> "); arrow != std::string::npos) full.insert(arrow + 4, root);
  Status status = errno_status(err, "cannot " + operation.kind + " (injected fault)", full);
  operation.kind = "FAILED " + operation.kind;
  operations_.push_back(std::move(operation));
  return status;
}

std::string FaultInjectingTarget::describe() const { return inner_->describe(); }

Status FaultInjectingTarget::create_directory(const std::string& path) {
  ZW_RETURN_IF_ERROR(record({"mkdir", path}));
  return inner_->create_directory(path);
}

Result<std::unique_ptr<WritableFile>> FaultInjectingTarget::create_file(const std::string& path) {
  ZW_RETURN_IF_ERROR(record({"create", path}));
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, inner_->create_file(path));
  return std::unique_ptr<WritableFile>(new FaultInjectingFile(std::move(file), *this, path));
}

Status FaultInjectingTarget::sync_directory(const std::string& path) {
  ZW_RETURN_IF_ERROR(record({"fsync-dir", path}));
  return inner_->sync_directory(path);
}

Status FaultInjectingTarget::rename(const std::string& from, const std::string& to) {
  ZW_RETURN_IF_ERROR(record({"rename", from + " -> " + to}));
  return inner_->rename(from, to);
}

Result<std::vector<std::string>> FaultInjectingTarget::list(const std::string& path) {
  return inner_->list(path);
}

Result<bool> FaultInjectingTarget::exists(const std::string& path) { return inner_->exists(path); }

Result<bool> FaultInjectingTarget::is_directory(const std::string& path) {
  return inner_->is_directory(path);
}

Result<std::string> FaultInjectingTarget::read_file(const std::string& path) {
  return inner_->read_file(path);
}

Result<uint64_t> FaultInjectingTarget::file_size(const std::string& path) {
  return inner_->file_size(path);
}

Result<std::unique_ptr<ByteSource>> FaultInjectingTarget::open_for_read(const std::string& path,
                                                                        IoBackend backend) {
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> inner, inner_->open_for_read(path, backend));
  return std::unique_ptr<ByteSource>(
      new FaultInjectingSource(std::move(inner), path, read_faults_));
}

Status FaultInjectingTarget::remove_file(const std::string& path) {
  ZW_RETURN_IF_ERROR(record({"remove", path}));
  return inner_->remove_file(path);
}

Status FaultInjectingTarget::remove_all(const std::string& path) {
  ZW_RETURN_IF_ERROR(record({"remove-all", path}));
  return inner_->remove_all(path);
}

}  // namespace zerowait
