#include "storage/cache/block_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/endian.hpp"
#include "common/json_number.hpp"
#include "common/xxhash.hpp"

namespace zerowait::internal {
namespace {

constexpr char kBlockMagic[8] = {'Z', 'W', 'B', 'L', 'O', 'C', 'K', '1'};
constexpr const char* kLayoutFormat = "zerowait-block-cache";
constexpr uint64_t kEvictionLockByte = 0;
constexpr uint64_t kLedgerLockByte = 1;
constexpr uint64_t kFirstBlockLockByte = 1024;
// A named temporary file (filesystems without O_TMPFILE) older than this belongs to a fill that
// died: a live fill writes its block within its read's deadline.
constexpr auto kStaleTempAge = std::chrono::hours(1);

std::string hex(uint64_t v, int digits) {
  static const char* k = "0123456789abcdef";
  std::string out(static_cast<size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i, v >>= 4) out[static_cast<size_t>(i)] = k[v & 15];
  return out;
}

Status make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return Status::ok();
  return errno_status(errno, "cannot create the cache directory", path);
}

Result<File> open_lock_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status(errno, "cannot open the cache's lock file", path);
  return File(fd, path);
}

// Tries the lock once: true when taken, false when another description holds it.
Result<bool> try_lock_byte(const File& file, uint64_t byte) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(byte);
  fl.l_len = 1;
  if (::fcntl(file.fd(), F_OFD_SETLK, &fl) == 0) return true;
  if (errno == EAGAIN || errno == EACCES || errno == EINTR) return false;
  return errno_status(errno, "cannot lock (open-file-description lock)", file.path(),
                      static_cast<long long>(byte));
}

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

Status check_layout(const std::string& directory, uint64_t block_bytes) {
  const std::string path = directory + "/layout.json";
  nlohmann::json layout = {{"format", kLayoutFormat}, {"version", 1}, {"block_bytes", block_bytes}};
  Result<std::string> text = read_whole_file(path);
  if (!text.is_ok() && text.status().code() == ErrorCode::kNotFound) {
    // Two processes creating it at once write the same bytes; the rename makes either whole.
    return write_file_atomic(path, layout.dump() + "\n", /*sync=*/false);
  }
  if (!text.is_ok()) return text.status();
  const nlohmann::json found = nlohmann::json::parse(text.value(), nullptr, false);
  if (!found.is_object() || found.value("format", "") != kLayoutFormat) {
    return invalid_argument("'" + path + "' is not a zerowait block cache's layout: choose an " +
                            "empty directory for the cache");
  }
  uint64_t found_block = 0;
  try {
    found_block = json_integer<uint64_t>(found.at("block_bytes"));
  } catch (const nlohmann::json::exception& e) {
    return corrupt("cache layout '" + path + "': block_bytes: " + e.what());
  }
  if (found_block != block_bytes) {
    return invalid_argument("the cache in '" + directory + "' holds blocks of " +
                            std::to_string(found_block) + " bytes, not " +
                            std::to_string(block_bytes) +
                            ": open it with that block size, or use another directory");
  }
  return Status::ok();
}

}  // namespace

std::string cache_object_id(const std::string& name, uint64_t size, const std::string& version) {
  std::string identity = name;
  identity.push_back('\0');
  identity += std::to_string(size);
  identity.push_back('\0');
  identity += version;
  const XXH128_hash_t h = XXH3_128bits(identity.data(), identity.size());
  return hex(h.high64, 16) + hex(h.low64, 16);
}

