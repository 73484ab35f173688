#include "zerowait/shard/dataset_writer.hpp"

#include <chrono>
#include <unordered_set>

#include "common/clock.hpp"
#include "shard/pack/dataset_output.hpp"
#include "shard/pack/image_check.hpp"
#include "shard/pack/shard_set_writer.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {

class DatasetWriter::Impl {
 public:
  Impl(DatasetWriterOptions options, std::unique_ptr<internal::DatasetOutput> output)
      : options_(std::move(options)),
        output_(std::move(output)),
        shards_(*output_, options_.shard_size, options_.align),
        start_(std::chrono::steady_clock::now()) {}

  Result<bool> write(std::string_view key, std::span<const FieldData> fields) {
    if (finished_) return finished_error();
    if (key.empty()) return invalid_argument("a sample needs a key (got an empty one)");
    if (keys_.count(std::string(key)) != 0) {
      return invalid_argument("sample key '" + std::string(key) +
                              "' was written before: every sample needs a key of its own");
    }
    const internal::ImageCheck mode =
        options_.verify_images ? internal::ImageCheck::kDecode : internal::ImageCheck::kHeader;
    for (const FieldData& f : fields) {
      Status image = internal::check_image(f.name, f.bytes, mode);
      if (image.code() == ErrorCode::kCorrupt) {
        report_.quarantined.push_back({"sample " + std::string(key),
                                       "field '" + std::string(f.name) + "': " + image.message()});
        return false;
      }
      ZW_RETURN_IF_ERROR(image);
    }
    ZW_RETURN_IF_ERROR(shards_.add_sample(key, fields, ShardWriter::sample_checksum(fields)));
    keys_.emplace(key);
    for (const FieldData& f : fields) report_.bytes_in += f.bytes.size();
    return true;
  }

  Result<DatasetWriterReport> finish() {
    if (finished_) return finished_error();
    finished_ = true;
    ZW_RETURN_IF_ERROR(shards_.finish());
    Manifest manifest;
    manifest.samples = shards_.samples();
    manifest.aligned = options_.align;
    manifest.fields.assign(shards_.field_names().begin(), shards_.field_names().end());
    manifest.classes = options_.classes;
    manifest.shards = shards_.shards();
    for (const ManifestShard& s : manifest.shards) manifest.bytes += s.bytes;
    ZW_ASSIGN_OR_RETURN(report_.manifest_path,
                        internal::publish_dataset(*output_, manifest, report_.quarantined));
    report_.samples = manifest.samples;
    report_.bytes_out = manifest.bytes;
    report_.shards = manifest.shards.size();
    report_.seconds = internal::seconds_since(start_);
    return report_;
  }

  uint64_t samples() const { return shards_.samples(); }

  static Status finished_error() {
    return invalid_argument("the dataset writer has finished: it writes nothing more");
  }
  uint64_t quarantined() const { return report_.quarantined.size(); }
  uint64_t bytes_written() const { return shards_.bytes(); }

 private:
  const DatasetWriterOptions options_;
  const std::unique_ptr<internal::DatasetOutput> output_;
  internal::ShardSetWriter shards_;  // after output_: destroyed first (it removes a partial shard)
  std::unordered_set<std::string> keys_;
  DatasetWriterReport report_;
  std::chrono::steady_clock::time_point start_;
  bool finished_ = false;
};

Result<std::unique_ptr<DatasetWriter>> DatasetWriter::create(DatasetWriterOptions options) {
  if (options.out_dir.empty()) return invalid_argument("the dataset writer needs an out_dir");
  if (options.shard_size == 0) return invalid_argument("shard size must be greater than 0");
  ZW_RETURN_IF_ERROR(require_writable_store(options.out_dir, "dataset output"));
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<internal::DatasetOutput> output,
                      internal::DatasetOutput::open(options.out_dir, options.tmp_dir,
                                                    options.overwrite, options.sync));
  return std::unique_ptr<DatasetWriter>(
      new DatasetWriter(std::make_unique<Impl>(std::move(options), std::move(output))));
}

DatasetWriter::DatasetWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DatasetWriter::~DatasetWriter() = default;

Result<bool> DatasetWriter::write(std::string_view key, std::span<const FieldData> fields) {
  return impl_->write(key, fields);
}
Result<DatasetWriterReport> DatasetWriter::finish() { return impl_->finish(); }
uint64_t DatasetWriter::samples() const { return impl_->samples(); }
uint64_t DatasetWriter::quarantined() const { return impl_->quarantined(); }
uint64_t DatasetWriter::bytes_written() const { return impl_->bytes_written(); }

}  // namespace zerowait
