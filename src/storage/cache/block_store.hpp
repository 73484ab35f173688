// The node-local cache's files and the protocol between the processes that share them
// (docs/cache.md): where a block lives, how it is written and checked, the locks, the shared
// usage ledger, and the directory scan that eviction and start-up use. No policy here: which
// block to evict is block_cache.cpp's choice.
//
//   DIR/layout.json          {"format": "zerowait-block-cache", "version": 1, "block_bytes": N}
//   DIR/lock                 open-file-description (OFD) locks on single bytes: 0 eviction,
//                            1 the ledger, 1024 + h one block; bytes 0..7 hold the ledger (the
//                            cache's bytes on disk, little-endian)
//   DIR/blocks/HH/<object>-<block>.blk   a block: its bytes, then a 32-byte trailer
//   DIR/tmp/                 unnamed (O_TMPFILE) files being filled; named *.tmp only where the
//                            filesystem has no O_TMPFILE
//
// OFD locks belong to an open file description, so they exclude threads of one process that use
// different descriptors as well as other processes, and the kernel drops them when the process
// dies: a killed filler never blocks the block for good.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/file.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait::internal {

// Which object a block belongs to: a 128-bit hash of the origin's name, size and version, as 32
// hex characters.
std::string cache_object_id(const std::string& name, uint64_t size, const std::string& version);

// Bytes after a block's data: magic "ZWBLOCK1", data length, xxh3 of the data, 0.
inline constexpr size_t kBlockTrailerBytes = 32;

// An exclusive lock on one byte of a file, through a descriptor of its own, held until
// destroyed.
class ByteLock {
 public:
  ByteLock() = default;
  ByteLock(ByteLock&&) = default;
  ByteLock& operator=(ByteLock&&) = default;

  // Waits for the lock until `deadline` (polling: OFD locks have no timed wait); kDeadlineExceeded
  // says "waiting for <what>" and names the lock file.
  static Result<ByteLock> acquire(const std::string& path, uint64_t byte, Deadline deadline,
                                  const std::string& what);

 private:
  explicit ByteLock(File file) : file_(std::move(file)) {}
  File file_;  // closing it drops the lock
};

// A block file on disk as a scan found it.
struct BlockFileEntry {
  std::string path;
  std::string name;         // "<object>-<block>.blk"
  uint64_t disk_bytes = 0;  // what removing it frees (allocated blocks)
  int64_t mtime_ns = 0;     // last use (fills and first opens touch it)
};

struct BlockStoreScan {
  std::vector<BlockFileEntry> blocks;
  uint64_t bytes = 0;  // blocks plus named temporary files
  uint64_t stale_temps_removed = 0;
};

// The directory of one cache. Thread-safe.
class BlockStore {
 public:
  // Creates the layout if missing; a layout of another block size is kInvalidArgument.
  static Result<std::unique_ptr<BlockStore>> open(const std::string& directory,
                                                  uint64_t block_bytes);

  const std::string& directory() const { return directory_; }
  std::string block_path(const std::string& object, uint64_t block) const;
  static std::string block_name(const std::string& object, uint64_t block);

  // Locks: each acquire opens the lock file anew, so threads of this process exclude each other.
  Result<ByteLock> lock_block(const std::string& object, uint64_t block, Deadline deadline,
                              const std::string& what) const;
  Result<ByteLock> lock_eviction(Deadline deadline) const;

  // Opens the block file if there is one: kNotFound when there is none. Does not check it.
  Result<File> open_block(const std::string& object, uint64_t block) const;
  // Checks the whole file against its trailer: `expected_bytes` of data, then the trailer with
  // those bytes' checksum. kCorrupt names the file and what is wrong.
  static Status check_block(const File& file, uint64_t expected_bytes);
  // Writes `data` as the block (unnamed temporary file, then linked under its name) and returns
  // it open for reading. kAlreadyExists when the name is taken meanwhile.
  Result<File> publish_block(const std::string& object, uint64_t block,
                             std::span<const std::byte> data) const;
  // Removes a block file; a file already gone is not an error.
  Status remove(const std::string& path) const;

  // The ledger of bytes on disk, shared by all processes: read, add (may be negative) or set.
  Result<uint64_t> ledger() const;
  Result<uint64_t> ledger_add(int64_t delta) const;
  Status ledger_set(uint64_t bytes) const;

  // Lists every block (and removes named temporary files of fills that died): hold the eviction
  // lock.
  Result<BlockStoreScan> scan() const;
  // Free bytes on the cache's filesystem for an unprivileged process.
  Result<uint64_t> free_bytes() const;

 private:
  BlockStore(std::string directory, File lock_file)
      : directory_(std::move(directory)), lock_file_(std::move(lock_file)) {}
  std::string lock_path() const { return directory_ + "/lock"; }
  Result<ByteLock> lock_ledger() const;
  // With the ledger lock held.
  Result<uint64_t> read_ledger_locked() const;
  Status write_ledger_locked(uint64_t value) const;

  std::string directory_;
  mutable File lock_file_;  // reads and writes the ledger's bytes (under the ledger lock)
};

}  // namespace zerowait::internal
