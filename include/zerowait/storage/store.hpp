// Where named objects are written and read back: one interface for a local directory (or an NFS
// mount), an S3 prefix, memory and a fault-injecting wrapper, so pack, merge, the dataset writer
// and the checkpoint engine never know which one they write to. ByteSource is its read half.
//
// Names are relative to the store's root and use '/' as separator; they never start with '/' and
// never contain "..". Every call takes a Deadline, metadata included: a call that has not
// finished when it passes returns kDeadlineExceeded naming the object (a local call stuck in the
// kernel is left to finish on its own, so a mutation may still happen afterwards). Every error
// names the full path or URL. Implementations are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait {

// An object being written (streamed; a driver with multipart uploads uses them). Writes may come
// from several threads at distinct offsets. Every call takes a deadline, as the Store's do: a call
// that has not finished when it passes returns kDeadlineExceeded naming the object, and the file
// is then fit only to be dropped (a local call stuck in the kernel finishes on its own, so it may
// still write, from `bytes`, later). write_deadline() is the default for a caller with none.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all of `bytes` at `offset` (retrying short writes and EINTR) within `deadline`.
  virtual Status write_at(uint64_t offset, std::span<const std::byte> bytes,
                          Deadline deadline) = 0;
  // Asks the OS to start writing back [offset, offset + length) without waiting, so the final
  // sync() has little left to do. A hint: stores without such a call do nothing, and one that
  // does not return by `deadline` is left to finish (its failure shows at sync()).
  virtual void start_writeback(uint64_t offset, uint64_t length, Deadline deadline) = 0;
  // Makes everything written so far durable within `deadline` (fsync; an object store uploads
  // the whole object, so its deadline must allow for the transfer).
  virtual Status sync(Deadline deadline) = 0;
  // Closes the file within `deadline`; its error is reported (a write path must call it). An
  // object store uploads here what sync() has not.
  virtual Status close(Deadline deadline) = 0;
};

// What stat() knows of a name.
struct ObjectStat {
  bool exists = false;
  bool is_directory = false;  // a directory, or a prefix with objects under it
  uint64_t size = 0;          // of an object; 0 for a directory
};

// What a store's namespace is like, for a caller that lays out many objects (pack, merge).
struct StoreTraits {
  // publish() is a rename(2): a file can be written under a temporary name and renamed into
  // place for nothing. False on an object store, where publish copies every byte on the server:
  // write the final name directly and let a commit record (a manifest) decide what counts.
  bool cheap_publish = true;
  // The store serves a bounded request rate per key prefix (about 5,500 GET/s in AWS S3), so
  // objects that many readers fetch at once belong under distinct prefixes.
  bool rate_limited_per_prefix = false;
};

class Store {
 public:
  virtual ~Store() = default;

  virtual StoreTraits traits() const { return {}; }

  // The root, for messages ("/ckpt", "s3://bucket/ckpt", "memory:test").
  virtual std::string describe() const = 0;

  // Object `path` as a file of this machine's file system, for a caller that maps it into
  // memory instead of reading it (Checkpointer.load(mmap=True)); nullopt where objects are not
  // local files, or where every read must go through the store (fault injection).
  virtual std::optional<std::string> local_file(const std::string& path) const {
    (void)path;
    return std::nullopt;
  }

  // Creates directory `path` (and missing parents); an existing one is fine. Object stores have
  // no directories: a name exists once an object lies under it.
  virtual Status make_directory(const std::string& path, Deadline deadline) = 0;
  // Creates (or truncates) object `path` for a streamed write.
  virtual Result<std::unique_ptr<WritableFile>> create(const std::string& path,
                                                       Deadline deadline) = 0;
  // create() for a large object written once, front to back from one thread, that this process
  // will not read back soon (a checkpoint's tensor files): a store that can keeps it out of its
  // cache. A local file is written with O_DIRECT through an aligned buffer (its bytes reach the
  // file as the buffer fills, the rest at sync() and close()); other stores create() it.
  virtual Result<std::unique_ptr<WritableFile>> create_streamed(const std::string& path,
                                                                Deadline deadline) {
    return create(path, deadline);
  }
  // Makes the entries of directory `path` durable (fsync of the directory; "" is the root).
  virtual Status sync_directory(const std::string& path, Deadline deadline) = 0;
  // Atomically makes `from` (an object or a directory) appear as `to`: a rename(2) on a local
  // filesystem and nothing more (the caller that needs the rename to survive a crash calls
  // sync_directory on `to`'s directory afterwards), a server-side copy on an object store. A directory never replaces an existing
  // one (kAlreadyExists); an object replaces its destination. `commit_record` names the object
  // inside a directory that must appear last (a reader that sees it sees the whole directory);
  // an object store copies it after every other one.
  virtual Status publish(const std::string& from, const std::string& to, Deadline deadline,
                         std::string_view commit_record = {}) = 0;
  // The names in directory `path` ("" is the root), sorted; kNotFound if it does not exist.
  virtual Result<std::vector<std::string>> list(const std::string& path, Deadline deadline) = 0;
  // Whether `path` exists, whether it is a directory, and its size.
  virtual Result<ObjectStat> stat(const std::string& path, Deadline deadline) = 0;
  // Reads a whole (small) object: manifests and pointers.
  virtual Result<std::string> read(const std::string& path, Deadline deadline) = 0;
  // Opens object `path` for ranged reads, each with its own deadline (ByteSource::read).
  // `backend` is how a local directory reads it (open_file_source); other stores read their own
  // way. The source's name() is the full path or URL. It may outlive the store's other calls but
  // not the store.
  virtual Result<std::unique_ptr<ByteSource>> open(const std::string& path, IoBackend backend,
                                                   Deadline deadline) = 0;
  // Removes object `path`; a missing one is fine.
  virtual Status remove(const std::string& path, Deadline deadline) = 0;
  // Removes directory `path` and everything in it, `commit_record` first (so that what is left
  // of a half-removed directory no longer counts); a missing directory is fine.
  virtual Status remove_all(const std::string& path, Deadline deadline,
                            std::string_view commit_record = {}) = 0;

  // Shorthands over the calls above.
  Result<bool> exists(const std::string& path, Deadline deadline);
  Result<bool> is_directory(const std::string& path, Deadline deadline);
  // The size of object `path`; kNotFound when it does not exist, an error for a directory.
  Result<uint64_t> size(const std::string& path, Deadline deadline);
  // Writes `bytes` as object `path` whole: create, write, sync, close.
  Status put(const std::string& path, std::span<const std::byte> bytes, Deadline deadline);
};

// A directory on a local (or network-mounted) filesystem. A URL is not one: every call of the
// store fails with kInvalidArgument naming it (open_store, storage/open.hpp, serves URLs).
std::shared_ptr<Store> make_local_store(const std::filesystem::path& root);

// The time a metadata call (stat, list, mkdir, a small read or publish) gets when its caller has
// no deadline of its own: long enough for any working storage, short enough that a hung mount is
// reported rather than waited on forever.
inline constexpr std::chrono::seconds kDefaultMetadataTimeout{120};
inline Deadline metadata_deadline() { return Deadline::after(kDefaultMetadataTimeout); }

// The time each call on a WritableFile (a write, a writeback hint, a sync, a close) gets when its
// caller has no deadline of its own. sync() and close() upload a whole object to an object
// store, so it allows for a 1 GiB file at under 2 MB/s; a hung mount is still reported, not
// waited on forever.
inline constexpr std::chrono::seconds kDefaultWriteTimeout{600};
inline Deadline write_deadline() { return Deadline::after(kDefaultWriteTimeout); }

}  // namespace zerowait
