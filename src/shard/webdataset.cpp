#include "zerowait/shard/webdataset.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "common/endian.hpp"
#include "common/file.hpp"
#include "common/log.hpp"
#include "storage/cache/block_store.hpp"
#include "shard/tar/tar_header.hpp"
#include "zerowait/storage/cache_directory.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

// How a scan of the headers reads the archive. A local file is read a window at a time, so a
// shard of 10 kB images costs one read per few headers; after a large member only a few blocks are
// read (its header, maybe pax or long-name records), and skipped data is never read. A remote
// object pays a request's latency per read, so it is read in windows of megabytes, and the next
// windows are announced (a cache in front of it downloads them in parallel meanwhile).
struct ScanReads {
  size_t window;
  size_t window_after_large_skip;
  size_t windows_announced_ahead;
};
constexpr ScanReads kLocalScan{64 << 10, 4 << 10, 0};
constexpr ScanReads kRemoteScan{8 << 20, 64 << 10, 4};

class SourceInput final : public internal::TarInput {
 public:
  // Each read has `read_timeout` when set, so that a server that stops answering fails the scan
  // (naming the object and range) instead of holding the open forever.
  SourceInput(ByteSource& source, ScanReads reads,
              std::optional<std::chrono::nanoseconds> read_timeout)
      : source_(source), size_(source.size()), reads_(reads), read_timeout_(read_timeout) {}

  Result<size_t> read(std::span<std::byte> dst) override {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), size_ - pos_));
    if (n == 0) return size_t{0};
    if (pos_ < window_offset_ || pos_ + n > window_offset_ + window_.size()) {
      if (n >= reads_.window) {
        ZW_RETURN_IF_ERROR(read_at(pos_, dst.first(n)));
        pos_ += n;
        return n;
      }
      const size_t window =
          std::max(n, after_large_skip_ ? reads_.window_after_large_skip : reads_.window);
      window_.resize(static_cast<size_t>(std::min<uint64_t>(window, size_ - pos_)));
      window_offset_ = pos_;
      announce_after(pos_ + window_.size());
      ZW_RETURN_IF_ERROR(read_at(pos_, window_));
    }
    std::memcpy(dst.data(), window_.data() + (pos_ - window_offset_), n);
    pos_ += n;
    return n;
  }

  Result<uint64_t> skip(uint64_t n) override {
    n = std::min(n, size_ - pos_);
    pos_ += n;
    after_large_skip_ = n > reads_.window;
    return n;
  }

  uint64_t position() const override { return pos_; }
  std::optional<uint64_t> known_size() const override { return size_; }

 private:
  Status read_at(uint64_t offset, std::span<std::byte> dst) {
    return source_.read_at(offset, dst,
                           read_timeout_ ? Deadline::after(*read_timeout_) : Deadline::none());
  }

  // Announces the windows after `offset` not announced yet, as if no member were skipped.
  void announce_after(uint64_t offset) {
    if (reads_.windows_announced_ahead == 0) return;
    const uint64_t until =
        std::min<uint64_t>(size_, offset + reads_.windows_announced_ahead * reads_.window);
    const uint64_t from = std::max(offset, announced_until_);
    if (from >= until) return;
    source_.prefetch(from, until - from);
    announced_until_ = until;
  }

  ByteSource& source_;
  const uint64_t size_;
  const ScanReads reads_;
  const std::optional<std::chrono::nanoseconds> read_timeout_;
  uint64_t pos_ = 0;
  std::vector<std::byte> window_;
  uint64_t window_offset_ = 0;
  uint64_t announced_until_ = 0;
  bool after_large_skip_ = false;
};

// Adds one sample per run of consecutive members with the same key.
class IndexBuilder {
 public:
  void add(std::string_view key, std::string_view field, uint64_t offset, uint64_t size) {
    if (!open_ || key != key_) {
      finish();
      open_ = true;
      key_ = key;
      first_field_ = index_.fields.size();
    }
    const uint32_t name_id = index_.intern_name(field);
    for (size_t i = first_field_; i < index_.fields.size(); ++i) {
      if (index_.fields[i].name_id == name_id) return;  // WebDataset keeps the first copy
    }
    index_.fields.push_back({name_id, offset, size});
  }

  format::ShardIndex finish_index() && {
    finish();
    return std::move(index_);
  }

