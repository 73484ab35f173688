#include "zerowait/shard/dataset.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <set>
#include <thread>

#include "common/log.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/webdataset.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

bool is_shard_file(const std::string& name) {
  return name.ends_with(format::kShardExtension) || name.ends_with(".tar");
}

// `name` inside folder `folder` (a path, a URL or a store's name; "" is a store's root).
std::string join(std::string folder, const std::string& name) {
  while (folder.ends_with('/')) folder.pop_back();
  return folder.empty() ? name : folder + "/" + name;
}

// WebDataset's shard lists: "shard-{000000..000099}.tar" (a numeric range, zero-padded to the
// width its bounds are written with) and "{train,val}/x.tar" (alternatives), any number of
// groups, expanded left to right. Patterns without braces expand to themselves.
constexpr size_t kMaxExpandedPaths = 1000000;

Status expand_braces(const std::string& pattern, std::vector<std::string>* out) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    if (out->size() >= kMaxExpandedPaths) {
      return invalid_argument("shard list '" + pattern + "' names more than " +
                              std::to_string(kMaxExpandedPaths) + " shards");
    }
    out->push_back(pattern);
    return Status::ok();
  }
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos) {
    return invalid_argument("shard list '" + pattern + "' has a '{' without its '}'");
  }
  const std::string body = pattern.substr(open + 1, close - open - 1);
  const std::string head = pattern.substr(0, open), tail = pattern.substr(close + 1);
  std::vector<std::string> choices;
  if (const size_t dots = body.find(".."); dots != std::string::npos) {
    const std::string first = body.substr(0, dots), last = body.substr(dots + 2);
    const bool digits = !first.empty() && !last.empty() &&
                        first.find_first_not_of("0123456789") == std::string::npos &&
                        last.find_first_not_of("0123456789") == std::string::npos &&
                        first.size() <= 18 && last.size() <= 18;
    if (!digits || std::stoull(first) > std::stoull(last)) {
      return invalid_argument("shard list '" + pattern + "': {" + body +
                              "} is not a range of numbers from low to high, like {000..099}");
    }
    const size_t width = first.size() == last.size() ? first.size() : 0;
    for (uint64_t n = std::stoull(first), end = std::stoull(last); n <= end; ++n) {
      std::string number = std::to_string(n);
      if (number.size() < width) number.insert(0, width - number.size(), '0');
      choices.push_back(std::move(number));
      if (choices.size() > kMaxExpandedPaths) break;
    }
  } else {
    for (size_t start = 0;;) {
      const size_t comma = body.find(',', start);
      choices.push_back(body.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  for (const std::string& choice : choices) {
    ZW_RETURN_IF_ERROR(expand_braces(head + choice + tail, out));
  }
  return Status::ok();
}

// Shards opened at once. A remote open waits a round trip or two and takes no CPU meanwhile: a
// first batch drawn from the 30 shards of a window opens them in one wave, not four.
constexpr size_t kParallelOpens = 32;

// Calls open(i) for every i < n, on up to kParallelOpens threads (the caller's among them).
void for_each_in_parallel(size_t n, const std::function<void(size_t)>& open) {
  std::atomic<size_t> next{0};
  const std::shared_ptr<internal::FallbackTally> tally = internal::current_fallback_tally();
  auto open_some = [&] {
    internal::FallbackScope scope(tally);  // an open's fallbacks count for the caller's owner
    for (size_t i = next++; i < n; i = next++) open(i);
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < std::min(n, kParallelOpens); ++t) helpers.emplace_back(open_some);
  open_some();
  for (std::thread& helper : helpers) helper.join();
}

}  // namespace

std::shared_ptr<Dataset> Dataset::make(std::string path, DatasetOptions options) {
  std::shared_ptr<Dataset> ds(new Dataset());
  ds->path_ = std::move(path);
  ds->options_ = std::move(options);
  return ds;
}

Result<std::shared_ptr<Dataset>> Dataset::open(const std::string& path, DatasetOptions options) {
  ZW_RETURN_IF_ERROR(require_readable(path, "dataset"));
  std::shared_ptr<Dataset> ds = make(path, std::move(options));
  std::vector<std::string> shards;
  if (path.find('{') != std::string::npos) {
    ZW_RETURN_IF_ERROR(expand_braces(path, &shards));
    for (const std::string& shard : shards) {
      ZW_RETURN_IF_ERROR(require_readable(shard, "dataset"));
    }
  } else if (is_shard_file(path)) {
    shards.push_back(path);
  } else {
    ZW_RETURN_IF_ERROR(ds->open_manifest_or_folder());
    return ds;
  }
  ZW_RETURN_IF_ERROR(ds->add_shard_paths(shards, /*from_manifest=*/false));
  return ds;
}

// The manifest is read whole (one GET at a URL): a folder is listed only when it has none, since a
// web server's folders cannot be listed and listing a bucket costs requests (for a large prefix,
// minutes). A folder of shards without a manifest (WebDataset tars) has each shard read.
Status Dataset::open_manifest_or_folder() {
  const std::string manifest_path =
      path_.ends_with(".json") ? path_ : join(path_, format::kManifestName);
  Result<std::string> text = read_whole(manifest_path);
  if (text.is_ok()) {
    ZW_ASSIGN_OR_RETURN(manifest_, Manifest::parse(*text, manifest_path));
    const std::string base = manifest_path.substr(0, manifest_path.rfind('/') + 1);
    std::vector<std::string> shards;
    for (const ManifestShard& s : manifest_.shards) shards.push_back(base + s.path);
    return add_shard_paths(shards, /*from_manifest=*/true);
  }
  if (text.status().code() != ErrorCode::kNotFound || manifest_path == path_) {
    return text.status();
  }
  const Result<std::vector<std::string>> names = list_folder(path_);
  std::vector<std::string> shards;
  if (names.is_ok()) {
    for (const std::string& name : *names) {
      if (is_shard_file(name)) shards.push_back(join(path_, name));
    }
  }
  if (!shards.empty()) return add_shard_paths(shards, /*from_manifest=*/false);
  if (names.status().code() == ErrorCode::kNotFound) {
    return not_found("dataset '" + path_ + "' does not exist (" + text.status().message() + ")");
  }
  return not_found("dataset '" + path_ + "' has no " + manifest_path + " and no " +
                   format::kShardExtension + " or .tar files beside it: not a dataset (" +
                   text.status().message() + ")");
}

Result<std::string> Dataset::read_whole(const std::string& path) const {
  if (options_.store) return options_.store->read(path, open_deadline());
  return read_object(path, open_deadline());
}

Result<std::vector<std::string>> Dataset::list_folder(const std::string& path) const {
  if (options_.store) return options_.store->list(path, open_deadline());
  ZW_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, open_store(path));
  return store->list("", open_deadline());
}

