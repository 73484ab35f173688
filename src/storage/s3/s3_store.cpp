// A Store in an S3 bucket (s3://BUCKET/PREFIX): the create / write / publish / list / read
// contract on objects.
//
// An object store has no directories, no writes at offsets and no rename, so:
// - A file is written into a spool file of this process (O_TMPFILE under $TMPDIR: no name, so
//   nothing outlives a crash) at any offsets and from any threads, and uploaded by sync() or
//   close(): one PUT, or a multipart upload with parts in parallel from 64 MiB. Every request
//   carries the SHA-256 of its payload (SigV4), which the server checks.
// - A directory exists while a key lies under its prefix; creating one does nothing.
// - publish copies each object on the server (CopyObject, up to 5 GiB an object) and then deletes
//   the source. A directory's commit record (the name the caller gives) is copied last and
//   deleted first, so a reader that goes by it sees the directory either whole or not at all.
//   Unlike a rename(2), two writers publishing the same new directory at once are not refused
//   atomically; each run therefore needs its own prefix (as it needs its own directory).
#include "storage/s3/s3_store.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <set>

#include "common/file.hpp"
#include "storage/s3/s3_source.hpp"
#include "storage/s3/s3_upload.hpp"
#include "storage/store_path.hpp"

namespace zerowait {
namespace {

using internal::File;
using internal::S3Client;
using internal::S3Location;
using namespace std::chrono_literals;

constexpr uint64_t kMaxCopyBytes = 5ull << 30;  // S3's limit for one CopyObject

class S3WritableFile final : public WritableFile {
 public:
  S3WritableFile(std::shared_ptr<S3Client> client, std::string bucket, std::string key, File spool)
      : client_(std::move(client)),
        bucket_(std::move(bucket)),
        key_(std::move(key)),
        spool_(std::move(spool)) {}

  // The spool is a local file of this process's own ($TMPDIR), not the storage the deadline
  // guards: a write to it is only refused once the deadline has passed.
  Status write_at(uint64_t offset, std::span<const std::byte> bytes, Deadline deadline) override {
    if (deadline.passed()) {
      return Status(ErrorCode::kDeadlineExceeded, "writing at offset " + std::to_string(offset) +
                                                      " of " + url() + ": its deadline had passed");
    }
    ZW_RETURN_IF_ERROR(spool_.pwrite_all(offset, bytes, "cannot spool"));
    std::lock_guard<std::mutex> lock(mutex_);
    size_ = std::max<uint64_t>(size_, offset + bytes.size());
    uploaded_ = false;
    return Status::ok();
  }
  void start_writeback(uint64_t, uint64_t, Deadline) override {}
  // The upload, one PUT or a multipart one, within `deadline`; a multipart upload that fails
  // (a part that fails on every retry, or the deadline) is aborted, leaving no parts behind.
  Status sync(Deadline deadline) override { return upload(deadline); }
  Status close(Deadline deadline) override {
    Status status = upload(deadline);
    Status closed = spool_.close();
    return status.is_ok() ? closed : status;
  }

 private:
  std::string url() const { return "s3://" + bucket_ + "/" + key_; }

  Status upload(Deadline deadline) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (uploaded_) return Status::ok();
    Status status =
        internal::upload_file_to_s3(*client_, bucket_, key_, spool_.fd(), size_, deadline);
    uploaded_ = status.is_ok();
    return status;
  }

  std::shared_ptr<S3Client> client_;
  std::string bucket_;
  std::string key_;
  File spool_;
  std::mutex mutex_;
  uint64_t size_ = 0;
  bool uploaded_ = false;
};

class S3Store final : public Store {
 public:
  S3Store(std::shared_ptr<S3Client> client, S3Location root, std::string spool_dir)
      : client_(std::move(client)),
        bucket_(std::move(root.bucket)),
        prefix_(std::move(root.key)),
        spool_dir_(std::move(spool_dir)) {
    while (prefix_.ends_with('/')) prefix_.pop_back();
  }

  StoreTraits traits() const override {
    return {.cheap_publish = false, .rate_limited_per_prefix = true};
  }

  std::string describe() const override {
    return "s3://" + bucket_ + (prefix_.empty() ? "" : "/" + prefix_);
  }

  Status make_directory(const std::string& path, Deadline) override {
    return key_of(path).status();
  }

  Result<std::unique_ptr<WritableFile>> create(const std::string& path, Deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string key, key_of(path));
    std::error_code ec;
    const std::string spool_dir =
        spool_dir_.empty() ? std::filesystem::temp_directory_path(ec).string() : spool_dir_;
    if (ec) return errno_status(ec.value(), "cannot find a temporary directory ($TMPDIR)", "");
    const int fd = ::open(spool_dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      return errno_status(errno,
                          "cannot make a spool file for " + url(key) +
                              " (--tmp or $TMPDIR chooses where) in",
                          spool_dir);
    }
    return std::unique_ptr<WritableFile>(std::make_unique<S3WritableFile>(
        client_, bucket_, key, File(fd, spool_dir + " (spool of " + url(key) + ")")));
  }

  Status sync_directory(const std::string& path, Deadline) override {
    return key_of(path).status();
  }

