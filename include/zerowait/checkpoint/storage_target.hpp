// Where checkpoints are written and read back: one small interface (create, write, sync, atomic
// publish, list, delete, ranged reads) so a local directory, a mirror directory, memory and an
// S3 bucket are interchangeable under the checkpoint engine. Restore, verification and the
// mirror copy read only through open_for_read(): no reader needs a local path. Paths are relative
// to the target's root and use '/' as separator; they never start with '/' and never contain
// "..".
#pragma once

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait {

// A file being written. Writes may come from several threads at distinct offsets.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all of `bytes` at `offset` (retrying short writes and EINTR).
  virtual Status write_at(uint64_t offset, std::span<const std::byte> bytes) = 0;
  // Asks the OS to start writing back [offset, offset + length) without waiting, so the final
  // sync() has little left to do. A hint: targets without such a call do nothing.
  virtual void start_writeback(uint64_t offset, uint64_t length) = 0;
  // Makes everything written so far durable (fsync).
  virtual Status sync() = 0;
  // Closes the file; its error is reported (a write path must call it).
  virtual Status close() = 0;
};

// A checkpoint storage target. Every operation names the full path in its error. Implementations
// are thread-safe: restore and the mirror copy call them from several threads at once.
class StorageTarget {
 public:
  virtual ~StorageTarget() = default;

  // The root, for messages ("/ckpt", "mirror /nfs/ckpt").
  virtual std::string describe() const = 0;

  // Creates directory `path` (and missing parents); an existing directory is fine.
  virtual Status create_directory(const std::string& path) = 0;
  // Creates (or truncates) file `path` for writing.
  virtual Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) = 0;
  // Makes the entries of directory `path` durable (fsync of the directory; "" is the root).
  virtual Status sync_directory(const std::string& path) = 0;
  // Atomically renames `from` to `to` (a file or a directory). Publishing a directory whose
  // destination exists fails with kAlreadyExists; a file replaces its destination.
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  // The names in directory `path` ("" is the root), sorted; kNotFound if it does not exist.
  virtual Result<std::vector<std::string>> list(const std::string& path) = 0;
  // Whether `path` exists (file or directory).
  virtual Result<bool> exists(const std::string& path) = 0;
  virtual Result<bool> is_directory(const std::string& path) = 0;
  // Reads a whole (small) file: manifests and pointers.
  virtual Result<std::string> read_file(const std::string& path) = 0;
  // The size of file `path`.
  virtual Result<uint64_t> file_size(const std::string& path) = 0;
  // Opens file `path` for ranged reads, each with its deadline (ByteSource::read). `backend` is
  // how a local directory reads it (pread, io_uring, or O_DIRECT with its fallback to the page
  // cache, see open_file_source); other targets read their own way and ignore it. The source's
  // name() is the full path or URL that errors name. It may outlive the target's other calls but
  // not the target.
  virtual Result<std::unique_ptr<ByteSource>> open_for_read(const std::string& path,
                                                            IoBackend backend) = 0;
  // Removes file `path`; a missing file is fine.
  virtual Status remove_file(const std::string& path) = 0;
  // Removes directory `path` and everything in it; a missing directory is fine.
  virtual Status remove_all(const std::string& path) = 0;
};

// A directory on a local (or network-mounted) filesystem. A URL ("s3://bucket/ck") is not one:
// every operation of its target fails with kInvalidArgument naming it (use open_storage_target).
std::shared_ptr<StorageTarget> make_local_directory_target(const std::filesystem::path& root);

// A prefix in an S3 bucket ("s3://bucket/team/ckpt"), with the settings the AWS SDKs read
// (environment, ~/.aws files; docs/remote.md). Files are spooled locally (unnamed temp files) and
// uploaded on sync/close; a directory is published by copying its objects on the server with
// commit records (manifest.json) last, so a step is seen whole or not at all. Not atomic against
// a second writer publishing the same directory at the same moment: give each run its own
// prefix. kInvalidArgument for a URL that is not s3://BUCKET[/PREFIX]; kNotFound when no
// credentials are found.
Result<std::shared_ptr<StorageTarget>> make_s3_target(const std::string& url);

