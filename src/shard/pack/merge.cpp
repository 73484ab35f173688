// merge_parts(): joins the parts of a `pack --part I/N` run into one manifest, after checking
// that they are all there, belong together and are intact. The parts and the merged manifest are
// in any Store open_store() serves: a local directory, an s3:// prefix (MergeRoot).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "common/clock.hpp"
#include "common/xxhash.hpp"
#include "shard/pack/dataset_output.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/pack.hpp"
#include "zerowait/storage/open.hpp"
#include "zerowait/storage/url.hpp"

namespace zerowait {
namespace fs = std::filesystem;
namespace {

constexpr size_t kMissingShown = 10;  // missing parts named in an error, then "and N more"

struct Part {
  std::string manifest_path;
  std::string rel;  // the part directory relative to out_dir, '/'-separated
  Manifest manifest;
  ManifestPart record;  // manifest.part's value
};

std::string part_name(const ManifestPart& p) {
  return std::to_string(p.index) + "/" + std::to_string(p.count);
}

std::string describe(const Part& p) {
  return "part " + part_name(p.record) + " (" + p.manifest_path + ")";
}

fs::path normal_absolute(const std::string& path) {
  fs::path p = fs::absolute(path).lexically_normal();
  if (p.has_relative_path() && p.filename().empty()) p = p.parent_path();  // "out/" -> "out"
  return p;
}

// True for "part-<digits>-of-<digits>".
bool is_part_dir_name(std::string_view name) {
  auto digits = [&name](std::string_view prefix) {
    if (!name.starts_with(prefix)) return false;
    name.remove_prefix(prefix.size());
    const size_t n = name.find_first_not_of("0123456789");
    const size_t count = n == std::string_view::npos ? name.size() : n;
    name.remove_prefix(count);
    return count > 0;
  };
  return digits("part-") && digits("-of-") && name.empty();
}

std::string no_parts_message(const std::string& out_dir) {
  return "'" + out_dir +
         "' holds no part-IIII-of-NNNN directories: pack each part first with "
         "`zerowait pack SRC... -o " +
         out_dir + " --part I/N`, or name the part directories";
}

std::string unfinished_part_message(const std::string& dir) {
  return "part directory '" + dir + "' holds no " + format::kManifestName +
         ": its pack has not finished or failed; run that part's "
         "`zerowait pack ... --part I/N --overwrite` again, then merge";
}

std::string outside_root_message(const std::string& part, const std::string& root) {
  return "part '" + part + "' is not inside the merge output '" + root +
         "': the merged manifest names shards relative to it; pack the parts with -o " + root +
         " (or move them into it) and merge again";
}

// The part in directory `rel` (relative to the root), whose manifest was read from
// `manifest_path`. `assigned`: the record of a whole dataset merged as a part, which has none.
Result<Part> make_part(std::string rel, std::string manifest_path, Manifest manifest,
                       const std::optional<ManifestPart>& assigned) {
  if (assigned) manifest.part = assigned;
  if (!manifest.part) {
    return invalid_argument("'" + manifest_path +
                            "' is not the manifest of a part (it records no \"part\"): only the "
                            "output of `zerowait pack --part I/N` can be merged");
  }
  Part part;
  part.rel = std::move(rel);
  part.manifest_path = std::move(manifest_path);
  part.record = *manifest.part;
  part.manifest = std::move(manifest);
  return part;
}

// Where the parts lie and the merged manifest goes: the Store open_store() gives for the merge
// output (a local directory, an s3:// prefix). Parts are found with one listing and read with a
// read of each part's manifest; the merged manifest is published whole (put_published).
class MergeRoot {
 public:
  // `out`: the output as the user gave it; messages and the report name it so.
  static Result<MergeRoot> open(const std::string& out) {
    std::string root = out;
    while (root.size() > 1 && root.ends_with('/')) root.pop_back();
    ZW_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, open_store(root));
    return MergeRoot(std::move(store), std::move(root));
  }

  // Whether the output is there to merge in (an object store's prefix always is).
  Result<bool> exists() {
    ZW_ASSIGN_OR_RETURN(ObjectStat st, store_->stat("", metadata_deadline()));
    return st.exists && st.is_directory;
  }

