// The file-backed ByteSources, one file each (byte_source.cpp: pread and mmap,
// io_uring_source.cpp, direct_source.cpp), and the checks and messages they share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/file.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait::internal {

// kCorrupt "short read" when `r` reaches past `size`: the caller's index is wrong, which for a
// file means it was truncated or the index is corrupt.
Status check_range(const std::string& name, uint64_t size, const ReadRequest& r);
// kDeadlineExceeded "deadline passed while reading '<name>' at offset N (M requests unfinished)",
// where N is the offset of the first unfinished request.
Status deadline_status(const std::string& name, uint64_t offset, size_t unfinished);

// A file read through the page cache: the pread and io_uring sources. Its hints go to the page
// cache (posix_fadvise).
class CachedFileSource : public ByteSource {
 public:
  CachedFileSource(File file, uint64_t size) : file_(std::move(file)), size_(size) {}
  const std::string& name() const override { return file_.path(); }
  uint64_t size() const override { return size_; }
  void advise_sequential() override;
  void prefetch(uint64_t offset, uint64_t length) override;

 protected:
  const File& file() const { return file_; }

 private:
  File file_;
  uint64_t size_;
};

// Requires io_uring_available().
std::unique_ptr<ByteSource> make_io_uring_source(File file, uint64_t size);
// Reads through the page cache with the engine resolve_auto_io_backend() picks.
std::unique_ptr<ByteSource> make_buffered_source(File file, uint64_t size);
// The kDirect source; on a filesystem without O_DIRECT, make_buffered_source (noted).
Result<std::unique_ptr<ByteSource>> open_direct_source(const std::string& path);
// Opens `path` read-only with O_DIRECT; on a filesystem that refuses it (EINVAL), without it,
// noting the fallback once ("direct") and counting it. `*direct` says which.
Result<File> open_direct_or_buffered(const std::string& path, bool* direct);

// Tests: while `err` is not 0, opening with O_DIRECT fails with it, the way it does on a
// filesystem without O_DIRECT (tmpfs before Linux 6.6, FUSE without direct_io, ...).
void fail_direct_open_for_testing(int err);

}  // namespace zerowait::internal