Result<ByteLock> ByteLock::acquire(const std::string& path, uint64_t byte, Deadline deadline,
                                   const std::string& what) {
  ZW_ASSIGN_OR_RETURN(File file, open_lock_file(path));
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    ZW_ASSIGN_OR_RETURN(bool taken, try_lock_byte(file, byte));
    if (taken) return ByteLock(std::move(file));
    if (deadline.passed()) {
      return Status(ErrorCode::kDeadlineExceeded,
                    "deadline passed while waiting for " + what + " (lock file '" + path + "')");
    }
    std::this_thread::sleep_for(std::min(
        pause, std::chrono::duration_cast<std::chrono::microseconds>(deadline.at - Clock::now())));
    pause = std::min(pause * 2, std::chrono::microseconds(20'000));
  }
}

Result<std::unique_ptr<BlockStore>> BlockStore::open(const std::string& directory,
                                                     uint64_t block_bytes) {
  if (directory.empty()) return invalid_argument("the cache needs a directory");
  if (block_bytes == 0) return invalid_argument("the cache's block size must be above 0");
  ZW_RETURN_IF_ERROR(make_directory(directory));
  ZW_RETURN_IF_ERROR(make_directory(directory + "/blocks"));
  ZW_RETURN_IF_ERROR(make_directory(directory + "/tmp"));
  ZW_RETURN_IF_ERROR(check_layout(directory, block_bytes));
  ZW_ASSIGN_OR_RETURN(File lock_file, open_lock_file(directory + "/lock"));
  // Filesystems without OFD locks (some network filesystems) cannot host a shared cache.
  ZW_ASSIGN_OR_RETURN(ByteLock probe, ByteLock::acquire(directory + "/lock", kLedgerLockByte,
                                                        Deadline::after(std::chrono::seconds(30)),
                                                        "the cache's ledger"));
  (void)probe;
  return std::unique_ptr<BlockStore>(new BlockStore(directory, std::move(lock_file)));
}

std::string BlockStore::block_name(const std::string& object, uint64_t block) {
  return object + "-" + hex(block, 10) + ".blk";
}

std::string BlockStore::block_path(const std::string& object, uint64_t block) const {
  return directory_ + "/blocks/" + object.substr(0, 2) + "/" + block_name(object, block);
}

Result<ByteLock> BlockStore::lock_block(const std::string& object, uint64_t block,
                                        Deadline deadline, const std::string& what) const {
  const std::string name = block_name(object, block);
  const uint64_t h = XXH3_64bits(name.data(), name.size());
  return ByteLock::acquire(lock_path(), kFirstBlockLockByte + (h >> 24), deadline, what);
}

Result<ByteLock> BlockStore::lock_eviction(Deadline deadline) const {
  return ByteLock::acquire(lock_path(), kEvictionLockByte, deadline,
                           "another process evicting from the cache");
}

Result<File> BlockStore::open_block(const std::string& object, uint64_t block) const {
  return File::open_read(block_path(object, block));
}

Status BlockStore::check_block(const File& file, uint64_t expected_bytes) {
  ZW_ASSIGN_OR_RETURN(uint64_t size, file.size());
  if (size != expected_bytes + kBlockTrailerBytes) {
    return corrupt("cache block '" + file.path() + "' holds " + std::to_string(size) +
                   " bytes, not " + std::to_string(expected_bytes + kBlockTrailerBytes) +
                   " (a fill that did not finish, or a damaged file)");
  }
  std::vector<std::byte> bytes(size);
  ZW_RETURN_IF_ERROR(file.pread_exact(0, bytes));
  const std::byte* trailer = bytes.data() + expected_bytes;
  const uint64_t stored_length = get_u64(trailer + 8);
  const uint64_t stored_hash = get_u64(trailer + 16);
  const uint64_t actual_hash = XXH3_64bits(bytes.data(), expected_bytes);
  if (std::memcmp(trailer, kBlockMagic, sizeof kBlockMagic) != 0 ||
      stored_length != expected_bytes || stored_hash != actual_hash) {
    return corrupt("cache block '" + file.path() + "' does not match its checksum (xxh3 " +
                   hex(actual_hash, 16) + ", recorded " + hex(stored_hash, 16) +
                   "): the file is damaged");
  }
  return Status::ok();
}

Result<File> BlockStore::publish_block(const std::string& object, uint64_t block,
                                       std::span<const std::byte> data) const {
  const std::string final_path = block_path(object, block);
  std::string trailer(kBlockMagic, sizeof kBlockMagic);
  put_u64(trailer, data.size());
  put_u64(trailer, XXH3_64bits(data.data(), data.size()));
  put_u64(trailer, 0);
  const std::string tmp_dir = directory_ + "/tmp";

  // An unnamed file: a fill that dies leaves nothing behind. Where the filesystem has no
  // O_TMPFILE, a named one that scan() removes once stale.
  std::string named_temp;
  int fd = ::open(tmp_dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    named_temp =
        tmp_dir + "/" + std::to_string(::getpid()) + "-" + block_name(object, block) + ".tmp";
    fd = ::open(named_temp.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
  }
  if (fd < 0) return errno_status(errno, "cannot create a cache block in", tmp_dir);
  File file(fd, final_path);
  ZW_RETURN_IF_ERROR(file.pwrite_all(0, data, "cannot write the cache block"));
  ZW_RETURN_IF_ERROR(file.pwrite_all(data.size(), std::as_bytes(std::span(trailer)),
                                     "cannot write the cache block"));

  const std::string fan_out = final_path.substr(0, final_path.rfind('/'));
  ZW_RETURN_IF_ERROR(make_directory(fan_out));
  int linked = 0;
  if (named_temp.empty()) {
    // linkat(AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH; the /proc path works for everyone.
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    linked = ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, final_path.c_str(), AT_SYMLINK_FOLLOW);
  } else {
    // link + unlink instead of rename: a block published meanwhile is never replaced.
    linked = ::link(named_temp.c_str(), final_path.c_str());
    const int saved = errno;
    ::unlink(named_temp.c_str());
    errno = saved;
  }
  if (linked != 0) return errno_status(errno, "cannot publish the cache block", final_path);
  return file;
}

Status BlockStore::remove(const std::string& path) const {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return Status::ok();
  return errno_status(errno, "cannot remove the cache block", path);
}

Result<ByteLock> BlockStore::lock_ledger() const {
  return ByteLock::acquire(lock_path(), kLedgerLockByte, Deadline::after(std::chrono::seconds(30)),
                           "the cache's ledger");
}

Result<uint64_t> BlockStore::read_ledger_locked() const {
  std::byte bytes[8] = {};
  ZW_ASSIGN_OR_RETURN(uint64_t size, lock_file_.size());
  if (size >= 8) ZW_RETURN_IF_ERROR(lock_file_.pread_exact(0, bytes));
  return get_u64(bytes);
}

Status BlockStore::write_ledger_locked(uint64_t value) const {
  std::string encoded;
  put_u64(encoded, value);
  return lock_file_.pwrite_all(0, std::as_bytes(std::span(encoded)), "cannot update the ledger");
}

Result<uint64_t> BlockStore::ledger() const {
  ZW_ASSIGN_OR_RETURN(ByteLock lock, lock_ledger());
  return read_ledger_locked();
}

Result<uint64_t> BlockStore::ledger_add(int64_t delta) const {
  ZW_ASSIGN_OR_RETURN(ByteLock lock, lock_ledger());
  ZW_ASSIGN_OR_RETURN(uint64_t old_value, read_ledger_locked());
  const uint64_t value =
      delta < 0 && static_cast<uint64_t>(-delta) > old_value ? 0 : old_value + delta;
  ZW_RETURN_IF_ERROR(write_ledger_locked(value));
  return value;
}

Status BlockStore::ledger_set(uint64_t value) const {
  ZW_ASSIGN_OR_RETURN(ByteLock lock, lock_ledger());
  return write_ledger_locked(value);
}

Result<BlockStoreScan> BlockStore::scan() const {
  BlockStoreScan result;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const int64_t stale_before_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now - kStaleTempAge).count();

  auto each_entry = [](const std::string& dir, auto&& visit) -> Status {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno == ENOENT) return Status::ok();
      return errno_status(errno, "cannot list the cache directory", dir);
    }
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      visit(name);
    }
    ::closedir(d);
    return Status::ok();
  };

  const std::string tmp_dir = directory_ + "/tmp";
  ZW_RETURN_IF_ERROR(each_entry(tmp_dir, [&](const std::string& name) {
    struct stat st {};
    const std::string path = tmp_dir + "/" + name;
    if (::stat(path.c_str(), &st) != 0) return;
    if (mtime_ns(st) < stale_before_ns && ::unlink(path.c_str()) == 0) {
      ++result.stale_temps_removed;
    } else {
      result.bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }));

  const std::string blocks_dir = directory_ + "/blocks";
  std::vector<std::string> fan_outs;
  ZW_RETURN_IF_ERROR(
      each_entry(blocks_dir, [&](const std::string& name) { fan_outs.push_back(name); }));
  for (const std::string& fan_out : fan_outs) {
    const std::string dir = blocks_dir + "/" + fan_out;
    ZW_RETURN_IF_ERROR(each_entry(dir, [&](const std::string& name) {
      if (!name.ends_with(".blk")) return;
      struct stat st {};
      const std::string path = dir + "/" + name;
      if (::stat(path.c_str(), &st) != 0) return;
      const uint64_t disk_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
      result.blocks.push_back({path, name, disk_bytes, mtime_ns(st)});
      result.bytes += disk_bytes;
    }));
  }
  return result;
}

Result<uint64_t> BlockStore::free_bytes() const {
  struct statvfs fs {};
  if (::statvfs(directory_.c_str(), &fs) != 0) {
    return errno_status(errno, "cannot measure the free space of", directory_);
  }
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

}  // namespace zerowait::internal