  std::string manifest_location() const { return root_ + "/" + format::kManifestName; }

  Result<bool> has_manifest() { return store_->exists(format::kManifestName, metadata_deadline()); }

  // The part directories named part-IIII-of-NNNN directly in the root, sorted, as paths below
  // the output as it was given.
  Result<std::vector<std::string>> find_part_dirs() {
    ZW_ASSIGN_OR_RETURN(std::vector<std::string> names, store_->list("", metadata_deadline()));
    std::vector<std::string> dirs;
    for (const std::string& name : names) {
      if (is_part_dir_name(name)) dirs.push_back(root_ + "/" + name);
    }
    if (dirs.empty()) return not_found(no_parts_message(root_));
    return dirs;  // list() is sorted
  }

  // The part at `path` (a part directory or its manifest.json, as a path or URL), which must lie
  // inside the root since the merged manifest names shards relative to it.
  Result<Part> load_part(const std::string& path, const std::optional<ManifestPart>& assigned) {
    std::string given = path;  // errors name the part as it was given
    while (given.size() > 1 && given.ends_with('/')) given.pop_back();
    const std::string manifest_tail = std::string("/") + format::kManifestName;
    if (given.ends_with(manifest_tail)) given.resize(given.size() - manifest_tail.size());
    if (given == format::kManifestName) given = ".";
    ZW_ASSIGN_OR_RETURN(std::string rel, relative_to_root(given, path));
    ZW_ASSIGN_OR_RETURN(ObjectStat st, store_->stat(rel, metadata_deadline()));
    if (!st.exists || !st.is_directory) {
      return not_found("part directory '" + given + "' does not exist");
    }
    const std::string manifest_path = given + manifest_tail;
    auto text = store_->read(rel + manifest_tail, metadata_deadline());
    if (text.status().code() == ErrorCode::kNotFound) {
      return not_found(unfinished_part_message(given));
    }
    ZW_RETURN_IF_ERROR(text.status());
    ZW_ASSIGN_OR_RETURN(Manifest manifest, Manifest::parse(*text, manifest_path));
    return make_part(std::move(rel), manifest_path, std::move(manifest), assigned);
  }

  Status write_manifest(const Manifest& manifest, bool sync) {
    return internal::put_published(*store_, "", format::kManifestName, manifest.to_json(), sync);
  }

 private:
  MergeRoot(std::shared_ptr<Store> store, std::string root)
      : store_(std::move(store)), root_(std::move(root)) {}

  // `given` as a name in the store ('/'-separated, below the root), or kInvalidArgument when
  // it lies outside. A root that is a URL takes parts named by URLs below it; a local one takes
  // paths, relative to the working directory or absolute.
  Result<std::string> relative_to_root(const std::string& given, const std::string& path) const {
    const bool root_is_url = is_url(root_);
    std::string rel;
    if (root_is_url) {
      if (given.starts_with(root_ + "/")) rel = given.substr(root_.size() + 1);
    } else if (!is_url(given)) {
      rel = normal_absolute(given).lexically_relative(normal_absolute(root_)).generic_string();
    }
    const std::string padded = "/" + rel + "/";
    if (rel.empty() || rel == "." || padded.find("/../") != std::string::npos ||
        padded.find("/./") != std::string::npos || padded.find("//") != std::string::npos) {
      const std::string root = root_is_url ? root_ : normal_absolute(root_).string();
      return invalid_argument(outside_root_message(path, root));
    }
    return rel;
  }

