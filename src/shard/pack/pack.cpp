#include "zerowait/shard/pack.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_set>

#include "common/byte_buffer.hpp"
#include "common/clock.hpp"
#include "common/file.hpp"
#include "shard/pack/image_check.hpp"
#include "shard/pack/pack_part.hpp"
#include "shard/pack/pack_plan.hpp"
#include "shard/pack/dataset_output.hpp"
#include "shard/pack/shard_set_writer.hpp"
#include "shard/tar/tar_stream.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/webdataset.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace fs = std::filesystem;
using internal::PlannedSample;

namespace {

constexpr size_t kLoadWindowSamples = 512;           // samples loaded ahead of the writer
constexpr uint64_t kLoadWindowBytes = 256ull << 20;  // bytes loaded ahead of the writer

// A sample with its bytes in memory, or the reasons it must not be packed.
struct LoadedSample {
  std::vector<std::string> names;
  std::vector<internal::ByteBuffer> data;
  std::vector<QuarantineEntry> bad;
  uint64_t checksum = 0;  // computed where the sample was loaded, off the writer thread

  std::vector<FieldData> field_data() const {
    std::vector<FieldData> fields;
    for (size_t i = 0; i < names.size(); ++i) fields.push_back({names[i], data[i]});
    return fields;
  }
};

// Checks the image fields (the first bad one is recorded with its reason) and computes the
// sample checksum of a good sample.
void check_sample(const std::vector<std::string>& paths, LoadedSample* s,
                  internal::ImageCheck mode) {
  for (size_t i = 0; i < s->names.size(); ++i) {
    Status st = internal::check_image(s->names[i], s->data[i], mode);
    if (!st.is_ok()) {
      s->bad.push_back({paths[i], st.message()});
      return;
    }
  }
  s->checksum = ShardWriter::sample_checksum(s->field_data());
}

LoadedSample load_sample(const PlannedSample& planned, internal::ImageCheck mode) {
  LoadedSample s;
  std::vector<std::string> paths;
  for (const auto& field : planned.fields) {
    s.names.push_back(field.name);
    paths.push_back(field.path);
    if (field.path.empty()) {
      const auto* p = reinterpret_cast<const std::byte*>(field.inline_value.data());
      s.data.emplace_back(p, p + field.inline_value.size());
      continue;
    }
    auto bytes = internal::read_whole_file<internal::ByteBuffer>(field.path);
    if (!bytes.is_ok()) {
      s.bad.push_back({field.path, bytes.status().message()});
      s.data.emplace_back();
    } else {
      s.data.push_back(std::move(bytes).value());
    }
  }
  if (s.bad.empty()) check_sample(paths, &s, mode);
  return s;
}

// Loads the samples of one directory source on `threads` threads and hands them out in order,
// never more than a bounded window ahead of the consumer.
class OrderedLoader {
 public:
  OrderedLoader(const std::vector<PlannedSample>& samples, unsigned threads,
                internal::ImageCheck mode)
      : samples_(samples), mode_(mode), slots_(kLoadWindowSamples) {
    for (unsigned t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
  }
  ~OrderedLoader() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    can_load_.notify_all();
    for (auto& w : workers_) w.join();
  }

  // Returns sample `consumed_` (the next one in order), waiting for it to be loaded.
  LoadedSample next() {
    std::unique_lock<std::mutex> lock(mutex_);
    Slot& slot = slots_[consumed_ % slots_.size()];
    consumer_waiting_ = true;
    loaded_.wait(lock, [&] { return slot.ready; });
    consumer_waiting_ = false;
    LoadedSample s = std::move(slot.sample);
    slot.ready = false;
    in_flight_bytes_ -= slot.bytes;
    ++consumed_;
    const bool wake = loaders_waiting_ > 0;
    lock.unlock();
    if (wake) can_load_.notify_all();
    return s;
  }

 private:
  struct Slot {
    bool ready = false;
    uint64_t bytes = 0;
    LoadedSample sample;
  };