Result<std::shared_ptr<ShardReader>> Dataset::open_shard_at(const std::string& path,
                                                            const KnownObject* known) const {
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> opened,
                      options_.store ? options_.store->open(path, options_.backend, open_deadline())
                                     : open_source(path, options_.backend, open_deadline(), known));
  std::shared_ptr<ByteSource> source = std::move(opened);
  // Objects fetched over the network are read through the node-local cache; local files in
  // place, where the page cache already keeps them.
  if (options_.cache && reads_over_network(source->name())) {
    source = options_.cache->wrap(std::move(source));
  }
  if (path.ends_with(".tar")) return open_tar_shard(std::move(source));
  return ShardReader::open(std::move(source));
}

Status Dataset::add_shard_paths(const std::vector<std::string>& paths, bool from_manifest) {
  shard_paths_ = paths;
  readers_.assign(paths.size(), nullptr);
  place_in_recent_.assign(paths.size(), recently_used_.end());
  opening_.assign(paths.size(), 0);
  first_index_.assign(1, 0);
  if (from_manifest) {
    // The manifest is the index of shards: nothing else is read until a shard is used.
    for (const ManifestShard& s : manifest_.shards) {
      first_index_.push_back(first_index_.back() + s.samples);
    }
    return Status::ok();
  }
  // Every shard is opened now, to count its samples: several at once, since a remote shard's
  // open waits on requests (and a remote tar's on a scan of the whole object).
  std::vector<std::optional<Result<std::shared_ptr<ShardReader>>>> opened(paths.size());
  for_each_in_parallel(paths.size(),
                       [&](size_t i) { opened[i] = open_shard_at(paths[i], nullptr); });
  std::set<std::string> fields;
  for (size_t i = 0; i < paths.size(); ++i) {
    ZW_ASSIGN_OR_RETURN(auto reader, std::move(*opened[i]));
    const ShardReader& r = *reader;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hold(i, reader);
    }
    for (const auto& n : r.index().names) fields.insert(n);
    ManifestShard s;
    s.path = paths[i];
    s.samples = r.size();
    s.bytes = r.source().size();
    manifest_.shards.push_back(s);
    manifest_.samples += s.samples;
    manifest_.bytes += s.bytes;
    manifest_.aligned = (r.flags() & format::kAligned) != 0;
    first_index_.push_back(first_index_.back() + s.samples);
  }
  manifest_.fields.assign(fields.begin(), fields.end());
  return Status::ok();
}

Result<SampleLocation> Dataset::locate(uint64_t global_index) const {
  if (global_index >= size()) {
    return invalid_argument("sample " + std::to_string(global_index) + " out of range: dataset '" +
                            path_ + "' has " + std::to_string(size()) + " samples");
  }
  // first_index_ is sorted; the shard is the last one whose first index is <= global_index.
  auto it = std::upper_bound(first_index_.begin(), first_index_.end(), global_index);
  const size_t shard = static_cast<size_t>(it - first_index_.begin()) - 1;
  return SampleLocation{shard, global_index - first_index_[shard]};
}