  std::shared_ptr<Store> store_;
  std::string root_;  // the output as the user gave it, without a trailing '/'
};

// Every part 0..N-1 exactly once, all of one input and options. `parts` is sorted by index.
Status check_parts_belong_together(const std::vector<Part>& parts) {
  const Part& first = parts.front();
  const uint32_t count = first.record.count;
  for (const Part& p : parts) {
    if (p.record.count != count) {
      return invalid_argument(describe(first) + " and " + describe(p) +
                              " come from runs with different part counts: merge the parts of "
                              "one run (same N in --part I/N): remove the other run's "
                              "directories, or name the part directories to merge");
    }
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].record.index == parts[i - 1].record.index) {
      return invalid_argument("part " + part_name(parts[i].record) +
                              " is given twice: " + parts[i - 1].manifest_path + " and " +
                              parts[i].manifest_path + "; remove or leave out one of them");
    }
  }
  if (parts.size() != count) {
    std::vector<uint32_t> missing;
    size_t next = 0;
    for (uint32_t i = 0; i < count; ++i) {
      if (next < parts.size() && parts[next].record.index == i) {
        ++next;
      } else {
        missing.push_back(i);
      }
    }
    std::string list;
    for (size_t i = 0; i < missing.size() && i < kMissingShown; ++i) {
      list += (i ? ", " : "") + std::to_string(missing[i]);
    }
    if (missing.size() > kMissingShown) {
      list += " and " + std::to_string(missing.size() - kMissingShown) + " more";
    }
    const std::string first_missing = std::to_string(missing.front()) + "/" + std::to_string(count);
    return not_found(std::to_string(missing.size()) + " of " + std::to_string(count) +
                     " parts missing (" + list + "): run the parts' pack command with --part " +
                     first_missing + (missing.size() > 1 ? " (and so on)" : "") +
                     ", which writes " + pack_part_dir_name(missing.front(), count) +
                     " beside the others, then merge again");
  }
  for (const Part& p : parts) {
    const auto& a = first.manifest.classes;
    const auto& b = p.manifest.classes;
    if (a != b) {
      const size_t i = std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin();
      const auto name = [i](const std::vector<std::string>& c) {
        return i < c.size() ? "'" + c[i] + "'" : std::string("missing");
      };
      return invalid_argument(
          "ImageFolder class lists differ: class " + std::to_string(i) + " is " + name(a) + " in " +
          describe(first) + " and " + name(b) + " in " + describe(p) +
          ", so their cls values would mean different classes. The parts were packed from "
          "different inputs; pack every part again from the same sources");
    }
    if (p.manifest.aligned != first.manifest.aligned) {
      return invalid_argument(describe(p) + " and " + describe(first) +
                              " differ in --align: pack every part with the same options");
    }
    if (p.record.input != first.record.input) {
      return invalid_argument(
          describe(p) + " was packed from another input listing or other options than " +
          describe(first) + " (input fingerprints " + p.record.input + " and " +
          first.record.input +
          "): pack every part from the same sources with the same --imagefolder, --align and "
          "--verify-images, and the files unchanged in between");
    }
  }
  return Status::ok();
}

// Opens every shard of every part (footer and index, checked against the part's manifest) and
// refuses a sample key that two parts hold. Keys are compared by XXH3, 24 bytes per sample held
// at once; equal hashes are confirmed against the keys themselves.
Status check_shards_and_keys(const std::vector<Part>& parts, bool whole_datasets) {
  struct KeyRef {
    uint64_t hash;
    uint32_t part;
    uint32_t shard;
    uint64_t local;
  };
  std::vector<KeyRef> keys;
  for (uint32_t p = 0; p < parts.size(); ++p) {
    ZW_ASSIGN_OR_RETURN(auto ds, Dataset::open(parts[p].manifest_path));
    for (uint32_t s = 0; s < ds->shard_count(); ++s) {
      ZW_ASSIGN_OR_RETURN(auto shard, ds->shard(s));
      for (uint64_t i = 0; i < shard->size(); ++i) {
        const std::string_view key = shard->key(i);
        keys.push_back({XXH3_64bits(key.data(), key.size()), p, s, i});
      }
    }
  }
  std::sort(keys.begin(), keys.end(), [](const KeyRef& a, const KeyRef& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.part < b.part;
  });
  const auto key_of = [&](const KeyRef& k) -> Result<std::string> {
    ZW_ASSIGN_OR_RETURN(auto ds, Dataset::open(parts[k.part].manifest_path));
    ZW_ASSIGN_OR_RETURN(auto shard, ds->shard(k.shard));
    return std::string(shard->key(k.local));
  };
  for (size_t run = 0; run < keys.size();) {
    size_t end = run + 1;
    while (end < keys.size() && keys[end].hash == keys[run].hash) ++end;
    for (size_t a = run; a < end; ++a) {
      for (size_t b = a + 1; b < end; ++b) {
        if (keys[a].part == keys[b].part) continue;  // pack keeps keys unique within a part
        ZW_ASSIGN_OR_RETURN(std::string key_a, key_of(keys[a]));
        ZW_ASSIGN_OR_RETURN(std::string key_b, key_of(keys[b]));
        if (key_a != key_b) continue;
        const std::string where = "sample key '" + key_a + "' is in " +
                                  describe(parts[keys[a].part]) + " and in " +
                                  describe(parts[keys[b].part]);
        if (whole_datasets) {
          return invalid_argument(where +
                                  ": every sample needs a key of its own; make the keys unique "
                                  "and write the datasets again");
        }
        return invalid_argument(
            where +
            ": the input holds it twice, in tars packed by different parts (one pack would "
            "quarantine the second); remove or rename one of them and pack those parts again");
      }
    }
    run = end;
  }
  return Status::ok();
}

}  // namespace