  void work() {
    for (;;) {
      size_t idx;
      uint64_t bytes = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ++loaders_waiting_;
        can_load_.wait(lock, [&] {
          if (stopping_ || next_ >= samples_.size()) return true;
          bytes = planned_bytes(samples_[next_]);
          // The sample the writer waits for always goes, whatever its size.
          return next_ < consumed_ + slots_.size() &&
                 (next_ == consumed_ || in_flight_bytes_ + bytes <= kLoadWindowBytes);
        });
        --loaders_waiting_;
        if (stopping_ || next_ >= samples_.size()) return;
        idx = next_++;
        in_flight_bytes_ += bytes;
      }
      LoadedSample s = load_sample(samples_[idx], mode_);
      bool wake;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        Slot& slot = slots_[idx % slots_.size()];
        slot.sample = std::move(s);
        slot.bytes = bytes;
        slot.ready = true;
        wake = consumer_waiting_ && idx == consumed_;
      }
      if (wake) loaded_.notify_one();
    }
  }

  static uint64_t planned_bytes(const PlannedSample& s) {
    uint64_t n = 0;
    for (const auto& f : s.fields) n += f.size;
    return n;
  }

  const std::vector<PlannedSample>& samples_;
  internal::ImageCheck mode_;
  std::mutex mutex_;
  std::condition_variable can_load_, loaded_;
  std::vector<Slot> slots_;
  size_t next_ = 0, consumed_ = 0;
  uint64_t in_flight_bytes_ = 0;
  bool stopping_ = false;
  bool consumer_waiting_ = false;
  int loaders_waiting_ = 0;
  std::vector<std::thread> workers_;
};

// Everything one pack run accumulates while writing.
class PackRun {
 public:
  // Publishes shards through `destination` (which must outlive the run). `earlier_keys` were packed by earlier parts: a sample with one of them is a
  // duplicate.
  PackRun(const PackOptions& options, internal::ShardDestination& destination,
          uint64_t files_total, uint64_t bytes_total, std::unordered_set<std::string> earlier_keys)
      : options_(options),
        mode_(options.verify_images ? internal::ImageCheck::kDecode
                                    : internal::ImageCheck::kHeader),
        writer_(destination, options.shard_size, options.align),
        keys_(std::move(earlier_keys)) {
    progress_.files_total = files_total;
    progress_.bytes_total = bytes_total;
  }

  internal::ImageCheck mode() const { return mode_; }
  internal::ShardSetWriter& writer() { return writer_; }
  PackReport& report() { return report_; }

  // Writes one loaded sample, or records why it is quarantined.
  Status put(const std::string& key, LoadedSample& s, const std::vector<std::string>& paths) {
    const size_t files = paths.size() - std::count(paths.begin(), paths.end(), std::string());
    uint64_t payload = 0;
    for (const auto& d : s.data) payload += d.size();
    if (s.bad.empty() && !keys_.insert(key).second) {
      for (const auto& p : paths) {
        if (!p.empty()) {
          s.bad.push_back({p, "duplicate sample key '" + key +
                                  "' (already packed from an earlier file or source)"});
        }
      }
    }
    if (!s.bad.empty()) {
      // The sample is incomplete without its bad file: its other files are listed too.
      const std::string bad_path = s.bad.front().path;
      for (const auto& p : paths) {
        const bool listed = std::any_of(s.bad.begin(), s.bad.end(),
                                        [&](const QuarantineEntry& q) { return q.path == p; });
        if (!p.empty() && !listed) {
          s.bad.push_back(
              {p, "not packed: sample '" + key + "' has a bad file '" + bad_path + "'"});
        }
      }
      for (auto& q : s.bad) report_.quarantined.push_back(std::move(q));
    } else {
      ZW_RETURN_IF_ERROR(writer_.add_sample(key, s.field_data(), s.checksum));
      report_.files += files;
      report_.bytes_in += payload;
    }
    progress_.files_done += files;
    progress_.bytes_done += payload;
    if (options_.on_progress) options_.on_progress(progress_);
    return Status::ok();
  }

  void count_streamed(uint64_t files, uint64_t bytes) {
    progress_.files_total += files;
    progress_.bytes_total += bytes;
  }

 private:
  const PackOptions& options_;
  internal::ImageCheck mode_;
  internal::ShardSetWriter writer_;
  PackReport report_;
  PackProgress progress_;
  std::unordered_set<std::string> keys_;
};

Status pack_directory(const internal::SourcePlan& source, unsigned threads, PackRun* run) {
  OrderedLoader loader(source.samples, threads, run->mode());
  for (const PlannedSample& planned : source.samples) {
    LoadedSample s = loader.next();
    std::vector<std::string> paths;
    for (const auto& f : planned.fields) paths.push_back(f.path);
    ZW_RETURN_IF_ERROR(run->put(planned.key, s, paths));
  }
  return Status::ok();
}

