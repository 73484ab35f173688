#include "shard/pack/s3_pack_output.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <unordered_set>

#include "common/file.hpp"
#include "common/xxhash.hpp"
#include "storage/remote_object.hpp"
#include "storage/s3/s3_upload.hpp"
#include "zerowait/shard/format.hpp"

namespace zerowait::internal {
namespace {

using namespace std::chrono_literals;

// Small requests (list, delete, the manifest) and shard uploads; the HTTP client's stall timeout
// ends an upload that stops moving long before the latter.
constexpr auto kRequestTimeout = 60s;
constexpr auto kShardUploadTimeout = 30min;
// 65,536 prefixes: far more request rate than any reader fleet needs, and short keys.
constexpr int kHashDigits = 4;

Deadline request_deadline() { return Deadline::after(kRequestTimeout); }

bool is_hex(std::string_view text) {
  return text.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// A path a pack writes shards to below its prefix: "shard-N.zws" (a local pack uploaded as it
// is) or "3f2a/shard-N.zws".
bool is_packed_shard_path(std::string_view path) {
  const size_t slash = path.find('/');
  if (slash != std::string_view::npos) {
    if (slash != kHashDigits || !is_hex(path.substr(0, slash))) return false;
    path.remove_prefix(slash + 1);
  }
  return path.starts_with("shard-") && path.ends_with(format::kShardExtension) &&
         path.find('/') == std::string_view::npos;
}

// s3://BUCKET/PREFIX as bucket and prefix, the prefix without a trailing '/'.
Result<S3Location> parse_prefix_url(const std::string& url) {
  ZW_ASSIGN_OR_RETURN(S3Location at, parse_s3_url(url));
  while (at.key.ends_with('/')) at.key.pop_back();
  return at;
}

std::string prefix_url(const S3Location& at) {
  return "s3://" + at.bucket + (at.key.empty() ? "" : "/" + at.key);
}

}  // namespace

std::string hashed_shard_path(const std::string& name) {
  char prefix[16];
  std::snprintf(
      prefix, sizeof prefix, "%0*x", kHashDigits,
      static_cast<unsigned>(XXH3_64bits(name.data(), name.size()) >> (64 - 4 * kHashDigits)));
  return std::string(prefix) + "/" + name;
}

Result<std::unique_ptr<S3PackOutput>> S3PackOutput::open(const std::string& url,
                                                         const std::string& tmp_dir,
                                                         bool overwrite,
                                                         const std::string& merged_url) {
  ZW_ASSIGN_OR_RETURN(S3Location root, parse_prefix_url(url));
  const std::string where = prefix_url(root);
  const std::string context = "cannot pack to " + where;
  auto client = default_s3_client();
  if (!client.is_ok()) return client.status().with_context(context);

  // A listing, not a HEAD: a HEAD of a key in a missing bucket is a bare 404, while a listing
  // says NoSuchBucket, and a wrong key or secret is refused here, before anything is packed.
  auto claim = [&](const S3Location& at) -> Status {
    const std::string manifest_key = (at.key.empty() ? "" : at.key + "/") + format::kManifestName;
    ZW_ASSIGN_OR_RETURN(auto listed, (*client)->list(at.bucket, manifest_key, request_deadline()));
    for (const S3Object& object : listed) {
      if (object.key != manifest_key) continue;
      if (!overwrite) {
        return Status(ErrorCode::kAlreadyExists,
                      "'" + prefix_url(at) + "' already holds a dataset (s3://" + at.bucket +
                          "/" + manifest_key +
                          "): pass --overwrite to replace it, or choose another prefix");
      }
      ZW_RETURN_IF_ERROR((*client)->remove(at.bucket, manifest_key, request_deadline()));
    }
    return Status::ok();
  };
  ZW_RETURN_IF_ERROR(claim(root).with_context(context));
  if (!merged_url.empty()) {
    ZW_ASSIGN_OR_RETURN(S3Location merged, parse_prefix_url(merged_url));
    ZW_RETURN_IF_ERROR(claim(merged).with_context(context));
  }

  std::error_code ec;
  const std::string tmp =
      tmp_dir.empty() ? std::filesystem::temp_directory_path(ec).string() : tmp_dir;
  if (ec) return errno_status(ec.value(), "cannot find a temporary directory ($TMPDIR)", tmp);
  std::string spool_dir = tmp + "/zerowait-pack-XXXXXX";
  if (::mkdtemp(spool_dir.data()) == nullptr) {
    return errno_status(errno,
                        "cannot make a directory for shards on their way to " + where +
                            " (--tmp or $TMPDIR chooses where) in",
                        tmp);
  }
  return std::unique_ptr<S3PackOutput>(
      new S3PackOutput(std::move(*client), std::move(root), std::move(spool_dir)));
}

S3PackOutput::S3PackOutput(std::shared_ptr<S3Client> client, S3Location root, std::string spool_dir)
    : client_(std::move(client)),
      bucket_(std::move(root.bucket)),
      prefix_(std::move(root.key)),
      spool_dir_(std::move(spool_dir)) {}

S3PackOutput::~S3PackOutput() {
  (void)wait_for_upload();  // an error here was either returned already or is moot
  std::error_code ec;
  std::filesystem::remove_all(spool_dir_, ec);
}

std::string S3PackOutput::key_of(const std::string& name) const {
  return prefix_.empty() ? name : prefix_ + "/" + name;
}

std::string S3PackOutput::location(const std::string& name) const {
  return "s3://" + bucket_ + "/" + key_of(name);
}

std::string S3PackOutput::spool_path(const std::string& name) {
  return spool_dir_ + "/" + name + ".partial";
}

Status S3PackOutput::wait_for_upload() {
  if (upload_.joinable()) upload_.join();
  return upload_status_;
}

Result<std::string> S3PackOutput::publish(const std::string& spool, const std::string& name) {
  // At most one shard uploads while the next is written: local disk holds two shards at most.
  ZW_RETURN_IF_ERROR(wait_for_upload());
  ZW_ASSIGN_OR_RETURN(File file, File::open_read(spool));
  ZW_ASSIGN_OR_RETURN(uint64_t size, file.size());
  // The open descriptor keeps the bytes until the upload is done; without a name, nothing is
  // left behind in the spool directory if the process dies.
  if (::unlink(spool.c_str()) != 0) return errno_status(errno, "cannot remove", spool);
  const std::string path = hashed_shard_path(name);
  upload_ = std::thread([this, file = std::move(file), size, key = key_of(path)] {
    upload_status_ = upload_file_to_s3(*client_, bucket_, key, file.fd(), size,
                                       Deadline::after(kShardUploadTimeout));
  });
  return path;
}

Status S3PackOutput::finish() { return wait_for_upload(); }

Status S3PackOutput::put_file(const std::string& name, std::string_view text) {
  return client_->put(bucket_, key_of(name), text, request_deadline());
}

void S3PackOutput::remove_stale_shards(const std::vector<ManifestShard>& kept) {
  const std::string below = prefix_.empty() ? "" : prefix_ + "/";
  auto objects = client_->list(bucket_, below, request_deadline());
  if (!objects.is_ok()) return;
  std::unordered_set<std::string> keep;
  for (const ManifestShard& s : kept) keep.insert(s.path);
  for (const S3Object& object : *objects) {
    const std::string path = object.key.substr(below.size());
    if (is_packed_shard_path(path) && !keep.count(path)) {
      (void)client_->remove(bucket_, object.key, request_deadline());
    }
  }
}

}  // namespace zerowait::internal