std::shared_ptr<ShardReader> Dataset::shard_if_open(size_t s) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return s < readers_.size() ? readers_[s] : nullptr;
}

Result<std::shared_ptr<ShardReader>> Dataset::shard(size_t s) const {
  if (s >= shard_paths_.size()) {
    return invalid_argument("shard " + std::to_string(s) + " out of range: dataset '" + path_ +
                            "' has " + std::to_string(shard_paths_.size()) + " shards");
  }
  std::unique_lock<std::mutex> lock(mutex_);
  // Another thread opening s: wait for its result rather than open the shard twice. Its reads
  // have deadlines, so the wait ends.
  opened_.wait(lock, [&] { return readers_[s] != nullptr || !opening_[s]; });
  if (readers_[s]) {
    recently_used_.splice(recently_used_.begin(), recently_used_, place_in_recent_[s]);
    return readers_[s];
  }
  // Opened without the lock, so that other shards open meanwhile.
  opening_[s] = 1;
  lock.unlock();
  Result<std::shared_ptr<ShardReader>> opened = open_checked(s);
  lock.lock();
  opening_[s] = 0;
  opened_.notify_all();
  if (!opened.is_ok()) return opened.status();
  hold(s, opened.value());
  return opened;
}

Result<std::shared_ptr<ShardReader>> Dataset::open_checked(size_t s) const {
  const ManifestShard& expected = manifest_.shards[s];
  const std::string& path = shard_paths_[s];
  // A shard the manifest describes (its index checksum recorded) opens without asking the
  // storage for its size (a HEAD at a URL).
  std::optional<KnownObject> known;
  if (!expected.checksum.empty() && path.ends_with(format::kShardExtension)) {
    known = KnownObject{expected.bytes, "index-" + expected.checksum};
  }
  auto opened = open_shard_at(path, known ? &*known : nullptr);
  if (known && !opened.is_ok()) {
    return opened.status().with_context(
        "shard '" + path + "' does not read as the manifest describes it (" +
        std::to_string(expected.bytes) + " bytes; replaced after packing?)");
  }
  ZW_RETURN_IF_ERROR(opened.status());
  return check_against_manifest(s, std::move(opened).value());
}

Result<std::shared_ptr<ShardReader>> Dataset::check_against_manifest(
    size_t s, std::shared_ptr<ShardReader> reader) const {
  const ManifestShard& expected = manifest_.shards[s];
  if (reader->size() != expected.samples || reader->source().size() != expected.bytes) {
    return corrupt("shard '" + shard_paths_[s] + "' has " + std::to_string(reader->size()) +
                   " samples and " + std::to_string(reader->source().size()) +
                   " bytes; the manifest says " + std::to_string(expected.samples) + " and " +
                   std::to_string(expected.bytes) + ": the dataset was modified after packing");
  }
  if (!expected.checksum.empty() &&
      format::checksum_hex(reader->index_checksum()) != expected.checksum) {
    return corrupt("shard '" + shard_paths_[s] + "' has index checksum " +
                   format::checksum_hex(reader->index_checksum()) + "; the manifest says " +
                   expected.checksum + ": the shard was replaced after packing");
  }
  return reader;
}

Status Dataset::open_shards(const std::vector<size_t>& shards) const {
  std::vector<Status> results(shards.size(), Status::ok());
  for_each_in_parallel(shards.size(), [&](size_t i) {
    Result<std::shared_ptr<ShardReader>> opened = shard(shards[i]);
    if (!opened.is_ok()) results[i] = opened.status();
  });
  for (const Status& status : results) ZW_RETURN_IF_ERROR(status);
  return Status::ok();
}

void Dataset::hold(size_t s, std::shared_ptr<ShardReader> reader) const {
  index_use_.bytes += reader->index().memory_bytes();
  ++index_use_.shards_open;
  ++index_use_.opens;
  readers_[s] = std::move(reader);
  recently_used_.push_front(s);
  place_in_recent_[s] = recently_used_.begin();
  while (index_use_.bytes > options_.index_budget_bytes && recently_used_.size() > 1) {
    const size_t oldest = recently_used_.back();
    recently_used_.pop_back();
    place_in_recent_[oldest] = recently_used_.end();
    index_use_.bytes -= readers_[oldest]->index().memory_bytes();
    --index_use_.shards_open;
    readers_[oldest].reset();
  }
}

Dataset::IndexUse Dataset::index_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return index_use_;
}

Result<Sample> Dataset::read(uint64_t global_index, const ReadOptions& options) const {
  ZW_ASSIGN_OR_RETURN(SampleLocation loc, locate(global_index));
  ZW_ASSIGN_OR_RETURN(auto reader, shard(loc.shard));
  return reader->read_sample(loc.local, options);
}

}  // namespace zerowait