// Streams a tar: consecutive members with the same key form a sample (WebDataset's rule).
Status pack_tar(const std::string& archive, PackRun* run) {
  ZW_ASSIGN_OR_RETURN(auto stream, internal::TarStream::open(archive));
  std::string key;
  LoadedSample group;
  std::vector<std::string> paths;
  auto flush = [&]() -> Status {
    if (paths.empty()) return Status::ok();
    if (group.bad.empty()) check_sample(paths, &group, run->mode());
    Status st = run->put(key, group, paths);
    group = LoadedSample();
    paths.clear();
    return st;
  };
  internal::TarMember m;
  for (;;) {
    ZW_ASSIGN_OR_RETURN(bool more, stream->next(&m));
    if (!more) break;
    std::string_view k, field;
    if (!m.is_regular() || !split_sample_name(m.path, &k, &field)) {
      ++run->report().ignored;
      continue;
    }
    const std::string where = archive + ":" + m.path;
    run->count_streamed(1, m.size);
    if (k != key) ZW_RETURN_IF_ERROR(flush());
    key = k;
    if (!is_safe_relative_path(k)) {
      group.bad.push_back({where, "unsafe member name (absolute or contains '..')"});
    } else if (std::find(group.names.begin(), group.names.end(), field) != group.names.end()) {
      // A repeated field would make the sample ambiguous; quarantine the repeat only.
      run->report().quarantined.push_back(
          {where, "duplicate field '" + std::string(field) + "' in sample '" + key + "'"});
      continue;
    }
    group.names.emplace_back(field);
    paths.push_back(where);
    group.data.emplace_back();
    ZW_RETURN_IF_ERROR(stream->read_data(&group.data.back()));
  }
  return flush();
}

// Packs every source of `plan` through `run` and returns the manifest of the shards, all
// published once this returns.
Result<Manifest> write_shards(const internal::PackPlan& plan, const internal::PartPlan& part,
                              const PackOptions& options, PackRun& run) {
  const unsigned threads =
      options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  run.report().ignored = plan.ignored;
  for (const auto& source : plan.sources) {
    ZW_RETURN_IF_ERROR(source.is_tar ? pack_tar(source.source, &run)
                                     : pack_directory(source, threads, &run));
  }
  ZW_RETURN_IF_ERROR(run.writer().finish());
  Manifest manifest;
  manifest.samples = run.writer().samples();
  manifest.aligned = options.align;
  manifest.fields.assign(run.writer().field_names().begin(), run.writer().field_names().end());
  manifest.classes = plan.classes;
  manifest.shards = run.writer().shards();
  for (const auto& s : manifest.shards) manifest.bytes += s.bytes;
  if (options.part_count > 1) {
    manifest.part = ManifestPart{options.part_index, options.part_count, part.input};
  }
  return manifest;
}

PackReport finish_report(PackRun& run, const Manifest& manifest, std::string manifest_path,
                         std::chrono::steady_clock::time_point start) {
  PackReport report = std::move(run.report());
  report.manifest_path = std::move(manifest_path);
  report.samples = manifest.samples;
  report.shards = manifest.shards.size();
  report.bytes_out = manifest.bytes;
  report.seconds = internal::seconds_since(start);
  return report;
}

}  // namespace

Result<PackReport> pack(const PackOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.out_dir.empty()) return invalid_argument("pack needs an output directory (-o)");
  if (options.shard_size == 0) return invalid_argument("shard size must be greater than 0");
  ZW_RETURN_IF_ERROR(require_writable_store(options.out_dir, "pack output"));
  ZW_RETURN_IF_ERROR(internal::check_part(options.part_index, options.part_count));
  ZW_ASSIGN_OR_RETURN(internal::PackPlan plan, internal::plan_pack(options));
  internal::PartPlan part;  // this part's share of the plan, wherever it goes
  if (options.part_count > 1) {
    part = internal::select_part(std::move(plan), options);
    plan = std::move(part.plan);
  }
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<internal::DatasetOutput> output,
                      internal::DatasetOutput::open(options.out_dir, options.tmp_dir,
                                                    options.overwrite, options.sync,
                                                    options.part_index, options.part_count,
                                                    options.out_store));
  PackRun run(options, *output, plan.files, plan.bytes,
              std::move(part.earlier_keys));
  ZW_ASSIGN_OR_RETURN(Manifest manifest, write_shards(plan, part, options, run));
  ZW_ASSIGN_OR_RETURN(std::string manifest_path,
                      internal::publish_dataset(*output, manifest, run.report().quarantined));
  return finish_report(run, manifest, manifest_path, start);
}

}  // namespace zerowait
