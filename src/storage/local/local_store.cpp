// A Store on a local (or network-mounted) filesystem: objects are files, publish is a rename(2)
// and nothing more (its caller makes it durable with sync_directory). Every call keeps its
// deadline through call_within (a hung mount is reported, not waited on).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "common/align.hpp"
#include "common/file.hpp"
#include "common/log.hpp"
#include "storage/local_path.hpp"
#include "storage/local/call_runner.hpp"
#include "storage/local/call_within.hpp"
#include "storage/store_path.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait {

namespace internal {

Status call_deadline_status(const std::string& what, const std::string& name) {
  return Status(ErrorCode::kDeadlineExceeded,
                what + " '" + name +
                    "' did not finish within its deadline (the storage does not answer: a hung "
                    "network mount?)");
}

}  // namespace internal

namespace {

using internal::call_within;

// close() of a file one of whose calls is still stuck past its deadline.
Status close_abandoned_status(const std::string& path) {
  return Status(ErrorCode::kDeadlineExceeded,
                "closing '" + path +
                    "': an earlier call on it did not finish within its deadline (the file is "
                    "closed once that call returns)");
}

// Turns O_DIRECT on or off for `file`'s descriptor.
Status set_direct(const internal::File& file, bool on) {
  const int flags = ::fcntl(file.fd(), F_GETFL);
  if (flags < 0 || ::fcntl(file.fd(), F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT) != 0) {
    return errno_status(errno, "cannot write", file.path());
  }
  return Status::ok();
}

// Each call runs on the file's CallRunner, which keeps its deadline without a thread per call.
// The File is shared with the runner's calls: one stuck past its deadline may still use it after
// the caller has dropped this object.
class LocalWritableFile : public WritableFile {
 public:
  explicit LocalWritableFile(internal::File file)
      : file_(std::make_shared<internal::File>(std::move(file))), calls_(file_->path()) {}

  Status write_at(uint64_t offset, std::span<const std::byte> bytes, Deadline deadline) override {
    return calls_.run(
        deadline,
        "writing " + std::to_string(bytes.size()) + " bytes at offset " + std::to_string(offset) +
            " of",
        [file = file_, offset, bytes] { return file->pwrite_all(offset, bytes); });
  }

  void start_writeback(uint64_t offset, uint64_t length, Deadline deadline) override {
    // A hint: a failure here shows up again, and is reported, at sync().
    (void)calls_.run(deadline, "starting writeback of", [file = file_, offset, length] {
      (void)::sync_file_range(file->fd(), static_cast<off64_t>(offset),
                              static_cast<off64_t>(length), SYNC_FILE_RANGE_WRITE);
      return Status::ok();
    });
  }

  Status sync(Deadline deadline) override {
    return calls_.run(deadline, "syncing", [file = file_] { return file->sync(); });
  }
  Status close(Deadline deadline) override {
    // A write still stuck may go on to pwrite the rest of its bytes: closing the descriptor under
    // it could send them into whichever file reuses the number. The last owner of the File (the
    // stuck call, once it returns) closes it instead.
    if (calls_.abandoned()) return close_abandoned_status(file_->path());
    return calls_.run(deadline, "closing", [file = file_] { return file->close(); });
  }

 private:
  std::shared_ptr<internal::File> file_;
  internal::CallRunner calls_;  // after file_: its threads end before this object lets go of it
};

// A file written front to back with O_DIRECT (create_streamed): a checkpoint's tensors go from
// staging to the disk without a copy into fresh page-cache pages, which costs CPU that a training
// loop shares (half of a buffered write's here), and without evicting what the page cache holds
// for the job (its training data). A large span whose memory lines up with the file (the kernel's
// dio_mem_align) is written straight from the caller's memory; other bytes are gathered in an
// aligned buffer, written when it fills or when a large span follows, and the tail, through the
// page cache, at sync() and close(). A file system that refuses O_DIRECT at open or at the first
// write gets the same bytes buffered, and says so once.
class LocalStreamedFile : public WritableFile {
 public:
  static constexpr size_t kAlign = 4096;              // of each O_DIRECT write's offset and size
  static constexpr size_t kBufferBytes = 8ull << 20;  // one pwrite(2)
  static constexpr size_t kDirectFrom = 1ull << 20;   // spans written from the caller's memory

  LocalStreamedFile(internal::File file, bool direct)
      : file_(std::make_shared<internal::File>(std::move(file))),
        buffer_(static_cast<std::byte*>(std::aligned_alloc(kAlign, kBufferBytes)), std::free),
        direct_(std::make_shared<bool>(direct)),
        memory_align_(direct_memory_alignment(file_->fd())),
        calls_(file_->path()) {}

