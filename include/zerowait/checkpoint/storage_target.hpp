// Where checkpoints are written: one small interface (create, write, sync, atomic publish, list,
// delete) so a local directory, a mirror directory and, later, an object store are
// interchangeable under the checkpoint engine. Paths are relative to the target's root and use
// '/' as separator; they never start with '/' and never contain "..".
#pragma once

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

// A checkpoint storage target. Every operation names the full path in its error.
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
  // Removes file `path`; a missing file is fine.
  virtual Status remove_file(const std::string& path) = 0;
  // Removes directory `path` and everything in it; a missing directory is fine.
  virtual Status remove_all(const std::string& path) = 0;

  // The local filesystem path of `path` when the target is a local directory, so bulk reads
  // can use O_DIRECT and io_uring; nullopt for remote targets.
  virtual std::optional<std::filesystem::path> local_path(const std::string& path) const = 0;
};

// A directory on a local (or network-mounted) filesystem.
std::shared_ptr<StorageTarget> make_local_directory_target(const std::filesystem::path& root);

// One operation as seen by a FaultInjectingTarget: "mkdir", "create", "write", "writeback",
// "fsync", "close", "fsync-dir", "rename", "list", "exists", "read", "size", "remove",
// "remove-all" with the path it applies to (a rename reads "from -> to").
struct StorageOperation {
  std::string kind;
  std::string path;
  std::string to_string() const { return kind + " " + path; }
};

// Wraps another target, records every mutating operation (mkdir, create, write, writeback,
// fsync, close, fsync-dir, rename, remove, remove-all) in order, and fails chosen ones with an
// errno (EIO, ENOSPC, ...) without performing them: how the tests show the commit order and what
// a failure at each step leaves behind.
class FaultInjectingTarget : public StorageTarget {
 public:
  explicit FaultInjectingTarget(std::shared_ptr<StorageTarget> inner);

  // Returns the errno to fail `operation` with, or 0 to let it through. Called for every
  // mutating operation, in order, with the lock held (the rule needs no locking of its own).
  using FaultRule = std::function<int(const StorageOperation& operation)>;
  void set_fault_rule(FaultRule rule);
  // The mutating operations performed or failed so far; a failed one is recorded with the
  // kind prefixed "FAILED ".
  std::vector<StorageOperation> operations() const;
  void clear_operations();

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
  Status remove_file(const std::string& path) override;
  Status remove_all(const std::string& path) override;
  std::optional<std::filesystem::path> local_path(const std::string& path) const override;

  // Records `operation` and returns the injected error, if any (used by its files too).
  Status record(StorageOperation operation);

 private:
  std::shared_ptr<StorageTarget> inner_;
  mutable std::mutex mutex_;
  FaultRule rule_;
  std::vector<StorageOperation> operations_;
};

}  // namespace zerowait