// s3:// URLs to make_s3_target, anything else to make_local_directory_target (which refuses other
// URLs by name).
Result<std::shared_ptr<StorageTarget>> open_storage_target(const std::string& path_or_url);

// A target held in memory, described as "memory:<name>": the contract of an object store (no
// local path, nothing survives the process) for tests and tools. Files are visible while they
// are written, as on a filesystem; sync does nothing.
std::shared_ptr<StorageTarget> make_memory_target(const std::string& name);

// One operation as seen by a FaultInjectingTarget: "mkdir", "create", "write", "writeback",
// "fsync", "close", "fsync-dir", "rename", "list", "exists", "read", "size", "remove",
// "remove-all" with the path it applies to (a rename reads "from -> to").
struct StorageOperation {
  std::string kind;
  std::string path;
  std::string to_string() const { return kind + " " + path; }
};

// What a FaultInjectingTarget does to one read request (a range of one file).
struct ReadFault {
  enum class Kind {
    kNone,       // read it
    kError,      // fail with `error` (kIo "cannot read (injected fault) '<path>' at offset N")
    kShortRead,  // the file seems to end half-way through the request (kCorrupt "short read")
    kStall,      // hang until the read's deadline, then kDeadlineExceeded; a read without a
                 // deadline hangs until release_stalled_reads() or the target is destroyed
    kFlipByte,   // read it, then invert the byte at file offset `flip_offset` if it is inside
  };
  Kind kind = Kind::kNone;
  int error = EIO;
  uint64_t flip_offset = 0;
};

// Wraps another target, records every mutating operation (mkdir, create, write, writeback,
// fsync, close, fsync-dir, rename, remove, remove-all) in order, and fails chosen ones with an
// errno (EIO, ENOSPC, ...) without performing them: how the tests show the commit order and what
// a failure at each step leaves behind. Reads go through a ByteSource that wraps the inner
// target's and applies a ReadFault to chosen requests. Thread-safe.
class FaultInjectingTarget : public StorageTarget {
 public:
  explicit FaultInjectingTarget(std::shared_ptr<StorageTarget> inner);
  ~FaultInjectingTarget() override;

  // Returns the errno to fail `operation` with, or 0 to let it through. Called for every
  // mutating operation, in order, with the lock held (the rule needs no locking of its own).
  using FaultRule = std::function<int(const StorageOperation& operation)>;
  void set_fault_rule(FaultRule rule);
  // The mutating operations performed or failed so far; a failed one is recorded with the
  // kind prefixed "FAILED ".
  std::vector<StorageOperation> operations() const;
  void clear_operations();

  // Returns the fault for reading [offset, offset + length) of file `path` (relative), or
  // kNone. Called for every request of every read, from the reading threads, without a lock
  // held: the rule must be thread-safe.
  using ReadFaultRule =
      std::function<ReadFault(const std::string& path, uint64_t offset, uint64_t length)>;
  void set_read_fault_rule(ReadFaultRule rule);
  // Ends every stalled read at once (kDeadlineExceeded), now and in future: a test's escape
  // hatch for reads without a deadline.
  void release_stalled_reads();

  std::string describe() const override;
  Status create_directory(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override;
  Status sync_directory(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Result<std::vector<std::string>> list(const std::string& path) override;
  Result<bool> exists(const std::string& path) override;
  Result<bool> is_directory(const std::string& path) override;
  Result<std::string> read_file(const std::string& path) override;
  Result<uint64_t> file_size(const std::string& path) override;
  Result<std::unique_ptr<ByteSource>> open_for_read(const std::string& path,
                                                    IoBackend backend) override;
  Status remove_file(const std::string& path) override;
  Status remove_all(const std::string& path) override;

  // Records `operation` and returns the injected error, if any (used by its files too).
  Status record(StorageOperation operation);

  // The read rule and stall release, shared with the sources it opened (defined in the .cpp).
  struct ReadFaults;

 private:
  std::shared_ptr<StorageTarget> inner_;
  mutable std::mutex mutex_;
  FaultRule rule_;
  std::vector<StorageOperation> operations_;
  std::shared_ptr<ReadFaults> read_faults_;
};

}  // namespace zerowait
