#include "shard/pack/dataset_output.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "common/file.hpp"
#include "storage/remote_object.hpp"
#include "shard/pack/s3_pack_output.hpp"
#include "zerowait/shard/format.hpp"

namespace zerowait::internal {
namespace {
namespace fs = std::filesystem;

// Makes `dir` ready: created if missing; an existing dataset is refused unless overwriting, in
// which case its manifest goes first so no reader ever sees it pointing at new shards. A part
// runs this on the merged directory too, for a manifest there lists the part's shards.
Status prepare_directory(const std::string& dir, bool overwrite, bool sync) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return errno_status(ec.value(), "cannot create output directory", dir);
  const std::string manifest = dir + "/" + format::kManifestName;
  if (fs::exists(manifest, ec)) {
    if (!overwrite) {
      return Status(ErrorCode::kAlreadyExists,
                    "'" + dir + "' already holds a dataset (" + manifest +
                        "): pass --overwrite to replace it, or choose another directory");
    }
    // Parts packed at once may race to remove a merged manifest: gone is what they want.
    if (!fs::remove(manifest, ec) && ec) return errno_status(ec.value(), "cannot remove", manifest);
    if (sync) ZW_RETURN_IF_ERROR(sync_directory(dir));
  }
  return Status::ok();
}

// A local directory: shards are written as ".<name>.partial" beside their final name and renamed
// into place; files are written atomically; the directory is fsynced when `sync`.
class DirectoryOutput final : public DatasetOutput {
 public:
  DirectoryOutput(std::string dir, bool sync) : dir_(std::move(dir)), sync_(sync) {}

  std::string spool_path(const std::string& name) override {
    // A leading dot keeps partial shards out of `*.zws` globs and directory scans.
    return dir_ + "/." + name + ".partial";
  }
  Result<std::string> publish(const std::string& spool, const std::string& name) override {
    ZW_RETURN_IF_ERROR(rename_file(spool, dir_ + "/" + name));
    return name;
  }
  Status finish() override { return sync_ ? sync_directory(dir_) : Status::ok(); }

  bool sync_shards() const override { return sync_; }
  Status put_file(const std::string& name, std::string_view text) override {
    return write_file_atomic(location(name), text, sync_);
  }
  void remove_stale_shards(const std::vector<ManifestShard>& kept) override {
    std::unordered_set<std::string> keep;
    for (const auto& s : kept) keep.insert(s.path);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("shard-") && name.ends_with(format::kShardExtension) &&
          !keep.count(name)) {
        fs::remove(e.path(), ec);
      }
    }
  }
  std::string location(const std::string& name) const override { return dir_ + "/" + name; }

 private:
  std::string dir_;
  bool sync_;
};

// The text of quarantine.json.
std::string quarantine_json(const std::vector<QuarantineEntry>& entries) {
  nlohmann::ordered_json j;
  j["count"] = entries.size();
  j["entries"] = nlohmann::ordered_json::array();
  for (const auto& q : entries) j["entries"].push_back({{"path", q.path}, {"reason", q.reason}});
  return j.dump(1) + "\n";
}

}  // namespace

Result<std::unique_ptr<DatasetOutput>> open_dataset_output(const std::string& out,
                                                           const std::string& tmp_dir,
                                                           bool overwrite, bool sync,
                                                           uint32_t part_index,
                                                           uint32_t part_count) {
  std::string root = out;
  std::string merged;  // where the parts are merged, for a part
  if (part_count > 1) {
    while (root.ends_with('/')) root.pop_back();
    merged = root;
    root.append("/").append(pack_part_dir_name(part_index, part_count));
  }
  if (is_s3_url(out)) {
    ZW_ASSIGN_OR_RETURN(std::unique_ptr<S3PackOutput> s3,
                        S3PackOutput::open(root, tmp_dir, overwrite, merged));
    return std::unique_ptr<DatasetOutput>(std::move(s3));
  }
  if (!merged.empty()) ZW_RETURN_IF_ERROR(prepare_directory(merged, overwrite, sync));
  ZW_RETURN_IF_ERROR(prepare_directory(root, overwrite, sync));
  return std::unique_ptr<DatasetOutput>(std::make_unique<DirectoryOutput>(root, sync));
}

Result<std::string> publish_dataset(DatasetOutput& output, const Manifest& manifest,
                                    const std::vector<QuarantineEntry>& quarantined) {
  ZW_RETURN_IF_ERROR(output.put_file(format::kQuarantineName, quarantine_json(quarantined)));
  ZW_RETURN_IF_ERROR(output.put_file(format::kManifestName, manifest.to_json()));
  output.remove_stale_shards(manifest.shards);
  return output.location(format::kManifestName);
}

}  // namespace zerowait::internal
