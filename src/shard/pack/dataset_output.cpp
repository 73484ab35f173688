#include "shard/pack/dataset_output.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "common/xxhash.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/storage/fault_store.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait::internal {
namespace {

// 65,536 prefixes: far more request rate than any reader fleet needs, and short keys.
constexpr int kHashDigits = 4;

std::span<const std::byte> as_bytes(std::string_view text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

bool is_shard_name(std::string_view name) {
  return name.starts_with("shard-") && name.ends_with(format::kShardExtension);
}

bool is_hash_prefix(std::string_view name) {
  return name.size() == kHashDigits &&
         name.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// `dir`/`name` in a store, where "" is the root.
std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

// A shard's object while it is written, with close() handed to DatasetOutput::close_in_background:
// on an object store close() is the upload, which then overlaps the writing of the next shard.
class BackgroundClose final : public WritableFile {
 public:
  BackgroundClose(std::unique_ptr<WritableFile> inner, DatasetOutput& output)
      : inner_(std::move(inner)), output_(output) {}

  Status write_at(uint64_t offset, std::span<const std::byte> bytes, Deadline deadline) override {
    return inner_->write_at(offset, bytes, deadline);
  }
  void start_writeback(uint64_t offset, uint64_t length, Deadline deadline) override {
    inner_->start_writeback(offset, length, deadline);
  }
  Status sync(Deadline deadline) override { return inner_->sync(deadline); }
  // The upload keeps the deadline the writer gave it, though it runs after this returns.
  Status close(Deadline deadline) override {
    return output_.close_in_background(std::move(inner_), deadline);
  }

 private:
  std::unique_ptr<WritableFile> inner_;
  DatasetOutput& output_;
};

// The text of quarantine.json.
std::string quarantine_json(const std::vector<QuarantineEntry>& entries) {
  nlohmann::ordered_json j;
  j["count"] = entries.size();
  j["entries"] = nlohmann::ordered_json::array();
  for (const auto& q : entries) j["entries"].push_back({{"path", q.path}, {"reason", q.reason}});
  return j.dump(1) + "\n";
}

// "ROOT" or "ROOT/dir": where directory `dir` below `root` (the output as the user gave it)
// is, for messages and the report.
std::string where(const std::string& root, const std::string& dir) {
  return dir.empty() ? root : root + "/" + dir;
}

// Makes directory `dir` of `store` ready: created if missing; an existing dataset is refused
// unless overwriting, in which case its manifest goes first so no reader ever sees it pointing at
// new shards. A part runs this on the merged directory too, for a manifest there lists the
// part's shards.
Status prepare_directory(Store& store, const std::string& root, const std::string& dir,
                         bool overwrite, bool sync) {
  ZW_RETURN_IF_ERROR(store.make_directory(dir, metadata_deadline()));
  // A listing, not a stat: on an object store a HEAD of a key in a missing bucket is a bare 404,
  // while a listing says NoSuchBucket, and a wrong key or secret is refused here, before anything
  // is packed. A part's directory that does not exist yet is not listed (kNotFound); the root,
  // listed first, reports a missing bucket.
  auto names = store.list(dir, metadata_deadline());
  if (!names.is_ok()) {
    return !dir.empty() && names.status().code() == ErrorCode::kNotFound ? Status::ok()
                                                                         : names.status();
  }
  if (std::find(names->begin(), names->end(), format::kManifestName) == names->end()) {
    return Status::ok();
  }
  const std::string at = where(root, dir);
  if (!overwrite) {
    return Status(ErrorCode::kAlreadyExists,
                  "'" + at + "' already holds a dataset (" + at + "/" + format::kManifestName +
                      "): pass --overwrite to replace it, or choose another output");
  }
  // Parts packed at once may race to remove a merged manifest: gone is what they want.
  ZW_RETURN_IF_ERROR(store.remove(join(dir, format::kManifestName), metadata_deadline()));
  if (sync) ZW_RETURN_IF_ERROR(store.sync_directory(dir, metadata_deadline()));
  return Status::ok();
}

}  // namespace

std::string hashed_shard_path(const std::string& name) {
  char prefix[16];
  std::snprintf(
      prefix, sizeof prefix, "%0*x", kHashDigits,
      static_cast<unsigned>(XXH3_64bits(name.data(), name.size()) >> (64 - 4 * kHashDigits)));
  return std::string(prefix) + "/" + name;
}

Result<std::unique_ptr<DatasetOutput>> DatasetOutput::open(const std::string& out,
                                                           const std::string& tmp_dir,
                                                           bool overwrite, bool sync,
                                                           uint32_t part_index,
                                                           uint32_t part_count,
                                                           std::shared_ptr<Store> store) {
  std::string root = out;
  while (root.size() > 1 && root.ends_with('/')) root.pop_back();
  if (!store) {
    ZW_ASSIGN_OR_RETURN(store, open_store(root, StoreOptions{.spool_dir = tmp_dir}));
  }
  // Crash tests end a real `zerowait pack` at any write, publish or sync of its output.
  store = with_exit_fault_from_environment(std::move(store));
  std::string dir;  // a part's directory below the merged root
  if (part_count > 1) {
    dir = pack_part_dir_name(part_index, part_count);
    ZW_RETURN_IF_ERROR(prepare_directory(*store, root, "", overwrite, sync)
                           .with_context("cannot pack to " + root));
  }
  ZW_RETURN_IF_ERROR(prepare_directory(*store, root, dir, overwrite, sync)
                         .with_context("cannot pack to " + where(root, dir)));
  std::string location = where(root, dir);
  return std::unique_ptr<DatasetOutput>(
      new DatasetOutput(std::move(store), std::move(location), std::move(dir), sync));
}

DatasetOutput::DatasetOutput(std::shared_ptr<Store> store, std::string location, std::string dir,
                             bool sync)
    : store_(std::move(store)),
      location_(std::move(location)),
      dir_(std::move(dir)),
      sync_(sync),
      traits_(store_->traits()) {}

DatasetOutput::~DatasetOutput() {
  (void)wait_for_upload();  // an error here was either returned already or is moot
}

std::string DatasetOutput::final_path(const std::string& name) const {
  return traits_.rate_limited_per_prefix ? hashed_shard_path(name) : name;
}

std::string DatasetOutput::write_path(const std::string& name) const {
  return traits_.cheap_publish ? "." + name + ".partial" : final_path(name);
}

std::string DatasetOutput::location(const std::string& name) const {
  return location_ + "/" + name;
}

Status DatasetOutput::wait_for_upload() {
  if (upload_.joinable()) upload_.join();
  return upload_status_;
}

Status DatasetOutput::close_in_background(std::unique_ptr<WritableFile> file, Deadline deadline) {
  ZW_RETURN_IF_ERROR(wait_for_upload());
  upload_ = std::thread(
      [this, deadline, file = std::move(file)] { upload_status_ = file->close(deadline); });
  return Status::ok();
}

Result<ShardWriter> DatasetOutput::create(const std::string& name, bool align_samples) {
  const std::string path = write_path(name);
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                      store_->create(join(dir_, path), metadata_deadline()));
  // Where publish is a rename the file is closed before it, and closing costs nothing.
  if (!traits_.cheap_publish) file = std::make_unique<BackgroundClose>(std::move(file), *this);
  // An uploaded object is made durable by its upload, checked by the server: no fsync.
  const bool sync_shard = sync_ && traits_.cheap_publish;
  ShardWriterOptions options;
  options.align_samples = align_samples;
  options.sync = sync_shard;
  return ShardWriter::create(std::move(file), location(path), options);
}

Result<std::string> DatasetOutput::publish(const std::string& name) {
  const std::string path = final_path(name);
  if (traits_.cheap_publish) {
    ZW_RETURN_IF_ERROR(
        store_->publish(join(dir_, write_path(name)), join(dir_, path), metadata_deadline()));
  }
  return path;
}

void DatasetOutput::discard(const std::string& name) {
  (void)wait_for_upload();
  (void)store_->remove(join(dir_, write_path(name)), metadata_deadline());
}

Status DatasetOutput::finish() {
  ZW_RETURN_IF_ERROR(wait_for_upload());
  return sync_ ? store_->sync_directory(dir_, metadata_deadline()) : Status::ok();
}

Status DatasetOutput::put_file(const std::string& name, std::string_view text) {
  return put_published(*store_, dir_, name, text, sync_);
}

Status put_published(Store& store, const std::string& dir, const std::string& name,
                     std::string_view text, bool sync) {
  const std::span<const std::byte> bytes = as_bytes(text);
  if (!store.traits().cheap_publish) {
    return store.put(join(dir, name), bytes, metadata_deadline());
  }
  const std::string partial = join(dir, "." + name + ".partial");
  ZW_RETURN_IF_ERROR(store.put(partial, bytes, metadata_deadline()));
  ZW_RETURN_IF_ERROR(store.publish(partial, join(dir, name), metadata_deadline()));
  return sync ? store.sync_directory(dir, metadata_deadline()) : Status::ok();
}

void DatasetOutput::remove_stale_shards(const std::vector<ManifestShard>& kept) {
  std::unordered_set<std::string> keep;
  for (const ManifestShard& s : kept) keep.insert(s.path);
  // The root, then the hash-named prefixes found there.
  std::vector<std::string> dirs{""};
  for (size_t i = 0; i < dirs.size(); ++i) {
    const std::string below = dirs[i];
    auto names = store_->list(join(dir_, below), metadata_deadline());
    if (!names.is_ok()) continue;
    for (const std::string& name : *names) {
      const std::string path = join(below, name);
      if (below.empty() && is_hash_prefix(name)) {
        dirs.push_back(name);
      } else if (is_shard_name(name) && !keep.count(path)) {
        (void)store_->remove(join(dir_, path), metadata_deadline());
      }
    }
  }
}

Result<std::string> publish_dataset(DatasetOutput& output, const Manifest& manifest,
                                    const std::vector<QuarantineEntry>& quarantined) {
  ZW_RETURN_IF_ERROR(output.put_file(format::kQuarantineName, quarantine_json(quarantined)));
  ZW_RETURN_IF_ERROR(output.put_file(format::kManifestName, manifest.to_json()));
  output.remove_stale_shards(manifest.shards);
  return output.location(format::kManifestName);
}

}  // namespace zerowait::internal
