#include "shard/pack/shard_set_writer.hpp"

#include <cstdio>

#include "zerowait/shard/format.hpp"

namespace zerowait::internal {

std::string ShardSetWriter::shard_name(size_t number) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%06zu%s", number, format::kShardExtension);
  return buf;
}

ShardSetWriter::~ShardSetWriter() {
  if (current_) {
    current_.reset();
    destination_.discard(shard_name(shards_.size()));
  }
}

Status ShardSetWriter::add_sample(std::string_view key, std::span<const FieldData> fields,
                                  uint64_t checksum) {
  if (current_ && current_->bytes_written() >= shard_size_) ZW_RETURN_IF_ERROR(close_current());
  if (!current_) {
    ZW_ASSIGN_OR_RETURN(ShardWriter w, destination_.create(shard_name(shards_.size()), align_samples_));
    current_.emplace(std::move(w));
  }
  ZW_RETURN_IF_ERROR(current_->add_sample(key, fields, checksum));
  for (const FieldData& f : fields) {
    if (field_names_.find(f.name) == field_names_.end()) field_names_.emplace(f.name);
  }
  ++samples_;
  return Status::ok();
}

Status ShardSetWriter::close_current() {
  ZW_ASSIGN_OR_RETURN(ShardSummary summary, current_->finish());
  current_.reset();
  const std::string name = shard_name(shards_.size());
  ZW_ASSIGN_OR_RETURN(std::string path, destination_.publish(name));
  shards_.push_back({std::move(path), summary.samples, summary.file_bytes,
                     format::checksum_hex(summary.index_checksum)});
  published_bytes_ += summary.file_bytes;
  return Status::ok();
}

Status ShardSetWriter::finish() {
  if (current_) ZW_RETURN_IF_ERROR(close_current());
  return destination_.finish();
}

uint64_t ShardSetWriter::bytes() const {
  return published_bytes_ + (current_ ? current_->bytes_written() : 0);
}

}  // namespace zerowait::internal