 private:
  void finish() {
    if (!open_) return;
    open_ = false;
    const format::FieldEntry& first = index_.fields[first_field_];
    const format::FieldEntry& last = index_.fields.back();
    format::SampleEntry sample;
    sample.offset = first.offset;
    sample.size = last.offset + last.size - first.offset;
    sample.first_field = first_field_;
    sample.field_count = static_cast<uint32_t>(index_.fields.size() - first_field_);
    sample.key_offset = index_.strings.size();
    sample.key_size = static_cast<uint32_t>(key_.size());
    index_.strings += key_;
    index_.samples.push_back(sample);
  }

  format::ShardIndex index_;
  bool open_ = false;
  std::string key_;
  size_t first_field_ = 0;
};

// Sidecar layout (little-endian): a 40-byte header, the serialized index, then the xxHash3 of
// every byte before it. encode_sidecar writes the header fields in this order.
constexpr char kSidecarMagic[8] = {'Z', 'W', 'T', 'A', 'R', 'I', 'X', '\0'};
constexpr uint32_t kSidecarVersion = 1;
namespace sidecar_field {
constexpr size_t kVersion = 8;      // u32 (then a reserved u32)
constexpr size_t kTarSize = 16;     // u64
constexpr size_t kTarMtimeNs = 24;  // u64
constexpr size_t kIndexBytes = 32;  // u64
}  // namespace sidecar_field
constexpr size_t kSidecarHeaderSize = 40;
constexpr size_t kSidecarChecksumSize = 8;

// What the sidecar must match: the tar as it is now.
struct TarIdentity {
  uint64_t size = 0;
  uint64_t mtime_ns = 0;
  bool operator==(const TarIdentity&) const = default;
};

Result<TarIdentity> stat_tar(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno_status(errno, "cannot stat", path);
  return TarIdentity{static_cast<uint64_t>(st.st_size),
                     static_cast<uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000ull +
                         static_cast<uint64_t>(st.st_mtim.tv_nsec)};
}

std::string encode_sidecar(const TarIdentity& tar, const format::ShardIndex& index) {
  const std::string index_bytes = index.serialize();
  std::string out(kSidecarMagic, sizeof(kSidecarMagic));
  internal::put_u32(out, kSidecarVersion);
  internal::put_u32(out, 0);
  internal::put_u64(out, tar.size);
  internal::put_u64(out, tar.mtime_ns);
  internal::put_u64(out, index_bytes.size());
  static_assert(sidecar_field::kIndexBytes + 8 == kSidecarHeaderSize);
  out += index_bytes;
  internal::put_u64(out, format::checksum(std::as_bytes(std::span(out))));
  return out;
}

// Returns the cached index, or nothing when the sidecar is missing, stale or damaged: all three
// only mean the index is built again.
std::optional<format::ShardIndex> load_sidecar(const std::string& sidecar, const TarIdentity& tar,
                                               const std::string& tar_name) {
  auto file = internal::read_whole_file(sidecar);
  if (!file.is_ok()) return std::nullopt;
  const std::span<const std::byte> bytes = std::as_bytes(std::span(*file));
  if (bytes.size() < kSidecarHeaderSize + kSidecarChecksumSize ||
      std::memcmp(bytes.data(), kSidecarMagic, sizeof(kSidecarMagic)) != 0 ||
      internal::get_u32(bytes.data() + sidecar_field::kVersion) != kSidecarVersion) {
    return std::nullopt;
  }
  const size_t body = bytes.size() - kSidecarChecksumSize;
  if (format::checksum(bytes.first(body)) != internal::get_u64(bytes.data() + body)) {
    return std::nullopt;
  }
  const TarIdentity stored{internal::get_u64(bytes.data() + sidecar_field::kTarSize),
                           internal::get_u64(bytes.data() + sidecar_field::kTarMtimeNs)};
  if (stored != tar ||
      internal::get_u64(bytes.data() + sidecar_field::kIndexBytes) != body - kSidecarHeaderSize) {
    return std::nullopt;
  }
  auto index = format::ShardIndex::parse(
      bytes.subspan(kSidecarHeaderSize, body - kSidecarHeaderSize), 0, tar.size, tar_name);
  if (!index.is_ok()) return std::nullopt;
  return std::move(*index);
}

}  // namespace

bool split_sample_name(std::string_view path, std::string_view* key, std::string_view* field) {
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = path.find('.', base);
  // WebDataset's "^((?:.*/|)[^.]+)[.]([^/]*)$" needs a stem before the dot; an empty field is
  // refused as well, since the index format has no empty field names.
  if (dot == std::string_view::npos || dot == base || dot + 1 == path.size()) return false;
  *key = path.substr(0, dot);
  *field = path.substr(dot + 1);
  return true;
}