Result<MergeReport> merge_parts(const MergeOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.out_dir.empty()) return invalid_argument("merge needs the output directory");
  ZW_ASSIGN_OR_RETURN(MergeRoot root_store, MergeRoot::open(options.out_dir));
  MergeRoot* root = &root_store;
  ZW_ASSIGN_OR_RETURN(const bool there, root->exists());
  if (!there) {
    return not_found("merge output '" + options.out_dir +
                     "' is not a directory: it is the -o OUT_DIR the parts were packed with");
  }
  const std::string manifest_path = root->manifest_location();
  ZW_ASSIGN_OR_RETURN(const bool exists, root->has_manifest());
  if (exists && !options.overwrite) {
    return Status(ErrorCode::kAlreadyExists,
                  "'" + manifest_path +
                      "' already exists: pass --overwrite to replace it with the merged one");
  }
  std::vector<std::string> dirs = options.parts;
  if (dirs.empty() && options.whole_datasets) {
    return invalid_argument("a merge of whole datasets into '" + options.out_dir +
                            "' needs them named, in the order the merged dataset takes them");
  }
  if (dirs.empty()) {
    ZW_ASSIGN_OR_RETURN(dirs, root->find_part_dirs());
  }

  std::vector<Part> parts;
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::optional<ManifestPart> assigned;
    if (options.whole_datasets) {
      assigned = ManifestPart{static_cast<uint32_t>(i), static_cast<uint32_t>(dirs.size()), ""};
    }
    ZW_ASSIGN_OR_RETURN(Part part, root->load_part(dirs[i], assigned));
    parts.push_back(std::move(part));
  }
  std::stable_sort(parts.begin(), parts.end(),
                   [](const Part& a, const Part& b) { return a.record.index < b.record.index; });
  ZW_RETURN_IF_ERROR(check_parts_belong_together(parts));
  ZW_RETURN_IF_ERROR(check_shards_and_keys(parts, options.whole_datasets));

  Manifest merged;
  merged.aligned = parts.front().manifest.aligned;
  merged.classes = parts.front().manifest.classes;
  std::set<std::string> fields;
  MergeReport report;
  report.part_count = static_cast<uint32_t>(parts.size());
  for (const Part& p : parts) {
    fields.insert(p.manifest.fields.begin(), p.manifest.fields.end());
    for (ManifestShard shard : p.manifest.shards) {
      shard.path = p.rel + "/" + shard.path;
      merged.shards.push_back(std::move(shard));
    }
    merged.samples += p.manifest.samples;
    merged.bytes += p.manifest.bytes;
    report.parts.push_back(
        {p.rel, p.record.index, p.manifest.samples, p.manifest.shards.size(), p.manifest.bytes});
  }
  merged.fields.assign(fields.begin(), fields.end());
  // What readers will parse: a part directory whose name the format refuses ("a..b") fails here,
  // before anything is written.
  ZW_RETURN_IF_ERROR(Manifest::parse(merged.to_json(), manifest_path).status());
  ZW_RETURN_IF_ERROR(root->write_manifest(merged, options.sync));

  report.manifest_path = manifest_path;
  report.samples = merged.samples;
  report.shards = merged.shards.size();
  report.bytes = merged.bytes;
  report.seconds = internal::seconds_since(start);
  return report;
}

}  // namespace zerowait