  Status write_at(uint64_t offset, std::span<const std::byte> bytes, Deadline deadline) override {
    if (buffer_ == nullptr) return Status(ErrorCode::kIo, "no memory for the write buffer of '" +
                                                              file_->path() + "'");
    if (offset != end_) {
      return invalid_argument("'" + file_->path() + "' is written front to back: a write at " +
                              std::to_string(offset) + " where " + std::to_string(end_) +
                              " bytes were written");
    }
    while (!bytes.empty()) {
      if (*direct_ && bytes.size() >= kDirectFrom) {
        if (fill_ > 0) {
          // The buffer is written up to the next block of the file, so the span can follow it.
          const size_t to_block = internal::align_up(end_, kAlign) - end_;
          if (to_block > 0) {
            ZW_ASSIGN_OR_RETURN(size_t took, gather(bytes.first(std::min(to_block, bytes.size())),
                                                    deadline));
            bytes = bytes.subspan(took);
          } else {
            ZW_RETURN_IF_ERROR(write_out(end_ - fill_, {buffer_.get(), fill_}, buffer_, deadline));
            fill_ = 0;
          }
          continue;
        }
        if (reinterpret_cast<uintptr_t>(bytes.data()) % memory_align_ == 0) {
          const size_t n = std::min(bytes.size() / kAlign * kAlign, kBufferBytes);
          ZW_RETURN_IF_ERROR(write_out(end_, bytes.first(n), nullptr, deadline));
          end_ += n;
          tail_written_ = end_;
          bytes = bytes.subspan(n);
          continue;
        }
      }
      ZW_ASSIGN_OR_RETURN(size_t took, gather(bytes, deadline));
      bytes = bytes.subspan(took);
    }
    return Status::ok();
  }

  void start_writeback(uint64_t, uint64_t, Deadline) override {}  // the writes go to the disk

  Status sync(Deadline deadline) override {
    ZW_RETURN_IF_ERROR(write_tail(deadline));
    return calls_.run(deadline, "syncing", [file = file_] { return file->sync(); });
  }

  Status close(Deadline deadline) override {
    if (calls_.abandoned()) return close_abandoned_status(file_->path());
    ZW_RETURN_IF_ERROR(write_tail(deadline));
    return calls_.run(deadline, "closing", [file = file_] { return file->close(); });
  }

