#include "shard/pack/pack_plan.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "common/text.hpp"
#include "storage/local_path.hpp"
#include "zerowait/shard/webdataset.hpp"
#include "zerowait/storage/open.hpp"
#include "zerowait/storage/url.hpp"

namespace zerowait::internal {
namespace fs = std::filesystem;
namespace {

// The image extensions torchvision's ImageFolder accepts, mapped to one field name each.
std::string imagefolder_field(const std::string& extension) {
  const std::string e = ascii_lower(extension);
  if (e == "jpg" || e == "jpeg") return "jpg";
  if (e == "tif") return "tiff";
  static const std::set<std::string> kOthers = {"png", "ppm", "bmp", "pgm", "tiff", "webp"};
  return kOthers.count(e) ? e : std::string();
}

struct FoundFile {
  std::string rel;  // relative to the source, '/'-separated
  std::string path;
  uint64_t size = 0;
};

Result<std::vector<FoundFile>> walk(const std::string& root, uint64_t* ignored) {
  std::vector<FoundFile> files;
  std::error_code ec;
  const size_t root_prefix = root.size() + (root.ends_with('/') ? 0 : 1);
  fs::recursive_directory_iterator it(root, fs::directory_options::follow_directory_symlink, ec);
  if (ec) return errno_status(ec.value(), "cannot list directory", root);
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return errno_status(ec.value(), "cannot list directory", it->path().string());
    const fs::directory_entry& e = *it;
    if (e.is_directory(ec)) continue;
    if (!e.is_regular_file(ec)) {  // sockets, fifos, dangling links
      ++*ignored;
      continue;
    }
    FoundFile f;
    f.path = e.path().string();
    // The iterator yields root + "/" + relative; plain string slicing avoids fs::relative, which
    // resolves symlinks component by component (a readlink per file).
    f.rel = f.path.substr(root_prefix);
    f.size = e.file_size(ec);
    files.push_back(std::move(f));
  }
  if (ec) return errno_status(ec.value(), "cannot list directory", root);
  return files;
}

}  // namespace

bool is_tar_source(const std::string& path) {
  return path.ends_with(".tar") || path.ends_with(".tar.gz") || path.ends_with(".tgz");
}

Result<PackPlan> plan_pack(const PackOptions& options) {
  PackPlan plan;
  if (options.sources.empty()) return invalid_argument("pack needs at least one source");
  std::vector<std::vector<FoundFile>> found(options.sources.size());
  std::set<std::string> classes;
  for (size_t i = 0; i < options.sources.size(); ++i) {
    const std::string& src = options.sources[i];
    std::error_code ec;
    // A URL names one object (an archive the storage registry reads), never a tree to walk.
    const bool url = !url_scheme(src).empty();
    if (url && !is_tar_source(src)) ZW_RETURN_IF_ERROR(require_local_path(src, "pack input"));
    if (!url && !fs::exists(src, ec)) {
      return not_found("pack source '" + src + "' does not exist");
    }
    SourcePlan sp;
    sp.source = src;
    if (url || fs::is_regular_file(src, ec)) {
      if (!is_tar_source(src)) {
        return invalid_argument("pack source '" + src +
                                "' is a file but not a .tar, .tar.gz or .tgz archive");
      }
      if (options.imagefolder) {
        return invalid_argument("--imagefolder applies to directories, not to archive '" + src +
                                "'");
      }
      sp.is_tar = true;
      ZW_ASSIGN_OR_RETURN(auto archive, open_source(src, IoBackend::kPread,
                                                    Deadline::after(std::chrono::seconds(60))));
      sp.archive_bytes = archive->size();
    } else {
      ZW_ASSIGN_OR_RETURN(found[i], walk(src, &plan.ignored));
      if (options.imagefolder) {
        for (const FoundFile& f : found[i]) {
          auto slash = f.rel.find('/');
          if (slash != std::string::npos) classes.insert(f.rel.substr(0, slash));
        }
      }
    }
    plan.sources.push_back(std::move(sp));
  }
  plan.classes.assign(classes.begin(), classes.end());
  std::map<std::string, size_t> class_index;
  for (size_t c = 0; c < plan.classes.size(); ++c) class_index[plan.classes[c]] = c;

  for (size_t i = 0; i < options.sources.size(); ++i) {
    SourcePlan& sp = plan.sources[i];
    // key -> fields, sorted by key then field name, so the order never depends on the walk.
    std::map<std::string, std::map<std::string, PlannedField>> samples;
    for (const FoundFile& f : found[i]) {
      std::string key, field;
      if (options.imagefolder) {
        const auto slash = f.rel.find('/');
        const auto dot = f.rel.rfind('.');
        if (slash == std::string::npos || dot == std::string::npos || dot < slash) {
          ++plan.ignored;  // a file at the top level, or without extension
          continue;
        }
        field = imagefolder_field(f.rel.substr(dot + 1));
        if (field.empty()) {
          ++plan.ignored;
          continue;
        }
        key = f.rel.substr(0, dot);
      } else {
        std::string_view k, fl;
        if (!split_sample_name(f.rel, &k, &fl)) {
          ++plan.ignored;
          continue;
        }
        key = k;
        field = fl;
      }
      auto& fields = samples[key];
      if (fields.count(field)) {  // "a/x.JPG" and "a/x.jpeg" in ImageFolder mode
        ++plan.ignored;
        continue;
      }
      fields[field] = PlannedField{field, f.path, {}, f.size};
      if (options.imagefolder) {
        const std::string cls = f.rel.substr(0, f.rel.find('/'));
        fields["cls"] = PlannedField{"cls", {}, std::to_string(class_index[cls]), 0};
      }
      ++sp.files;
      sp.bytes += f.size;
    }
    sp.samples.reserve(samples.size());
    for (auto& [key, fields] : samples) {
      PlannedSample s;
      s.key = key;
      for (auto& [name, field] : fields) s.fields.push_back(std::move(field));
      sp.samples.push_back(std::move(s));
    }
    plan.files += sp.files;
    plan.bytes += sp.bytes;
  }
  return plan;
}

}  // namespace zerowait::internal