bool is_safe_relative_path(std::string_view key) {
  if (key.empty() || key.front() == '/' || key.find('\0') != std::string_view::npos) return false;
  size_t start = 0;
  for (;;) {
    const size_t slash = key.find('/', start);
    const std::string_view part = key.substr(start, slash - start);
    if (part.empty() || part == "..") return false;
    if (slash == std::string_view::npos) return true;
    start = slash + 1;
  }
}

Result<format::ShardIndex> build_tar_index(ByteSource& tar) {
  tar.advise_sequential();
  const bool remote = !is_local_path(tar.name());
  SourceInput input(tar, remote ? kRemoteScan : kLocalScan,
                    remote ? std::optional<std::chrono::nanoseconds>(kOpenTimeout) : std::nullopt);
  internal::TarWalker walker(&input, tar.name());
  IndexBuilder builder;
  internal::TarMember member;
  for (;;) {
    ZW_ASSIGN_OR_RETURN(bool more, walker.next(&member));
    if (!more) break;
    std::string_view key, field;
    if (!member.is_regular() || !split_sample_name(member.path, &key, &field)) continue;
    builder.add(key, field, member.data_offset, member.size);
  }
  return std::move(builder).finish_index();
}

std::string tar_index_sidecar_path(const std::string& tar_path) { return tar_path + ".zwidx"; }

Result<std::string> tar_index_user_cache_path(const std::string& tar_path) {
  ZW_ASSIGN_OR_RETURN(const std::string dir, default_cache_directory(kTarIndexSubdirectory));
  // Named by the tar's absolute path: the sidecar's own header says whether it still matches.
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(tar_path, error);
  const std::string name = error ? tar_path : absolute.lexically_normal().string();
  return dir + "/" + internal::cache_object_id(name, 0, "tar-index") + ".zwidx";
}

Result<std::shared_ptr<ShardReader>> open_tar_shard(const std::string& tar_path,
                                                    IoBackend backend) {
  ZW_ASSIGN_OR_RETURN(std::shared_ptr<ByteSource> source,
                      open_source(tar_path, backend, open_deadline()));
  return open_tar_shard(std::move(source));
}

Result<std::shared_ptr<ShardReader>> open_tar_shard(std::shared_ptr<ByteSource> source) {
  const std::string tar_path = source->name();
  if (!is_local_path(tar_path)) {
    // No sidecar: the index is built by one scan per open. Through a cache, that scan is what
    // fills the cache with the tar's blocks, so the samples' reads that follow hit.
    ZW_ASSIGN_OR_RETURN(format::ShardIndex index, build_tar_index(*source));
    return std::make_shared<ShardReader>(std::move(source), std::move(index),
                                         format::kNoChecksums, ShardKind::kTar);
  }
  ZW_ASSIGN_OR_RETURN(TarIdentity opened, stat_tar(tar_path));
  // A tar replaced since it was opened (another size) or changed while it is indexed is indexed,
  // but its index is not cached.
  bool cacheable = opened.size == source->size();

  // Beside the tar first; where this user may not write there (a shared dataset), in the
  // user's cache directory.
  const std::string sidecar = tar_index_sidecar_path(tar_path);
  const Result<std::string> user_sidecar = tar_index_user_cache_path(tar_path);
  std::optional<format::ShardIndex> index;
  if (cacheable) index = load_sidecar(sidecar, opened, tar_path);
  if (cacheable && !index && user_sidecar.is_ok()) {
    index = load_sidecar(*user_sidecar, opened, tar_path);
  }
  if (!index) {
    ZW_ASSIGN_OR_RETURN(index, build_tar_index(*source));
    if (cacheable) {
      const Result<TarIdentity> indexed = stat_tar(tar_path);
      cacheable = indexed.is_ok() && *indexed == opened;
    }
    // Neither place writable (or a full disk) only costs the cache: the index stays in memory.
    if (cacheable) {
      const std::string bytes = encode_sidecar(opened, *index);
      Status written = internal::write_file_atomic(sidecar, bytes, false);
      if (!written.is_ok()) {
        const std::string beside = written.message();
        written = user_sidecar.status();
        if (written.is_ok()) written = make_default_cache_directory(kTarIndexSubdirectory).status();
        if (written.is_ok()) written = internal::write_file_atomic(*user_sidecar, bytes, false);
        if (!written.is_ok()) {
          internal::note_fallback(
              "tar_index_not_cached",
              "tar indexes are kept in memory only (" + beside + "; " + written.message() + ")");
        }
      }
    }
  }
  return std::make_shared<ShardReader>(std::move(source), std::move(*index), format::kNoChecksums,
                                       ShardKind::kTar);
}

}  // namespace zerowait