 private:
  // The memory alignment O_DIRECT wants of this file (statx's dio_mem_align; a page where the
  // kernel does not say).
  static size_t direct_memory_alignment(int fd) {
    struct statx info {};
    if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &info) == 0 &&
        (info.stx_mask & STATX_DIOALIGN) != 0 && info.stx_dio_mem_align > 0) {
      return info.stx_dio_mem_align;
    }
    return kAlign;
  }

  // Copies the first bytes of `bytes` into the buffer, as many as it has room for, and writes
  // the buffer when that fills it. Returns how many it took.
  Result<size_t> gather(std::span<const std::byte> bytes, Deadline deadline) {
    const size_t take = std::min(bytes.size(), kBufferBytes - fill_);
    std::memcpy(buffer_.get() + fill_, bytes.data(), take);
    fill_ += take;
    end_ += take;
    if (fill_ == kBufferBytes) {
      ZW_RETURN_IF_ERROR(write_out(end_ - fill_, {buffer_.get(), fill_}, buffer_, deadline));
      fill_ = 0;
    }
    return take;
  }

  // The bytes past the last full buffer, through the page cache: O_DIRECT would want them padded
  // to the block and the file cut back to its length, a second metadata change for every file
  // (a checkpoint of small files took twice as long to save). They stay in the buffer: a later
  // write appends to them and writes them again.
  Status write_tail(Deadline deadline) {
    if (tail_written_ == end_) return Status::ok();
    if (fill_ > 0) {
      const uint64_t offset = end_ - fill_;
      ZW_RETURN_IF_ERROR(calls_.run(
          deadline, writing(fill_, offset),
          [file = file_, buffer = buffer_, direct = direct_, bytes = fill_, offset]() -> Status {
            if (*direct) ZW_RETURN_IF_ERROR(set_direct(*file, false));
            Status written =
                file->pwrite_all(offset, std::span<const std::byte>(buffer.get(), bytes));
            if (*direct && written.is_ok()) written = set_direct(*file, true);
            return written;
          }));
    }
    tail_written_ = end_;
    return Status::ok();
  }

  // What a call writing `bytes` at `offset` says it was doing, for its errors.
  static std::string writing(size_t bytes, uint64_t offset) {
    return "writing " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
           " of";
  }

  // Writes `data` (whole blocks) at `offset`, O_DIRECT while the file system takes it. `holds`
  // keeps the memory alive for the call: one stuck past its deadline may still read it after
  // the caller dropped this object (the buffer; a caller's own memory is the caller's to keep,
  // as WritableFile says).
  Status write_out(uint64_t offset, std::span<const std::byte> data,
                   std::shared_ptr<std::byte> holds, Deadline deadline) {
    return calls_.run(
        deadline, writing(data.size(), offset),
        [file = file_, holds = std::move(holds), direct = direct_, data, offset]() -> Status {
          size_t done = 0;
          while (*direct && done < data.size()) {
            const ssize_t n = ::pwrite(file->fd(), data.data() + done, data.size() - done,
                                       static_cast<off_t>(offset + done));
            if (n > 0) {
              done += size_t(n);
            } else if (n < 0 && errno == EINTR) {
              continue;
            } else if (n < 0 && errno == EINVAL && done == 0) {
              // An alignment this file system does not take: buffered from here on.
              ZW_RETURN_IF_ERROR(set_direct(*file, false));
              *direct = false;
              internal::note_fallback("checkpoint-direct-write",
                                      "the file system of " + file->path() +
                                          " refuses O_DIRECT writes; writing through the page "
                                          "cache");
            } else {
              return errno_status(n == 0 ? EIO : errno, "cannot write", file->path(),
                                  static_cast<long long>(offset + done));
            }
          }
          return file->pwrite_all(offset + done, data.subspan(done));
        });
  }

  std::shared_ptr<internal::File> file_;
  std::shared_ptr<std::byte> buffer_;
  std::shared_ptr<bool> direct_;  // cleared by the first write O_DIRECT refuses
  size_t memory_align_;           // of a span written from the caller's memory
  size_t fill_ = 0;               // bytes in the buffer; buffer_[0] is at offset end_ - fill_
  uint64_t end_ = 0;              // bytes written so far
  uint64_t tail_written_ = 0;     // end_ when the tail was last written
  internal::CallRunner calls_;    // last: its threads end before this object lets go of the rest
};

