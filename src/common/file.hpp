// RAII file descriptors and the few POSIX file operations every component needs, each returning
// a Status that names the path (and offset) on failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// Owns a file descriptor. close() on a write path must be called explicitly so its error is seen;
// the destructor closes silently (a read path, or an abandoned write).
class File {
 public:
  File() = default;
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  File(File&& other) noexcept { *this = std::move(other); }
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  static Result<File> open_read(const std::string& path);
  // O_WRONLY | O_CREAT | O_TRUNC, mode 0644.
  static Result<File> create(const std::string& path);

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

  Result<uint64_t> size() const;
  // Reads exactly dst.size() bytes at `offset` (retrying short reads and EINTR); hitting the end
  // of the file first is kCorrupt "short read".
  Status pread_exact(uint64_t offset, std::span<std::byte> dst) const;
  // Writes all of `src` at the current position.
  Status write_all(std::span<const std::byte> src);
  // Writes all of `src` at `offset` (retrying short writes and EINTR; a write that takes no
  // bytes is an I/O error, not a loop). `what` starts the error message ("cannot write").
  Status pwrite_all(uint64_t offset, std::span<const std::byte> src,
                    const char* what = "cannot write");
  Status sync();
  Status close();

 private:
  int fd_ = -1;
  std::string path_;
};

// kCorrupt "short read of '<path>' at offset N: needs M more bytes, the file ends there": what
// every reader says when a file ends before a range it was asked for.
Status short_read_status(const std::string& path, uint64_t offset, uint64_t missing);

// Reads a whole file into a std::string (text) or a ByteBuffer (data, not zero-filled first).
template <typename Buffer = std::string>
Result<Buffer> read_whole_file(const std::string& path) {
  ZW_ASSIGN_OR_RETURN(File file, File::open_read(path));
  ZW_ASSIGN_OR_RETURN(uint64_t size, file.size());
  Buffer bytes;
  bytes.resize(size);
  ZW_RETURN_IF_ERROR(
      file.pread_exact(0, std::span<std::byte>(reinterpret_cast<std::byte*>(bytes.data()), size)));
  return bytes;
}
// The suffix of a file or directory written under a temporary name and then renamed into place
// ("step-5.tmp", "latest.tmp"): one spelling, so the readers, gc and `ckpt ls` that look for
// leftovers recognise what a writer leaves behind.
inline constexpr char kTempSuffix[] = ".tmp";

// Writes `path` atomically: a unique "<path>.tmp.<pid>.<n>", fsync (if `sync`), rename, fsync the
// directory.
Status write_file_atomic(const std::string& path, std::string_view bytes, bool sync = true);
// fsyncs a directory so renames inside it are durable.
Status sync_directory(const std::string& dir);
Status rename_file(const std::string& from, const std::string& to);

}  // namespace zerowait::internal