  Status publish(const std::string& from, const std::string& to, Deadline deadline,
                 std::string_view commit_record) override {
    ZW_ASSIGN_OR_RETURN(std::string from_key, key_of(from));
    ZW_ASSIGN_OR_RETURN(std::string to_key, key_of(to));
    auto file = client_->head(bucket_, from_key, deadline);
    if (file.is_ok()) {
      ZW_RETURN_IF_ERROR(copy_object(*file, to_key, deadline));
      return client_->remove(bucket_, from_key, deadline);
    }
    if (file.status().code() != ErrorCode::kNotFound) return file.status();
    ZW_ASSIGN_OR_RETURN(auto objects, client_->list(bucket_, from_key + "/", deadline));
    if (objects.empty()) {
      return not_found("cannot rename '" + url(from_key) + "' to '" + url(to_key) +
                       "': it does not exist");
    }
    ZW_ASSIGN_OR_RETURN(auto there, client_->list(bucket_, to_key + "/", deadline, 1));
    if (!there.empty()) {
      return Status(ErrorCode::kAlreadyExists,
                    "cannot publish '" + url(from_key) + "' as '" + url(to_key) + "': it exists");
    }
    for (const internal::S3Object& object : commit_records_last(objects, commit_record)) {
      ZW_RETURN_IF_ERROR(
          copy_object(object, to_key + "/" + object.key.substr(from_key.size() + 1), deadline));
    }
    return remove_objects(objects, commit_record, deadline);
  }

  Result<std::vector<std::string>> list(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string key, key_of(path));
    const std::string prefix = key.empty() ? "" : key + "/";
    ZW_ASSIGN_OR_RETURN(auto objects, client_->list(bucket_, prefix, deadline));
    if (objects.empty() && !path.empty()) {
      return not_found("cannot list '" + url(key) + "': no object lies under it");
    }
    std::set<std::string> names;
    for (const internal::S3Object& object : objects) {
      const std::string rest = object.key.substr(prefix.size());
      names.insert(rest.substr(0, rest.find('/')));
    }
    return std::vector<std::string>(names.begin(), names.end());
  }

  Result<ObjectStat> stat(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string key, key_of(path));
    // The root: objects appear under it as they are written.
    if (path.empty()) return ObjectStat{true, true, 0};
    auto file = client_->head(bucket_, key, deadline);
    if (file.is_ok()) return ObjectStat{true, false, file->size};
    if (file.status().code() != ErrorCode::kNotFound) return file.status();
    ZW_ASSIGN_OR_RETURN(auto objects, client_->list(bucket_, key + "/", deadline, 1));
    return objects.empty() ? ObjectStat{} : ObjectStat{true, true, 0};
  }

  Result<std::string> read(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string key, key_of(path));
    return client_->get(bucket_, key, deadline);
  }

  Result<std::unique_ptr<ByteSource>> open(const std::string& path, IoBackend,
                                           Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string key, key_of(path));
    return internal::open_s3_source(client_, S3Location{bucket_, key}, deadline);
  }

  Status remove(const std::string& path, Deadline deadline) override {
    ZW_ASSIGN_OR_RETURN(std::string key, key_of(path));
    Status removed = client_->remove(bucket_, key, deadline);
    return removed.code() == ErrorCode::kNotFound ? Status::ok() : removed;
  }

  Status remove_all(const std::string& path, Deadline deadline,
                    std::string_view commit_record) override {
    ZW_ASSIGN_OR_RETURN(std::string key, key_of(path));
    if (path.empty()) return invalid_argument("refusing to remove the whole of " + describe());
    ZW_ASSIGN_OR_RETURN(auto objects, client_->list(bucket_, key + "/", deadline));
    return remove_objects(std::move(objects), commit_record, deadline);
  }

 private:
  // The key of `path`: the prefix joined with it, refused (kInvalidArgument) when it would leave
  // the prefix (absolute, or with a ".." component), as on a local directory.
  Result<std::string> key_of(const std::string& path) const {
    ZW_RETURN_IF_ERROR(internal::join_store_path(describe(), path).status());
    if (prefix_.empty()) return path;
    return path.empty() ? prefix_ : prefix_ + "/" + path;
  }
  std::string url(const std::string& key) const { return "s3://" + bucket_ + "/" + key; }

  static bool is_commit_record(const internal::S3Object& object, std::string_view record) {
    return !record.empty() && object.key.ends_with("/" + std::string(record));
  }
  static std::vector<internal::S3Object> commit_records_last(
      std::vector<internal::S3Object> objects, std::string_view record) {
    std::stable_partition(objects.begin(), objects.end(), [&](const internal::S3Object& o) {
      return !is_commit_record(o, record);
    });
    return objects;
  }

  Status copy_object(const internal::S3Object& object, const std::string& to_key,
                     Deadline deadline) {
    if (object.size > kMaxCopyBytes) {
      return unsupported("cannot move " + url(object.key) + " (" + std::to_string(object.size) +
                         " bytes): S3 copies at most 5 GiB in one request; keep the objects "
                         "smaller (a checkpoint's max_file_bytes)");
    }
    return client_->copy(bucket_, object.key, to_key, deadline);
  }

  // Commit records first, so that a directory stops counting before any of its objects go.
  Status remove_objects(std::vector<internal::S3Object> objects, std::string_view record,
                        Deadline deadline) {
    std::stable_partition(objects.begin(), objects.end(),
                          [&](const internal::S3Object& o) { return is_commit_record(o, record); });
    for (const internal::S3Object& object : objects) {
      Status removed = client_->remove(bucket_, object.key, deadline);
      if (!removed.is_ok() && removed.code() != ErrorCode::kNotFound) return removed;
    }
    return Status::ok();
  }

  std::shared_ptr<S3Client> client_;
  std::string bucket_;
  std::string prefix_;
  std::string spool_dir_;  // empty: $TMPDIR, else /tmp
};

}  // namespace

namespace internal {

Result<std::shared_ptr<Store>> open_s3_store(const std::string& url, const std::string& spool_dir) {
  ZW_ASSIGN_OR_RETURN(S3Location root, parse_s3_url(url));
  ZW_ASSIGN_OR_RETURN(auto client, default_s3_client());
  return std::shared_ptr<Store>(std::make_shared<S3Store>(client, std::move(root), spool_dir));
}

}  // namespace internal

}  // namespace zerowait