// rename(2) silently replaces an empty destination directory; publishing must never do that.
Status rename_directory(const std::string& from, const std::string& to) {
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

Status rename_any(const std::string& from, const std::string& to) {
  struct stat st;
  if (::stat(from.c_str(), &st) != 0) {
    return errno_status(errno, "cannot rename to '" + to + "' from", from);
  }
  if (!S_ISDIR(st.st_mode)) return internal::rename_file(from, to);
  return rename_directory(from, to);
}

class LocalStore final : public Store {
 public:
  // `refused`: why every operation fails (a URL root), or ok.
  LocalStore(std::filesystem::path root, Status refused)
      : root_(std::move(root)), refused_(std::move(refused)) {}

  std::string describe() const override { return root_.string(); }

  std::optional<std::string> local_file(const std::string& path) const override {
    auto full = full_path(path);
    if (!full.is_ok()) return std::nullopt;
    return std::move(full).value();
  }

  Status make_directory(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return call_within(deadline, "creating directory", full, [full]() -> Status {
      std::error_code ec;
      std::filesystem::create_directories(full, ec);
      if (ec) return errno_status(ec.value(), "cannot create directory", full);
      return Status::ok();
    });
  }

  Result<std::unique_ptr<WritableFile>> create(const std::string& path,
                                               Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return call_within<std::unique_ptr<WritableFile>>(
        deadline, "creating", full, [full]() -> Result<std::unique_ptr<WritableFile>> {
          ZW_ASSIGN_OR_RETURN(internal::File file, internal::File::create(full));
          return std::unique_ptr<WritableFile>(new LocalWritableFile(std::move(file)));
        });
  }

  Result<std::unique_ptr<WritableFile>> create_streamed(const std::string& path,
                                                        Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return call_within<std::unique_ptr<WritableFile>>(
        deadline, "creating", full, [full]() -> Result<std::unique_ptr<WritableFile>> {
          constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
          int fd = ::open(full.c_str(), kFlags | O_DIRECT, 0644);
          const bool direct = fd >= 0;
          if (!direct && errno == EINVAL) {  // tmpfs before Linux 6.6, some FUSE file systems
            internal::note_fallback("checkpoint-direct-write",
                                    "the file system of " + full +
                                        " refuses O_DIRECT; writing through the page cache");
            fd = ::open(full.c_str(), kFlags, 0644);
          }
          if (fd < 0) return errno_status(errno, "cannot create", full);
          return std::unique_ptr<WritableFile>(
              new LocalStreamedFile(internal::File(fd, full), direct));
        });
  }

  Status sync_directory(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return call_within(deadline, "syncing directory", full,
                       [full] { return internal::sync_directory(full); });
  }

  Status publish(const std::string& from, const std::string& to, Deadline deadline,
                 std::string_view /*commit_record: a rename moves a directory whole*/) override {
    ZW_ASSIGN_OR_RETURN(std::string full_from, full_path(from));
    ZW_ASSIGN_OR_RETURN(std::string full_to, full_path(to));
    return call_within(deadline, "publishing", full_to,
                       [full_from, full_to] { return rename_any(full_from, full_to); });
  }

  Result<std::vector<std::string>> list(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return call_within<std::vector<std::string>>(
        deadline, "listing", full, [full]() -> Result<std::vector<std::string>> {
          std::error_code ec;
          std::filesystem::directory_iterator it(full, ec);
          std::vector<std::string> names;
          for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
            names.push_back(it->path().filename().string());
          }
          if (ec) return errno_status(ec.value(), "cannot list directory", full);
          std::sort(names.begin(), names.end());
          return names;
        });
  }

  Result<ObjectStat> stat(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return call_within<ObjectStat>(deadline, "stat of", full, [full]() -> Result<ObjectStat> {
      struct stat st;
      if (::stat(full.c_str(), &st) == 0) {
        const bool dir = S_ISDIR(st.st_mode);
        return ObjectStat{true, dir, dir ? 0 : static_cast<uint64_t>(st.st_size)};
      }
      if (errno == ENOENT || errno == ENOTDIR) return ObjectStat{};
      return errno_status(errno, "cannot stat", full);
    });
  }

  Result<std::string> read(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return call_within<std::string>(deadline, "reading", full, [full]() {
      return internal::read_whole_file<std::string>(full);
    });
  }

  Result<std::unique_ptr<ByteSource>> open(const std::string& path, IoBackend backend,
                                           Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return call_within<std::unique_ptr<ByteSource>>(
        deadline, "opening", full, [full, backend] { return open_file_source(full, backend); });
  }

  Status remove(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    return call_within(deadline, "removing", full, [full]() -> Status {
      if (::unlink(full.c_str()) != 0 && errno != ENOENT) {
        return errno_status(errno, "cannot remove", full);
      }
      return Status::ok();
    });
  }

  Status remove_all(const std::string& path, Deadline deadline,
                    std::string_view commit_record) override {
    // "" would be the root itself: never what a caller cleaning up a step means.
    if (path.empty()) return invalid_argument("refusing to remove the whole of " + describe());
    ZW_ASSIGN_OR_RETURN(std::string full, full_path(path));
    const std::string first = commit_record.empty() ? "" : full + "/" + std::string(commit_record);
    return call_within(deadline, "removing", full, [full, first]() -> Status {
      if (!first.empty() && ::unlink(first.c_str()) != 0 && errno != ENOENT && errno != ENOTDIR) {
        return errno_status(errno, "cannot remove", first);
      }
      std::error_code ec;
      std::filesystem::remove_all(full, ec);
      if (ec) return errno_status(ec.value(), "cannot remove", full);
      return Status::ok();
    });
  }

 private:
  Result<std::string> full_path(const std::string& path) const {
    ZW_RETURN_IF_ERROR(refused_);
    return internal::join_store_path(root_.string(), path);
  }

  std::filesystem::path root_;
  Status refused_;
};

}  // namespace

std::shared_ptr<Store> make_local_store(const std::filesystem::path& root) {
  // A URL is kept as given, not normalised into "<cwd>/s3:/bucket": every operation of the
  // store then refuses it by name.
  if (Status refused = internal::require_local_path(root, "path"); !refused.is_ok()) {
    return std::make_shared<LocalStore>(root, std::move(refused));
  }
  std::filesystem::path absolute = std::filesystem::absolute(root).lexically_normal();
  // "/ckpt/" normalises to "/ckpt/"; messages read better without the trailing separator.
  if (!absolute.has_filename() && absolute.has_relative_path()) absolute = absolute.parent_path();
  return std::make_shared<LocalStore>(std::move(absolute), Status::ok());
}

}  // namespace zerowait
