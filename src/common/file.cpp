#include "common/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace zerowait::internal {

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

Result<File> File::open_read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "cannot open", path);
  return File(fd, path);
}

Result<File> File::create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "cannot create", path);
  return File(fd, path);
}

Result<uint64_t> File::size() const {
  struct stat st;
  if (fstat(fd_, &st) != 0) return errno_status(errno, "cannot stat", path_);
  return static_cast<uint64_t>(st.st_size);
}

Status File::pread_exact(uint64_t offset, std::span<std::byte> dst) const {
  size_t done = 0;
  while (done < dst.size()) {
    ssize_t n =
        ::pread(fd_, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, "cannot read", path_, static_cast<long long>(offset + done));
    }
    if (n == 0) return short_read_status(path_, offset + done, dst.size() - done);
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status short_read_status(const std::string& path, uint64_t offset, uint64_t missing) {
  return corrupt("short read of '" + path + "' at offset " + std::to_string(offset) + ": needs " +
                 std::to_string(missing) + " more bytes, the file ends there (truncated?)");
}

Status File::pwrite_all(uint64_t offset, std::span<const std::byte> src, const char* what) {
  size_t done = 0;
  while (done < src.size()) {
    const uint64_t at = offset + done;
    ssize_t n = ::pwrite(fd_, src.data() + done, src.size() - done, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return errno_status(n < 0 ? errno : EIO, what, path_, static_cast<long long>(at));
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status File::write_all(std::span<const std::byte> src) {
  size_t done = 0;
  while (done < src.size()) {
    ssize_t n = ::write(fd_, src.data() + done, src.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      off_t pos = ::lseek(fd_, 0, SEEK_CUR);
      return errno_status(errno, "cannot write", path_, static_cast<long long>(pos));
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Status File::sync() {
  if (::fsync(fd_) != 0) return errno_status(errno, "cannot fsync", path_);
  return Status::ok();
}

Status File::close() {
  if (fd_ < 0) return Status::ok();
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return errno_status(errno, "cannot close", path_);
  return Status::ok();
}

Status sync_directory(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "cannot open directory", dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return errno_status(err, "cannot fsync directory", dir);
  return Status::ok();
}

Status rename_file(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return errno_status(errno, "cannot rename to '" + to + "' from", from);
  }
  return Status::ok();
}

Status write_file_atomic(const std::string& path, std::string_view bytes, bool sync) {
  // pid + a process-wide counter: two threads writing the same path never share a temp file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + kTempSuffix + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  ZW_ASSIGN_OR_RETURN(File file, File::create(tmp));
  Status st = file.write_all(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
  if (st.is_ok() && sync) st = file.sync();
  if (st.is_ok()) st = file.close();
  if (st.is_ok()) st = rename_file(tmp, path);
  if (!st.is_ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  if (sync) return sync_directory(std::filesystem::path(path).parent_path().string());
  return Status::ok();
}

}  // namespace zerowait::internal
